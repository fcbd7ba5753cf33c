// The cache inside a model: dense with one chunk equals the plain forward; chunked dense
// equals a single pass; replaying the log rebuilds every layer output bit for bit; paged and
// offloaded storage give bit-identical outputs to the plain buffer; bad options fail clearly.
#include <gtest/gtest.h>

#include <functional>

#include "engine/core/error.h"
#include "engine/driver/long_context.h"
#include "engine/kv/kv_cache.h"
#include "engine/memory/memory_tracker.h"
#include "engine/model/presets.h"
#include "engine/model/transformer.h"
#include "tests/support/test_support.h"

namespace kv::test {
namespace {

struct TinyModel {
    ModelConfig cfg = preset_config("tiny");
    Transformer model{cfg, random_weights(cfg, 3, DType::F32), ModelOptions{}};
};

TinyModel& tiny() {
    static TinyModel m;
    // long_context_forward narrows the shared model's RoPE width to its sequence; restore it so no
    // case depends on which ran before it (scripts/sanitize.sh runs them all in one process).
    m.model.set_context_width(m.cfg.max_position_embeddings);
    return m;
}

Tensor random_ids(int64_t B, int64_t T, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<int32_t> v((size_t)(B * T));
    for (auto& x : v) x = int32_t(rng() % 256);
    return Tensor::from_i32({B, T}, v);
}

// Every layer's output for every chunk, chunk by chunk (layer-major within a chunk).
// replay: per layer, the plans to commit instead of the policy's (ChunkInput::replay).
std::vector<std::vector<float>> run_chunks(Transformer& m, KVCache& cache, const Tensor& ids, const std::vector<int64_t>& chunks,
                                           const std::vector<std::vector<SlotPlan>>* replay = nullptr) {
    std::vector<std::vector<float>> outs;
    int64_t P = 0;
    for (int64_t n : chunks) {
        Tensor x = m.embed(ids.slice(1, P, P + n));
        ChunkCall call(cache, ChunkInput{.replay = replay});
        for (int l = 0; l < int(m.config().num_layers); ++l) {
            x = m.block(l, x, P, call);
            outs.push_back(x.to_f32_vector());
        }
        P += n;
    }
    return outs;
}

KVCacheConfig cache_cfg(const std::string& name, int64_t L) {
    KVCacheConfig c;
    c.name = name;
    c.cache_length = L;
    return c;
}

TEST(KVModel, DenseOneChunkEqualsPlainForward) {
    TinyModel& t = tiny();
    Tensor ids = random_ids(2, 37, 1);
    Tensor plain = t.model.forward(ids);
    KVCache cache(cache_cfg("dense-default", 0), t.cfg, Device{}, DType::F32, 37);
    Tensor x = t.model.embed(ids);
    for (int l = 0; l < int(t.cfg.num_layers); ++l) x = t.model.block(l, x, 0, cache);
    Comparison c = compare(t.model.lm_head(t.model.final_norm(x)), plain);
    EXPECT_LE(c.rel_err, 1e-6) << c.report;
}

TEST(KVModel, ChunkedDenseEqualsSinglePass) {
    TinyModel& t = tiny();
    Tensor ids = random_ids(2, 100, 2);
    Tensor plain = t.model.forward(ids);
    for (auto chunks : std::vector<std::vector<int64_t>>{{40, 20, 20, 20}, {10, 1, 1, 33, 55}, {99, 1}}) {
        KVCache cache(cache_cfg("dense-default", 0), t.cfg, Device{}, DType::F32, 100);
        std::vector<Tensor> logits;
        int64_t P = 0;
        for (int64_t n : chunks) {
            Tensor x = t.model.embed(ids.slice(1, P, P + n));
            for (int l = 0; l < int(t.cfg.num_layers); ++l) x = t.model.block(l, x, P, cache);
            Comparison c = compare(t.model.lm_head(t.model.final_norm(x)), plain.slice(1, P, P + n).contiguous());
            EXPECT_LE(c.rel_err, 1e-5) << "chunk at " << P << "\n" << c.report;
            P += n;
        }
    }
}

TEST(KVModel, LongContextDriverDenseEqualsPlainLoss) {
    // cell -> layer -> chunk order with a dense cache gives the plain forward's loss.
    TinyModel& t = tiny();
    const int64_t T = 300;
    Tensor ids = random_ids(1, T, 3);
    Tensor plain = t.model.forward(ids);
    std::vector<float> z = plain.to_f32_vector();
    double want = 0;
    std::vector<int64_t> ids_v = ids.to_i64_vector();
    for (int64_t p = 0; p + 1 < T; ++p) {
        const float* zr = z.data() + p * kByteVocab;
        double m = -INFINITY, s = 0;
        for (int64_t v = 0; v < kByteVocab; ++v) m = std::max(m, double(zr[v]));
        for (int64_t v = 0; v < kByteVocab; ++v) s += std::exp(double(zr[v]) - m);
        want += m + std::log(s) - zr[ids_v[size_t(p + 1)]];
    }
    want /= double(T - 1);
    ChunkPlanOptions po;
    po.chunk_size = 32;
    po.cell_factor = cell_factor(t.cfg);
    po.chunks_per_cell_multiplier = 0.5;
    ChunkPlan plan = plan_chunks(T, {64, 64}, po);
    ASSERT_GT(plan.cells.size(), 2u);  // several cells, so the loop order matters
    KVCache cache(cache_cfg("dense-default", 0), t.cfg, Device{}, DType::F32, T);
    HeadSpec hs;
    hs.kind = HeadKind::NEXT_TOKEN;
    hs.T = T;
    hs.token_targets.assign(size_t(T), -100);
    for (int64_t p = 0; p + 1 < T; ++p) hs.token_targets[size_t(p)] = int32_t(ids_v[size_t(p + 1)]);
    HeadResult res;
    long_context_forward(t.model, cache, ids, plan, hs, res);
    EXPECT_NEAR(res.loss_sum[0] / res.count[0], want, 1e-5 * std::fabs(want));
}

// The per-token loss record (evaluation's sample_tokens): entry t is the f64 cross-entropy of
// the plain forward's logits at t against target t, NaN where no target; with sparse targets
// (a scored span, as repeat/RULER) over several chunks and cells, and B = 2.
TEST(KVModel, PerTokenLossMatchesPlainForwardCrossEntropy) {
    TinyModel& t = tiny();
    const int64_t B = 2, T = 150;
    Tensor ids = random_ids(B, T, 5);
    const std::vector<float> z = t.model.forward(ids).to_f32_vector();  // (B, T, V)
    const std::vector<int64_t> ids_v = ids.to_i64_vector();
    HeadSpec hs;
    hs.kind = HeadKind::NEXT_TOKEN;
    hs.B = B;
    hs.T = T;
    hs.record_token_loss = true;
    hs.token_targets.assign(size_t(B * T), -100);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t p = 0; p + 1 < T; ++p)
            if (b == 0 || (p >= 70 && p < 110)) hs.token_targets[size_t(b * T + p)] = int32_t(ids_v[size_t(b * T + p + 1)]);
    ChunkPlanOptions po;
    po.chunk_size = 32;
    po.cell_factor = cell_factor(t.cfg);
    po.chunks_per_cell_multiplier = 0.5;
    const ChunkPlan plan = plan_chunks(T, {64, 64}, po);
    KVCache cache(cache_cfg("dense-default", 0), t.cfg, Device{}, DType::F32, T);
    HeadResult res;
    long_context_forward(t.model, cache, ids, plan, hs, res);
    ASSERT_EQ(res.token_loss.size(), size_t(B * T));
    for (int64_t b = 0; b < B; ++b) {
        double finite_sum = 0;
        for (int64_t p = 0; p < T; ++p) {
            const float got = res.token_loss[size_t(b * T + p)];
            const int32_t y = hs.token_targets[size_t(b * T + p)];
            if (y < 0) {
                EXPECT_TRUE(std::isnan(got)) << "b " << b << " p " << p << " has no target";
                continue;
            }
            const float* zr = z.data() + (b * T + p) * kByteVocab;
            double m = -INFINITY, s = 0;
            for (int64_t v = 0; v < kByteVocab; ++v) m = std::max(m, double(zr[v]));
            for (int64_t v = 0; v < kByteVocab; ++v) s += std::exp(double(zr[v]) - m);
            const double want = m + std::log(s) - zr[y];
            EXPECT_NEAR(got, want, 1e-4 * std::max(1.0, std::fabs(want))) << "b " << b << " p " << p;
            finite_sum += got;
        }
        EXPECT_NEAR(finite_sum, res.loss_sum[size_t(b)], 1e-4 * res.loss_sum[size_t(b)]);
    }
    // Classification: one entry, the label's loss at the last position.
    HeadSpec cs;
    cs.kind = HeadKind::CLASS_ON_LOGITS;
    cs.B = B;
    cs.T = T;
    cs.record_token_loss = true;
    cs.class_tokens = {65, 66, 67};
    cs.labels = {1, 2};
    HeadResult cr;
    long_context_forward(t.model, cache, ids, plan, cs, cr);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t p = 0; p < T; ++p) {
            if (p == T - 1) EXPECT_NEAR(cr.token_loss[size_t(b * T + p)], cr.loss_sum[size_t(b)], 1e-6);
            else EXPECT_TRUE(std::isnan(cr.token_loss[size_t(b * T + p)]));
        }
}

// The classification heads on the loss op against f64 log-softmax of the plain forward's
// last-position logits: over the class tokens' columns (on logits), and through a linear head on
// the last hidden state (seq_classification, weight and bias made here).
TEST(KVModel, ClassificationHeadsMatchLogSoftmaxReference) {
    TinyModel& t = tiny();
    const int64_t B = 2, T = 96, E = t.cfg.hidden_size;
    Tensor ids = random_ids(B, T, 11);
    ChunkPlanOptions po;
    po.chunk_size = 32;
    po.cell_factor = cell_factor(t.cfg);
    ChunkPlan plan = plan_chunks(T, {32, 32}, po);
    auto log_softmax = [](const std::vector<double>& z) {
        double m = -INFINITY, s = 0;
        for (double v : z) m = std::max(m, v);
        for (double v : z) s += std::exp(v - m);
        std::vector<double> r;
        for (double v : z) r.push_back(v - m - std::log(s));
        return r;
    };
    {  // on logits
        std::vector<float> z = t.model.forward(ids).to_f32_vector();  // (B, T, V)
        HeadSpec hs;
        hs.kind = HeadKind::CLASS_ON_LOGITS;
        hs.T = T;
        hs.class_tokens = {65, 66, 67, 200};
        hs.labels = {2, 0};
        KVCache cache(cache_cfg("dense-default", 0), t.cfg, Device{}, DType::F32, T);
        HeadResult res;
        res.init(B);
        long_context_forward(t.model, cache, ids, plan, hs, res);
        for (int64_t b = 0; b < B; ++b) {
            std::vector<double> c;
            for (int32_t tok : hs.class_tokens) c.push_back(z[size_t((b * T + T - 1) * kByteVocab + tok)]);
            const std::vector<double> lp = log_softmax(c);
            for (size_t k = 0; k < c.size(); ++k) EXPECT_NEAR(res.class_logprob[size_t(b) * c.size() + k], lp[k], 1e-5);
            EXPECT_NEAR(res.loss_sum[size_t(b)], -lp[size_t(hs.labels[size_t(b)])], 1e-5);
            EXPECT_EQ(res.prediction[size_t(b)], int32_t(std::max_element(lp.begin(), lp.end()) - lp.begin()));
        }
    }
    {  // linear head on the last hidden state
        const int64_t C = 3;
        std::vector<float> w(size_t(C * E)), bias = {0.25f, -0.5f, 0.1f};
        for (size_t i = 0; i < w.size(); ++i) w[i] = float(std::sin(0.37 * double(i))) * 0.2f;
        HeadSpec hs;
        hs.kind = HeadKind::SEQ_CLASS;
        hs.T = T;
        hs.class_weight = Tensor::from_f32({C, E}, w);
        hs.class_bias = Tensor::from_f32({C}, bias);
        hs.labels = {1, 2};
        KVCache cache(cache_cfg("dense-default", 0), t.cfg, Device{}, DType::F32, T);
        HeadResult res;
        res.init(B);
        long_context_forward(t.model, cache, ids, plan, hs, res);
        // The reference hidden state: the plain forward's blocks and final norm, in f64 from there.
        Tensor x = t.model.embed(ids);
        PlainAttention att;
        for (int l = 0; l < int(t.cfg.num_layers); ++l) x = t.model.block(l, x, 0, att);
        std::vector<float> hv = t.model.final_norm(x).to_f32_vector();
        for (int64_t b = 0; b < B; ++b) {
            std::vector<double> c;
            for (int64_t k = 0; k < C; ++k) {
                double sacc = bias[size_t(k)];
                for (int64_t e = 0; e < E; ++e) sacc += double(w[size_t(k * E + e)]) * hv[size_t((b * T + T - 1) * E + e)];
                c.push_back(sacc);
            }
            const std::vector<double> lp = log_softmax(c);
            for (int64_t k = 0; k < C; ++k) EXPECT_NEAR(res.class_logprob[size_t(b * C + k)], lp[size_t(k)], 1e-5);
            EXPECT_NEAR(res.loss_sum[size_t(b)], -lp[size_t(hs.labels[size_t(b)])], 1e-5);
        }
    }
}

class KVReplay : public testing::TestWithParam<std::string> {};

TEST_P(KVReplay, LogRebuildsEveryLayerOutputBitForBit) {
    TinyModel& t = tiny();
    KVCacheConfig kc = cache_cfg(GetParam(), 48);
    kc.grace_period = GetParam().find("grace") != std::string::npos ? 4 : 0;
    if (kc.grace_period) kc.name = GetParam().substr(0, GetParam().find("+grace"));
    Tensor ids = random_ids(2, 160, 4);
    const std::vector<int64_t> chunks = {48, 16, 8, 16, 16, 8, 16, 16, 16};
    KVCache live(kc, t.cfg, Device{}, DType::F32, 160);
    live.set_replay_logging(true);
    auto a = run_chunks(t.model, live, ids, chunks);
    KVCache replay(kc, t.cfg, Device{}, DType::F32, 160);
    std::vector<std::vector<SlotPlan>> plans;
    for (int l = 0; l < live.num_layers(); ++l) plans.push_back(live.layer(l).replay_log().plans());
    auto b = run_chunks(t.model, replay, ids, chunks, &plans);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << GetParam() << ": output " << i << " differs";
    // And the encoded log round-trips.
    for (const auto& p : live.layer(1).replay_log().plans()) {
        std::vector<uint8_t> blob = encode_plan(p);
        SlotPlan q = decode_plan(blob.data(), blob.size());
        EXPECT_EQ(q.targets, p.targets);
        EXPECT_EQ(q.move_from, p.move_from);
        EXPECT_EQ(q.input_pos, p.input_pos);
    }
}

INSTANTIATE_TEST_SUITE_P(Policies, KVReplay,
                         testing::Values("lastrec-default", "streaming-q8", "h2o-default", "h2o-q8", "h2o-default+grace",
                                         "h2o-orig-default", "h2o-vlen-q4", "qh2o-q8+grace", "qh2o-vlen-q8_0", "tova-default",
                                         "snapkv-default", "knorm-q4"),
                         [](const testing::TestParamInfo<std::string>& i) {
                             std::string s = i.param;
                             for (char& c : s)
                                 if (!isalnum((unsigned char)c)) c = '_';
                             return s;
                         });

TEST(KVModel, PagedAndOffloadedStorageAreBitIdentical) {
    TinyModel& t = tiny();
    Tensor ids = random_ids(2, 150, 5);
    const std::vector<int64_t> chunks = {40, 10, 10, 30, 10, 20, 10, 20};
    for (std::string name : {"h2o-default", "lastrec-default", "qh2o-q8", "dense-default", "h2o-kivi2"}) {
        const int64_t L = name.rfind("dense", 0) == 0 ? 150 : 40;
        auto base_cfg = cache_cfg(name, L);
        KVCache plain(base_cfg, t.cfg, Device{}, DType::F32, 150);
        auto want = run_chunks(t.model, plain, ids, chunks);
        std::vector<std::pair<std::string, KVCacheConfig>> variants;
        if (name.find("q8") == std::string::npos && name.find("kivi") == std::string::npos) {  // paged: full precision only
            KVCacheConfig p = base_cfg;
            p.paged_block_size = 16;
            variants.push_back({"paged", p});
        }
        KVCacheConfig o = base_cfg;
        o.cpu_offload = true;
        variants.push_back({"offload", o});
        for (auto& [what, kc] : variants) {
            KVCache cache(kc, t.cfg, Device{}, DType::F32, 150);
            auto got = run_chunks(t.model, cache, ids, chunks);
            for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << name << " " << what << ": output " << i;
        }
    }
}

TEST(KVModel, OffloadAccountsParkedLayersUnderKvOffload) {
    TinyModel& t = tiny();
    MemoryTracker tr;
    MemoryTrackerScope scope(tr);
    KVCacheConfig kc = cache_cfg("lastrec-default", 32);
    kc.cpu_offload = true;
    KVCache cache(kc, t.cfg, Device{}, DType::F32, 64);
    run_chunks(t.model, cache, random_ids(1, 64, 6), {32, 16, 16});
    // Two layers, both parked in the host pool (kv_offload); on the device the last layer is
    // resident and layer 0 is already being prefetched for the next chunk: two layers' K and V.
    const int64_t layer_bytes = 2 * t.cfg.num_kv_heads * 32 * t.cfg.head_dim * 4;
    ASSERT_EQ(t.cfg.num_layers, 2);
    EXPECT_EQ(tr.current(Device{}, MemCategory::KV_CACHE), 2 * layer_bytes);
    EXPECT_GE(tr.current(Device{}, MemCategory::KV_OFFLOAD), 2 * layer_bytes);
    // The end of a pass drops the prefetch and parks the resident layer.
    cache.flush();
    EXPECT_EQ(tr.current(Device{}, MemCategory::KV_CACHE), 0);
}

TEST(KVModel, OffloadPrefetchServesEveryRestoreAfterTheFirstChunk) {
    TinyModel& t = tiny();
    for (const char* name : {"lastrec-default", "h2o-q8", "h2o-q4"}) {
        KVCacheConfig kc = cache_cfg(name, 32);
        kc.cpu_offload = true;
        KVCache cache(kc, t.cfg, Device{}, DType::F32, 96);
        const std::vector<int64_t> chunks{32, 16, 16, 16, 16};
        run_chunks(t.model, cache, random_ids(1, 96, 7), chunks);
        // Chunk 0 prefills (nothing parked yet); every later (chunk, layer) restore finds its
        // state already copied by the prefetch started while the layer before computed.
        const auto [hits, misses] = cache.offload_restores();
        EXPECT_EQ(hits, int64_t(chunks.size() - 1) * t.cfg.num_layers) << name;
        EXPECT_EQ(misses, 0) << name;
    }
}

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "<no error>";
}

TEST(KVErrors, BadOptionsGiveClearMessages) {
    TinyModel& t = tiny();
    auto make = [&](KVCacheConfig kc) { KVCache c(kc, t.cfg, Device{}, DType::F32, 64); };
    EXPECT_NE(error_of([&] { make(cache_cfg("bogus-default", 16)); }).find("is not {policy}-{buffer}"), std::string::npos);
    EXPECT_NE(error_of([&] { make(cache_cfg("h2o-q5", 16)); }).find("unknown buffer 'q5'"), std::string::npos);
    EXPECT_NE(error_of([&] { make(cache_cfg("h2o-default", 0)); }).find("cache_length is required"), std::string::npos);
    EXPECT_NE(error_of([&] { make(cache_cfg("qh2o-default", 16)); }).find("needs a quantized buffer"), std::string::npos);
    KVCacheConfig g = cache_cfg("h2o-default", 16);
    g.grace_period = 16;
    EXPECT_NE(error_of([&] { make(g); }).find("grace_period: 16 must be smaller than the cache length 16"), std::string::npos);
    // 4-bit blocks: q4_0 needs 32-value blocks; tiny has head size 16 and 2 heads (32) -> ok,
    // but nf4 needs 64: an odd block for this model.
    EXPECT_NE(error_of([&] { make(cache_cfg("h2o-nf4", 16)); }).find("cannot store head size 16"), std::string::npos);
    // A chunk larger than allowed: h2o with max_chunk_size 4 refuses a chunk of 8.
    KVCacheConfig mc = cache_cfg("h2o-default", 16);
    mc.max_chunk_size = 4;
    KVCache cache(mc, t.cfg, Device{}, DType::F32, 64);
    Tensor ids = random_ids(1, 24, 7);
    Tensor x = t.model.embed(ids.slice(1, 0, 16));
    t.model.block(0, x, 0, cache);
    Tensor x2 = t.model.embed(ids.slice(1, 16, 24));
    EXPECT_NE(error_of([&] { t.model.block(0, x2, 16, cache); }).find("a chunk of 8 tokens is not allowed here"), std::string::npos);
    // A chunk straddling the moment the cache becomes full.
    KVCache lr(cache_cfg("lastrec-default", 16), t.cfg, Device{}, DType::F32, 64);
    t.model.block(0, t.model.embed(ids.slice(1, 0, 10)), 0, lr);
    EXPECT_NE(error_of([&] { t.model.block(0, t.model.embed(ids.slice(1, 10, 18)), 10, lr); }).find("straddles"), std::string::npos);
}

}  // namespace
}  // namespace kv::test
