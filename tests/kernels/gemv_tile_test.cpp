// The small-M kernels of kernels/cpu/gemv_tile.h against a naive f64 product, directly (the
// op cases reach them through MATMUL, where the CPU picks one bf16 kernel): dot and axpy
// layouts, f32 and bf16 weights, the vdpbf16ps kernel when this CPU has it, M = 1..4, K and
// N tails, row strides wider than the rows.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/common/dtype.h"
#include "kernels/cpu/gemv_tile.h"

namespace kv::cpu {
namespace {

struct Case {
    int M;
    int64_t N, K;
};

const Case kCases[] = {{1, 1, 1}, {1, 37, 45}, {2, 64, 96}, {3, 131, 17}, {4, 70, 130}, {4, 5, 260}, {2, 200, 33}};

// Values exactly representable in bf16, so f32 and bf16 kernels see the same inputs.
std::vector<float> bf16_values(size_t n, std::mt19937& rng) {
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    std::vector<float> v(n);
    for (float& f : v) f = bf16_to_f32(f32_to_bf16(u(rng)));
    return v;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
    std::vector<uint16_t> r(v.size());
    for (size_t i = 0; i < v.size(); ++i) r[i] = f32_to_bf16(v[i]);
    return r;
}

// max |got - ref| / max |ref| over the M x N outputs.
double rel_err(const std::vector<float>& got, int64_t ldy, const std::vector<double>& ref, int M, int64_t N) {
    double mx = 0, e = 0;
    for (int m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
            mx = std::max(mx, std::fabs(ref[size_t(m * N + n)]));
            e = std::max(e, std::fabs(double(got[size_t(m * ldy + n)]) - ref[size_t(m * N + n)]));
        }
    return e / (mx > 0 ? mx : 1);
}

TEST(GemvTile, DotLayoutMatchesF64) {
    std::mt19937 rng(7);
    for (const Case& c : kCases) {
        const int64_t ldx = c.K + 3, ldw = c.K + 5, ldy = c.N + 2;  // padded rows
        std::vector<float> x = bf16_values(size_t(c.M * ldx), rng), w = bf16_values(size_t(c.N * ldw), rng);
        std::vector<double> ref(size_t(c.M * c.N), 0.0);
        for (int m = 0; m < c.M; ++m)
            for (int64_t n = 0; n < c.N; ++n)
                for (int64_t k = 0; k < c.K; ++k) ref[size_t(m * c.N + n)] += double(x[size_t(m * ldx + k)]) * w[size_t(n * ldw + k)];
        std::vector<float> y(size_t(c.M * ldy), -999.f);
        gemv_dot<float>(c.M, c.N, c.K, x.data(), ldx, w.data(), ldw, y.data(), ldy);
        EXPECT_LT(rel_err(y, ldy, ref, c.M, c.N), 1e-5) << "f32 M " << c.M << " N " << c.N << " K " << c.K;
        const std::vector<uint16_t> w16 = to_bf16(w), x16 = to_bf16(x);
        std::fill(y.begin(), y.end(), -999.f);
        gemv_dot<uint16_t>(c.M, c.N, c.K, x.data(), ldx, w16.data(), ldw, y.data(), ldy);
        EXPECT_LT(rel_err(y, ldy, ref, c.M, c.N), 1e-5) << "bf16 weights M " << c.M << " N " << c.N << " K " << c.K;
#if KV_GEMV_DOT_BF16
        {  // compiled only where the ISA level has AVX512-BF16 (a native build on such a CPU)
            std::fill(y.begin(), y.end(), -999.f);
            gemv_dot_bf16(c.M, c.N, c.K, x16.data(), ldx, w16.data(), ldw, y.data(), ldy);
            EXPECT_LT(rel_err(y, ldy, ref, c.M, c.N), 1e-5) << "vdpbf16ps M " << c.M << " N " << c.N << " K " << c.K;
        }
#endif
    }
}

TEST(GemvTile, AxpyLayoutMatchesF64) {
    std::mt19937 rng(11);
    for (const Case& c : kCases) {
        const int64_t ldx = c.K + 1, ldw = c.N + 7, ldy = c.N + 3;
        std::vector<float> x = bf16_values(size_t(c.M * ldx), rng), w = bf16_values(size_t(c.K * ldw), rng);
        std::vector<double> ref(size_t(c.M * c.N), 0.0);
        for (int m = 0; m < c.M; ++m)
            for (int64_t n = 0; n < c.N; ++n)
                for (int64_t k = 0; k < c.K; ++k) ref[size_t(m * c.N + n)] += double(x[size_t(m * ldx + k)]) * w[size_t(k * ldw + n)];
        std::vector<float> y(size_t(c.M * ldy), -999.f);
        gemv_axpy<float>(c.M, c.N, c.K, x.data(), ldx, w.data(), ldw, y.data(), ldy);
        EXPECT_LT(rel_err(y, ldy, ref, c.M, c.N), 1e-5) << "f32 M " << c.M << " N " << c.N << " K " << c.K;
        const std::vector<uint16_t> w16 = to_bf16(w);
        std::fill(y.begin(), y.end(), -999.f);
        gemv_axpy<uint16_t>(c.M, c.N, c.K, x.data(), ldx, w16.data(), ldw, y.data(), ldy);
        EXPECT_LT(rel_err(y, ldy, ref, c.M, c.N), 1e-5) << "bf16 weights M " << c.M << " N " << c.N << " K " << c.K;
    }
}

}  // namespace
}  // namespace kv::cpu
