// Cross-layer KV sharing (Gemma 3n's num_kv_shared_layers, LayerSpec::kv_source): a shared
// layer computes no keys or values and attends over its source layer's cache.
// The gemma3_kv_shared fixture is a Gemma 3 model whose last three layers share (3, 4 sliding ->
// 1; 5 full -> 2); gemma3_text has no key for it, so the test sets the sources on the loaded
// config, as tools/reference/model_reference.py's kv_sources() applies them in float64.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "engine/driver/long_context.h"
#include "engine/kv/kv_cache.h"
#include "engine/kv/kv_config.h"
#include "engine/kv/layer_cache.h"
#include "engine/model/transformer.h"
#include "formats/io/hf_config.h"
#include "formats/io/hf_folder.h"
#include "formats/io/safetensors_file.h"
#include "tests/engine/chunked_logits_util.h"
#include "tests/engine/fixture_driver_util.h"
#include "tests/support/test_support.h"

namespace kv {
namespace {

std::string fixture_dir(const std::string& name = "gemma3_kv_shared") {
    return std::string(KVLAB_SOURCE_DIR) + "/tests/fixtures/models/" + name;
}

// The fixture's sources: the last 3 layers read the last earlier layer of their type.
void share(ModelConfig& c) {
    ASSERT_EQ(c.num_layers, 6);
    c.layer_specs[3].kv_source = 1;
    c.layer_specs[4].kv_source = 1;
    c.layer_specs[5].kv_source = 2;
    c.validate("gemma3_kv_shared");
}

// gemma3_kv_shared with the sources set by the test, or gemma3n_text (the same layout: 3, 4 -> 1;
// 5 -> 2), whose config.json gives them (num_kv_shared_layers 3).
struct Shared {
    HfModelFolder mf;
    SafetensorsContents expected;
    explicit Shared(const std::string& name = "gemma3_kv_shared")
        : mf(load_hf_model_folder(fixture_dir(name))), expected(load_safetensors(fixture_dir(name) + "/expected.safetensors")) {
        if (name == "gemma3_kv_shared") share(mf.config);
    }
};

const char* const kFixtures[] = {"gemma3_kv_shared", "gemma3n_text"};

TEST(KvSharing, WholeAndChunkedThroughDenseCacheMatchReference) {
    Shared f;
    ASSERT_EQ(f.mf.config.kv_layer(3), 1);
    ASSERT_EQ(f.mf.config.kv_layer(5), 2);
    ModelOptions opt;
    opt.rope = RopeMode::YARN;
    Transformer model(f.mf.config, f.mf.weights, opt);
    model.set_context_width(64);
    for (int j = 0; j < 2; ++j) {
        const Tensor& ids = f.expected.tensors.at("input_ids." + std::to_string(j));
        const Tensor& want = f.expected.tensors.at("logits." + std::to_string(j));
        const int64_t T = ids.size(1), V = want.size(2);
        test::Comparison whole = test::compare(model.forward(ids), want);
        EXPECT_LE(whole.rel_err, 1e-5) << "input " << j << " whole\n" << whole.report;
        for (int64_t chunk : {int64_t(1), int64_t(7), int64_t(32)}) {
            SCOPED_TRACE(str("input ", j, " chunk ", chunk));
            KVCacheConfig kc;  // dense-default
            KVCache cache(kc, f.mf.config, Device{}, DType::F32, T);
            test::Comparison c = test::compare(test::chunked_logits(model, f.mf.config, ids, chunk, V, &cache), want);
            EXPECT_LE(c.rel_err, 1e-5) << c.report;
            // Shared layers hold nothing; the bytes are the three source-holding layers' (0, 1, 2).
            size_t own = 0;
            for (int l = 0; l < 3; ++l) own += cache.layer(l).buffer().bytes();
            for (int l = 3; l < 6; ++l) {
                EXPECT_TRUE(cache.shared_layer(l));
                EXPECT_EQ(cache.layer(l).buffer().bytes(), 0u) << l;
                EXPECT_EQ(cache.layer(l).logical_bytes(), 0u) << l;
            }
            EXPECT_EQ(cache.physical_bytes(), own);
            EXPECT_GT(own, 0u);
        }
    }
    // Without the sources the same weights give other logits: the sharing is what matches.
    HfModelFolder plain = load_hf_model_folder(fixture_dir());
    Transformer unshared(plain.config, plain.weights, opt);
    unshared.set_context_width(64);
    const Tensor& ids = f.expected.tensors.at("input_ids.1");
    EXPECT_GT(test::compare(unshared.forward(ids), f.expected.tensors.at("logits.1")).rel_err, 1e-3);
}

// Observes the cache: after a shared layer's attention, recomputes it in f64 over exactly the
// slots its source keeps (inside the window), and records the positions both saw.
class SharedCheck final : public CacheAttention {
   public:
    // rerotated_source >= 0: that source's policy re-rotates its kept keys to contiguous RoPE
    // positions (kvpress' KeyRerotationPress), so its readers' queries continue at the number of
    // kept tokens before the chunk: the check turns them by that shift in f64 first.
    explicit SharedCheck(KVCache& cache, int rerotated_source = -1) : cache_(cache), rerotated_(rerotated_source) {}
    void set_rope_frequencies(const std::vector<double>* inv_freq) override {
        inv_freq_ = inv_freq;
        cache_.set_rope_frequencies(inv_freq);
    }
    void attend(int layer, const Tensor& q, const Tensor& k, const Tensor& v, int64_t input_pos, float scale, int window, Tensor& y,
                const ChunkInput& in) override {
        cache_.attend(layer, q, k, v, input_pos, scale, window, y, in);
        kept_[layer] = held(layer);
    }
    void attend_shared(int layer, int source, const Tensor& q, int64_t input_pos, float scale, int window, Tensor& y) override {
        cache_.attend_shared(layer, source, q, input_pos, scale, window, y);
        ++shared_calls;
        // What the source kept after its own call for this chunk is what the reader saw.
        if (held(source) != kept_[source]) ++position_mismatches;
        LayerCache& lc = cache_.layer(source);
        const KVPolicy& pol = lc.policy();
        const int64_t NH = q.size(1), n = q.size(2), D = q.size(3), T = pol.current_length(), L = pol.cache_length();
        const int64_t G = pol.groups(), R = NH / G;
        auto [K, V] = lc.buffer().read(T);
        std::vector<double> qv = q.contiguous().to_f64_vector();
        const std::vector<double> yv = y.contiguous().to_f64_vector();
        const std::vector<double> Kv = K.contiguous().to_f64_vector(), Vv = V.contiguous().to_f64_vector();
        const std::vector<int32_t>& pos = pol.token_positions();
        if (source == rerotated_) {
            // The queries continue at K = the kept tokens before the chunk: turn by K - input_pos,
            // the pair (j, j + D/2) by that times theta_j (every channel rotates in these models).
            int64_t kept_before = 0;
            for (int64_t t = 0; t < T; ++t) kept_before += pos[size_t(t)] >= 0 && pos[size_t(t)] < input_pos;
            const int64_t shift = kept_before - input_pos, half = int64_t(inv_freq_->size());
            EXPECT_EQ(2 * half, D);
            if (shift != 0) ++turned_calls;
            for (int64_t r = 0; r < NH * n; ++r)
                for (int64_t j = 0; j < half; ++j) {
                    double& a = qv[size_t(r * D + j)];
                    double& b = qv[size_t(r * D + j + half)];
                    const double c = std::cos(double(shift) * (*inv_freq_)[size_t(j)]), sn = std::sin(double(shift) * (*inv_freq_)[size_t(j)]);
                    const double a0 = a, b0 = b;
                    a = a0 * c - b0 * sn;
                    b = b0 * c + a0 * sn;
                }
        }
        for (int64_t h = 0; h < NH; ++h) {
            const int64_t g = h / R;
            const int32_t* p = pos.data() + (pol.per_row_positions() ? g * L : 0);
            for (int64_t i = 0; i < n; ++i) {
                const int64_t qp = input_pos + i;
                std::vector<double> s(size_t(T), -INFINITY);
                double m = -INFINITY;
                for (int64_t t = 0; t < T; ++t) {
                    if (p[t] < 0 || p[t] > qp || (window > 0 && p[t] <= qp - window)) continue;
                    double dot = 0;
                    for (int64_t d = 0; d < D; ++d) dot += qv[size_t((h * n + i) * D + d)] * Kv[size_t((g * T + t) * D + d)];
                    s[size_t(t)] = dot * double(scale);
                    m = std::max(m, s[size_t(t)]);
                }
                double den = 0;
                std::vector<double> out(size_t(D), 0.0);
                for (int64_t t = 0; t < T; ++t) {
                    if (s[size_t(t)] == -INFINITY) continue;
                    const double w = std::exp(s[size_t(t)] - m);
                    den += w;
                    for (int64_t d = 0; d < D; ++d) out[size_t(d)] += w * Vv[size_t((g * T + t) * D + d)];
                }
                for (int64_t d = 0; d < D; ++d) {
                    const double want = out[size_t(d)] / den, got = yv[size_t((h * n + i) * D + d)];
                    max_err = std::max(max_err, std::fabs(got - want));
                    max_ref = std::max(max_ref, std::fabs(want));
                }
            }
        }
    }
    int64_t shared_calls = 0, position_mismatches = 0, turned_calls = 0;
    double max_err = 0, max_ref = 0;

   private:
    std::multiset<int32_t> held(int layer) const {
        const KVPolicy& pol = cache_.layer(layer).policy();
        std::multiset<int32_t> s;
        for (int32_t p : pol.token_positions())
            if (p >= 0) s.insert(p);
        return s;
    }
    KVCache& cache_;
    int rerotated_;
    const std::vector<double>* inv_freq_ = nullptr;
    std::map<int, std::multiset<int32_t>> kept_;
};

// One chunk per cell, as cell_factor() plans a model with shared layers.
ChunkPlan one_chunk_per_cell(int64_t T) {
    ChunkPlan plan = test::fixture_chunk_plan(T);
    plan.cells.clear();
    for (size_t c = 0; c < plan.chunks.size(); ++c) plan.cells.push_back({c, c + 1});
    return plan;
}

// h2o with 8 slots on the full layer 2 (its reader, 5, sees exactly what h2o keeps there) and
// rings on the sliding layers 0 and 1 (read by 3 and 4): every shared call equals an f64
// attention over its source's held keys, and the positions it saw are the source's.
TEST(KvSharing, H2oSharedLayerSeesExactlyWhatItsSourceKeeps) {
  for (const char* name : kFixtures) {
    SCOPED_TRACE(name);
    Shared f(name);
    for (int l = 3; l < 6; ++l) ASSERT_TRUE(f.mf.config.kv_shared(l)) << l;
    ModelOptions opt;
    opt.rope = RopeMode::YARN;
    Transformer model(f.mf.config, f.mf.weights, opt);
    const Tensor ids = f.expected.tensors.at("input_ids.1");  // (1, 37)
    const int64_t T = ids.size(1);
    KVCacheConfig kc;
    kc.name = "h2o-default";
    kc.cache_length = 8;
    KVCache cache(kc, f.mf.config, Device{}, DType::F32, T);
    const ChunkPlan plan = one_chunk_per_cell(T);
    SharedCheck check(cache);
    const HeadResult res = test::drive_next_token(model, cache, ids, plan, check);
    EXPECT_EQ(check.shared_calls, int64_t(plan.chunks.size()) * 3);
    EXPECT_EQ(check.position_mismatches, 0);
    EXPECT_LE(check.max_err, 1e-5 * check.max_ref) << "max |y - f64 attention over the source's held keys| " << check.max_err;
    EXPECT_TRUE(std::isfinite(res.loss_sum[0]));
    // h2o evicted on layer 2 (8 slots of 37 positions), so layer 5 read a reduced cache.
    EXPECT_EQ(cache.layer(2).policy().current_length(), 8);
    for (int l = 3; l < 6; ++l) EXPECT_EQ(cache.layer(l).buffer().bytes(), 0u) << l;
  }
}

// Key re-rotation on the source: after h2o evicts on layer 2, its kept keys move to contiguous
// RoPE positions and its queries turn by the same shift; its reader (5) must turn its queries
// alike, so its output equals an f64 attention over the turned keys with queries turned by
// (kept tokens before the chunk) - input_pos.
TEST(KvSharing, KeyRerotationTurnsTheReadersQueriesLikeItsSources) {
    Shared f("gemma3_kv_shared");
    ModelOptions opt;
    opt.rope = RopeMode::YARN;
    Transformer model(f.mf.config, f.mf.weights, opt);
    const Tensor ids = f.expected.tensors.at("input_ids.1");  // (1, 37)
    const int64_t T = ids.size(1);
    KVCacheConfig kc;
    kc.name = "key-rerotation-h2o-default";
    kc.cache_length = 8;
    KVCache cache(kc, f.mf.config, Device{}, DType::F32, T);
    const ChunkPlan plan = one_chunk_per_cell(T);
    SharedCheck check(cache, 2);
    test::drive_next_token(model, cache, ids, plan, check);
    EXPECT_EQ(check.shared_calls, int64_t(plan.chunks.size()) * 3);
    EXPECT_GT(check.turned_calls, 0) << "h2o never evicted before a chunk on layer 2: nothing turned";
    EXPECT_LE(check.max_err, 1e-5 * check.max_ref) << "max |y - f64 attention with turned queries| " << check.max_err;
}

// A cell of several chunks runs layer-major: the source would be ahead of its reader.
TEST(KvSharing, RefusesASourceAheadOfItsReader) {
    Shared f;
    ModelOptions opt;
    opt.rope = RopeMode::YARN;
    Transformer model(f.mf.config, f.mf.weights, opt);
    const Tensor ids = f.expected.tensors.at("input_ids.1");
    KVCacheConfig kc;
    KVCache cache(kc, f.mf.config, Device{}, DType::F32, ids.size(1));
    SharedCheck check(cache);
    try {
        test::drive_next_token(model, cache, ids, test::fixture_chunk_plan(ids.size(1)), check);
        FAIL() << "expected a refusal";
    } catch (const Error& e) {
        const std::string m = std::string(e.what()) + " / " + e.hint();
        EXPECT_NE(m.find("layer 3 reads layer 1's keys and values for positions 0..5"), std::string::npos) << m;
        EXPECT_NE(m.find("one chunk per cell"), std::string::npos) << m;
    }
    EXPECT_EQ(cell_factor(f.mf.config), 0.0);
}

TEST(KvSharing, ConfigRefusesALaterOrDifferentSource) {
    HfModelFolder mf = load_hf_model_folder(fixture_dir());
    auto refusal = [&](int layer, int source) {
        ModelConfig c = mf.config;
        c.layer_specs[size_t(layer)].kv_source = source;
        try {
            c.validate("cfg");
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string();
    };
    EXPECT_NE(refusal(2, 4).find("layer 2 shares the keys and values of layer 4; expected an earlier layer"), std::string::npos);
    EXPECT_NE(refusal(5, 1).find("expected a source of the same attention type and window"), std::string::npos) << refusal(5, 1);
    EXPECT_EQ(refusal(4, 3), "");
}

// An attention that keeps no sources' K/V refuses a shared layer by name.
TEST(KvSharing, AttentionWithoutSharingRefusesByName) {
    class NoSharing final : public LayerAttention {
       public:
        void attend(int, const Tensor&, const Tensor&, const Tensor&, int64_t, float, int, Tensor&) override {}
    } att;
    Tensor q, y;
    try {
        att.attend_shared(4, 1, q, 0, 1.0f, 0, y);
        FAIL() << "expected a refusal";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("layer 4 reads the keys and values of layer 1 (cross-layer KV sharing)"), std::string::npos)
            << e.what();
    }
}

}  // namespace
}  // namespace kv
