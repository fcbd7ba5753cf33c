// Quest (engine/kv/policies/policy_quest.cpp, kernels/common/quest_math.h, SDPA_QUEST): the page bound
// is >= every score of its page (random q and keys of both signs, f32 and f64); SDPA_QUEST
// with a tiny budget selects exactly the pages an f64 reference written here selects (full
// sort, not the kernel's partial one) and attends over them as the f64 softmax restricted to
// those pages does, weight sums included; on the tiny model, quest reading every page equals
// dense bit for bit, and a small budget changes the outputs while replaying bit for bit.
// The registry loops (kv_registry_test, kv_invariants_test, grad_fd_test) take quest as a
// policy of the table.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>

#include "engine/driver/chunk_plan.h"
#include "engine/kv/kv_cache.h"
#include "engine/kv/policies/quest_policy.h"
#include "engine/model/presets.h"
#include "engine/model/transformer.h"
#include "engine/ops/ops.h"
#include "kernels/common/quest_math.h"
#include "tests/support/test_support.h"

namespace kv::test {
namespace {

TEST(QuestMath, PageBoundIsAtLeastEveryScoreInItsPage) {
    std::mt19937_64 rng(seed_for("quest bound"));
    std::uniform_real_distribution<double> u(-3.0, 3.0);
    for (int trial = 0; trial < 200; ++trial) {
        const int64_t D = 1 + int64_t(rng() % 80), P = 1 + int64_t(rng() % 24);
        std::vector<double> q((size_t)D), k((size_t)(P * D)), mn((size_t)D, 1e300), mx((size_t)D, -1e300);
        for (auto& x : q) x = u(rng);
        for (auto& x : k) x = u(rng) * (trial % 3 == 0 ? 1e-3 : 1.0);
        for (int64_t t = 0; t < P; ++t)
            for (int64_t d = 0; d < D; ++d) mn[size_t(d)] = std::min(mn[size_t(d)], k[size_t(t * D + d)]), mx[size_t(d)] = std::max(mx[size_t(d)], k[size_t(t * D + d)]);
        std::vector<float> qf(q.begin(), q.end()), kf(k.begin(), k.end()), mnf(mn.begin(), mn.end()), mxf(mx.begin(), mx.end());
        const double ub = quest_page_bound<double>(q.data(), mn.data(), mx.data(), D);
        const float ubf = quest_page_bound<float>(qf.data(), mnf.data(), mxf.data(), D);
        for (int64_t t = 0; t < P; ++t) {
            // The same summation order: floating products and sums are monotone, so the bound
            // holds exactly in each precision, not just up to rounding.
            double s = 0;
            float sf = 0;
            for (int64_t d = 0; d < D; ++d) s += q[size_t(d)] * k[size_t(t * D + d)], sf += qf[size_t(d)] * kf[size_t(t * D + d)];
            ASSERT_GE(ub, s) << "trial " << trial << " slot " << t;
            ASSERT_GE(ubf, sf) << "trial " << trial << " slot " << t;
        }
    }
}

// The f64 reference: pages by bound (larger first, lower index on ties), top `pages` of the
// visible ones plus the last visible, ascending.
std::vector<int32_t> reference_selection(const std::vector<double>& ub, int64_t visible, int64_t pages) {
    std::vector<int32_t> order((size_t)(visible));
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return ub[size_t(a)] != ub[size_t(b)] ? ub[size_t(a)] > ub[size_t(b)] : a < b; });
    std::vector<int32_t> out(order.begin(), order.begin() + std::min<int64_t>(pages, visible));
    if (visible > 0 && std::find(out.begin(), out.end(), int32_t(visible - 1)) == out.end()) out.push_back(int32_t(visible - 1));
    std::sort(out.begin(), out.end());
    return out;
}

TEST(QuestSdpa, TinyBudgetSelectsAndAttendsAsTheF64Reference) {
    std::mt19937_64 rng(seed_for("quest sdpa"));
    struct Case {
        int64_t B, NH, G, n, T, D, P, pages;
    };
    for (const Case& cs : {Case{1, 4, 2, 1, 37, 16, 4, 2}, Case{2, 6, 3, 5, 64, 8, 8, 1}, Case{1, 2, 1, 3, 50, 24, 5, 3},
                           Case{1, 3, 3, 1, 33, 16, 16, 0}}) {
        const int64_t B = cs.B, NH = cs.NH, G = cs.G, n = cs.n, T = cs.T, D = cs.D, P = cs.P, R = NH / G;
        const int64_t NP = (T + P - 1) / P;
        Tensor q = random_tensor({B, NH, n, D}, DType::F32, rng, -2.0, 2.0);
        Tensor k = random_tensor({B, G, T, D}, DType::F32, rng, -2.0, 2.0);
        Tensor v = random_tensor({B, G, T, D}, DType::F32, rng, -1.0, 1.0);
        std::vector<int32_t> kp((size_t)(T)), qp((size_t)(n));
        for (int64_t t = 0; t < T; ++t) kp[size_t(t)] = int32_t(t);
        for (int64_t i = 0; i < n; ++i) qp[size_t(i)] = int32_t(T - n + i);  // the chunk's own tokens are the last slots
        Tensor kpos = Tensor::from_i32({1, 1, T}, kp), qpos = Tensor::from_i32({1, n}, qp);
        const std::vector<double> qd = q.to_f64_vector(), kd = k.to_f64_vector(), vd = v.to_f64_vector();
        std::vector<float> mnv((size_t)(B * G * NP * D), std::numeric_limits<float>::infinity()), mxv(mnv.size(), -std::numeric_limits<float>::infinity());
        for (int64_t r = 0; r < B * G; ++r)
            for (int64_t t = 0; t < T; ++t)
                for (int64_t d = 0; d < D; ++d) {
                    const float x = float(kd[size_t((r * T + t) * D + d)]);
                    float& a = mnv[size_t((r * NP + t / P) * D + d)];
                    float& b = mxv[size_t((r * NP + t / P) * D + d)];
                    a = std::min(a, x), b = std::max(b, x);
                }
        Tensor kmin = Tensor::from_f32({B, G, NP, D}, mnv), kmax = Tensor::from_f32({B, G, NP, D}, mxv);
        Tensor y = Tensor::empty(q.shape(), DType::F32), w = Tensor::empty({B, G, T}, DType::F32);
        Tensor sel = Tensor::empty({B, NH, n, cs.pages + 1}, DType::I32);
        const float scale = 0.3f;
        ops::sdpa_quest_(y, q, k, v, kpos, qpos, kmin, kmax, scale, P, cs.pages, &w, &sel);
        const std::vector<int64_t> got = sel.to_i64_vector();
        const std::vector<double> yg = y.to_f64_vector(), wg = w.to_f64_vector();
        std::vector<double> wref((size_t)(B * G * T), 0.0);
        for (int64_t b = 0; b < B; ++b)
            for (int64_t h = 0; h < NH; ++h)
                for (int64_t i = 0; i < n; ++i) {
                    const int64_t g = h / R, pos = qp[size_t(i)], visible = pos / P + 1;
                    const double* qr = qd.data() + ((b * NH + h) * n + i) * D;
                    std::vector<double> ub((size_t)(NP));
                    for (int64_t j = 0; j < visible; ++j)
                        for (int64_t d = 0; d < D; ++d) {
                            const size_t at = size_t(((b * G + g) * NP + j) * D + d);
                            ub[size_t(j)] += std::max(qr[d] * double(mnv[at]), qr[d] * double(mxv[at]));
                        }
                    const std::vector<int32_t> want = reference_selection(ub, visible, cs.pages);
                    const int64_t row = (b * NH + h) * n + i;
                    for (int64_t e = 0; e <= cs.pages; ++e)
                        ASSERT_EQ(got[size_t(row * (cs.pages + 1) + e)], e < int64_t(want.size()) ? want[size_t(e)] : -1)
                            << "case T " << T << " P " << P << " pages " << cs.pages << ": row " << row << " entry " << e;
                    // Attention over the selected pages' visible slots, in f64.
                    std::vector<double> sc;
                    std::vector<int64_t> slots;
                    for (int32_t j : want)
                        for (int64_t t = j * P; t < std::min(T, (j + 1) * P); ++t)
                            if (t <= pos) {
                                double s = 0;
                                for (int64_t d = 0; d < D; ++d) s += qr[d] * kd[size_t(((b * G + g) * T + t) * D + d)];
                                sc.push_back(double(scale) * s);
                                slots.push_back(t);
                            }
                    const double m = *std::max_element(sc.begin(), sc.end());
                    double l = 0;
                    for (double& s : sc) l += (s = std::exp(s - m));
                    for (int64_t d = 0; d < D; ++d) {
                        double acc = 0;
                        for (size_t e = 0; e < slots.size(); ++e) acc += sc[e] / l * vd[size_t(((b * G + g) * T + slots[e]) * D + d)];
                        ASSERT_NEAR(yg[size_t(row * D + d)], acc, 2e-5) << "case T " << T << " row " << row << " d " << d;
                    }
                    for (size_t e = 0; e < slots.size(); ++e) wref[size_t((b * G + g) * T + slots[e])] += sc[e] / l / double(R);
                }
        for (size_t t = 0; t < wref.size(); ++t) ASSERT_NEAR(wg[t], wref[t], 2e-6) << "weight sum " << t;
    }
}

// ---- the policy on the tiny model ----------------------------------------------------------

struct TinyModel {
    ModelConfig cfg = preset_config("tiny");
    Transformer model{cfg, random_weights(cfg, 11, DType::F32), ModelOptions{}};
};

std::vector<std::vector<float>> run(TinyModel& t, const std::string& name, const std::map<std::string, double>& opts,
                                    const Tensor& ids, const std::vector<int64_t>& chunks, KVCache** keep = nullptr) {
    KVCacheConfig kc;
    kc.name = name;
    kc.cache_length = 0;
    kc.policy_options = opts;
    static std::unique_ptr<KVCache> last;
    last = std::make_unique<KVCache>(kc, t.cfg, Device{}, DType::F32, ids.size(1));
    last->set_replay_logging(true);
    std::vector<std::vector<float>> outs;
    int64_t P = 0;
    for (int64_t n : chunks) {
        Tensor x = t.model.embed(ids.slice(1, P, P + n));
        for (int l = 0; l < int(t.cfg.num_layers); ++l) x = t.model.block(l, x, P, *last);
        outs.push_back(x.to_f32_vector());
        P += n;
    }
    if (keep) *keep = last.get();
    return outs;
}

TEST(QuestPolicy, ReadingEveryPageIsDenseBitForBitAndASmallBudgetIsNot) {
    TinyModel t;
    const int64_t B = 2, T = 120;
    std::mt19937_64 rng(seed_for("quest tiny"));
    std::vector<int32_t> idv((size_t)(B * T));
    for (auto& x : idv) x = int32_t(rng() % 200 + 32);
    Tensor ids = Tensor::from_i32({B, T}, idv);
    std::vector<int64_t> chunks = {40};
    for (int64_t i = 0; i < 10; ++i) chunks.push_back(4);
    for (int64_t i = 0; i < 40; ++i) chunks.push_back(1);  // decode steps
    const auto dense = run(t, "dense-default", {}, ids, chunks);
    const auto all = run(t, "quest-default", {{"quest_page_size", 8}, {"quest_pages", 15}}, ids, chunks);
    ASSERT_EQ(dense.size(), all.size());
    for (size_t c = 0; c < dense.size(); ++c) ASSERT_EQ(dense[c], all[c]) << "chunk " << c;

    KVCache* cache = nullptr;
    const auto small = run(t, "quest-default", {{"quest_page_size", 8}, {"quest_pages", 2}}, ids, chunks, &cache);
    EXPECT_EQ(small[0], dense[0]);  // the prefill is dense attention
    double diff = 0;
    for (size_t i = 0; i < small.back().size(); ++i) diff = std::max(diff, double(std::fabs(small.back()[i] - dense.back()[i])));
    EXPECT_GT(diff, 1e-4) << "reading 3 of 15 pages should change the last decode step";
    // The last step's selections: the 2 pages of largest bound plus the query's own page 14
    // (one of those two already, or a third), ascending.
    auto* qs = dynamic_cast<const QuestSelections*>(&cache->layer(0).policy());
    ASSERT_NE(qs, nullptr);
    int64_t heads = 0, queries = 0;
    const std::vector<int32_t>& sel = qs->last_selection(&heads, &queries);
    ASSERT_EQ(heads, t.cfg.num_heads);
    ASSERT_EQ(queries, 1);
    ASSERT_EQ(sel.size(), size_t(B * heads * 3));
    for (int64_t r = 0; r < B * heads; ++r) {
        const int32_t* e = sel.data() + r * 3;
        const int count = e[2] >= 0 ? 3 : 2;
        EXPECT_EQ(e[count - 1], 14) << "row " << r;
        EXPECT_LT(e[0], e[1]) << "row " << r;
        if (count == 3) {
            EXPECT_LT(e[1], e[2]) << "row " << r;
        }
    }

    // Replaying the logged plans reproduces every output.
    KVCacheConfig kc = cache->config();
    std::vector<std::vector<SlotPlan>> plans;
    for (int l = 0; l < cache->num_layers(); ++l) plans.push_back(cache->layer(l).replay_log().plans());
    KVCache replay(kc, t.cfg, Device{}, DType::F32, T);
    ChunkCall call(replay, ChunkInput{.replay = &plans});
    int64_t P = 0;
    for (size_t c = 0; c < chunks.size(); ++c) {
        Tensor x = t.model.embed(ids.slice(1, P, P + chunks[c]));
        for (int l = 0; l < int(t.cfg.num_layers); ++l) x = t.model.block(l, x, P, call);
        ASSERT_EQ(x.to_f32_vector(), small[c]) << "chunk " << c;
        P += chunks[c];
    }
}

}  // namespace
}  // namespace kv::test
