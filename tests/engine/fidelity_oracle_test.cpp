// The fidelity oracle (engine/driver/fidelity.h, FidelityStep::oracle_mass): the kept attention
// mass of the best set of the same size, known in hindsight. Checked as a property over every
// registered policy (never below the policy's kept mass, in every layer and chunk), against an
// f64 recomputation on the `tiny` model from the queries and keys each layer received and the
// replay log's held positions, and the best-set rule against an exhaustive search over subsets.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "engine/driver/fidelity.h"
#include "engine/driver/long_context.h"
#include "engine/kv/policies/policy_registry.h"
#include "engine/kv/replay_log.h"
#include "engine/model/presets.h"
#include "engine/model/transformer.h"
#include "engine/run/run_plan.h"
#include "tests/engine/kv_test_util.h"
#include "tests/support/test_support.h"

namespace kv::test {
namespace {

// Records what each layer's attention was given (q and k in f64, in call order) and passes the
// call on to the fidelity measurement.
struct Recording final : CacheAttention {
    FidelityAttention& fid;
    struct Call {
        int layer;
        int64_t input_pos, n;
        float scale;
        int window;
        std::vector<double> q, k;  // (1, NH, n, HS), (1, G, n, HS)
    };
    std::vector<Call> calls;
    explicit Recording(FidelityAttention& f) : fid(f) {}
    using CacheAttention::attend;
    void attend(int layer, const Tensor& q, const Tensor& k, const Tensor& v, int64_t input_pos, float scale, int window,
                Tensor& y, const ChunkInput& in) override {
        calls.push_back({layer, input_pos, q.size(2), scale, window, q.to_f64_vector(), k.to_f64_vector()});
        fid.attend(layer, q, k, v, input_pos, scale, window, y, in);
    }
    void set_rope_frequencies(const std::vector<double>* inv_freq) override { fid.set_rope_frequencies(inv_freq); }
    void set_layer_input(int layer, const Tensor& h) override { fid.set_layer_input(layer, h); }  // kvzap scores from it
};

struct OracleRun {
    std::vector<FidelityStep> steps;
    std::vector<Recording::Call> calls;
    std::vector<std::vector<SlotPlan>> plans;  // per layer: the replay log
    std::vector<int64_t> lengths;              // per layer: the cache length the plans index
};

// `tiny` (2 layers, 4 heads / 2 KV heads) over T random bytes: in chunks of `chunk` from
// position 0, or (run_plan) as a run plans them (a prefill of the shortest layer's length, then
// chunks that respect every layer's length).
OracleRun run_tiny(const std::string& name, int64_t L, int64_t T, int64_t chunk, bool run_plan = false) {
    const ModelConfig cfg = preset_config("tiny");
    Transformer model{cfg, random_weights(cfg, 5, DType::F32), ModelOptions{}};
    RunConfig rc;
    rc.kv_cache.name = name;
    rc.kv_cache.cache_length = L;
    rc.kv_cache.snapkv_window = chunk;  // pyramidkv: every layer keeps a window of a chunk on top of its budget
    rc.driver.chunk_size = chunk;
    apply_required_options(rc.kv_cache);
    KVCacheConfig kc = run_cache_config(rc, cfg, DType::F32);
    if (!run_plan) kc.max_chunk_size = chunk;
    KVCache cache(kc, cfg, Device{}, DType::F32, T, &byte_codec());
    cache.set_replay_logging(true);
    FidelityAttention fid(cache, cfg, 1, T, Device{}, DType::F32);
    fid.set_oracle(true);
    Recording rec(fid);
    std::mt19937_64 rng(23);
    std::vector<int32_t> v((size_t)T);
    for (auto& x : v) x = int32_t(rng() % 256);
    const Tensor ids = Tensor::from_i32({1, T}, v);
    ChunkPlan plan;
    if (run_plan) {
        plan = run_chunk_plan(rc, kc, cfg, T, 1);
    } else {
        for (int64_t p = 0; p < T; p += chunk) {
            plan.starts.push_back(p);
            plan.chunks.push_back(std::min(chunk, T - p));
        }
        plan.cells = group_cells(plan.chunks, 1 << 30);
    }
    HeadSpec hs;
    hs.kind = HeadKind::NEXT_TOKEN;
    hs.B = 1;
    hs.T = T;
    hs.token_targets.assign(size_t(T), -100);
    HeadResult res;
    DriverCallbacks cb;
    cb.attention = &rec;
    long_context_forward(model, cache, ids, plan, hs, res, cb);
    OracleRun out;
    out.steps = fid.steps();
    out.calls = std::move(rec.calls);
    for (int l = 0; l < int(cfg.num_layers); ++l) {
        out.plans.push_back(cache.layer(l).replay_log().plans());
        out.lengths.push_back(cache.layer(l).policy().cache_length());
    }
    EXPECT_EQ(out.steps.size(), plan.chunks.size() * size_t(cfg.num_layers)) << name;
    return out;
}

// The cache name of a registered policy on the default buffer (q8 where it needs a quantized
// one, its first allowed buffer where it names some).
std::string cache_name_of(const PolicyInfo& p) {
    std::string buffer = p.needs_quantized_buffer ? "q8" : "default";
    if (!p.buffers.empty() && std::find(p.buffers.begin(), p.buffers.end(), buffer) == p.buffers.end()) buffer = p.buffers.front();
    return p.name + "-" + buffer;
}

TEST(FidelityOracle, NeverBelowThePolicyInAnyLayerOrChunkForEveryRegisteredPolicy) {
    int evicting = 0;
    for (const PolicyInfo& p : policy_registry()) {
        const std::string name = cache_name_of(p);
        SCOPED_TRACE(name);
        const OracleRun r = run_tiny(name, p.needs_cache_length ? 32 : 0, 96, 8, true);
        ASSERT_FALSE(r.steps.empty());
        bool dropped = false;
        for (const FidelityStep& s : r.steps) {
            // Both masses sum the same f32 weights in the same order: exact, no tolerance.
            EXPECT_GE(s.oracle_mass, s.kept_mass) << "layer " << s.layer << " chunk " << s.chunk;
            EXPECT_LE(s.oracle_mass, 1.0 + 1e-6) << "layer " << s.layer << " chunk " << s.chunk;
            EXPECT_GE(s.efficiency, 0.0);
            EXPECT_LE(s.efficiency, 1.0) << "layer " << s.layer << " chunk " << s.chunk;
            EXPECT_DOUBLE_EQ(s.efficiency, s.oracle_mass > 0 ? s.kept_mass / s.oracle_mass : 1.0);
            if (s.kept_mass == 1.0) {
                EXPECT_EQ(s.oracle_mass, 1.0) << "nothing dropped: the oracle keeps everything too";
            }
            dropped = dropped || s.kept_mass < 1.0;
        }
        evicting += dropped ? 1 : 0;
        if (!p.evicts) {
            EXPECT_FALSE(dropped) << "a policy that never evicts keeps the whole mass";
        }
    }
    EXPECT_GE(evicting, 3) << "the case must make policies drop attention mass to test anything";
}

// The full attention weights of one step in f64: w[g][t] = sum over the chunk's queries and the
// group's heads of softmax(q . k_t * scale), divided by the heads per group (so each row sums
// to n), causal by position.
std::vector<std::vector<double>> weights_f64(const OracleRun& r, size_t step_call, int64_t NH, int64_t G, int64_t HS) {
    const Recording::Call& c = r.calls[step_call];
    const int64_t end = c.input_pos + c.n;
    // Keys at every position up to end, from this layer's earlier calls.
    std::vector<double> K(size_t(G * end * HS));
    for (size_t j = 0; j <= step_call; ++j) {
        const Recording::Call& e = r.calls[j];
        if (e.layer != c.layer || e.input_pos + e.n > end) continue;
        for (int64_t g = 0; g < G; ++g)
            for (int64_t t = 0; t < e.n; ++t)
                for (int64_t d = 0; d < HS; ++d) K[size_t((g * end + e.input_pos + t) * HS + d)] = e.k[size_t((g * e.n + t) * HS + d)];
    }
    std::vector<std::vector<double>> w(size_t(G), std::vector<double>(size_t(end), 0.0));
    for (int64_t h = 0; h < NH; ++h) {
        const int64_t g = h / (NH / G);
        for (int64_t i = 0; i < c.n; ++i) {
            const int64_t p = c.input_pos + i;
            std::vector<double> s(size_t(p + 1));
            double m = -INFINITY, z = 0;
            for (int64_t t = 0; t <= p; ++t) {
                double dot = 0;
                for (int64_t d = 0; d < HS; ++d) dot += c.q[size_t(((h * c.n) + i) * HS + d)] * K[size_t((g * end + t) * HS + d)];
                s[size_t(t)] = dot * double(c.scale);
                m = std::max(m, s[size_t(t)]);
            }
            for (int64_t t = 0; t <= p; ++t) z += std::exp(s[size_t(t)] - m);
            for (int64_t t = 0; t <= p; ++t) w[size_t(g)][size_t(t)] += std::exp(s[size_t(t)] - m) / z / double(NH / G);
        }
    }
    return w;
}

TEST(FidelityOracle, EqualsF64BruteForceOnTiny) {
    const ModelConfig cfg = preset_config("tiny");
    const int64_t NH = cfg.num_heads, G = cfg.num_kv_heads, HS = cfg.head_dim;
    for (const std::string name : {"h2o-default", "lastrec-default", "tova-default"}) {
        SCOPED_TRACE(name);
        const OracleRun r = run_tiny(name, 24, 80, 8);
        ASSERT_EQ(r.calls.size(), r.steps.size());
        bool below = false;
        std::vector<size_t> chunk_of_layer(r.plans.size(), 0);
        for (size_t i = 0; i < r.steps.size(); ++i) {
            const FidelityStep& s = r.steps[i];
            const Recording::Call& c = r.calls[i];
            ASSERT_EQ(c.window, 0) << "tiny has no sliding window: the reference attends causally";
            ASSERT_EQ(s.layer, c.layer);
            ASSERT_EQ(s.input_pos, c.input_pos);
            const int64_t end = c.input_pos + c.n, L = r.lengths[size_t(c.layer)];
            const size_t ci = chunk_of_layer[size_t(c.layer)]++;
            int64_t rows = 1;
            const std::vector<int32_t> slots = replay_positions(r.plans[size_t(c.layer)], ci + 1, L, &rows);
            const auto w = weights_f64(r, i, NH, G, HS);
            double kept = 0, oracle = 0;
            for (int64_t g = 0; g < G; ++g) {
                const int64_t row = rows == 1 ? 0 : g;
                std::vector<char> held(size_t(end), 0);
                for (int64_t k = 0; k < L; ++k)
                    if (const int32_t p = slots[size_t(row * L + k)]; p >= 0 && p < end) held[size_t(p)] = 1;
                int64_t size = 0;
                for (int64_t t = 0; t < end; ++t)
                    if (held[size_t(t)]) kept += w[size_t(g)][size_t(t)], ++size;
                // The best set of that size: the `size` heaviest positions.
                std::vector<double> sorted = w[size_t(g)];
                std::sort(sorted.begin(), sorted.end(), std::greater<double>());
                for (int64_t k = 0; k < size; ++k) oracle += sorted[size_t(k)];
            }
            kept /= double(c.n * G);
            oracle /= double(c.n * G);
            // f32 attention weights in the engine against f64 here.
            EXPECT_NEAR(s.kept_mass, kept, 2e-6) << "layer " << s.layer << " chunk " << s.chunk;
            EXPECT_NEAR(s.oracle_mass, oracle, 2e-6) << "layer " << s.layer << " chunk " << s.chunk;
            EXPECT_NEAR(s.efficiency, kept / oracle, 4e-6) << "layer " << s.layer << " chunk " << s.chunk;
            below = below || oracle - kept > 1e-3;
        }
        EXPECT_TRUE(below) << "the policy must miss the best set somewhere to test anything";
    }
}

// The best-set rule (the lightest positions dropped) against every subset of the same size.
TEST(FidelityOracle, DroppedWeightMatchesExhaustiveSearch) {
    std::mt19937_64 rng(5);
    std::uniform_real_distribution<float> u(0.f, 1.f);
    for (int trial = 0; trial < 20; ++trial) {
        const int64_t end = 6 + trial % 7;
        std::vector<float> w((size_t)end);
        for (float& x : w) x = u(rng) * u(rng);
        std::vector<char> held((size_t)end);
        int64_t kept = 0;
        for (auto& h : held) h = char(rng() % 2), kept += h;
        double lost = -1;
        const double dropped = dropped_weight(w.data(), held.data(), end, &lost);
        double best = INFINITY, mine = 0;
        for (uint32_t mask = 0; mask < (1u << end); ++mask) {
            if (__builtin_popcount(mask) != kept) continue;
            double d = 0;
            for (int64_t t = 0; t < end; ++t)
                if (!(mask >> t & 1)) d += double(w[size_t(t)]);
            best = std::min(best, d);
        }
        for (int64_t t = 0; t < end; ++t)
            if (!held[size_t(t)]) mine += double(w[size_t(t)]);
        EXPECT_NEAR(lost, best, 1e-12) << "trial " << trial;
        EXPECT_NEAR(dropped, mine, 1e-12) << "trial " << trial;
        EXPECT_LE(lost, dropped) << "trial " << trial;
    }
}

}  // namespace
}  // namespace kv::test
