// key-rerotation-* (docs/POLICIES.md#key-rerotation): against an f64 reference written from the
// definition. RoPE here is the half-split rotation written out in the test, over a partial
// rotary width with frequencies unlike any preset (as YaRN leaves them): a key turned by the
// cache equals the unrotated key rotated directly at its new position, and each chunk's output
// equals naive f64 attention in a model where the kept tokens sit at positions 0..K-1 in token
// order and the chunk continues at K.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include "engine/core/error.h"
#include "engine/kv/key_rotation.h"
#include "engine/kv/kv_cache.h"
#include "engine/kv/policies/policy_registry.h"
#include "engine/model/model_grads.h"
#include "grad_test_util.h"
#include "kv_test_util.h"
#include "tests/support/test_support.h"

namespace kv::test {
namespace {

const std::vector<double> kFreq = {1.0, 0.31, 0.047};  // 6 of 8 channels rotated (partial rotary)

// x rotated at position p, half-split pairs (j, j + half), in f64.
std::vector<double> rope_at(const std::vector<double>& x, int64_t p, const std::vector<double>& f) {
    std::vector<double> y = x;
    const size_t h = f.size();
    for (size_t j = 0; j < h; ++j) {
        const double a = double(p) * f[j];
        y[j] = x[j] * std::cos(a) - x[j + h] * std::sin(a);
        y[j + h] = x[j + h] * std::cos(a) + x[j] * std::sin(a);
    }
    return y;
}

TEST(KeyRerotation, ARotatedKeyEqualsTheKeyComputedAtItsNewPosition) {
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<double> u(-2, 2);
    for (int trial = 0; trial < 20; ++trial) {
        std::vector<double> raw(8, 0.0);
        for (double& x : raw) x = u(rng);
        const int64_t p = int64_t(rng() % 5000), q = int64_t(rng() % 5000);
        std::vector<double> k = rope_at(raw, p, kFreq);
        rotate_by_positions(k.data(), 8, kFreq, q - p);
        const std::vector<double> want = rope_at(raw, q, kFreq);
        for (int d = 0; d < 8; ++d) EXPECT_NEAR(k[size_t(d)], want[size_t(d)], 1e-11) << "channel " << d << " from " << p << " to " << q;
        EXPECT_EQ(k[6], raw[6]);  // channels past the rotary width never move
        std::vector<double> nope = raw;
        rotate_by_positions(nope.data(), 8, {}, q - p);  // a NoPE layer: nothing turns
        EXPECT_EQ(nope, raw);
    }
}

std::vector<std::string> rerotating_policies() {
    std::vector<std::string> out;
    for (const PolicyInfo& p : policy_registry())
        if (p.name.rfind("key-rerotation-", 0) == 0) out.push_back(p.name);
    return out;
}

struct Feed {
    int64_t B = 2, G = 2, NH = 4, D = 8, L = 8;
    KVCacheConfig cfg;
    ModelConfig model;
    std::unique_ptr<KVCache> cache;
    std::mt19937_64 rng{11};
    // raw (unrotated) k, v per (b g) row and token position; q per (b, query head) and position
    std::vector<std::map<int64_t, std::pair<std::vector<double>, std::vector<double>>>> kv;
    int64_t P = 0;

    explicit Feed(const std::string& name, int64_t grace = 0) {
        cfg.name = name;
        cfg.cache_length = L;
        cfg.grace_period = grace;
        apply_required_options(cfg);
        cfg.snapkv_window = 2;
        model.vocab_size = 16, model.hidden_size = NH * D, model.intermediate_size = 8, model.num_layers = 1;
        model.num_heads = NH, model.num_kv_heads = G, model.head_dim = D, model.max_position_embeddings = 4096;
        cache = std::make_unique<KVCache>(cfg, model, Device{}, DType::F64, 0, &byte_codec());
        cache->set_replay_logging(true);
        kv.resize(size_t(B * G));
    }
    std::vector<double> rnd() {
        std::uniform_real_distribution<double> u(-1.5, 1.5);
        std::vector<double> x((size_t)D);
        for (double& e : x) e = u(rng);
        return x;
    }
    // One chunk of n tokens rotated at their token positions, as the model hands them; returns
    // y and the raw queries (B, NH, n, D).
    std::pair<std::vector<double>, std::vector<double>> step(int64_t n, const std::vector<double>& freq) {
        std::vector<double> q, k, v, rawq;
        for (int64_t bh = 0; bh < B * NH; ++bh)
            for (int64_t t = 0; t < n; ++t) {
                const std::vector<double> x = rnd();
                rawq.insert(rawq.end(), x.begin(), x.end());
                const std::vector<double> r = rope_at(x, P + t, freq);
                q.insert(q.end(), r.begin(), r.end());
            }
        for (int64_t r = 0; r < B * G; ++r)
            for (int64_t t = 0; t < n; ++t) {
                const std::vector<double> kr = rnd(), vr = rnd(), rk = rope_at(kr, P + t, freq);
                kv[size_t(r)][P + t] = {kr, vr};
                k.insert(k.end(), rk.begin(), rk.end());
                v.insert(v.end(), vr.begin(), vr.end());
            }
        Tensor y = Tensor::empty({B, NH, n, D}, DType::F64);
        cache->set_rope_frequencies(&freq);
        cache->attend(0, Tensor::from_f64({B, NH, n, D}, q), Tensor::from_f64({B, G, n, D}, k), Tensor::from_f64({B, G, n, D}, v), P,
                      float(1.0 / std::sqrt(double(D))), 0, y);
        P += n;
        return {y.to_f64_vector(), rawq};
    }
    std::vector<int32_t> row_positions(int64_t r) const {
        const KVPolicy& p = cache->layer(0).policy();
        const int64_t L_ = p.cache_length(), T = p.current_length();
        const auto& pos = p.token_positions();
        const int64_t off = p.per_row_positions() ? r * L_ : 0;
        return std::vector<int32_t>(pos.begin() + off, pos.begin() + off + T);
    }
};

// The naive model: the tokens kept before the chunk at 0..K-1 in token order, the chunk at K.
void expect_naive(const Feed& f, const std::vector<double>& y, const std::vector<double>& rawq, int64_t P0, int64_t n,
                  const std::vector<double>& freq, const std::string& what) {
    const int64_t R = f.NH / f.G;
    double worst = 0;
    for (int64_t b = 0; b < f.B; ++b)
        for (int64_t h = 0; h < f.NH; ++h) {
            const int64_t r = b * f.G + h / R;
            std::vector<int32_t> pos = f.row_positions(r);
            std::sort(pos.begin(), pos.end());
            const int64_t K = int64_t(std::count_if(pos.begin(), pos.end(), [&](int32_t p) { return p >= 0 && p < P0; }));
            for (int64_t i = 0; i < n; ++i) {
                const std::vector<double> qraw(rawq.begin() + ((b * f.NH + h) * n + i) * f.D, rawq.begin() + ((b * f.NH + h) * n + i + 1) * f.D);
                const std::vector<double> qv = rope_at(qraw, K + i, freq);
                std::vector<double> s, o((size_t)f.D, 0.0);
                std::vector<const std::vector<double>*> vals;
                int64_t rank = 0;
                for (int32_t p : pos) {
                    if (p < 0) continue;
                    const int64_t at = p < P0 ? rank++ : K + (p - P0);
                    if (p > P0 + i) continue;
                    const auto& e = f.kv[size_t(r)].at(p);
                    const std::vector<double> kk = rope_at(e.first, at, freq);
                    double dot = 0;
                    for (int64_t d = 0; d < f.D; ++d) dot += qv[size_t(d)] * kk[size_t(d)];
                    s.push_back(dot / std::sqrt(double(f.D)));
                    vals.push_back(&e.second);
                }
                const double m = *std::max_element(s.begin(), s.end());
                double z = 0;
                for (double& e : s) z += (e = std::exp(e - m));
                for (size_t j = 0; j < s.size(); ++j)
                    for (int64_t d = 0; d < f.D; ++d) o[size_t(d)] += s[j] / z * (*vals[j])[size_t(d)];
                for (int64_t d = 0; d < f.D; ++d)
                    worst = std::max(worst, std::fabs(o[size_t(d)] - y[size_t(((b * f.NH + h) * n + i) * f.D + d)]));
            }
        }
    // The model's RoPE tables hold float cos/sin, so an f64 run agrees with exact angles to ~1e-8.
    EXPECT_LT(worst, 1e-7) << what;
}

class KeyRerotationLoop : public testing::TestWithParam<std::string> {};

TEST_P(KeyRerotationLoop, EachChunkAttendsAsANaiveModelWithTheKeptTokensContiguous) {
    for (int64_t grace : {0, 3}) {
        Feed f(GetParam() + "-default", grace);
        int64_t evictions = 0;
        for (int64_t n : {8, 2, 1, 2, 3, 1, 2, 2, 1, 3, 2}) {
            const int64_t P0 = f.P;
            evictions += P0 >= f.L;
            auto [y, rawq] = f.step(n, kFreq);
            expect_naive(f, y, rawq, P0, n, kFreq, str(GetParam(), " grace ", grace, " chunk at ", P0));
            // every stored key is its raw key rotated at its rank among the kept tokens
            auto [K, V] = f.cache->layer(0).buffer().read(f.cache->layer(0).policy().current_length());
            const std::vector<double> kv = K.to_f64_vector();
            const int64_t T = K.size(2);
            for (int64_t r = 0; r < f.B * f.G; ++r) {
                const std::vector<int32_t> pos = f.row_positions(r);
                std::vector<int32_t> sorted = pos;
                std::sort(sorted.begin(), sorted.end());
                for (int64_t s = 0; s < T; ++s) {
                    const int64_t rank = std::lower_bound(sorted.begin(), sorted.end(), pos[size_t(s)]) - sorted.begin();
                    const std::vector<double> want = rope_at(f.kv[size_t(r)].at(pos[size_t(s)]).first, rank, kFreq);
                    for (int64_t d = 0; d < f.D; ++d)
                        ASSERT_NEAR(kv[size_t((r * T + s) * f.D + d)], want[size_t(d)], 1e-11)
                            << GetParam() << " row " << r << " slot " << s << " (token " << pos[size_t(s)] << ", rank " << rank << ")";
                }
            }
        }
        EXPECT_GE(evictions, 8) << GetParam();
    }
}

// A NoPE layer (no frequencies): nothing turns, and the wrapper is its scorer.
TEST_P(KeyRerotationLoop, ANoPELayerIsTheWrappedPolicyBitForBit) {
    const std::string inner = GetParam().substr(std::string("key-rerotation-").size());
    Feed a(GetParam() + "-default"), b(inner + "-default");
    const std::vector<double> none;
    for (int64_t n : {8, 2, 1, 2, 3, 1, 2}) {
        auto ya = a.step(n, none).first;
        auto yb = b.step(n, none).first;
        ASSERT_EQ(ya, yb) << GetParam() << " at " << a.P;
        ASSERT_EQ(a.cache->layer(0).replay_log().plans().back().targets, b.cache->layer(0).replay_log().plans().back().targets);
    }
}

INSTANTIATE_TEST_SUITE_P(Registry, KeyRerotationLoop, testing::ValuesIn(rerotating_policies()), [](const testing::TestParamInfo<std::string>& i) {
    std::string s = i.param;
    for (char& c : s)
        if (!isalnum((unsigned char)c)) c = '_';
    return s;
});

TEST(KeyRerotation, AQuantizedBufferIsRefusedByName) {
    KVCacheConfig c;
    c.name = "key-rerotation-h2o-q8";
    c.cache_length = 8;
    try {
        validate_kv_config(c, 1, 8, 2);
        FAIL() << "a q8 buffer was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("q8"), std::string::npos) << e.what();
    }
}

// The gradient replay turns keys and queries as the live cache did (SlotPlan::rerotate): its
// loss is the live pass's over several cells, and the same plans without the flag attend
// elsewhere. Finite differences of this replay: Policies/PolicyGradient.*key_rerotation*.
TEST(KeyRerotation, TheGradientReplayAttendsAsTheLiveCacheDid) {
    const ModelConfig cfg = grad_test_config("llama", 2);
    auto model = grad_test_model(cfg, DType::F64, 3);
    const int64_t T = 40, L = 12;
    GradData d = grad_test_data(cfg, 2, T, 5);
    for (const std::string& name : rerotating_policies()) {
        KVCacheConfig kc;
        kc.name = name + "-default";
        kc.cache_length = L;
        kc.snapkv_window = 4;
        KVCache cache(kc, cfg, Device{}, DType::F64, T);
        const ChunkPlan plan = grad_test_plan(cfg, T, L, 4, 0.5);
        ASSERT_GT(plan.cells.size(), 2u);
        ModelGrads g = ModelGrads::zeros_like(*model);
        GradientTargets tg;
        tg.model = &g;
        const GradientStats st = gradient_step(*model, cache, d.ids, plan, d.head, 1.0, GradientOptions{}, tg);
        const std::vector<int64_t> Ls(size_t(cfg.num_layers), L);
        const double l0 = replay_loss(*model, st.plans, Ls, d.ids, plan, d.head, 1.0);
        EXPECT_NEAR(st.loss, l0, 1e-9 * std::fabs(l0)) << name << ": the replay does not attend as the live cache did";
        EXPECT_NEAR(st.replay_loss, l0, 1e-12 * std::fabs(l0)) << name;
        bool flagged = false;
        auto plain = st.plans;
        for (auto& layer : plain)
            for (SlotPlan& p : layer) flagged |= p.rerotate, p.rerotate = false;
        EXPECT_TRUE(flagged) << name << ": no plan says its keys turned";
        EXPECT_GT(std::fabs(replay_loss(*model, plain, Ls, d.ids, plan, d.head, 1.0) - l0), 1e-9 * std::fabs(l0)) << name;
    }
}

}  // namespace
}  // namespace kv::test
