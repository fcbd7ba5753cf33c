// Policies registered at run time (engine/kv/policies/policy_runtime.h) without Python: an external
// scorer computing knorm's score (minus the key's L2 norm, from the paper's definition) and one
// computing snapkv's window-vote score make the built-ins' decisions plan for plan on a real
// layer cache with random keys; the registry's lookups see registered names; bad names are
// refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>

#include "engine/kv/kv_config.h"
#include "engine/kv/policies/policy_runtime.h"
#include "kv_test_util.h"

namespace kv::test {
namespace {

struct KnormScorer final : ExternalScorer {
    int* calls;
    explicit KnormScorer(int* c) : calls(c) {}
    void score_new(const ExternalFeatures& f, float* out) override {
        ++*calls;
        EXPECT_NE(f.key_norm, nullptr);
        EXPECT_EQ(f.value_norm, nullptr);  // not declared
        for (int64_t i = 0; i < f.rows * f.n; ++i) out[i] = -f.key_norm[i];
    }
    void update(const ExternalFeatures&) override { ADD_FAILURE() << "update without declaring attention"; }
};

// snapkv as POLICIES.md states it (SnapKV's published rule): the last `window` queries vote;
// votes sorted by token position are summed over `kernel` neighbours (zero padding) among the
// positions before the window and divided by kernel; the window's tokens take the highest
// score of the layer; empty slots 0; new tokens start at 0.
struct SnapScorer final : ExternalScorer {
    int64_t kernel, window;
    SnapScorer(int64_t k, int64_t w) : kernel(k), window(w) {}
    void score_new(const ExternalFeatures& f, float* out) override { std::fill(out, out + f.rows * f.n, 0.0f); }
    void update(const ExternalFeatures& f) override {
        const int64_t T = f.length, half = kernel / 2;
        const int64_t first = f.input_pos - std::min(window, f.n);  // the window: positions [first, input_pos)
        float top = -1e30f;
        bool any = false;
        for (int64_t r = 0; r < f.rows; ++r) {
            const int32_t* pos = f.positions + r * f.slots;
            std::vector<int32_t> before;  // the pooled slots, in position order
            for (int32_t j = 0; j < int32_t(T); ++j) {
                if (pos[j] < 0) f.scores[r * f.slots + j] = 0.0f;
                else if (pos[j] < first) before.push_back(j);
            }
            std::sort(before.begin(), before.end(), [pos](int32_t a, int32_t b) { return pos[a] < pos[b]; });
            const int64_t m = int64_t(before.size());
            for (int64_t i = 0; i < m; ++i) {
                float s = 0;
                for (int64_t k = std::max<int64_t>(0, i - half); k <= std::min(m - 1, i + half); ++k)
                    s += f.weights[r * T + before[size_t(k)]];
                const float v = s / float(kernel);
                f.scores[r * f.slots + before[size_t(i)]] = v;
                top = any ? std::max(top, v) : v;
                any = true;
            }
        }
        for (int64_t r = 0; r < f.rows; ++r)
            for (int64_t j = 0; j < T; ++j)
                if (f.positions[r * f.slots + j] >= first) f.scores[r * f.slots + j] = any ? top : 0.0f;
    }
};

int g_knorm_calls = 0;

void register_test_policies() {
    static bool done = false;
    if (done) return;
    done = true;
    ExternalPolicySpec k;
    k.name = "ext_knorm";
    k.needs.features = Feature::KeyNorm;
    k.make = [](const PolicyArgs&) { return std::make_unique<KnormScorer>(&g_knorm_calls); };
    register_external_policy(k);
    ExternalPolicySpec s;
    s.name = "ext_snapkv";
    s.needs.attention = true;
    s.needs.attention_window = KVCacheConfig{}.snapkv_window;
    s.make = [](const PolicyArgs& a) { return std::make_unique<SnapScorer>(a.cfg.snapkv_kernel, a.cfg.snapkv_window); };
    register_external_policy(s);
}

void expect_same_decisions(const std::string& builtin, const std::string& external) {
    register_test_policies();
    for (uint64_t seed : {1u, 2u, 3u}) {
        LayerHarness a(builtin, 24, seed, 4), b(external, 24, seed, 4);
        for (int64_t n : {16, 5, 3, 7, 9, 4, 8}) {
            a.step(n);
            b.step(n);
            const auto& pa = a.layer().replay_log().plans().back();
            const auto& pb = b.layer().replay_log().plans().back();
            ASSERT_EQ(pa.targets, pb.targets) << builtin << " seed " << seed << " at position " << a.P;
            ASSERT_EQ(pa.move_from, pb.move_from);
            ASSERT_EQ(pa.move_to, pb.move_to);
            ASSERT_EQ(a.layer().policy().token_positions(), b.layer().policy().token_positions());
        }
    }
}

// A registration lasts as long as the process: each case runs in a child process (a death test
// that must exit 0), so the registry-loop tests of this binary never see these policies,
// whatever order the cases run in.
template <class F>
void isolated(F&& body) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_EXIT(
        {
            body();
            std::_Exit(::testing::Test::HasFailure() ? 1 : 0);
        },
        ::testing::ExitedWithCode(0), "");
}

TEST(PolicyRuntime, AnExternalKnormMakesKnormsDecisions) {
    isolated([] {
        g_knorm_calls = 0;
        expect_same_decisions("knorm-default", "ext_knorm-default");
        EXPECT_EQ(g_knorm_calls, 3 * 7);  // one call per chunk
    });
}

TEST(PolicyRuntime, AnExternalSnapkvMakesSnapkvsDecisions) {
    isolated([] { expect_same_decisions("snapkv-default", "ext_snapkv-default"); });
}

TEST(PolicyRuntime, RegisteredNamesJoinTheRegistry) { isolated([] {
    register_test_policies();
    const auto& names = kv_policy_names();
    EXPECT_NE(std::find(names.begin(), names.end(), "ext_knorm"), names.end());
    EXPECT_NE(std::find(names.begin(), names.end(), "knorm"), names.end());  // built-ins stay
    ASSERT_NE(find_policy("ext_snapkv"), nullptr);
    EXPECT_TRUE(find_policy("ext_snapkv")->needs_attention_weights);
    EXPECT_EQ(parse_kv_cache_name("ext_knorm-q8").policy, "ext_knorm");
}); }

TEST(PolicyRuntime, BadNamesAreRefused) { isolated([] {
    ExternalPolicySpec s;
    s.make = [](const PolicyArgs&) { return std::make_unique<KnormScorer>(&g_knorm_calls); };
    s.name = "knorm";
    EXPECT_THROW(register_external_policy(s), Error);
    s.name = "my-policy";
    EXPECT_THROW(register_external_policy(s), Error);
    s.name = "";
    EXPECT_THROW(register_external_policy(s), Error);
    s.name = "no_factory";
    s.make = nullptr;
    EXPECT_THROW(register_external_policy(s), Error);
}); }

// A scorer sees exactly the features it declared: key norms, keys and queries here, and no
// value norms or values; the key norms are the L2 norms of the keys it was given (f64 here).
struct DeclaredFeaturesScorer final : ExternalScorer {
    int* calls;
    explicit DeclaredFeaturesScorer(int* c) : calls(c) {}
    void score_new(const ExternalFeatures& f, float* out) override {
        ++*calls;
        EXPECT_EQ(f.value_norm, nullptr);
        EXPECT_EQ(f.values, nullptr);
        EXPECT_NE(f.queries, nullptr);
        EXPECT_GT(f.query_heads, 0);
        EXPECT_NE(f.key_norm, nullptr);
        EXPECT_NE(f.keys, nullptr);
        EXPECT_GT(f.head_dim, 0);
        if (!f.key_norm || !f.keys) return;
        for (int64_t i = 0; i < f.rows * f.n; ++i) {
            double ss = 0;
            for (int64_t d = 0; d < f.head_dim; ++d) ss += double(f.keys[i * f.head_dim + d]) * double(f.keys[i * f.head_dim + d]);
            EXPECT_NEAR(f.key_norm[i], std::sqrt(ss), 1e-5 * (1 + std::sqrt(ss))) << i;
            out[i] = -f.key_norm[i];
        }
    }
    void update(const ExternalFeatures&) override { ADD_FAILURE() << "update without declaring attention"; }
};

TEST(PolicyRuntime, AScorerGetsExactlyTheFeaturesItDeclares) { isolated([] {
    static int calls = 0;
    ExternalPolicySpec s;
    s.name = "ext_declared";
    s.needs.features = {Feature::KeyNorm, Feature::KeyVectors, Feature::QueryVectors};
    s.make = [](const PolicyArgs&) { return std::make_unique<DeclaredFeaturesScorer>(&calls); };
    register_external_policy(s);
    LayerHarness h("ext_declared-default", 24, 1, 4);
    for (int64_t n : {16, 5, 3}) h.step(n);
    EXPECT_EQ(calls, 3);
}); }

TEST(PolicyFeatures, EachFeatureIsItsOwnMember) {
    const Feature all[] = {Feature::ValueNorm, Feature::KeyNorm, Feature::QuantError,
                           Feature::KeyVectors, Feature::ValueVectors, Feature::QueryVectors, Feature::HiddenStates};
    EXPECT_TRUE(FeatureSet().empty());
    for (Feature a : all) {
        const FeatureSet one = a;
        EXPECT_FALSE(one.empty());
        for (Feature b : all) EXPECT_EQ(one.has(b), a == b);
        FeatureSet both = {Feature::KeyNorm};
        both |= a;
        EXPECT_TRUE(both.has(a) && both.has(Feature::KeyNorm));
        EXPECT_EQ(both, FeatureSet(Feature::KeyNorm) | a);
    }
}

}  // namespace
}  // namespace kv::test
