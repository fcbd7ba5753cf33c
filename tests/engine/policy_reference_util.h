// Shared driver of the per-policy formula tests (tests/engine/policy_<name>_test.cpp): a
// 12-slot layer of random q/k/v, or a real model's captured activations
// (policy_smollm2_reference_test.cpp), through a full prefill and chunks; after each chunk the
// policy's scores must equal an f64 reference (called once per chunk, in order; a prefill
// records no attention weights, so a stateful reference starts after it) and the next chunk's
// slots must be the lowest scores, ties by the lower slot, and the reference's lowest up to
// ties. The math several references share is here; each policy's reference, written from the
// paper's / press's definition, is in policy_references.h.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <iterator>
#include <numeric>

#include "kv_test_util.h"

namespace kv::test {

// Key of the token in slot j of row r, from the harness's record of what went in.
inline const std::vector<float>& slot_key(const LayerHarness& h, int64_t r, int64_t j) {
    const auto& pos = h.cache->layer(0).policy().token_positions();
    return h.history[size_t(r)].at(pos[size_t(r * h.L + j)]).first;
}

// Softmax weights in f64 of query i (of the chunk q, starting at position P) of query head hh
// over the T cached slots of row r (causal: slots holding later positions get 0).
inline std::vector<double> ref_attention_row(const LayerHarness& h, const std::vector<double>& qv, int64_t n, int64_t P, int64_t r,
                                             int64_t hh, int64_t i) {
    const KVPolicy& pol = h.cache->layer(0).policy();
    const int64_t T = pol.current_length(), L = h.L, b = r / h.G;
    const auto& pos = pol.token_positions();
    std::vector<double> s((size_t)T, -INFINITY);
    double m = -INFINITY;
    for (int64_t j = 0; j < T; ++j) {
        const int32_t p = pos[size_t(r * L + j)];
        if (p < 0 || p > P + i) continue;
        const auto& key = h.history[size_t(r)].at(p).first;
        double dot = 0;
        for (int64_t d = 0; d < h.D; ++d) dot += qv[size_t(((b * h.NH + hh) * n + i) * h.D + d)] * double(key[size_t(d)]);
        s[size_t(j)] = dot / std::sqrt(double(h.D));
        m = std::max(m, s[size_t(j)]);
    }
    double z = 0;
    for (double& e : s) z += (e = std::exp(e - m));
    for (double& e : s) e /= z;
    return s;
}

// SnapKV's published rule in f64 (SnapKV's code, kvpress' SnapKVPress): the last `win` queries'
// softmax weights (averaged over the group's query heads, summed over the queries) on the
// positions before the window, average-pooled in position order over `k` neighbours with zero
// padding counted (avg_pool1d, count_include_pad); the window's tokens take the maximum over the
// layer (kvpress pads them with scores.max()). Scores per (row, slot) after the chunk [P, P + n).
inline std::vector<double> published_snapkv_reference(const LayerHarness& h, int64_t P, int64_t n, int64_t win, int64_t k) {
    const KVPolicy& pol = h.cache->layer(0).policy();
    const int64_t T = pol.current_length(), L = h.L, R = h.NH / h.G, nq = std::min(win, n), first = P + n - nq;
    const auto& pos = pol.token_positions();
    const std::vector<double> qv = h.last_q[0].to_f64_vector();
    std::vector<double> out((size_t)(h.B * h.G * L), 0.0);
    double top = -INFINITY;
    for (int64_t r = 0; r < h.B * h.G; ++r) {
        std::vector<double> w((size_t)T, 0.0);
        for (int64_t hh = (r % h.G) * R; hh < (r % h.G + 1) * R; ++hh)
            for (int64_t i = n - nq; i < n; ++i) {
                const std::vector<double> a = ref_attention_row(h, qv, n, P, r, hh, i);
                for (int64_t j = 0; j < T; ++j) w[size_t(j)] += a[size_t(j)] / double(R);
            }
        // the positions before the window, in order; the pooling sees nothing past them
        std::vector<std::pair<int32_t, int64_t>> before;
        for (int64_t j = 0; j < T; ++j)
            if (pos[size_t(r * L + j)] < first) before.push_back({pos[size_t(r * L + j)], j});
        std::sort(before.begin(), before.end());
        const int64_t m = int64_t(before.size());
        for (int64_t i = 0; i < m; ++i) {
            double acc = 0;
            for (int64_t o = i - k / 2; o <= i + k / 2; ++o)
                if (o >= 0 && o < m) acc += w[size_t(before[size_t(o)].second)];
            top = std::max(top, out[size_t(r * L + before[size_t(i)].second)] = acc / double(k));
        }
    }
    for (int64_t r = 0; r < h.B * h.G; ++r)
        for (int64_t j = 0; j < T; ++j)
            if (pos[size_t(r * L + j)] >= first) out[size_t(r * L + j)] = top;
    return out;
}

// (x - mean) / max(unbiased std, 1e-6) over all of v.
inline void ref_z_normalise(std::vector<double>& v) {
    double mu = 0, var = 0;
    for (double x : v) mu += x / double(v.size());
    for (double x : v) var += (x - mu) * (x - mu);
    const double sd = std::max(v.size() > 1 ? std::sqrt(var / double(v.size() - 1)) : 0.0, 1e-6);
    for (double& x : v) x = (x - mu) / sd;
}

inline uint64_t splitmix(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Gauss-Jordan inverse of the n x n matrix A (partial pivoting).
inline std::vector<double> inverse(std::vector<double> A, int64_t n) {
    std::vector<double> I((size_t)(n * n), 0.0);
    for (int64_t i = 0; i < n; ++i) I[size_t(i * n + i)] = 1;
    for (int64_t c = 0; c < n; ++c) {
        int64_t p = c;
        for (int64_t r = c + 1; r < n; ++r)
            if (std::fabs(A[size_t(r * n + c)]) > std::fabs(A[size_t(p * n + c)])) p = r;
        for (int64_t k = 0; k < n; ++k) std::swap(A[size_t(c * n + k)], A[size_t(p * n + k)]), std::swap(I[size_t(c * n + k)], I[size_t(p * n + k)]);
        const double d = A[size_t(c * n + c)];
        for (int64_t k = 0; k < n; ++k) A[size_t(c * n + k)] /= d, I[size_t(c * n + k)] /= d;
        for (int64_t r = 0; r < n; ++r)
            if (r != c) {
                const double f = A[size_t(r * n + c)];
                for (int64_t k = 0; k < n; ++k) A[size_t(r * n + k)] -= f * A[size_t(c * n + k)], I[size_t(r * n + k)] -= f * I[size_t(c * n + k)];
            }
    }
    return I;
}

// Leverage in f64 (docs/POLICIES.md#leverage) of the keys in `slots` of row r (layer 0): centred
// over those keys, sketched by the documented Gaussian Phi (k 0: none), y^T (Y^T Y + 0.01 I)^-1 y
// by an explicit inverse, clamped at 0. The harness's keys are unrotated.
inline std::vector<double> ref_leverage(const LayerHarness& h, int64_t r, const std::vector<int64_t>& slots, int64_t k) {
    const int64_t T = int64_t(slots.size()), D = h.D, K = k > 0 ? k : D, g = r % h.G;
    std::vector<double> mean((size_t)D, 0.0), out;
    for (int64_t j : slots)
        for (int64_t d = 0; d < D; ++d) mean[size_t(d)] += double(slot_key(h, r, j)[size_t(d)]) / double(T);
    std::vector<double> Y((size_t)(T * K), 0.0);
    for (int64_t i = 0; i < T; ++i)
        for (int64_t c = 0; c < K; ++c)
            for (int64_t d = 0; d < D; ++d) {
                const double x = double(slot_key(h, r, slots[size_t(i)])[size_t(d)]) - mean[size_t(d)];
                if (k == 0) {
                    if (d == c) Y[size_t(i * K + c)] = x;
                    continue;
                }
                const uint64_t e = uint64_t(d * K + c), hh = splitmix(splitmix(splitmix(0) ^ uint64_t(g)) ^ e), h2 = splitmix(hh);
                const double u1 = double((hh >> 11) + 1) / 9007199254740992.0, u2 = double(h2 >> 11) / 9007199254740992.0;
                Y[size_t(i * K + c)] += x * std::sqrt(-2 * std::log(u1)) * std::cos(2 * M_PI * u2) / std::sqrt(double(k));
            }
    std::vector<double> G((size_t)(K * K), 0.0);
    for (int64_t a = 0; a < K; ++a)
        for (int64_t b = 0; b < K; ++b) {
            for (int64_t i = 0; i < T; ++i) G[size_t(a * K + b)] += Y[size_t(i * K + a)] * Y[size_t(i * K + b)];
            if (a == b) G[size_t(a * K + b)] += 1e-2;
        }
    const std::vector<double> Gi = inverse(G, K);
    for (int64_t i = 0; i < T; ++i) {
        double l = 0;
        for (int64_t a = 0; a < K; ++a)
            for (int64_t b = 0; b < K; ++b) l += Y[size_t(i * K + a)] * Gi[size_t(a * K + b)] * Y[size_t(i * K + b)];
        out.push_back(std::max(l, 0.0));
    }
    return out;
}

// Non-causal tile attention in f64 (docs/POLICIES.md#non-causal-attn) of every cached slot:
// A_j |v_j| with A_j the unscaled softmax weight the queries of j's tile of C positions pay j
// over the tile's keys (every query and key ever fed), summed over queries, averaged over the
// group's heads. (rows, L), 0 past the cached slots.
inline std::vector<double> ref_tile_attention(const LayerHarness& h, int64_t C) {
    const KVPolicy& pol = h.cache->layer(0).policy();
    const int64_t T = pol.current_length(), L = h.L, R = h.NH / h.G, D = h.D, Pa = h.P;
    const auto& pos = pol.token_positions();
    auto query = [&](int64_t b, int64_t hh, int64_t p) {
        for (const auto& [P0, q] : h.all_q)
            if (p >= P0 && p < P0 + q.size(2)) {
                const std::vector<double> qv = q.to_f64_vector();
                const int64_t n = q.size(2), at = ((b * h.NH + hh) * n + (p - P0)) * D;
                return std::vector<double>(qv.begin() + at, qv.begin() + at + D);
            }
        ADD_FAILURE() << "no query at position " << p;
        return std::vector<double>((size_t)D, 0.0);
    };
    std::vector<double> a((size_t)(h.B * h.G * L), 0.0);
    for (int64_t r = 0; r < h.B * h.G; ++r) {
        const int64_t b = r / h.G, g = r % h.G;
        for (int64_t j = 0; j < T; ++j) {
            const int64_t p = pos[size_t(r * L + j)], t0 = p / C * C, t1 = std::min(t0 + C, Pa);
            double A = 0;
            for (int64_t hh = g * R; hh < (g + 1) * R; ++hh)
                for (int64_t i = t0; i < t1; ++i) {
                    const std::vector<double> q = query(b, hh, i);
                    std::vector<double> s;
                    for (int64_t kp = t0; kp < t1; ++kp) {
                        const auto& k = h.history[size_t(r)].at(kp).first;
                        double d = 0;
                        for (int64_t x = 0; x < D; ++x) d += q[size_t(x)] * double(k[size_t(x)]);
                        s.push_back(d);
                    }
                    const double m = *std::max_element(s.begin(), s.end());
                    double z = 0;
                    for (double x : s) z += std::exp(x - m);
                    A += std::exp(s[size_t(p - t0)] - m) / z / double(R);
                }
            const auto& v = h.history[size_t(r)].at(p).second;
            double vn = 0;
            for (float x : v) vn += double(x) * double(x);
            a[size_t(r * L + j)] = A * std::sqrt(vn);
        }
    }
    return a;
}

// avg_pool1d(3) with zero padding of v (rows, L) along `slots` (in position order) of row r.
inline std::vector<double> ref_pool3(const std::vector<double>& v, int64_t L, int64_t r, const std::vector<int64_t>& slots) {
    std::vector<double> out;
    const int64_t m = int64_t(slots.size());
    for (int64_t i = 0; i < m; ++i) {
        double acc = 0;
        for (int64_t o = i - 1; o <= i + 1; ++o)
            if (o >= 0 && o < m) acc += v[size_t(r * L + slots[size_t(o)])];
        out.push_back(acc / 3);
    }
    return out;
}

// The cached slots of row r whose positions satisfy keep, in position order.
template <class Keep>
std::vector<int64_t> ref_slots_by_position(const LayerHarness& h, int64_t r, Keep keep) {
    const KVPolicy& pol = h.cache->layer(0).policy();
    const auto& pos = pol.token_positions();
    std::vector<std::pair<int32_t, int64_t>> o;
    for (int64_t j = 0; j < pol.current_length(); ++j)
        if (keep(pos[size_t(r * h.L + j)])) o.push_back({pos[size_t(r * h.L + j)], j});
    std::sort(o.begin(), o.end());
    std::vector<int64_t> out;
    for (auto& x : o) out.push_back(x.second);
    return out;
}

using ReferenceScores = std::function<std::vector<double>(const LayerHarness&, int64_t P, int64_t n)>;

// How the evictions of a run compared with the reference's: per (chunk, row), the slots the
// engine freed equal the n lowest reference scores (ties by the lower slot: matched), differ
// only between slots whose reference scores are within the score tolerance of each other (ties:
// the f32 scores may order them either way), or differ otherwise (mismatches).
struct DecisionCounts {
    int64_t matched = 0, ties = 0, mismatches = 0;
    DecisionCounts& operator+=(const DecisionCounts& o) {
        matched += o.matched, ties += o.ties, mismatches += o.mismatches;
        return *this;
    }
};

// The driver over harness h (setup applied to h.cfg, the cache rebuilt from it): a full prefill of
// h.L, then `chunks`; after each chunk the engine's scores must be within tol of ref_of's, and
// the next chunk must free the lowest engine scores (ties by the lower slot), which are also
// compared with the reference's lowest (counted in the result, a mismatch fails).
inline DecisionCounts compare_policy_with_reference(LayerHarness& h, const std::string& name, const std::function<void(KVCacheConfig&)>& setup,
                                                    const ReferenceScores& ref_of, const std::vector<int64_t>& chunks, double tol,
                                                    const std::function<void(LayerHarness&)>& made = {}) {
    const int64_t L = h.L;
    DecisionCounts counts;
    // failures so far in the running test (one test may run several comparisons)
    auto failures = [] { return ::testing::UnitTest::GetInstance()->current_test_info()->result()->total_part_count(); };
    const int failed_before = failures();
    setup(h.cfg);
    h.cache = std::make_unique<KVCache>(h.cfg, h.model, Device{}, DType::F32, 0, &byte_codec());
    if (made) made(h);  // e.g. hand the cache what a model would (an output projection)
    h.cache->set_replay_logging(true);
    h.step(L);
    std::vector<int32_t> expected;
    std::vector<double> ref;
    for (int64_t n : chunks) {
        const int64_t P = h.P;
        h.step(n);
        const SlotPlan& plan = h.layer().replay_log().plans().back();
        if (!expected.empty()) {
            for (int64_t r = 0; r < h.B * h.G; ++r) {
                for (int64_t t = 0; t < n; ++t)
                    EXPECT_EQ(plan.targets[size_t(r * n + t)], expected[size_t(r * L + t)]) << name << " row " << r << " at " << P;
                // the reference's choice: its n lowest, ties by the lower slot
                std::vector<int32_t> idx(L);
                std::iota(idx.begin(), idx.end(), 0);
                const double* rr = ref.data() + r * L;
                std::stable_sort(idx.begin(), idx.end(), [rr](int32_t a, int32_t b) { return rr[a] < rr[b]; });
                std::vector<int32_t> want(idx.begin(), idx.begin() + n), got(plan.targets.begin() + r * n, plan.targets.begin() + (r + 1) * n);
                std::sort(want.begin(), want.end());
                std::sort(got.begin(), got.end());
                if (want == got) {
                    ++counts.matched;
                    continue;
                }
                // differing slots: a tie when every one the engine freed instead scores within
                // the tolerance of every one the reference frees instead
                std::vector<int32_t> only_got, only_want;
                std::set_difference(got.begin(), got.end(), want.begin(), want.end(), std::back_inserter(only_got));
                std::set_difference(want.begin(), want.end(), got.begin(), got.end(), std::back_inserter(only_want));
                bool tie = true;
                for (int32_t a : only_got)
                    for (int32_t b : only_want)
                        tie = tie && std::fabs(rr[a] - rr[b]) <= 2 * tol * std::max({1.0, std::fabs(rr[a]), std::fabs(rr[b])});
                ++(tie ? counts.ties : counts.mismatches);
                EXPECT_TRUE(tie) << name << " row " << r << " at " << P << ": the engine freed slot " << only_got[0] << " (reference score "
                                 << rr[only_got[0]] << ") instead of slot " << only_want[0] << " (" << rr[only_want[0]] << ")";
            }
        }
        ref = ref_of(h, P, n);
        const std::vector<float> got = h.layer().policy().slot_scores();
        EXPECT_EQ(got.size(), ref.size()) << name;
        if (got.size() != ref.size()) return counts;
        expected.assign(ref.size(), 0);
        for (int64_t r = 0; r < h.B * h.G; ++r) {
            for (int64_t j = 0; j < L; ++j)
                EXPECT_NEAR(got[size_t(r * L + j)], ref[size_t(r * L + j)], tol * std::max(1.0, std::fabs(ref[size_t(r * L + j)])))
                    << name << " row " << r << " slot " << j << " at " << P;
            std::vector<int32_t> idx(L);
            std::iota(idx.begin(), idx.end(), 0);
            // order by the engine's scores (just checked against the reference): f32 rounding
            // must not turn a reference near-tie into a false failure
            std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return got[size_t(r * L + a)] < got[size_t(r * L + b)]; });
            std::copy(idx.begin(), idx.end(), expected.begin() + r * L);
        }
        if (failures() > failed_before) return counts;  // one chunk's failures, not a cascade
    }
    return counts;
}

// The driver on a 12-slot layer of random q/k/v (seeded by the name).
inline void check_policy_against_reference(const std::string& name, const std::function<void(KVCacheConfig&)>& setup, const ReferenceScores& ref_of,
                                           const std::vector<int64_t>& chunks = {4, 3, 4, 2, 4, 1, 5, 1}, double tol = 2e-6,
                                           const std::function<void(LayerHarness&)>& made = {}) {
    LayerHarness h(name, 12, seed_for(name + " formula"));
    compare_policy_with_reference(h, name, setup, ref_of, chunks, tol, made);
}

}  // namespace kv::test

