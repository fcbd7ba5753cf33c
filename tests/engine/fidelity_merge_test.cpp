// The log-sum-exp merge behind fidelity's fast path (engine/driver/fidelity.h): SDPA's per-row
// log-sum-exp output against an f64 recomputation; two attentions over disjoint halves of the
// keys (kept and evicted), merged, against f64 full attention over all of them; and a fidelity
// run taking the merge path against the same run recomputing full attention.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <tuple>

#include "engine/driver/fidelity.h"
#include "engine/kv/kv_cache.h"
#include "engine/ops/ops.h"
#include "tests/support/test_support.h"

namespace kv::test {
namespace {

// f64 attention of one query over the keys j with visible(j): output y (D) and the
// log-sum-exp of the scaled scores (-inf when it sees none).
template <class Vis>
double ref_attention(const double* q, const std::vector<double>& K, const std::vector<double>& V, int64_t T, int64_t D, double scale,
                     Vis visible, double* y) {
    std::vector<double> s((size_t)T, -INFINITY);
    double m = -INFINITY;
    for (int64_t j = 0; j < T; ++j) {
        if (!visible(j)) continue;
        double d = 0;
        for (int64_t i = 0; i < D; ++i) d += q[i] * K[size_t(j * D + i)];
        s[size_t(j)] = d * scale;
        m = std::max(m, s[size_t(j)]);
    }
    std::fill(y, y + D, 0.0);
    if (m == -INFINITY) return -INFINITY;
    double z = 0;
    for (int64_t j = 0; j < T; ++j) z += std::isinf(s[size_t(j)]) ? 0.0 : std::exp(s[size_t(j)] - m);
    for (int64_t j = 0; j < T; ++j) {
        if (std::isinf(s[size_t(j)])) continue;
        const double a = std::exp(s[size_t(j)] - m) / z;
        for (int64_t i = 0; i < D; ++i) y[i] += a * V[size_t(j * D + i)];
    }
    return m + std::log(z);
}

TEST(FidelityMerge, SdpaLogSumExpEqualsF64) {
    std::mt19937_64 rng(seed_for("FidelityMerge.SdpaLogSumExpEqualsF64"));
    const int64_t B = 2, G = 2, NH = 4, R = NH / G, D = 32, T = 150;
    // n = 3 takes the decode kernel, 37 the blocked one; a window, and f64 inputs (the f64 kernel).
    for (const auto& [n, window, dt] : std::vector<std::tuple<int64_t, int, DType>>{
             {3, 0, DType::F32}, {37, 0, DType::F32}, {37, 40, DType::F32}, {5, 0, DType::F64}, {37, 0, DType::F64}}) {
        SCOPED_TRACE(str("n ", n, " window ", window, dt == DType::F64 ? " f64" : " f32"));
        const Tensor q = random_tensor({B, NH, n, D}, dt, rng, -2.0, 2.0);
        const Tensor k = random_tensor({B, G, T, D}, dt, rng, -2.0, 2.0), v = random_tensor({B, G, T, D}, dt, rng, -1.0, 1.0);
        // Distinct shuffled positions per row (a cache's slot order); query 0 of batch row 1
        // sits before every key, so it sees nothing (-inf).
        std::vector<int32_t> kp((size_t)(B * G * T)), qp((size_t)(B * n));
        for (int64_t r = 0; r < B * G; ++r) {
            std::vector<int32_t> p((size_t)T);
            std::iota(p.begin(), p.end(), 10);
            std::shuffle(p.begin(), p.end(), rng);
            std::copy(p.begin(), p.end(), kp.begin() + r * T);
        }
        for (int64_t b = 0; b < B; ++b)
            for (int64_t i = 0; i < n; ++i) qp[size_t(b * n + i)] = int32_t(b == 1 && i == 0 ? 5 : 20 + rng() % 150);
        const Tensor kpos = Tensor::from_i32({B, G, T}, kp), qpos = Tensor::from_i32({B, n}, qp);
        Tensor y = Tensor::empty({B, NH, n, D}, dt), lse = Tensor::empty({B, NH, n}, DType::F64);
        const double scale = double(float(1.0 / std::sqrt(double(D))));  // the op's scale is an f32
        ops::sdpa_(y, q, k, v, kpos, qpos, float(scale), window, nullptr, &lse);
        const std::vector<double> Q = q.to_f64_vector(), Kv = k.to_f64_vector(), Vv = v.to_f64_vector(), got = lse.to_f64_vector();
        int64_t blind = 0;
        for (int64_t b = 0; b < B; ++b)
            for (int64_t h = 0; h < NH; ++h) {
                const int64_t r = b * G + h / R;
                const std::vector<double> Kr(Kv.begin() + r * T * D, Kv.begin() + (r + 1) * T * D), Vr(Vv.begin() + r * T * D, Vv.begin() + (r + 1) * T * D);
                for (int64_t i = 0; i < n; ++i) {
                    const int32_t p = qp[size_t(b * n + i)];
                    std::vector<double> yr((size_t)D);
                    const double want = ref_attention(&Q[size_t(((b * NH + h) * n + i) * D)], Kr, Vr, T, D, scale, [&](int64_t j) {
                        const int32_t kj = kp[size_t(r * T + j)];
                        return kj <= p && (window <= 0 || kj > p - window);
                    }, yr.data());
                    const double g = got[size_t((b * NH + h) * n + i)];
                    if (std::isinf(want)) {
                        EXPECT_EQ(g, -INFINITY) << "b " << b << " h " << h << " i " << i;
                        ++blind;
                    } else {
                        // f32 scores and sums: a few ulp of the score scale.
                        EXPECT_NEAR(g, want, (dt == DType::F64 ? 1e-12 : 2e-6) * (1.0 + std::abs(want))) << "b " << b << " h " << h << " i " << i;
                    }
                }
            }
        EXPECT_EQ(blind, NH) << "batch row 1's first query sees no key in any head";
    }
}

TEST(FidelityMerge, KeptAndEvictedMergeToFullAttention) {
    // A chunk of n queries at positions [P - n, P) over keys at positions [0, P): each (b, g)
    // row keeps a random subset (in a shuffled slot order, as a cache holds them) and evicts the
    // rest, some of the chunk's own positions included. Attention over each half with its
    // log-sum-exp, merged, must equal f64 full attention; the kept half's share must equal the
    // f64 full attention's weight on the kept positions.
    std::mt19937_64 rng(seed_for("FidelityMerge.KeptAndEvictedMergeToFullAttention"));
    const int64_t B = 2, G = 2, NH = 6, R = NH / G, D = 16, P = 70, n = 12;
    const Tensor q = random_tensor({B, NH, n, D}, DType::F32, rng, -2.0, 2.0);
    const Tensor k = random_tensor({B, G, P, D}, DType::F32, rng, -2.0, 2.0), v = random_tensor({B, G, P, D}, DType::F32, rng, -1.0, 1.0);
    std::vector<std::vector<int32_t>> kept((size_t)(B * G)), evicted((size_t)(B * G));
    int64_t Lk = 0, Le = 0;
    for (int64_t r = 0; r < B * G; ++r) {
        std::vector<int32_t> all((size_t)P);
        std::iota(all.begin(), all.end(), 0);
        std::shuffle(all.begin(), all.end(), rng);
        const int64_t keep = 20 + int64_t(rng() % 30);  // 20..49 of 70
        kept[size_t(r)].assign(all.begin(), all.begin() + keep);
        evicted[size_t(r)].assign(all.begin() + keep, all.end());
        std::sort(evicted[size_t(r)].begin(), evicted[size_t(r)].end());
        Lk = std::max<int64_t>(Lk, keep), Le = std::max<int64_t>(Le, P - keep);
    }
    // Each half as (B, G, L, D) gathered out of k, v; padding rows at a position nobody sees.
    auto half = [&](const std::vector<std::vector<int32_t>>& sets, int64_t Lh, Tensor& Kh, Tensor& Vh, Tensor& kpos) {
        std::vector<int32_t> idx((size_t)(B * G * Lh), 0), kp((size_t)(B * G * Lh), std::numeric_limits<int32_t>::max());
        for (int64_t r = 0; r < B * G; ++r)
            for (size_t j = 0; j < sets[size_t(r)].size(); ++j) idx[size_t(r * Lh) + j] = kp[size_t(r * Lh) + j] = sets[size_t(r)][j];
        const Tensor index = Tensor::from_i32({B, G, Lh, 1}, idx).expand({B, G, Lh, D});
        Kh = ops::gather(k, 2, index), Vh = ops::gather(v, 2, index);
        kpos = Tensor::from_i32({B, G, Lh}, kp);
    };
    Tensor Kk, Vk, kpk, Ke, Ve, kpe;
    half(kept, Lk, Kk, Vk, kpk);
    half(evicted, Le, Ke, Ve, kpe);
    const Tensor qpos = position_range(P - n, n, Device{});
    const double scale = 1.0 / std::sqrt(double(D));
    Tensor yk = Tensor::empty({B, NH, n, D}, DType::F32), ye = Tensor::empty({B, NH, n, D}, DType::F32);
    Tensor lk = Tensor::empty({B, NH, n}, DType::F64), le = Tensor::empty({B, NH, n}, DType::F64);
    ops::sdpa_(yk, q, Kk, Vk, kpk, qpos, float(scale), 0, nullptr, &lk);
    ops::sdpa_(ye, q, Ke, Ve, kpe, qpos, float(scale), 0, nullptr, &le);
    const std::vector<double> ya = yk.to_f64_vector(), yev = ye.to_f64_vector(), la = lk.to_f64_vector(), lev = le.to_f64_vector();
    const int64_t rows = B * NH * n;
    std::vector<double> merged((size_t)(rows * D)), mass((size_t)rows);
    const AttentionMerge m = merge_attention(ya.data(), la.data(), yev.data(), lev.data(), rows, D, merged.data(), mass.data());

    const std::vector<double> Q = q.to_f64_vector(), Kv = k.to_f64_vector(), Vv = v.to_f64_vector();
    double num = 0, den = 0, mass_sum = 0, max_y = 0, max_m = 0, min_mass = 1;
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < NH; ++h) {
            const int64_t r = b * G + h / R;
            const std::vector<double> Kr(Kv.begin() + r * P * D, Kv.begin() + (r + 1) * P * D), Vr(Vv.begin() + r * P * D, Vv.begin() + (r + 1) * P * D);
            std::vector<char> is_kept((size_t)P, 0);
            for (int32_t p : kept[size_t(r)]) is_kept[size_t(p)] = 1;
            for (int64_t i = 0; i < n; ++i) {
                const int64_t p = P - n + i, row = (b * NH + h) * n + i;
                const double* qi = &Q[size_t(row * D)];
                std::vector<double> yf((size_t)D), yp((size_t)D);
                const double lse_all = ref_attention(qi, Kr, Vr, P, D, scale, [&](int64_t j) { return j <= p; }, yf.data());
                const double lse_kept = ref_attention(qi, Kr, Vr, P, D, scale, [&](int64_t j) { return j <= p && is_kept[size_t(j)]; }, yp.data());
                const double mass_ref = std::exp(lse_kept - lse_all);  // sum of the full softmax over the kept positions
                for (int64_t d = 0; d < D; ++d) {
                    max_y = std::max(max_y, std::abs(merged[size_t(row * D + d)] - yf[size_t(d)]));
                    num += (yp[size_t(d)] - yf[size_t(d)]) * (yp[size_t(d)] - yf[size_t(d)]), den += yf[size_t(d)] * yf[size_t(d)];
                }
                max_m = std::max(max_m, std::abs(mass[size_t(row)] - mass_ref));
                mass_sum += mass_ref;
                min_mass = std::min(min_mass, mass_ref);
            }
        }
    // f32 attention halves against f64: outputs of magnitude <= 1.
    EXPECT_LT(max_y, 2e-6) << "merged output vs f64 full attention";
    EXPECT_LT(max_m, 2e-6) << "kept share vs f64 full attention's weight on the kept positions";
    EXPECT_NEAR(m.mass_a, mass_sum, 2e-6 * double(rows));
    const double err_ref = std::sqrt(num / den);
    EXPECT_NEAR(std::sqrt(m.diff_sq / m.full_sq), err_ref, 1e-5 + 1e-4 * err_ref) << "relative error of the kept half's output";
    EXPECT_LT(min_mass, 0.9) << "the case must evict mass to test anything";
}

TEST(FidelityMerge, SideNobodySeesGetsExactlyNothing) {
    // A row that sees no evicted key keeps its output and mass 1 bit for bit; a row that sees
    // no kept key takes the evicted side's output and mass 0.
    const std::vector<double> ya = {0.25, -1.5, 3.0, 7.0}, ye = {9.0, 9.0, -0.5, 0.125};
    const std::vector<double> la = {1.7, -INFINITY}, le = {-INFINITY, 0.3};
    std::vector<double> y(4), mass(2);
    const AttentionMerge m = merge_attention(ya.data(), la.data(), ye.data(), le.data(), 2, 2, y.data(), mass.data());
    EXPECT_EQ(y[0], 0.25);
    EXPECT_EQ(y[1], -1.5);
    EXPECT_EQ(y[2], -0.5);
    EXPECT_EQ(y[3], 0.125);
    EXPECT_EQ(mass[0], 1.0);
    EXPECT_EQ(mass[1], 0.0);
    EXPECT_EQ(m.mass_a, 1.0);
}

// One layer of random q/k/v chunks through a FidelityAttention on `cache_name`.
std::vector<FidelityStep> run_layer(const std::string& cache_name, bool merge, uint64_t seed, int64_t* merged) {
    const int64_t B = 2, G = 2, NH = 4, D = 16, L = 24, T = 72, n = 8;
    ModelConfig mc;
    mc.vocab_size = 16;
    mc.hidden_size = NH * D;
    mc.intermediate_size = 8;
    mc.num_layers = 1;
    mc.num_heads = NH;
    mc.num_kv_heads = G;
    mc.head_dim = D;
    mc.max_position_embeddings = 4096;
    KVCacheConfig kc;
    kc.name = cache_name;
    kc.cache_length = L;
    kc.max_chunk_size = n;
    KVCache cache(kc, mc, Device{}, DType::F32, 0);
    FidelityAttention fid(cache, mc, B, T, Device{}, DType::F32);
    fid.set_merge(merge);
    std::mt19937_64 rng(seed);
    for (int64_t p0 = 0; p0 < T; p0 += n) {
        Tensor q = random_tensor({B, NH, n, D}, DType::F32, rng, -2.0, 2.0);
        Tensor k = random_tensor({B, G, n, D}, DType::F32, rng, -2.0, 2.0);
        Tensor v = random_tensor({B, G, n, D}, DType::F32, rng, -2.0, 2.0);
        Tensor y = Tensor::empty({B, NH, n, D}, DType::F32);
        fid.attend(0, q, k, v, p0, 0.25f, 0, y);
    }
    *merged = fid.merged_steps();
    return fid.steps();
}

TEST(FidelityMerge, MergePathEqualsFullAttentionPath) {
    // Raw f32 storage takes the merge; its numbers equal full attention recomputed over the
    // shadow (set_merge(false)) to f32 rounding (each path is within the f64 bounds of
    // Fidelity.EqualsF64RecomputationFromReplayLog, so the two within twice those). Quantized
    // storage (q8) and per-head lengths (ada) never merge.
    const uint64_t seed = seed_for("FidelityMerge.MergePathEqualsFullAttentionPath");
    for (const std::string name : {"h2o-default", "lastrec-default", "tova-default", "snapkv-default", "h2o-q8", "ada-snapkv-default"}) {
        SCOPED_TRACE(name);
        int64_t merged = 0, full_merged = 0;
        const std::vector<FidelityStep> a = run_layer(name, true, seed, &merged), b = run_layer(name, false, seed, &full_merged);
        ASSERT_EQ(a.size(), b.size());
        EXPECT_EQ(full_merged, 0);
        if (name == "h2o-q8" || name == "ada-snapkv-default") EXPECT_EQ(merged, 0) << "this cache must recompute full attention";
        else EXPECT_GT(merged, 0) << "raw storage that evicts must take the merge path";
        bool lost = false;
        for (size_t i = 0; i < a.size(); ++i) {
            EXPECT_NEAR(a[i].attn_rel_error, b[i].attn_rel_error, 2e-5 + 2e-4 * b[i].attn_rel_error) << "step " << i;
            EXPECT_NEAR(a[i].kept_mass, b[i].kept_mass, 4e-6) << "step " << i;
            lost = lost || b[i].kept_mass < 0.999;
        }
        EXPECT_TRUE(lost) << "the case must evict mass to test anything";
    }
}

}  // namespace
}  // namespace kv::test
