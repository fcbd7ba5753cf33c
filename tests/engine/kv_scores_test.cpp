// Score-based eviction against an independent recomputation: accumulated H2O (and h2o-vlen)
// scores equal sums of attention weights computed in f64 from full softmax matrices over the
// tokens actually in the cache; the slots chosen for the next chunk are the lowest scores with
// ties broken by the lower slot; top-k selection (max_chunk_size) equals the full argsort.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/kv/policies/policy_registry.h"
#include "policy_references.h"

namespace kv::test {
namespace {

void check_scores(const std::string& name, bool vlen) {
    LayerHarness h(name, 24, seed_for("scores " + name));
    BruteScores brute;
    h.step(24);  // full prefill: every token starts with score 0
    for (int64_t r = 0; r < h.B * h.G; ++r)
        for (int32_t p = 0; p < 24; ++p) brute.score.resize(size_t(h.B * h.G)), brute.score[size_t(r)][p] = 0.0;
    const std::vector<int64_t> chunks = {4, 3, 5, 4, 2, 6, 4, 3, 1, 4};
    std::vector<int32_t> expected;  // slots the brute force says the next chunk evicts (rows x k)
    for (size_t s = 0; s < chunks.size(); ++s) {
        const int64_t n = chunks[s], P = h.P;
        h.step(n);
        const SlotPlan& plan = h.layer().replay_log().plans().back();
        if (!expected.empty()) {  // the first chunk after a full prefill uses the keep-initial rule
            for (int64_t r = 0; r < h.B * h.G; ++r)
                for (int64_t t = 0; t < n; ++t)
                    ASSERT_EQ(plan.targets[size_t(r * n + t)], expected[size_t(r * 24 + t)]) << name << " chunk " << s << " row " << r;
        }
        brute.step(h, h.last_q[0], P, n, vlen);
        const KVPolicy& pol = h.layer().policy();
        std::vector<float> got = pol.slot_scores();
        ASSERT_EQ(got.size(), size_t(h.B * h.G * 24));
        const auto& pos = pol.token_positions();
        expected.assign(size_t(h.B * h.G * 24), 0);
        for (int64_t r = 0; r < h.B * h.G; ++r) {
            std::vector<double> want(24);
            for (int64_t j = 0; j < 24; ++j) {
                want[size_t(j)] = brute.score[size_t(r)].at(pos[size_t(r * 24 + j)]);
                ASSERT_NEAR(got[size_t(r * 24 + j)], want[size_t(j)], 2e-5 * std::max(1.0, std::fabs(want[size_t(j)])))
                    << name << " row " << r << " slot " << j;
            }
            std::vector<int32_t> idx(24);
            std::iota(idx.begin(), idx.end(), 0);
            // lowest score first; ties (within f32 noise of the engine) by the lower slot
            std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return got[size_t(r * 24 + a)] < got[size_t(r * 24 + b)]; });
            std::copy(idx.begin(), idx.end(), expected.begin() + r * 24);
        }
    }
}

TEST(KVScores, H2OAccumulatedScoresEqualBruteForce) { check_scores("h2o-default", false); }
TEST(KVScores, H2OVlenScoresEqualBruteForce) { check_scores("h2o-vlen-default", true); }

TEST(KVScores, TopKEqualsFullArgsortThroughAModelRun) {
    // max_chunk_size (top-k) and full argsort must choose identical slots at every step, for
    // every registered policy that selects by top-k (alternating default and q8 buffers).
    std::vector<std::string> names;
    for (const PolicyInfo& p : policy_registry())
        if (std::find(p.uses.begin(), p.uses.end(), "max_chunk_size") != p.uses.end())
            names.push_back(p.name + ((p.needs_quantized_buffer || names.size() % 2) &&
                                              (p.buffers.empty() || std::find(p.buffers.begin(), p.buffers.end(), "q8") != p.buffers.end())
                                          ? "-q8"
                                          : "-default"));
    ASSERT_GE(names.size(), 6u);
    for (const std::string& name : names) {
        LayerHarness full(name, 32, seed_for("topk " + name)), topk(name, 32, seed_for("topk " + name));
        topk.cfg.max_chunk_size = 8;
        topk.cache = std::make_unique<KVCache>(topk.cfg, topk.model, Device{}, DType::F32, 0, &byte_codec());
        topk.cache->set_replay_logging(true);
        for (int64_t n : {32, 4, 8, 5, 8, 3, 8, 8, 1, 7}) {
            full.step(n);
            topk.step(n);
            const auto& a = full.layer().replay_log().plans().back();
            const auto& b = topk.layer().replay_log().plans().back();
            ASSERT_EQ(a.targets, b.targets) << name << " at position " << full.P;
        }
    }
}

TEST(KVScores, ATokenEnteringTheGraceRingStartsAtZero) {
    // docs/POLICIES.md's worked example of keys_values' grace-ring reset bug: a token that enters
    // a ring slot must not inherit the score of the slot's previous occupant. h2o, L 6, grace 2,
    // one row; only token 5 (ring slot 5) ever receives attention (0.9).
    KVCacheConfig cfg;
    cfg.name = "h2o-default";
    cfg.cache_length = 6;
    cfg.grace_period = 2;
    auto pol = make_policy(cfg, 6, 1);
    pol->reset(1);
    pol->prefill(6, {});
    auto step = [&](float w5) {
        SlotPlan p = pol->prepare(1);
        pol->apply(p, {});
        std::vector<float> w(6, 0.0f);
        w[5] = w5;
        pol->update(w, 1);
        return p;
    };
    step(0.9f);             // token 6 enters ring slot 4; token 5 (slot 5) now scores 0.9
    SlotPlan p2 = step(0);  // token 5 leaves the ring with its 0.9; token 7 enters slot 5
    ASSERT_EQ(p2.move_from[0], 5);
    EXPECT_EQ(pol->token_positions()[5], 7);
    step(0);                // token 6 leaves slot 4; token 8 enters it
    SlotPlan p4 = step(0);  // token 7 leaves slot 5 for an evicted slot
    ASSERT_EQ(p4.move_from[0], 5);
    const int32_t landed = p4.move_to[0];
    EXPECT_EQ(pol->token_positions()[size_t(landed)], 7);
    const std::vector<float> s = pol->slot_scores();
    EXPECT_EQ(s[size_t(landed)], 0.0f) << "token 7 inherited the score of token 5 (keys_values' reset on a copy)";
    EXPECT_EQ(s[size_t(p2.move_to[0])], 0.9f) << "token 5 must keep its score when it leaves the ring";
}

TEST(KVScores, TiesAreBrokenByTheLowerSlot) {
    // knorm with identical keys: every score ties, so slots are taken in index order.
    LayerHarness h("knorm-default", 16, 7);
    Tensor q = Tensor::zeros({h.B, h.NH, 16, h.D}, DType::F32), k = Tensor::full({h.B, h.G, 16, h.D}, DType::F32, 0.5);
    Tensor v = Tensor::zeros({h.B, h.G, 16, h.D}, DType::F32), y = Tensor::empty({h.B, h.NH, 16, h.D}, DType::F32);
    h.cache->attend(0, q, k, v, 0, 1.0f, 0, y);
    Tensor q2 = Tensor::zeros({h.B, h.NH, 3, h.D}, DType::F32), k2 = Tensor::full({h.B, h.G, 3, h.D}, DType::F32, 0.5);
    Tensor v2 = Tensor::zeros({h.B, h.G, 3, h.D}, DType::F32), y2 = Tensor::empty({h.B, h.NH, 3, h.D}, DType::F32);
    h.cache->attend(0, q2, k2, v2, 16, 1.0f, 0, y2);  // initial rule: keep = min(int(0.05*16), 16-3) = 0
    h.cache->attend(0, q2, k2, v2, 19, 1.0f, 0, y2);  // now by score: all equal -> slots 0, 1, 2
    const SlotPlan& p = h.layer().replay_log().plans().back();
    for (int64_t r = 0; r < h.B * h.G; ++r)
        for (int t = 0; t < 3; ++t) EXPECT_EQ(p.targets[size_t(r * 3 + t)], t) << "row " << r;
}

}  // namespace
}  // namespace kv::test
