// Kernel lab (STYLE item 7): GGUF weights dequantized to f32 at load (what kvlab does) against
// weights kept packed (Q8_0, Q4_1) and dequantized on the fly inside the matmul — the question
// the GGUF issue asks us to measure. Standalone, not part of the product.
//   at load     the product's CPU matmul on f32 weights: M = 1 is the small-M GEMV path
//               (gemv_tile.h), M = 128 (one prefill chunk) is oneDNN
//   packed M=1  a GEMV that reads each 32-weight block once (Q8_0: 34 bytes, Q4_1: 20 bytes),
//               widens it in registers and accumulates d * (q . x) (+ m * sum(x) for Q4_1,
//               with the per-block sums of x computed once per call); rows split over threads
//   packed M=128  the whole matrix dequantized into a reused f32 scratch, then the same
//               oneDNN matmul: an upper bound on what dequantizing panels on the fly costs
// Weights rotate through copies totalling >= 256 MiB so every call streams from DRAM, as in a
// decode step. Every kernel is first checked against an f64 product of the dequantized weights.
// Usage: kvlab_lab_packed [--quick] [--threads N]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#if defined(__AVX512F__)
// GCC 12 flags the intrinsics' own _mm512_undefined_* placeholders as maybe-uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#endif

#include "kernels/common/dtype.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/lab/lab_common.h"
#include "kernels/cpu/cpu_common.h"

namespace kv::lab {

constexpr int kBlock = 32;

uint16_t f16_bits(float f) {  // round to nearest even through the F16C-free path
    return f32_to_f16(f);
}

enum class Packed { Q8_0, Q4_1 };
size_t block_bytes(Packed f) { return f == Packed::Q8_0 ? 34 : 20; }
const char* name_of(Packed f) { return f == Packed::Q8_0 ? "q8_0" : "q4_1"; }

// llama.cpp's block layouts: Q8_0 = f16 d, 32 x int8; Q4_1 = f16 d, f16 m, 16 bytes whose low
// nibbles are elements 0..15 and high nibbles 16..31; value = d * q (+ m).
void quantize_row(Packed f, const float* x, int64_t K, uint8_t* out) {
    for (int64_t b = 0; b < K / kBlock; ++b, x += kBlock) {
        uint8_t* o = out + b * int64_t(block_bytes(f));
        if (f == Packed::Q8_0) {
            float amax = 0;
            for (int j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(x[j]));
            const float d = amax / 127.f, id = d ? 1.f / d : 0.f;
            const uint16_t h = f16_bits(d);
            std::memcpy(o, &h, 2);
            for (int j = 0; j < kBlock; ++j) o[2 + j] = uint8_t(int8_t(std::lround(x[j] * id)));
        } else {
            float mn = x[0], mx = x[0];
            for (int j = 1; j < kBlock; ++j) mn = std::min(mn, x[j]), mx = std::max(mx, x[j]);
            const float d = (mx - mn) / 15.f, id = d ? 1.f / d : 0.f;
            const uint16_t hd = f16_bits(d), hm = f16_bits(mn);
            std::memcpy(o, &hd, 2);
            std::memcpy(o + 2, &hm, 2);
            for (int j = 0; j < 16; ++j) {
                const int lo = std::clamp(int(std::lround((x[j] - mn) * id)), 0, 15);
                const int hi = std::clamp(int(std::lround((x[j + 16] - mn) * id)), 0, 15);
                o[4 + j] = uint8_t(lo | (hi << 4));
            }
        }
    }
}

void dequantize_row(Packed f, const uint8_t* in, int64_t K, float* y) {
    for (int64_t b = 0; b < K / kBlock; ++b, y += kBlock) {
        const uint8_t* p = in + b * int64_t(block_bytes(f));
        uint16_t hd;
        std::memcpy(&hd, p, 2);
        const float d = f16_to_f32(hd);
        if (f == Packed::Q8_0) {
            for (int j = 0; j < kBlock; ++j) y[j] = d * float(int8_t(p[2 + j]));
        } else {
            uint16_t hm;
            std::memcpy(&hm, p + 2, 2);
            const float m = f16_to_f32(hm);
            for (int j = 0; j < 16; ++j) y[j] = d * float(p[4 + j] & 15) + m, y[j + 16] = d * float(p[4 + j] >> 4) + m;
        }
    }
}

// y[n] = sum_k W[n, k] x[k] for packed rows of K weights.
void packed_gemv(Packed f, const uint8_t* W, int64_t N, int64_t K, const float* x, float* y, int threads) {
    const int64_t nb = K / kBlock;
    const size_t bb = block_bytes(f), row_bytes = size_t(nb) * bb;
    std::vector<float> xsum(static_cast<size_t>(nb));  // Q4_1: sum of x over each block
    for (int64_t b = 0; b < nb; ++b) {
        float s = 0;
        for (int j = 0; j < kBlock; ++j) s += x[b * kBlock + j];
        xsum[size_t(b)] = s;
    }
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t n = 0; n < N; ++n) {
        const uint8_t* r = W + size_t(n) * row_bytes;
#if defined(__AVX512F__)
        __m512 acc = _mm512_setzero_ps();
        float extra = 0;
        for (int64_t b = 0; b < nb; ++b, r += bb) {
            uint16_t hd;
            std::memcpy(&hd, r, 2);
            const __m512 d = _mm512_set1_ps(_cvtsh_ss(hd));
            const __m512 x0 = _mm512_loadu_ps(x + b * kBlock), x1 = _mm512_loadu_ps(x + b * kBlock + 16);
            __m512 q0, q1;
            if (f == Packed::Q8_0) {
                q0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r + 2))));
                q1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r + 18))));
            } else {
                const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r + 4)));
                q0 = _mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(15)));
                q1 = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
                uint16_t hm;
                std::memcpy(&hm, r + 2, 2);
                extra += _cvtsh_ss(hm) * xsum[size_t(b)];
            }
            acc = _mm512_fmadd_ps(d, _mm512_fmadd_ps(q1, x1, _mm512_mul_ps(q0, x0)), acc);
        }
        y[n] = _mm512_reduce_add_ps(acc) + extra;
#else
        float w[kBlock], s = 0;
        for (int64_t b = 0; b < nb; ++b, r += bb) {
            dequantize_row(f, r, kBlock, w);
            for (int j = 0; j < kBlock; ++j) s += w[j] * x[b * kBlock + j];
        }
        y[n] = s;
#endif
    }
}

struct Shape {
    const char* name;
    int64_t N, K;  // weight [N, K] (PyTorch Linear [out, in])
};

// y (M, N) f32 = x (M, K) @ W^T through the product's CPU matmul.
OpCall matmul_call(const float* x, const float* w, float* y, int64_t M, int64_t N, int64_t K) {
    OpCall c;
    c.op = OpKind::MATMUL;
    c.p.alpha = 1.f;
    c.p.beta = 0.f;
    TensorView a, b, d;
    a.data = const_cast<float*>(x), a.dtype = DType::F32, a.ndim = 2, a.ne[0] = M, a.ne[1] = K, a.nb[0] = K * 4, a.nb[1] = 4;
    b.data = const_cast<float*>(w), b.dtype = DType::F32, b.ndim = 2, b.ne[0] = K, b.ne[1] = N, b.nb[0] = 4, b.nb[1] = K * 4;
    d.data = y, d.dtype = DType::F32, d.ndim = 2, d.ne[0] = M, d.ne[1] = N, d.nb[0] = N * 4, d.nb[1] = 4;
    c.dst = d;
    c.src[0] = a, c.src[1] = b;
    c.nsrc = 2;
    return c;
}

int main_impl(int argc, char** argv) {
    const LabArgs args = parse_lab_args(argc, argv, "kvlab_lab_packed");
    if (!args.ok) return 2;
    const bool quick = args.quick;
    const int threads = args.threads;
    OpContext ctx;
    ctx.threads = threads;
    KernelBackend* product = lab_backend();
    if (!product) return 2;
    KernelBackend& be = *product;
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<float> u(-1.f, 1.f);

    // ---- correctness: packed GEMV against an f64 product of the dequantized weights --------
    for (Packed f : {Packed::Q8_0, Packed::Q4_1}) {
        const int64_t N = 37, K = 96;
        std::vector<float> w(static_cast<size_t>(N * K)), x(static_cast<size_t>(K)), wd(static_cast<size_t>(N * K)), y(static_cast<size_t>(N));
        for (float& v : w) v = u(rng);
        for (float& v : x) v = u(rng);
        std::vector<uint8_t> packed(size_t(N) * size_t(K / kBlock) * block_bytes(f));
        for (int64_t n = 0; n < N; ++n) {
            quantize_row(f, &w[size_t(n * K)], K, packed.data() + size_t(n) * size_t(K / kBlock) * block_bytes(f));
            dequantize_row(f, packed.data() + size_t(n) * size_t(K / kBlock) * block_bytes(f), K, &wd[size_t(n * K)]);
        }
        packed_gemv(f, packed.data(), N, K, x.data(), y.data(), threads);
        double err = 0, mx = 0;
        for (int64_t n = 0; n < N; ++n) {
            double r = 0;
            for (int64_t k = 0; k < K; ++k) r += double(wd[size_t(n * K + k)]) * x[size_t(k)];
            err = std::max(err, std::fabs(r - y[size_t(n)])), mx = std::max(mx, std::fabs(r));
        }
        const bool ok = err / mx < 1e-5;
        std::printf("check %s gemv: max rel err %.2e %s\n", name_of(f), err / mx, ok ? "ok" : "FAIL");
        if (!ok) return 1;
    }

    std::vector<Shape> shapes = {{"smollm2 q_proj", 576, 576},   {"smollm2 gate+up", 3072, 576},
                                 {"smollm2 down", 576, 1536},    {"smollm2 lm_head", 49152, 576},
                                 {"qwen2.5-0.5b gate+up", 9728, 896}, {"qwen2.5-0.5b down", 896, 4864}};
    if (quick) shapes = {{"smollm2 gate+up", 3072, 576}};
    const size_t min_bytes = quick ? size_t(64) << 20 : size_t(256) << 20;
    const double min_s = quick ? 0.05 : 0.3;
    std::printf("\nthreads %d; time per call in ms (weights rotate through >= %zu MiB of copies)\n", threads, min_bytes >> 20);
    std::printf("%-22s %4s %10s %10s %10s %9s %9s\n", "shape", "M", "f32 (load)", "q8_0", "q4_1", "f32/q8_0", "f32/q4_1");
    for (const Shape& sh : shapes) {
        const int64_t N = sh.N, K = sh.K;
        std::vector<float> base(static_cast<size_t>(N * K));
        for (float& v : base) v = u(rng);
        const size_t f32_bytes = size_t(N * K) * 4;
        const size_t copies = std::max<size_t>(2, (min_bytes + f32_bytes - 1) / f32_bytes);
        std::vector<std::vector<float>> wf(copies, base);
        std::vector<std::vector<uint8_t>> wq8(copies), wq4(copies);
        for (size_t c = 0; c < copies; ++c)
            for (Packed f : {Packed::Q8_0, Packed::Q4_1}) {
                auto& dst = f == Packed::Q8_0 ? wq8[c] : wq4[c];
                const size_t rb = size_t(K / kBlock) * block_bytes(f);
                dst.resize(size_t(N) * rb);
                for (int64_t n = 0; n < N; ++n) quantize_row(f, &base[size_t(n * K)], K, dst.data() + size_t(n) * rb);
            }
        for (int64_t M : {int64_t(1), int64_t(128)}) {
            std::vector<float> x(size_t(M * K)), y(size_t(M * N)), scratch(size_t(N * K));
            for (float& v : x) v = u(rng);
            auto packed_call = [&](Packed f, size_t i) {
                const auto& w = (f == Packed::Q8_0 ? wq8 : wq4)[i % copies];
                if (M == 1) {
                    packed_gemv(f, w.data(), N, K, x.data(), y.data(), threads);
                } else {
                    const size_t rb = size_t(K / kBlock) * block_bytes(f);
#pragma omp parallel for num_threads(threads) schedule(static)
                    for (int64_t n = 0; n < N; ++n) dequantize_row(f, w.data() + size_t(n) * rb, K, &scratch[size_t(n * K)]);
                    be.compute(ctx, matmul_call(x.data(), scratch.data(), y.data(), M, N, K));
                }
            };
            double tf = 1e30, t8 = 1e30, t4 = 1e30;
            for (int rep = 0; rep < 3; ++rep) {  // interleaved so all three see the same load
                tf = std::min(tf, seconds_per_call([&](size_t i) { be.compute(ctx, matmul_call(x.data(), wf[i % copies].data(), y.data(), M, N, K)); }, min_s));
                t8 = std::min(t8, seconds_per_call([&](size_t i) { packed_call(Packed::Q8_0, i); }, min_s));
                t4 = std::min(t4, seconds_per_call([&](size_t i) { packed_call(Packed::Q4_1, i); }, min_s));
            }
            std::printf("%-22s %4lld %10.3f %10.3f %10.3f %8.2fx %8.2fx\n", sh.name, (long long)M, tf * 1e3, t8 * 1e3, t4 * 1e3, tf / t8, tf / t4);
        }
    }
    std::printf("ratios > 1: packed weights (dequantized on the fly) are faster than f32 weights dequantized at load\n");
    return 0;
}

}  // namespace kv::lab

int main(int argc, char** argv) { return kv::lab::main_impl(argc, argv); }
