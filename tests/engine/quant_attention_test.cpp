// Attention over the codes of the deployed row formats (the SDPA_QROWS op, kernels/cpu/sdpa_qrows.cpp,
// the quantized buffer's fused attention for fp8_e4m3, fp8_e5m2, nvfp4, mxfp4, kfp8vfp4 and
// turboquant at several widths): the output and the weight sums equal an f64 SDPA written here
// over the decoded cache (the buffer's read(), whose decoding fp_buffers_test and
// turboquant_buffer_test check against f64 decoders of the format definitions), with GQA,
// position masking, a sliding window, decode and multi-query calls; a decode step allocates
// no f32 copy of the cache (scratch counted by the memory tracker does not grow with T).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "engine/backend/backend_registry.h"
#include "engine/kv/buffers/buffer_common.h"
#include "engine/kv/buffers/kv_buffer.h"
#include "engine/kv/kv_config.h"
#include "engine/memory/memory_tracker.h"
#include "engine/ops/ops.h"
#include "tests/support/test_support.h"

namespace kv::test {
namespace {

struct FmtCase {
    std::string buffer;
    int64_t key_bits = 0, value_bits = 0;
    KVCacheConfig cfg() const {
        KVCacheConfig c;
        c.name = "dense-" + buffer;
        c.key_bits = key_bits;
        c.value_bits = value_bits;
        return c;
    }
    std::string what() const { return buffer + " k" + std::to_string(key_bits) + " v" + std::to_string(value_bits); }
};

std::vector<FmtCase> setups() {
    return {{"fp8_e4m3"}, {"fp8_e5m2"}, {"nvfp4"}, {"mxfp4"}, {"kfp8vfp4"}, {"turboquant"}, {"turboquant", 2, 8}, {"turboquant", 3, 2}};
}

Tensor random_kv(int64_t B, int64_t G, int64_t n, int64_t D, std::mt19937_64& rng) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> v(size_t(B * G * n * D));
    for (size_t i = 0; i < v.size(); ++i) v[i] = nd(rng) * (i % 11 == 0 ? 4.0f : 1.0f) + 0.3f * float(i % 5);
    return Tensor::from_f32({B, G, n, D}, v);
}

// A buffer of L slots holding B x G rows: a prefill of half, then a scattered write.
std::unique_ptr<KVBuffer> filled_buffer(const FmtCase& st, int64_t B, int64_t G, int64_t L, int64_t D, std::mt19937_64& rng) {
    const KVCacheConfig cfg = st.cfg();
    BufferParams p;
    p.L = L, p.G = G, p.D = D;
    auto buf = make_buffer(cfg, p, make_buffer_shared(cfg, L, G, D, Device{}, DType::F32));
    buf->prefill(random_kv(B, G, L / 2, D, rng), random_kv(B, G, L / 2, D, rng));
    SlotPlan w;  // per-row targets, and one move per row
    w.n = L - L / 2;
    w.rows = B * G;
    w.moves = 1;
    for (int64_t r = 0; r < B * G; ++r) {
        for (int64_t t = 0; t < w.n; ++t) w.targets.push_back(int32_t(L / 2 + (t + r) % w.n));
        w.move_from.push_back(int32_t(r % (L / 2)));
        w.move_to.push_back(int32_t((r + 3) % (L / 2)));
    }
    buf->write(w, random_kv(B, G, w.n, D, rng), random_kv(B, G, w.n, D, rng));
    return buf;
}

// f64 SDPA over decoded K, V (B, G, T, D) with op.h's masking; weights (B, G, T) as SDPA's dst2.
void reference(const std::vector<float>& q, const std::vector<float>& K, const std::vector<float>& V, const std::vector<int32_t>& kp,
               const std::vector<int32_t>& qp, int64_t B, int64_t NH, int64_t G, int64_t n, int64_t T, int64_t D, double scale, int window,
               std::vector<double>& y, std::vector<double>& w) {
    const int64_t R = NH / G;
    y.assign(size_t(B * NH * n * D), 0.0);
    w.assign(size_t(B * G * T), 0.0);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < NH; ++h)
            for (int64_t i = 0; i < n; ++i) {
                const int64_t g = h / R, qpos = qp[size_t(i)];
                std::vector<double> s(size_t(T), -INFINITY);
                double mx = -INFINITY;
                for (int64_t t = 0; t < T; ++t) {
                    const int64_t kpos = kp[size_t((b * G + g) * T + t)];
                    if (!(kpos <= qpos && (window <= 0 || kpos > qpos - window))) continue;
                    double d = 0;
                    for (int64_t c = 0; c < D; ++c) d += double(q[size_t(((b * NH + h) * n + i) * D + c)]) * double(K[size_t(((b * G + g) * T + t) * D + c)]);
                    s[size_t(t)] = d * scale;
                    mx = std::max(mx, s[size_t(t)]);
                }
                if (mx == -INFINITY) continue;
                double z = 0;
                for (double& x : s) z += (x = std::exp(x - mx));
                for (int64_t t = 0; t < T; ++t) {
                    const double p = s[size_t(t)] / z;
                    w[size_t((b * G + g) * T + t)] += p / double(R);
                    for (int64_t c = 0; c < D; ++c) y[size_t(((b * NH + h) * n + i) * D + c)] += p * double(V[size_t(((b * G + g) * T + t) * D + c)]);
                }
            }
}

void check_against_reference(const FmtCase& st, int64_t B, int64_t NH, int64_t G, int64_t T, int64_t D, int64_t n, int window, bool weights) {
    const std::string what = st.what() + " T " + std::to_string(T) + " n " + std::to_string(n) + " window " + std::to_string(window);
    std::mt19937_64 rng(seed_for(what));
    auto buf = filled_buffer(st, B, G, T, D, rng);
    ASSERT_TRUE(buf->fused_attention()) << what;
    Tensor q = random_kv(B, NH, n, D, rng);
    // Positions: a permutation with holes, per (b, g) row; the queries after most of them.
    std::vector<int32_t> kp(size_t(B * G * T), 0), qp(size_t(n), 0);
    for (int64_t r = 0; r < B * G; ++r)
        for (int64_t t = 0; t < T; ++t) kp[size_t(r * T + t)] = int32_t((t * 7 + r * 3) % (T + 5));
    for (int64_t i = 0; i < n; ++i) qp[size_t(i)] = int32_t(T - 8 + i * 5);
    Tensor kpos = Tensor::from_i32({B, G, T}, kp), qpos = Tensor::from_i32({1, n}, qp);
    const float scale = 1.0f / std::sqrt(float(D));
    Tensor y = Tensor::empty({B, NH, n, D}, DType::F32);
    Tensor ws = Tensor::empty({B, G, T}, DType::F32);
    buf->attend(y, q, T, kpos, qpos, scale, weights ? &ws : nullptr, window);
    auto [K, V] = buf->read(T);
    std::vector<double> yr, wr;
    reference(q.to_f32_vector(), K.contiguous().to_f32_vector(), V.contiguous().to_f32_vector(), kp, qp, B, NH, G, n, T, D, double(scale),
              window, yr, wr);
    const std::vector<float> yv = y.to_f32_vector();
    double ymax = 0, err = 0;
    for (size_t i = 0; i < yr.size(); ++i) ymax = std::max(ymax, std::fabs(yr[i])), err = std::max(err, std::fabs(double(yv[i]) - yr[i]));
    EXPECT_LE(err, 1e-5 * ymax) << what << ": output max error " << err << " of max |y| " << ymax;
    if (!weights) return;
    const std::vector<float> wv = ws.to_f32_vector();
    double werr = 0, wtot = 0;
    for (size_t i = 0; i < wr.size(); ++i) werr = std::max(werr, std::fabs(double(wv[i]) - wr[i])), wtot += double(wv[i]);
    EXPECT_LE(werr, 1e-5) << what << ": weight sums max error";
    double rtot = 0;
    for (double x : wr) rtot += x;
    EXPECT_NEAR(wtot, rtot, 1e-4 * double(B * G * n)) << what;
}

TEST(QuantAttention, DecodeEqualsF64SdpaOverTheDecodedCache) {
    for (const FmtCase& st : setups()) check_against_reference(st, 2, 6, 2, 3000, 64, 1, 0, false);  // several key ranges per pair
}

TEST(QuantAttention, QueriesWithWindowAndWeightSumsEqualF64) {
    for (const FmtCase& st : setups()) {
        check_against_reference(st, 2, 4, 2, 300, 32, 3, 0, true);
        check_against_reference(st, 1, 4, 2, 2100, 64, 2, 700, true);
        check_against_reference(st, 1, 2, 2, 96, 32, 5, 20, true);
    }
}

// A decode step reads the codes: the only tracked f32 scratch is per unit of work (max, sum and
// an accumulator of the head size per query row; units: a range of keys of a (batch row, KV
// head) pair, at most 16 per thread beyond one per pair; the bound below also leaves room for
// per-thread tiles): one bound, whatever the context, and no working buffer is allocated.
TEST(QuantAttention, DecodeScratchDoesNotGrowWithTheContext) {
    for (const FmtCase& st : {FmtCase{"fp8_e4m3"}, FmtCase{"nvfp4"}, FmtCase{"turboquant"}}) {
        const int64_t B = 1, NH = 9, G = 3, D = 64, rows = NH / G;
        const int64_t units = B * G + 16 * num_threads();
        const int64_t tile = 32, bound = (units * rows * (D + 2) + num_threads() * (rows * D + 2 * tile * D + rows * tile + 2 * tile)) * 4;
        for (int k = 0; k < 2; ++k) {
            const int64_t T = k == 0 ? 2048 : 16384;
            MemoryTracker tracker;
            MemoryTrackerScope scope(tracker);
            std::mt19937_64 rng(seed_for(st.what() + " scratch"));
            auto buf = filled_buffer(st, B, G, T, D, rng);
            Tensor q = random_kv(B, NH, 1, D, rng);
            std::vector<int32_t> kp(size_t(T), 0);
            for (int64_t t = 0; t < T; ++t) kp[size_t(t)] = int32_t(t);
            Tensor kpos = Tensor::from_i32({1, 1, T}, kp), qpos = Tensor::from_i32({1, 1}, {int32_t(T)});
            Tensor y = Tensor::empty({B, NH, 1, D}, DType::F32);
            EXPECT_EQ(tracker.current(Device{}, MemCategory::KV_CACHE), int64_t(buf->bytes())) << st.what() << ": codes only, no working buffer";
            tracker.reset_peaks();
            const int64_t before = tracker.current(Device{}, MemCategory::WORKSPACE);
            buf->attend(y, q, T, kpos, qpos, 0.125f, nullptr);
            const int64_t peak = tracker.peak(Device{}, MemCategory::WORKSPACE) - before;
            EXPECT_LE(peak, bound) << st.what() << " T " << T;
            const int64_t f32_copy = 2 * B * G * T * D * 4;
            EXPECT_LT(peak * 50, f32_copy) << st.what() << " T " << T << ": scratch " << peak << " bytes";
        }
    }
}

}  // namespace
}  // namespace kv::test
