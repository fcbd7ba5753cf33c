// merging-* and cam-* against their definitions in f64, on a 12-slot layer of random q/k/v:
// the kept positions are the wrapped scorer's own (the same layer run by the bare scorer: merges
// change values, never keys, so neither the scores nor the attention weights move), keys stay
// their tokens', and every kept value equals the f64 value the rule gives, tracked token by
// token from the harness's record of what went in:
//   merging: a kept slot holds the mean of the values of every token folded into it, each
//            evicted token (with what it held) joining the kept slot of most cosine-similar key;
//   cam:     an evicted value e is added to the m kept slots after it in position order with
//            weight p_e / m, p_e = clamp(A_e / mean A over them, 0, 1), A the accumulated f64
//            attention-weight sums (all queries, group heads averaged).
#include <map>
#include <set>

#include <cmath>

#include "engine/grad/replay_cache.h"
#include "engine/kv/buffers/buffer_common.h"
#include "engine/kv/policies/policy_registry.h"
#include "policy_reference_util.h"

namespace kv::test {
namespace {

using Members = std::map<int32_t, std::vector<int32_t>>;  // kept position -> tokens folded into it

// Positions kept per row after the layer's last call, position -> slot.
std::vector<std::map<int32_t, int64_t>> kept_positions(const LayerHarness& h) {
    const KVPolicy& pol = h.cache->layer(0).policy();
    std::vector<std::map<int32_t, int64_t>> out(size_t(h.B * h.G));
    for (int64_t r = 0; r < h.B * h.G; ++r)
        for (int64_t j = 0; j < pol.current_length(); ++j) out[size_t(r)][pol.token_positions()[size_t(r * h.L + j)]] = j;
    return out;
}

void rebuild(LayerHarness& h, const std::function<void(KVCacheConfig&)>& setup) {
    setup(h.cfg);
    h.cache = std::make_unique<KVCache>(h.cfg, h.model, Device{}, DType::F32, 0, &byte_codec());
    h.cache->set_replay_logging(true);
}

double cosine(const std::vector<float>& a, const std::vector<float>& b) {
    double d = 0, na = 0, nb = 0;
    for (size_t i = 0; i < a.size(); ++i) d += double(a[i]) * b[i], na += double(a[i]) * a[i], nb += double(b[i]) * b[i];
    return na > 0 && nb > 0 ? d / std::sqrt(na * nb) : 0.0;
}

// Keys exactly their tokens'; values within tol of want (row r, position -> D values).
void expect_cache(const LayerHarness& h, const std::vector<std::map<int32_t, std::vector<double>>>& want, double tol, const std::string& what) {
    const int64_t T = h.cache->layer(0).policy().current_length();
    auto [K, V] = const_cast<LayerHarness&>(h).layer().buffer().read(T);
    const std::vector<float> kb = K.contiguous().to_f32_vector(), vb = V.contiguous().to_f32_vector();
    const auto kept = kept_positions(h);
    for (int64_t r = 0; r < h.B * h.G; ++r)
        for (const auto& [p, j] : kept[size_t(r)]) {
            const auto& hist = h.history[size_t(r)].at(p);
            const std::vector<double>& v = want[size_t(r)].at(p);
            for (int64_t d = 0; d < h.D; ++d) {
                ASSERT_EQ(kb[size_t((r * T + j) * h.D + d)], hist.first[size_t(d)]) << what << ": key of position " << p << " row " << r;
                ASSERT_NEAR(vb[size_t((r * T + j) * h.D + d)], v[size_t(d)], tol) << what << ": value of position " << p << " row " << r << " at P " << h.P;
            }
        }
}

void check_merging(const std::string& inner, double threshold, int64_t* merged_out) {
    const std::string name = "merging-" + inner + "-default";
    const uint64_t seed = seed_for("merging " + inner);
    LayerHarness h(name, 12, seed), bare(inner + "-default", 12, seed);
    rebuild(h, [&](KVCacheConfig& c) { c.policy_options["merging_threshold"] = threshold; });
    const int64_t R = h.B * h.G;
    h.step(12), bare.step(12);
    std::vector<Members> members(static_cast<size_t>(R));
    for (int64_t r = 0; r < R; ++r)
        for (int32_t p = 0; p < 12; ++p) members[size_t(r)][p] = {p};
    int64_t merged = 0;
    for (int64_t n : {4, 3, 4, 2, 4, 1, 5, 1, 3, 3}) {
        const auto before = kept_positions(h);
        h.step(n), bare.step(n);
        const auto after = kept_positions(h), bare_after = kept_positions(bare);
        for (int64_t r = 0; r < R; ++r) {
            std::set<int32_t> a, b;
            for (const auto& [p, j] : after[size_t(r)]) a.insert(p);
            for (const auto& [p, j] : bare_after[size_t(r)]) b.insert(p);
            ASSERT_EQ(a, b) << name << " keeps what " << inner << " keeps, row " << r << " at P " << h.P;
            Members next;
            for (const auto& [p, j] : before[size_t(r)])
                if (after[size_t(r)].count(p)) next[p] = members[size_t(r)][p];
            for (const auto& [e, js] : before[size_t(r)]) {
                if (after[size_t(r)].count(e)) continue;  // evicted: its tokens join the most similar kept key
                double best = -2;
                int32_t to = -1;
                for (const auto& [t, jt] : next) {
                    const double c = cosine(h.history[size_t(r)].at(e).first, h.history[size_t(r)].at(t).first);
                    if (c > best) best = c, to = t;
                }
                if (to < 0 || best < threshold) continue;
                ++merged;
                for (int32_t x : members[size_t(r)][e]) next[to].push_back(x);
            }
            for (int64_t t = 0; t < n; ++t) next[int32_t(h.P - n + t)] = {int32_t(h.P - n + t)};
            members[size_t(r)] = next;
        }
        std::vector<std::map<int32_t, std::vector<double>>> want(static_cast<size_t>(R));
        for (int64_t r = 0; r < R; ++r)
            for (const auto& [p, toks] : members[size_t(r)]) {
                std::vector<double> v(static_cast<size_t>(h.D), 0.0);
                for (int32_t x : toks)
                    for (int64_t d = 0; d < h.D; ++d) v[size_t(d)] += double(h.history[size_t(r)].at(x).second[size_t(d)]) / double(toks.size());
                want[size_t(r)][p] = v;
            }
        expect_cache(h, want, 2e-6, name);
        if (::testing::Test::HasFatalFailure()) return;
    }
    *merged_out = merged;
}

TEST(Merging, KeptSetsAndValuesEqualTheF64ReferenceOverSnapKV) {
    int64_t merged = 0;
    check_merging("snapkv", 0.0, &merged);
    EXPECT_GT(merged, 0);
}

TEST(Merging, KeptSetsAndValuesEqualTheF64ReferenceOverKnormEveryEvictionMerging) {
    int64_t merged = 0;
    check_merging("knorm", -1.0, &merged);
    EXPECT_EQ(merged, 2 * 2 * 30);  // B G rows, every evicted token of 30 chunk tokens
}

TEST(Merging, AThresholdOfOneMergesNothing) {
    int64_t merged = -1;
    check_merging("knorm", 1.0, &merged);  // random keys are never parallel
    EXPECT_EQ(merged, 0);
}

void check_cam(const std::string& inner, int64_t budget, int64_t* merged_out) {
    const std::string name = "cam-" + inner + "-default";
    const uint64_t seed = seed_for("cam " + inner);
    LayerHarness h(name, 12, seed), bare(inner + "-default", 12, seed);
    rebuild(h, [&](KVCacheConfig& c) { c.policy_options["cam_merge_budget"] = double(budget); });
    const int64_t R = h.B * h.G, Rq = h.NH / h.G;
    h.step(12), bare.step(12);
    std::vector<std::map<int32_t, std::vector<double>>> val(static_cast<size_t>(R));
    std::vector<std::map<int32_t, double>> A(static_cast<size_t>(R));
    for (int64_t r = 0; r < R; ++r)
        for (int32_t p = 0; p < 12; ++p) {
            const auto& v = h.history[size_t(r)].at(p).second;
            val[size_t(r)][p] = std::vector<double>(v.begin(), v.end());
            A[size_t(r)][p] = 0.0;  // a prefill records no weights
        }
    int64_t merged = 0;
    for (int64_t n : {4, 3, 4, 2, 4, 1, 5, 1, 3, 3}) {
        const auto before = kept_positions(h);
        h.step(n), bare.step(n);
        const auto after = kept_positions(h), bare_after = kept_positions(bare);
        for (int64_t r = 0; r < R; ++r) {
            std::set<int32_t> a, b;
            for (const auto& [p, j] : after[size_t(r)]) a.insert(p);
            for (const auto& [p, j] : bare_after[size_t(r)]) b.insert(p);
            ASSERT_EQ(a, b) << name << " keeps what " << inner << " keeps, row " << r << " at P " << h.P;
            std::vector<int32_t> kept;  // in place before and after, in position order
            for (const auto& [p, j] : before[size_t(r)])
                if (after[size_t(r)].count(p)) kept.push_back(p);
            for (const auto& [e, js] : before[size_t(r)]) {
                if (after[size_t(r)].count(e)) continue;
                std::vector<int32_t> win;
                for (int32_t t : kept)
                    if (t > e && int64_t(win.size()) < budget) win.push_back(t);
                if (win.empty()) continue;
                double mean = 0;
                for (int32_t t : win) mean += A[size_t(r)][t] / double(win.size());
                const double ae = A[size_t(r)][e];
                const double prob = std::clamp(mean > 0 ? ae / mean : (ae > 0 ? 1.0 : 0.0), 0.0, 1.0);
                if (prob > 0) ++merged;
                for (int32_t t : win)
                    for (int64_t d = 0; d < h.D; ++d) val[size_t(r)][t][size_t(d)] += prob / double(win.size()) * val[size_t(r)][e][size_t(d)];
            }
            std::map<int32_t, std::vector<double>> nv;
            std::map<int32_t, double> na;
            for (int32_t t : kept) nv[t] = val[size_t(r)][t], na[t] = A[size_t(r)][t];
            for (int64_t t = 0; t < n; ++t) {
                const int32_t p = int32_t(h.P - n + t);
                const auto& v = h.history[size_t(r)].at(p).second;
                nv[p] = std::vector<double>(v.begin(), v.end());
                na[p] = 0.0;
            }
            // This chunk's attention: every query, the group's query heads averaged.
            const std::vector<double> qv = h.last_q[0].to_f64_vector();
            for (int64_t hh = (r % h.G) * Rq; hh < (r % h.G + 1) * Rq; ++hh)
                for (int64_t i = 0; i < n; ++i) {
                    const std::vector<double> w = ref_attention_row(h, qv, n, h.P - n, r, hh, i);
                    for (const auto& [p, j] : after[size_t(r)]) na[p] += w[size_t(j)] / double(Rq);
                }
            val[size_t(r)] = nv, A[size_t(r)] = na;
        }
        expect_cache(h, val, 1e-5, name);
        if (::testing::Test::HasFatalFailure()) return;
    }
    *merged_out = merged;
}

TEST(Cam, KeptSetsAndValuesEqualTheF64ReferenceOverH2O) {
    int64_t merged = 0;
    check_cam("h2o", 32, &merged);
    EXPECT_GT(merged, 0);
}

TEST(Cam, AWindowOfTwoOverKnormEqualsTheF64Reference) {
    int64_t merged = 0;
    check_cam("knorm", 2, &merged);
    EXPECT_GT(merged, 0);
}

TEST(ValueMerges, ThePlanCodecCarriesThemAndTheGradientIsTheLinearMapsTranspose) {
    SlotPlan p;
    p.input_pos = 12, p.n = 2, p.rows = 2, p.length_after = 4;
    p.targets = {0, 1, 2, 3};
    p.merge_row = {0, 1, 1}, p.merge_to = {2, 0, 0}, p.merge_from = {1, 3, 2};
    p.merge_keep = {0.5f, 0.25f, 1.0f}, p.merge_take = {0.5f, 0.75f, 0.125f};
    const std::vector<uint8_t> blob = encode_plan(p);
    const SlotPlan q = decode_plan(blob.data(), blob.size());
    EXPECT_EQ(q.merge_row, p.merge_row);
    EXPECT_EQ(q.merge_to, p.merge_to);
    EXPECT_EQ(q.merge_from, p.merge_from);
    EXPECT_EQ(q.merge_keep, p.merge_keep);
    EXPECT_EQ(q.merge_take, p.merge_take);
    EXPECT_THROW(decode_plan(blob.data(), blob.size() - 3), Error);
    // <M v, g> = <v, M^T g> for the map M of the merges on (1, 2, 4, 3) values.
    std::mt19937_64 rng(seed_for("merge adjoint"));
    std::uniform_real_distribution<double> u(-1, 1);
    std::vector<double> v(24), g(24);
    for (double& x : v) x = u(rng);
    for (double& x : g) x = u(rng);
    Tensor V = Tensor::from_f64({1, 2, 4, 3}, v), dV = Tensor::from_f64({1, 2, 4, 3}, g);
    MergedValues saved;
    merge_values_in(V, p, &saved);
    merge_values_backward(dV, p);
    const std::vector<double> mv = V.to_f64_vector(), mg = dV.to_f64_vector();
    double lhs = 0, rhs = 0;
    for (size_t i = 0; i < v.size(); ++i) lhs += mv[i] * g[i], rhs += v[i] * mg[i];
    EXPECT_NEAR(lhs, rhs, 1e-12);
    // row 1 slot 0: 0.25 v0 + 0.75 v3, then + 0.125 v2
    for (int64_t d = 0; d < 3; ++d)
        EXPECT_NEAR(mv[size_t((4 + 0) * 3 + d)], 0.25 * v[size_t((4 + 0) * 3 + d)] + 0.75 * v[size_t((4 + 3) * 3 + d)] + 0.125 * v[size_t((4 + 2) * 3 + d)], 1e-12);
    restore_merged_values(V, saved);
    EXPECT_EQ(V.to_f64_vector(), v);
}

// A plan may carry value merges (flag 4) and key re-rotation (flag 2) together: the codec keeps
// both, and the gradient replay applies both, checked against f64 by hand on one row of four
// slots: the prefill writes tokens 0..3, then token 4 overwrites slot 1 while token 1's value is
// folded into slot 2 and the kept keys turn to the ranks of their tokens (0, 2, 3, 4 -> 0..3).
TEST(ValueMerges, APlanThatAlsoReRotatesKeepsBothAndTheReplayAppliesBoth) {
    const int64_t D = 4;
    const std::vector<double> freq = {0.7, 0.05};  // channel pairs (0, 2) and (1, 3)
    SlotPlan pre;
    pre.n = 4, pre.length_after = 4, pre.targets = {0, 1, 2, 3};
    SlotPlan p;
    p.input_pos = 4, p.n = 1, p.length_after = 4, p.targets = {1}, p.rerotate = true;
    p.merge_row = {0}, p.merge_to = {2}, p.merge_from = {1}, p.merge_keep = {0.75f}, p.merge_take = {0.25f};
    const std::vector<uint8_t> blob = encode_plan(p);
    const SlotPlan back = decode_plan(blob.data(), blob.size());
    EXPECT_TRUE(back.rerotate);
    EXPECT_EQ(back.merge_to, p.merge_to);
    EXPECT_EQ(back.merge_take, p.merge_take);
    SlotPlan only_merges = p;
    only_merges.rerotate = false;
    const std::vector<uint8_t> b2 = encode_plan(only_merges);
    EXPECT_FALSE(decode_plan(b2.data(), b2.size()).rerotate) << "value merges read back as re-rotation";
    const std::vector<SlotPlan> plans = {pre, back};

    std::mt19937_64 rng(seed_for("merge and rerotate"));
    std::uniform_real_distribution<double> u(-1, 1);
    auto rnd = [&](int64_t n) {
        std::vector<double> x(size_t(n * D));
        for (double& e : x) e = u(rng);
        return x;
    };
    const std::vector<double> k0 = rnd(4), v0 = rnd(4), q0 = rnd(4), k1 = rnd(1), v1 = rnd(1), q1 = rnd(1);
    ReplayLayerCache c(0, 1, 1, 4, D, DType::F64, Device{}, &plans);
    c.set_rope_frequencies(&freq);
    const double scale = 0.5;
    Tensor y0 = Tensor::from_f64({1, 1, 4, D}, std::vector<double>(16, 0.0));
    c.forward(Tensor::from_f64({1, 1, 4, D}, q0), Tensor::from_f64({1, 1, 4, D}, k0), Tensor::from_f64({1, 1, 4, D}, v0), 0, scale, y0,
              false);
    Tensor y1 = Tensor::from_f64({1, 1, 1, D}, std::vector<double>(4, 0.0));
    c.forward(Tensor::from_f64({1, 1, 1, D}, q1), Tensor::from_f64({1, 1, 1, D}, k1), Tensor::from_f64({1, 1, 1, D}, v1), 4, scale, y1,
              false);

    // f64 reference from the definitions: turn channel pair (j, j + 2) by shift * freq[j].
    auto turn = [&](std::vector<double> x, int64_t shift) {
        for (size_t j = 0; j < freq.size(); ++j) {
            const double a = double(shift) * freq[j], x1 = x[j], x2 = x[j + 2];
            x[j] = x1 * std::cos(a) - x2 * std::sin(a);
            x[j + 2] = x2 * std::cos(a) + x1 * std::sin(a);
        }
        return x;
    };
    auto row = [&](const std::vector<double>& x, int64_t i) { return std::vector<double>(x.begin() + i * D, x.begin() + (i + 1) * D); };
    // slot -> (key, value): token 0 stays at RoPE 0; tokens 4, 2, 3 move from 4, 2, 3 to 3, 1, 2.
    std::vector<std::vector<double>> K = {row(k0, 0), turn(row(k1, 0), -1), turn(row(k0, 2), -1), turn(row(k0, 3), -1)};
    std::vector<std::vector<double>> V = {row(v0, 0), row(v1, 0), row(v0, 2), row(v0, 3)};
    for (int64_t d = 0; d < D; ++d) V[2][size_t(d)] = 0.75 * v0[size_t(2 * D + d)] + 0.25 * v0[size_t(1 * D + d)];
    const std::vector<double> q = turn(row(q1, 0), -1);  // 3 kept tokens before position 4
    const std::vector<double> gk = c.keys().to_f64_vector(), gv = c.values().to_f64_vector(), gy = y1.to_f64_vector();
    std::vector<double> w(4), y(size_t(D), 0.0);
    double z = 0;
    for (size_t s = 0; s < 4; ++s) {
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) {
            EXPECT_NEAR(gk[s * D + size_t(d)], K[s][size_t(d)], 1e-12) << "key of slot " << s;
            EXPECT_NEAR(gv[s * D + size_t(d)], V[s][size_t(d)], 1e-12) << "value of slot " << s;
            dot += q[size_t(d)] * K[s][size_t(d)];
        }
        w[s] = std::exp(scale * dot), z += w[s];
    }
    for (size_t s = 0; s < 4; ++s)
        for (int64_t d = 0; d < D; ++d) y[size_t(d)] += w[s] / z * V[s][size_t(d)];
    for (int64_t d = 0; d < D; ++d) EXPECT_NEAR(gy[size_t(d)], y[size_t(d)], 1e-12) << "output channel " << d;
}

TEST(ValueMerges, ABufferThatCannotMergeRefusesByName) {
    LayerHarness h("merging-knorm-default", 12, seed_for("merging paged"));
    rebuild(h, [](KVCacheConfig& c) { c.paged_block_size = 4; });
    h.step(12);
    try {
        h.step(4);
        FAIL() << "a paged buffer merged values";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("cannot merge values"), std::string::npos) << e.what();
    }
}

TEST(ValueMerges, TheDefaultsAreThePresses) {
    EXPECT_EQ(find_policy_option("merging_threshold")->def, 0.0);  // MergingPress' similarity_threshold
    EXPECT_EQ(find_policy_option("cam_merge_budget")->def, 32.0);  // CAMPress' merge_budget
    for (const char* p : {"merging-snapkv", "merging-knorm", "cam-h2o", "cam-knorm"}) EXPECT_TRUE(find_policy(p)->merges_values) << p;
}

}  // namespace
}  // namespace kv::test
