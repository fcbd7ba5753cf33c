// The per-policy f64 references, each written from its paper's / kvpress' definition (the file
// comment of the policy's test states it): called by the driver in policy_reference_util.h on
// random q/k/v (tests/engine/policy_<name>_test.cpp) and on SmolLM2's own activations
// (policy_smollm2_reference_test.cpp). Scores per (row, slot) of layer 0 of the harness.
#pragma once

#include <cfloat>
#include <limits>
#include <map>

#include "engine/kv/policies/qfilter_filters.h"
#include "policy_reference_util.h"

namespace kv::test {

// ---- keydiff (its tests: policy_keydiff_test.cpp)
inline std::vector<double> keydiff_reference(const LayerHarness& h) {
    const int64_t T = h.cache->layer(0).policy().current_length(), L = h.L, D = h.D;
    std::vector<double> out((size_t)(h.B * h.G * L), 0.0);
    for (int64_t r = 0; r < h.B * h.G; ++r) {
        std::vector<double> a((size_t)D, 0.0);
        for (int64_t j = 0; j < T; ++j) {
            const auto& k = slot_key(h, r, j);
            double nn = 0;
            for (float x : k) nn += double(x) * double(x);
            for (int64_t d = 0; d < D; ++d) a[size_t(d)] += double(k[size_t(d)]) / std::sqrt(nn) / double(T);
        }
        for (int64_t j = 0; j < T; ++j) {
            const auto& k = slot_key(h, r, j);
            double dot = 0, kk = 0, aa = 0;
            for (int64_t d = 0; d < D; ++d) dot += double(k[size_t(d)]) * a[size_t(d)], kk += double(k[size_t(d)]) * double(k[size_t(d)]),
                                         aa += a[size_t(d)] * a[size_t(d)];
            out[size_t(r * L + j)] = -dot / std::sqrt(kk * aa);
        }
    }
    return out;
}

// ---- non-causal-attn (its tests: policy_non_causal_attn_test.cpp)
inline std::vector<double> nca_reference(const LayerHarness& h, int64_t C) {
    const std::vector<double> a = ref_tile_attention(h, C);
    std::vector<double> out((size_t)(h.B * h.G * h.L), 0.0), all;
    std::vector<std::vector<int64_t>> slots;
    for (int64_t r = 0; r < h.B * h.G; ++r) {
        slots.push_back(ref_slots_by_position(h, r, [](int32_t) { return true; }));
        for (double x : ref_pool3(a, h.L, r, slots.back())) all.push_back(x);
    }
    ref_z_normalise(all);
    size_t i = 0;
    for (int64_t r = 0; r < h.B * h.G; ++r)
        for (int64_t j : slots[size_t(r)]) out[size_t(r * h.L + j)] = all[i++];
    return out;
}

// ---- cur (its tests: policy_cur_test.cpp)
inline double cur_sq_norm(const std::vector<float>& x) {
    double s = 0;
    for (float e : x) s += double(e) * double(e);
    return s;
}

inline std::vector<double> cur_reference(const LayerHarness& h, int64_t sinks, int64_t w, int kind) {
    const KVPolicy& pol = h.cache->layer(0).policy();
    const int64_t T = pol.current_length(), L = h.L;
    const auto& pos = pol.token_positions();
    std::vector<double> out((size_t)(h.B * h.G * L), 0.0);
    for (int64_t r = 0; r < h.B * h.G; ++r) {
        std::map<int64_t, double> ksum, vsum;  // per window
        for (int64_t j = 0; j < T; ++j) {
            const auto& kv = h.history[size_t(r)].at(pos[size_t(r * L + j)]);
            const int64_t win = w > 0 ? pos[size_t(r * L + j)] / w : 0;
            ksum[win] += cur_sq_norm(kv.first), vsum[win] += cur_sq_norm(kv.second);
        }
        std::vector<double> s((size_t)T);
        double total = 0;
        for (int64_t j = 0; j < T; ++j) {
            const auto& kv = h.history[size_t(r)].at(pos[size_t(r * L + j)]);
            const int64_t win = w > 0 ? pos[size_t(r * L + j)] / w : 0;
            const double k2 = cur_sq_norm(kv.first) / (w > 0 ? ksum[win] : 1.0), v2 = cur_sq_norm(kv.second) / (w > 0 ? vsum[win] : 1.0);
            total += s[size_t(j)] = kind == 0 ? k2 : kind == 1 ? v2 : kind == 2 ? (k2 + v2) / 2 : k2 * v2;
        }
        for (int64_t j = 0; j < T; ++j) out[size_t(r * L + j)] = pos[size_t(r * L + j)] < sinks ? 1.0 : s[size_t(j)] / total;
    }
    return out;
}

// ---- compactor (its tests: policy_compactor_test.cpp)
inline std::vector<double> compactor_reference(const LayerHarness& h, int64_t C, int64_t k, double blending, int64_t first, int64_t last) {
    const int64_t Pa = h.P, T = h.cache->layer(0).policy().current_length();
    const int64_t left = std::min(first, Pa), right = std::min(last, std::max<int64_t>(0, Pa - left));
    const std::vector<double> a = ref_tile_attention(h, C);
    std::vector<double> att, lev;
    std::vector<std::vector<int64_t>> slots;
    for (int64_t r = 0; r < h.B * h.G; ++r) {
        slots.push_back(ref_slots_by_position(h, r, [&](int32_t p) { return p >= left && p < Pa - right; }));
        for (double x : ref_pool3(a, h.L, r, slots.back())) att.push_back(x);
        for (double x : ref_leverage(h, r, slots.back(), k)) lev.push_back(x);
    }
    ref_z_normalise(att);
    ref_z_normalise(lev);
    const double b = blending >= 0 ? blending : std::max(0.0, 1.0 - double(T) / double(Pa));
    double top = -INFINITY;
    for (size_t i = 0; i < att.size(); ++i) top = std::max(top, att[i] += b * lev[i]);
    if (att.empty()) top = 0;  // nothing scored: every token is protected alike
    std::vector<double> out((size_t)(h.B * h.G * h.L), 0.0);
    for (int64_t r = 0; r < h.B * h.G; ++r)
        for (int64_t j = 0; j < T; ++j) out[size_t(r * h.L + j)] = top + 1;
    size_t i = 0;
    for (int64_t r = 0; r < h.B * h.G; ++r)
        for (int64_t j : slots[size_t(r)]) out[size_t(r * h.L + j)] = att[i++];
    return out;
}

// ---- chunkkv (its tests: policy_chunkkv_test.cpp)
inline std::vector<double> chunkkv_reference(const LayerHarness& h, int64_t P, int64_t n, int64_t win, int64_t k, int64_t C) {
    const std::vector<double> s = published_snapkv_reference(h, P, n, win, k);
    const KVPolicy& pol = h.cache->layer(0).policy();
    const int64_t T = pol.current_length(), L = h.L, Pa = P + n;
    const auto& pos = pol.token_positions();
    std::vector<double> out(s.size(), 0.0);
    for (int64_t b = 0; b < h.B; ++b) {
        std::map<int64_t, double> sum;
        for (int64_t g = 0; g < h.G; ++g)
            for (int64_t j = 0; j < T; ++j) sum[pos[size_t((b * h.G + g) * L + j)] / C] += s[size_t((b * h.G + g) * L + j)];
        for (int64_t g = 0; g < h.G; ++g)
            for (int64_t j = 0; j < T; ++j) {
                const int64_t c = pos[size_t((b * h.G + g) * L + j)] / C;
                out[size_t((b * h.G + g) * L + j)] = sum[c] / double(std::min(C, Pa - c * C));
            }
    }
    return out;
}

// ---- finch (its tests: policy_finch_test.cpp)
inline std::vector<double> finch_reference(const LayerHarness& h, int64_t P, int64_t n, int64_t win, bool normalize) {
    const KVPolicy& pol = h.cache->layer(0).policy();
    const int64_t T = pol.current_length(), L = h.L, R = h.NH / h.G, nq = std::min(win, n), first = P + n - nq;
    const auto& pos = pol.token_positions();
    const std::vector<double> qv = h.last_q[0].to_f64_vector();
    std::vector<double> out((size_t)(h.B * h.G * L), 0.0);
    double top = -INFINITY;
    for (int64_t r = 0; r < h.B * h.G; ++r) {
        for (int64_t hh = (r % h.G) * R; hh < (r % h.G + 1) * R; ++hh)
            for (int64_t i = n - nq; i < n; ++i) {
                const std::vector<double> a = ref_attention_row(h, qv, n, P, r, hh, i);
                const double p = double(P + i);  // the query's position: the keys before it
                for (int64_t j = 0; j < T; ++j) out[size_t(r * L + j)] += (normalize ? p : 1.0) * a[size_t(j)] / double(R * nq);
            }
        for (int64_t j = 0; j < T; ++j)
            if (pos[size_t(r * L + j)] < first) top = std::max(top, out[size_t(r * L + j)]);
    }
    for (int64_t r = 0; r < h.B * h.G; ++r)
        for (int64_t j = 0; j < T; ++j)
            if (pos[size_t(r * L + j)] >= first) out[size_t(r * L + j)] = top + 1;
    return out;
}

// ---- leverage (its tests: policy_leverage_test.cpp)
inline std::vector<double> leverage_reference(const LayerHarness& h, int64_t k) {
    std::vector<double> out((size_t)(h.B * h.G * h.L), 0.0), all;
    std::vector<std::vector<int64_t>> slots;
    for (int64_t r = 0; r < h.B * h.G; ++r) {
        slots.push_back(ref_slots_by_position(h, r, [](int32_t) { return true; }));
        for (double x : ref_leverage(h, r, slots.back(), k)) all.push_back(x);
    }
    ref_z_normalise(all);
    size_t i = 0;
    for (int64_t r = 0; r < h.B * h.G; ++r)
        for (int64_t j : slots[size_t(r)]) out[size_t(r * h.L + j)] = all[i++];
    return out;
}

// ---- lagkv (its tests: policy_lagkv_test.cpp)
// kvpress' _get_states_score of one block (rows x D each) against its reference block.
inline std::vector<double> lagkv_states_score(const std::vector<std::vector<float>>& block, const std::vector<std::vector<float>>& ref) {
    const size_t D = block[0].size();
    std::vector<double> s;
    for (const auto& x : block) {
        std::vector<double> v;
        for (size_t d = 0; d < D; ++d) {
            double mn = INFINITY, mx = -INFINITY;
            for (const auto& y : ref) mn = std::min(mn, double(y[d])), mx = std::max(mx, double(y[d]));
            v.push_back((double(x[d]) - mn) / (mx - mn));
        }
        double mean = 0, var = 0;
        for (double e : v) mean += e / double(D);
        for (double e : v) var += (e - mean) * (e - mean);
        s.push_back(std::sqrt(var / double(D - 1)));
    }
    // softmax; shifted by the maximum, as torch's (a narrow reference range makes the stds large)
    const double top = *std::max_element(s.begin(), s.end());
    double z = 0;
    for (double e : s) z += std::exp(e - top);
    for (double& e : s) e = std::exp(e - top) / z;
    return s;
}

inline std::vector<double> lagkv_reference(const LayerHarness& h, int64_t sinks, int64_t lag, bool cross) {
    const int64_t L = h.L;
    std::vector<double> out((size_t)(h.B * h.G * L), 0.0);
    for (int64_t r = 0; r < h.B * h.G; ++r) {
        const std::vector<int64_t> seq = ref_slots_by_position(h, r, [](int32_t p) { return p >= 0; });
        const int64_t m = int64_t(seq.size());
        for (int64_t i = 0; i < m; ++i) out[size_t(r * L + seq[size_t(i)])] = 1.0;
        if (m < sinks + 2 * lag) {
            for (int64_t i = sinks; i < m; ++i) out[size_t(r * L + seq[size_t(i)])] = double(i - sinks) / double(m - sinks);
            continue;
        }
        const int64_t end = sinks + (m - sinks) / lag * lag;
        for (int64_t b = sinks; b + lag < end; b += lag) {
            std::vector<double> mix((size_t)lag, 0.0);
            for (int half = 0; half < 2; ++half) {
                std::vector<std::vector<float>> blk, ref;
                for (int64_t i = b; i < b + 2 * lag; ++i) {
                    const auto& kv = h.history[size_t(r)].at(h.cache->layer(0).policy().token_positions()[size_t(r * L + seq[size_t(i)])]);
                    (i < b + lag ? blk : ref).push_back(half == 0 ? kv.first : kv.second);
                }
                const std::vector<double> s = lagkv_states_score(blk, ref);
                for (int64_t t = 0; t < lag; ++t) mix[size_t(t)] += s[size_t(t)] / 2;
            }
            for (int64_t t = 0; t < lag; ++t) {
                // argsort().argsort(): how many of the block score lower; exact ties (a saturated
                // softmax: (1 + 0) / 2 = (0 + 1) / 2) rank the earlier token lower
                int64_t rank = 0;
                for (int64_t u = 0; u < lag; ++u) rank += mix[size_t(u)] < mix[size_t(t)] || (mix[size_t(u)] == mix[size_t(t)] && u < t);
                out[size_t(r * L + seq[size_t(b + t)])] = cross ? mix[size_t(t)] : double(rank) / double(lag);
            }
        }
    }
    return out;
}

// ---- critical-* (its tests: policy_critical_test.cpp)
// n_j of every cached slot, (rows, L): (1/R) sum_h sum_c |sum_d W[c, h D + d] v_d|; W empty = I.
inline std::vector<double> critical_projected_norms(const LayerHarness& h, const std::vector<double>& W, int64_t E) {
    const KVPolicy& pol = h.cache->layer(0).policy();
    const int64_t T = pol.current_length(), L = h.L, R = h.NH / h.G, D = h.D, Q = h.NH * D;
    const auto& pos = pol.token_positions();
    std::vector<double> out((size_t)(h.B * h.G * L), 0.0);
    for (int64_t r = 0; r < h.B * h.G; ++r)
        for (int64_t j = 0; j < T; ++j) {
            const auto& v = h.history[size_t(r)].at(pos[size_t(r * L + j)]).second;
            double acc = 0;
            if (W.empty()) {
                for (float x : v) acc += std::fabs(double(x));
            } else {
                const int64_t g = r % h.G;
                for (int64_t hh = g * R; hh < (g + 1) * R; ++hh)
                    for (int64_t c = 0; c < E; ++c) {
                        double o = 0;
                        for (int64_t d = 0; d < D; ++d) o += W[size_t(c * Q + hh * D + d)] * double(v[size_t(d)]);
                        acc += std::fabs(o) / double(R);
                    }
            }
            out[size_t(r * L + j)] = acc;
        }
    return out;
}

// The two stages over the inner scores s (rows, L) and norms.
inline std::vector<double> critical_reference(const LayerHarness& h, const std::vector<double>& s, const std::vector<double>& norms,
                                       double first_stage, double eps) {
    const int64_t L = h.L, k1 = int64_t(first_stage * double(L));
    std::vector<double> out((size_t)(h.B * h.G * L));
    for (int64_t r = 0; r < h.B * h.G; ++r) {
        std::vector<int64_t> idx((size_t)L);
        std::iota(idx.begin(), idx.end(), 0);
        const double* sr = s.data() + r * L;
        // highest first; equal scores: the higher slot first (it is the later one evicted)
        std::sort(idx.begin(), idx.end(), [sr](int64_t a, int64_t b) { return sr[a] > sr[b] || (sr[a] == sr[b] && a > b); });
        for (int64_t j = 0; j < L; ++j) out[size_t(r * L + j)] = (sr[j] + eps) * norms[size_t(r * L + j)];
        for (int64_t t = 0; t < k1; ++t) out[size_t(r * L + idx[size_t(t)])] = FLT_MAX;
    }
    return out;
}

// ---- simlayerkv (its tests: policy_simlayerkv_test.cpp)
struct SimLayerRef {
    double threshold;
    int64_t sinks, recent, win, kernel;
    std::vector<int>* decisions;  // 1 lazy, 0 busy, per chunk
};

inline std::vector<double> simlayerkv_reference(const LayerHarness& h, int64_t P, int64_t n, const SimLayerRef& c) {
    const KVPolicy& pol = h.cache->layer(0).policy();
    const int64_t T = pol.current_length(), L = h.L, R = h.NH / h.G, nq = std::min(c.win, n), Pa = P + n;
    const auto& pos = pol.token_positions();
    const std::vector<double> qv = h.last_q[0].to_f64_vector();
    double near = 0, count = 0;
    for (int64_t r = 0; r < h.B * h.G; ++r)
        for (int64_t hh = (r % h.G) * R; hh < (r % h.G + 1) * R; ++hh)
            for (int64_t i = n - nq; i < n; ++i) {
                const std::vector<double> a = ref_attention_row(h, qv, n, P, r, hh, i);
                for (int64_t j = 0; j < T; ++j) {
                    const int32_t p = pos[size_t(r * L + j)];
                    if (p < c.sinks || p >= Pa - c.recent) near += a[size_t(j)];
                }
                count += 1;
            }
    const double mass = near / count;
    EXPECT_GT(std::fabs(mass - c.threshold), 1e-5) << "a near tie: f32 may decide either way";
    const bool lazy = mass > c.threshold;
    c.decisions->push_back(lazy ? 1 : 0);
    if (!lazy) return published_snapkv_reference(h, P, n, c.win, c.kernel);
    std::vector<double> out((size_t)(h.B * h.G * L), 0.0);
    for (int64_t r = 0; r < h.B * h.G; ++r)
        for (int64_t j = 0; j < T; ++j) {
            const int32_t p = pos[size_t(r * L + j)];
            out[size_t(r * L + j)] = p < c.sinks ? double(std::numeric_limits<float>::max()) : double(p);
        }
    return out;
}

// ---- cap (its tests: policy_cap_test.cpp)
inline std::vector<double> cap_reference(const LayerHarness& h, const std::vector<double>& theta, double tau, int64_t F, int64_t sink, double eps) {
    const KVPolicy& pol = h.cache->layer(0).policy();
    const int64_t T = pol.current_length(), L = h.L, D = h.D, R = h.NH / h.G;
    const auto& pos = pol.token_positions();
    const auto qs = prerope_queries(h, theta, sink);
    std::vector<double> out((size_t)(h.B * h.G * L), 0.0);
    double top = -INFINITY;
    for (int64_t r = 0; r < h.B * h.G; ++r) {
        const int64_t b = r / h.G, g = r % h.G;
        std::vector<int64_t> js;
        for (int64_t j = 0; j < T; ++j)
            if (pos[size_t(r * L + j)] >= sink) js.push_back(j);
        std::vector<double> acc(js.size(), 0.0);
        for (int64_t hh = g * R; hh < (g + 1) * R; ++hh) {
            const std::vector<double> mu = future_query_moments(qs[size_t(b * h.NH + hh)], theta, h.P, F, D).mean;
            double mn = 0;
            for (double x : mu) mn += x * x;
            std::vector<double> w;
            for (int64_t j : js) {
                const auto& k = slot_key(h, r, j);
                double dot = 0, kn = 0;
                for (int64_t d = 0; d < D; ++d) dot += double(k[size_t(d)]) * mu[size_t(d)], kn += double(k[size_t(d)]) * double(k[size_t(d)]);
                w.push_back(tau * std::clamp(dot / std::sqrt(mn * kn), -1.0, 1.0));
            }
            const double m = *std::max_element(w.begin(), w.end());
            for (double& x : w) x = std::exp(x - m);
            std::vector<double> A((size_t)(D * D), 0.0);
            for (int64_t d = 0; d < D; ++d) A[size_t(d * D + d)] = 1;
            for (size_t i = 0; i < js.size(); ++i) {
                const auto& v = h.history[size_t(r)].at(pos[size_t(r * L + js[i])]).second;
                for (int64_t d = 0; d < D; ++d)
                    for (int64_t e = 0; e < D; ++e) A[size_t(d * D + e)] += (w[i] + eps) * double(v[size_t(d)]) * double(v[size_t(e)]);
            }
            const std::vector<double> Ai = inverse(A, D);
            for (size_t i = 0; i < js.size(); ++i) {
                const auto& v = h.history[size_t(r)].at(pos[size_t(r * L + js[i])]).second;
                double l = 0;
                for (int64_t d = 0; d < D; ++d)
                    for (int64_t e = 0; e < D; ++e) l += double(v[size_t(d)]) * Ai[size_t(d * D + e)] * double(v[size_t(e)]);
                acc[i] += w[i] * l / double(R);
            }
        }
        for (size_t i = 0; i < js.size(); ++i) top = std::max(top, out[size_t(r * L + js[i])] = acc[i]);
    }
    for (int64_t r = 0; r < h.B * h.G; ++r)
        for (int64_t j = 0; j < T; ++j)
            if (pos[size_t(r * L + j)] < sink) out[size_t(r * L + j)] = top + 1;
    return out;
}

// ---- observed-attention (its tests: policy_observed_attention_test.cpp)
// The attention a token received from every query since it entered (softmax weights over the
// cached tokens, averaged over the group's query heads) / the queries that could see it (P - pos).
// Stateful: one object per run, called after every chunk in order.
struct ObservedAttentionReference {
    std::vector<std::map<int32_t, double>> acc;  // [row][position]: attention received so far
    std::vector<double> operator()(const LayerHarness& h, int64_t P, int64_t n) {
        const KVPolicy& pol = h.cache->layer(0).policy();
        const int64_t T = pol.current_length(), L = h.L, R = h.NH / h.G;
        const auto& pos = pol.token_positions();
        const std::vector<double> qv = h.last_q[0].to_f64_vector();
        acc.resize(size_t(h.B * h.G));
        std::vector<double> out((size_t)(h.B * h.G * L), 0.0);
        for (int64_t r = 0; r < h.B * h.G; ++r) {
            std::map<int32_t, double> next;  // evicted tokens leave
            for (int64_t j = 0; j < T; ++j) next[pos[size_t(r * L + j)]] = acc[size_t(r)][pos[size_t(r * L + j)]];
            for (int64_t hh = (r % h.G) * R; hh < (r % h.G + 1) * R; ++hh)
                for (int64_t i = 0; i < n; ++i) {
                    const std::vector<double> a = ref_attention_row(h, qv, n, P, r, hh, i);
                    for (int64_t j = 0; j < T; ++j) next[pos[size_t(r * L + j)]] += a[size_t(j)] / double(R);
                }
            acc[size_t(r)] = next;
            for (int64_t j = 0; j < T; ++j) {
                const int32_t p = pos[size_t(r * L + j)];
                out[size_t(r * L + j)] = next[p] / double(P + n - p);
            }
        }
        return out;
    }
};

// ---- qfilter (its tests: policy_qfilter_test.cpp)
// A slot's score is <k, f> with f the file's filter of (layer, the row's KV head).
inline std::vector<double> qfilter_reference(const LayerHarness& h, const QFilters& f, int64_t layer) {
    const KVPolicy& pol = h.cache->layer(0).policy();
    std::vector<double> out((size_t)(h.B * h.G * h.L), 0.0);
    for (int64_t r = 0; r < h.B * h.G; ++r)
        for (int64_t j = 0; j < pol.current_length(); ++j) {
            const auto& k = slot_key(h, r, j);
            for (int64_t d = 0; d < h.D; ++d) out[size_t(r * h.L + j)] += double(k[size_t(d)]) * f.filter(layer, r % h.G)[d];
        }
    return out;
}

// ---- h2o, h2o-vlen (its tests: kv_scores_test.cpp)
// Independent H2O bookkeeping: score per (row, token position), the softmax weights each chunk's
// queries pay the cached tokens (averaged over the group's heads) summed since the token entered;
// h2o-vlen weighs each by the value norm, n w |v| / sum_j w_j |v_j|.
struct BruteScores {
    std::vector<std::map<int32_t, double>> score;  // [row][position]
    std::vector<std::map<int32_t, double>> vnorm;

    void step(const LayerHarness& h, const Tensor& q, int64_t P, int64_t n, bool vlen) {
        const KVPolicy& pol = h.cache->layer(0).policy();
        const int64_t T = pol.current_length(), L = h.L, R = h.NH / h.G;
        const auto& pos = pol.token_positions();
        const std::vector<double> qv = q.to_f64_vector();
        const double scale = 1.0 / std::sqrt(double(h.D));
        if (score.empty()) score.resize(size_t(h.B * h.G)), vnorm.resize(size_t(h.B * h.G));
        for (int64_t b = 0; b < h.B; ++b)
            for (int64_t g = 0; g < h.G; ++g) {
                const int64_t r = b * h.G + g;
                std::vector<double> w((size_t)T, 0.0);
                for (int64_t hh = g * R; hh < (g + 1) * R; ++hh)
                    for (int64_t i = 0; i < n; ++i) {
                        std::vector<double> s((size_t)T, -INFINITY);
                        double m = -INFINITY;
                        for (int64_t j = 0; j < T; ++j) {
                            const int32_t p = pos[size_t(r * L + j)];
                            if (p > P + i) continue;
                            const auto& k = h.history[size_t(r)].at(p).first;
                            double dot = 0;
                            for (int64_t d = 0; d < h.D; ++d) dot += qv[size_t(((b * h.NH + hh) * n + i) * h.D + d)] * double(k[size_t(d)]);
                            s[size_t(j)] = dot * scale;
                            m = std::max(m, s[size_t(j)]);
                        }
                        double z = 0;
                        for (double& e : s) z += (e = std::exp(e - m));
                        for (int64_t j = 0; j < T; ++j) w[size_t(j)] += s[size_t(j)] / z / double(R);
                    }
                std::map<int32_t, double> next;  // only tokens still in the cache keep a score
                double denom = 0;
                if (vlen)
                    for (int64_t j = 0; j < T; ++j) denom += w[size_t(j)] * norm(h, r, pos[size_t(r * L + j)]);
                for (int64_t j = 0; j < T; ++j) {
                    const int32_t p = pos[size_t(r * L + j)];
                    const double inc = vlen ? double(n) * w[size_t(j)] * norm(h, r, p) / denom : w[size_t(j)];
                    next[p] = (score[size_t(r)].count(p) ? score[size_t(r)][p] : 0.0) + inc;
                }
                score[size_t(r)] = next;
            }
    }
    static double norm(const LayerHarness& h, int64_t r, int32_t p) {
        const auto& v = h.history[size_t(r)].at(p).second;
        double s = 0;
        for (float x : v) s += double(x) * double(x);
        return std::sqrt(s);
    }
};

// BruteScores as a reference for the shared driver: (rows, L) by slot.
struct H2OReference {
    bool vlen = false;
    BruteScores brute;
    std::vector<double> operator()(const LayerHarness& h, int64_t P, int64_t n) {
        brute.step(h, h.last_q[0], P, n, vlen);
        const KVPolicy& pol = h.cache->layer(0).policy();
        const auto& pos = pol.token_positions();
        std::vector<double> out((size_t)(h.B * h.G * h.L), 0.0);
        for (int64_t r = 0; r < h.B * h.G; ++r)
            for (int64_t j = 0; j < pol.current_length(); ++j) out[size_t(r * h.L + j)] = brute.score[size_t(r)].at(pos[size_t(r * h.L + j)]);
        return out;
    }
};

// ---- snapkv with the window pooled, rkv, expected-attention (their tests: kv_registry_test.cpp)
// SnapKV scores in f64: the last `win` queries' softmax weights over the cached tokens
// (averaged over the group's query heads, summed over queries), pooled in token-position order
// with width k (zero padding counted), per (b, g) row.
inline std::vector<double> snapkv_pool_window_reference(const LayerHarness& h, const Tensor& q, int64_t P, int64_t n, int64_t win, int64_t k) {
    const KVPolicy& pol = h.cache->layer(0).policy();
    const int64_t T = pol.current_length(), L = h.L, R = h.NH / h.G;
    const auto& pos = pol.token_positions();
    const std::vector<double> qv = q.to_f64_vector();
    std::vector<double> out((size_t)(h.B * h.G * L), 0.0);
    for (int64_t b = 0; b < h.B; ++b)
        for (int64_t g = 0; g < h.G; ++g) {
            const int64_t r = b * h.G + g;
            std::vector<double> w((size_t)T, 0.0);
            for (int64_t hh = g * R; hh < (g + 1) * R; ++hh)
                for (int64_t i = n - std::min(win, n); i < n; ++i) {
                    std::vector<double> s((size_t)T, -INFINITY);
                    double m = -INFINITY;
                    for (int64_t j = 0; j < T; ++j) {
                        const int32_t p = pos[size_t(r * L + j)];
                        if (p > P + i) continue;
                        const auto& key = h.history[size_t(r)].at(p).first;
                        double dot = 0;
                        for (int64_t d = 0; d < h.D; ++d) dot += qv[size_t(((b * h.NH + hh) * n + i) * h.D + d)] * double(key[size_t(d)]);
                        s[size_t(j)] = dot / std::sqrt(double(h.D));
                        m = std::max(m, s[size_t(j)]);
                    }
                    double z = 0;
                    for (double& e : s) z += (e = std::exp(e - m));
                    for (int64_t j = 0; j < T; ++j) w[size_t(j)] += s[size_t(j)] / z / double(R);
                }
            std::vector<int64_t> order((size_t)T);
            std::iota(order.begin(), order.end(), 0);
            std::sort(order.begin(), order.end(), [&](int64_t a, int64_t c) { return pos[size_t(r * L + a)] < pos[size_t(r * L + c)]; });
            for (int64_t i = 0; i < T; ++i) {
                double acc = 0;
                for (int64_t o = i - k / 2; o <= i + k / 2; ++o)
                    if (o >= 0 && o < T) acc += w[size_t(order[size_t(o)])];
                out[size_t(r * L + order[size_t(i)])] = acc / double(k);
            }
        }
    return out;
}

// R-KV in f64 (docs/POLICIES.md#rkv): lambda * maxpool(mean window weight) - (1 - lambda) *
// softmax(mean cosine similarity, the newest similar key exempt); the window's newest tokens
// take the row's maximum.
inline std::vector<double> rkv_reference(const LayerHarness& h, int64_t P, int64_t n, int64_t win, int64_t k, double lambda, double thr) {
    const KVPolicy& pol = h.cache->layer(0).policy();
    const int64_t T = pol.current_length(), L = h.L;
    const auto& pos = pol.token_positions();
    const int64_t nq = std::min(win, n);
    // summed window weights per slot, pooled by max over k neighbours (k odd): reuse the
    // snapkv reference with width 1 for the raw sums
    const std::vector<double> wsum = snapkv_pool_window_reference(h, h.last_q[0], P, n, win, 1);
    std::vector<double> out((size_t)(h.B * h.G * L), 0.0);
    for (int64_t r = 0; r < h.B * h.G; ++r) {
        std::vector<int64_t> order((size_t)T);
        std::iota(order.begin(), order.end(), 0);
        std::sort(order.begin(), order.end(), [&](int64_t a, int64_t c) { return pos[size_t(r * L + a)] < pos[size_t(r * L + c)]; });
        std::vector<double> imp((size_t)T), red((size_t)T);
        for (int64_t i = 0; i < T; ++i) {
            double m = -INFINITY;
            for (int64_t o = std::max<int64_t>(0, i - k / 2); o <= std::min(T - 1, i + k / 2); ++o)
                m = std::max(m, wsum[size_t(r * L + order[size_t(o)])] / double(nq));
            imp[size_t(order[size_t(i)])] = m;
        }
        std::vector<std::vector<double>> u((size_t)T);
        for (int64_t j = 0; j < T; ++j) {
            const auto& key = h.history[size_t(r)].at(pos[size_t(r * L + j)]).first;
            double nn = 0;
            for (float x : key) nn += double(x) * double(x);
            for (float x : key) u[size_t(j)].push_back(double(x) / (std::sqrt(nn) + 1e-8));
        }
        for (int64_t i = 0; i < T; ++i) {
            double sum = 0, exempt = 0;
            int32_t newest = -1;
            for (int64_t j = 0; j < T; ++j) {
                if (j == i) continue;
                double c = 0;
                for (int64_t d = 0; d < h.D; ++d) c += u[size_t(i)][size_t(d)] * u[size_t(j)][size_t(d)];
                sum += c;
                if (c > thr && pos[size_t(r * L + j)] > newest) newest = pos[size_t(r * L + j)], exempt = c;
            }
            red[size_t(i)] = (sum - exempt) / double(T);
        }
        double z = 0;
        for (double x : red) z += std::exp(x);
        double top = -INFINITY;
        for (int64_t j = 0; j < T; ++j) top = std::max(top, out[size_t(r * L + j)] = lambda * imp[size_t(j)] - (1 - lambda) * std::exp(red[size_t(j)]) / z);
        for (int64_t j = 0; j < T; ++j)
            if (pos[size_t(r * L + j)] >= P + n - win) out[size_t(r * L + j)] = top;
    }
    return out;
}

// Expected Attention in f64 (docs/POLICIES.md#expected-attention), from the raw harness data:
// every query seen at positions >= n_sink, rotated back by RoPE angle -p theta_i on pairs
// (i, i + D/2) with theta_i = 10000^(-2i/D); per (b, head) mean and population covariance;
// mean rotation over positions [P_after, P_after + F); exponent s k.mu' + s^2 k^T Sigma' k / 2
// over the non-sink cached keys, softmax, mean over the group's heads, times |v|; sinks take
// the maximum over the whole layer.
inline std::vector<double> expected_attention_reference(const LayerHarness& h, const std::vector<double>& theta, int64_t F, int64_t sink,
                                                 bool use_cov = true, bool use_vnorm = true) {
    const KVPolicy& pol = h.cache->layer(0).policy();
    const int64_t T = pol.current_length(), L = h.L, D = h.D, R = h.NH / h.G, Pa = h.P;
    const auto& pos = pol.token_positions();
    const double s = 1.0 / std::sqrt(double(D));
    const auto qs = prerope_queries(h, theta, sink);  // per (b, head)
    std::vector<double> out((size_t)(h.B * h.G * L), 0.0);
    double top = -INFINITY;  // over every row of the layer
    for (int64_t b = 0; b < h.B; ++b)
        for (int64_t g = 0; g < h.G; ++g) {
            const int64_t r = b * h.G + g;
            std::vector<double> a((size_t)T, 0.0);
            for (int64_t hh = g * R; hh < (g + 1) * R; ++hh) {
                const auto& Q = qs[size_t(b * h.NH + hh)];
                const FutureQueryMoments fm = future_query_moments(Q, theta, Pa, F, D);
                const std::vector<double>&m2 = fm.mean, &C2 = fm.cov;
                std::vector<double> z((size_t)T, 0.0);
                double zs = 0;
                for (int64_t j = 0; j < T; ++j) {
                    if (pos[size_t(r * L + j)] < sink) continue;
                    const auto& k = h.history[size_t(r)].at(pos[size_t(r * L + j)]).first;
                    double lin = 0, quad = 0;
                    for (int64_t d = 0; d < D; ++d) lin += double(k[size_t(d)]) * m2[size_t(d)];
                    for (int64_t d = 0; d < D; ++d)
                        for (int64_t e = 0; e < D; ++e) quad += double(k[size_t(d)]) * C2[size_t(d * D + e)] * double(k[size_t(e)]);
                    zs += (z[size_t(j)] = std::exp(s * lin + (use_cov ? s * s * quad / 2 : 0.0)));
                }
                for (int64_t j = 0; j < T; ++j) a[size_t(j)] += z[size_t(j)] / zs / double(R);
            }
            for (int64_t j = 0; j < T; ++j) {
                if (pos[size_t(r * L + j)] < sink) continue;
                const auto& v = h.history[size_t(r)].at(pos[size_t(r * L + j)]).second;
                double vn = 0;
                for (float x : v) vn += double(x) * double(x);
                top = std::max(top, out[size_t(r * L + j)] = a[size_t(j)] * (use_vnorm ? std::sqrt(vn) : 1.0));
            }
        }
    // sinks take the maximum over the whole layer (kvpress pads them with scores.max())
    for (int64_t r = 0; r < h.B * h.G; ++r)
        for (int64_t j = 0; j < T; ++j)
            if (pos[size_t(r * L + j)] < sink) out[size_t(r * L + j)] = top;
    return out;
}

}  // namespace kv::test
