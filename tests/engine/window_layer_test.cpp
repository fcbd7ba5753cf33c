// The cache understands layer types: a sliding-window layer keeps its window by rule (a ring of
// window - 1 + the largest chunk, no policy), the run's policy acts only on the full-attention
// layers. Checked on the tiny-gemma3 layout (window 64 in layers 0, 1, 3, 4; full in 2 and 5)
// against numbers written here from that description, and against a one-pass forward whose
// caches keep every position.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "engine/core/error.h"
#include "engine/kv/kv_cache.h"
#include "engine/kv/window_layer.h"
#include "engine/model/presets.h"
#include "engine/model/transformer.h"
#include "engine/run/run_plan.h"
#include "tests/support/test_support.h"

namespace kv {
namespace {

constexpr int64_t kWindow = 64;
// tiny-gemma3 from its description: layer l slides iff (l + 1) % 3 != 0; 1 KV head of 16.
bool sliding(int64_t l) { return (l + 1) % 3 != 0; }
constexpr int64_t kSlotBytes = 2 * 1 * 16 * 4;  // K and V of one token in one layer (f32)

// f64 activations: a ring changes the order of the softmax sums, which f32 shows at 1e-5.
std::unique_ptr<Transformer> f64_model(const ModelConfig& mc, uint64_t seed) {
    ModelOptions o;
    o.dtype = DType::F64;
    return std::make_unique<Transformer>(mc, random_weights(mc, seed, DType::F64), o);
}

Tensor random_ids(int64_t T, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> ids(static_cast<size_t>(T));
    for (auto& x : ids) x = int32_t(rng() % 200 + 10);
    return Tensor::from_i32({1, T}, ids);
}

// Feeds ids through the cache in chunks of `chunk` after a prefill of `prefill` tokens; returns
// the logits of every position (T, V).
std::vector<double> feed(const Transformer& m, KVCache& cache, const Tensor& ids, int64_t prefill, int64_t chunk) {
    const int64_t T = ids.size(1);
    std::vector<double> out;
    for (int64_t s = 0; s < T;) {
        const int64_t n = std::min(T - s, s == 0 ? prefill : chunk);
        const std::vector<double> z = m.forward(ids.slice(1, s, s + n).contiguous(), s, &cache).to_f64_vector();
        out.insert(out.end(), z.begin(), z.end());
        s += n;
    }
    return out;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want) {
    ASSERT_EQ(got.size(), want.size());
    double scale = 0, err = 0;
    for (size_t i = 0; i < want.size(); ++i) scale = std::max(scale, std::abs(want[i])), err = std::max(err, std::abs(got[i] - want[i]));
    EXPECT_LE(err, 1e-12 * scale) << "max |logit| " << scale;
}

TEST(WindowLayer, GemmaKvBytesAreWindowTimesLocalPlusLengthTimesGlobal) {
    const ModelConfig mc = preset_config("tiny-gemma3");
    Transformer model(mc, random_weights(mc, 11, DType::F32), ModelOptions{});
    auto model64 = f64_model(mc, 11);
    const int64_t T = 200;
    const Tensor ids = random_ids(T, 3);
    KVCacheConfig kc;  // dense-default: the full layers keep the whole sequence
    kc.max_chunk_size = 1;  // decode: a ring of exactly the window
    KVCache cache(kc, mc, Device{}, DType::F32, T);
    EXPECT_EQ(cache.min_cache_length(), kWindow);
    feed(model, cache, ids, kWindow, 1);

    int64_t local = 0, global = 0;
    for (int64_t l = 0; l < mc.num_layers; ++l) (sliding(l) ? local : global) += 1;
    ASSERT_EQ(local, 4);
    EXPECT_EQ(cache.buffer_bytes(), size_t((kWindow * local + T * global) * kSlotBytes));
    for (int l = 0; l < mc.num_layers; ++l) {
        const KVPolicy& p = cache.layer(l).policy();
        EXPECT_EQ(std::string(p.name()), sliding(l) ? "window" : "dense") << l;
        if (!sliding(l)) continue;
        // The ring holds exactly the last window of positions.
        std::set<int32_t> kept(p.token_positions().begin(), p.token_positions().begin() + p.current_length());
        std::set<int32_t> want;
        for (int64_t t = T - kWindow; t < T; ++t) want.insert(int32_t(t));
        EXPECT_EQ(kept, want) << "layer " << l;
    }

    // Same logits as one pass through caches that keep every position (the window is masked
    // either way, so what the ring dropped was never visible).
    KVCache ring64(kc, mc, Device{}, DType::F64, T);
    const std::vector<double> got64 = feed(*model64, ring64, ids, kWindow, 1);
    KVCacheConfig all;
    KVCache full(all, mc, Device{}, DType::F64, T);
    expect_close(got64, feed(*model64, full, ids, T, T));
}

// A byte budget counts each layer's real bytes: the 4 windowed layers hold rings of 64 - 1 + 32
// + 4 (the plan's snap) = 99 slots whatever the length, so the 2 full layers get what is left:
// (100 KiB - 4 x 99 x 128 B) / (2 x 128 B) = 202 slots, and the cache holds exactly the budget.
TEST(WindowLayer, AByteBudgetGivesTheFullLayersWhatTheRingsLeave) {
    const ModelConfig mc = preset_config("tiny-gemma3");
    RunConfig c;
    c.mode = "eval_long";
    c.data.seq_length = 512;
    c.driver.chunk_size = 32;
    c.kv_cache.name = "h2o-default";
    c.kv_cache.budget_bytes = 100 * 1024;
    const KVCacheConfig kc = run_cache_config(c, mc, DType::F32);
    const int64_t ring = kWindow - 1 + 32 + kChunkSnapTokens;
    ASSERT_EQ(ring, 99);
    EXPECT_EQ(kc.cache_length, (100 * 1024 - 4 * ring * kSlotBytes) / (2 * kSlotBytes));
    EXPECT_EQ(kc.cache_length, 202);
    Transformer model(mc, random_weights(mc, 5, DType::F32), ModelOptions{});
    KVCache cache(kc, mc, Device{}, DType::F32, 512);
    feed(model, cache, random_ids(512, 4), 42, 32);  // 42 + 5 x 32 fills the 202 slots exactly
    EXPECT_EQ(cache.buffer_bytes(), size_t(100 * 1024));
    // A budget under the rings alone names them.
    c.kv_cache.budget_bytes = 4 * ring * kSlotBytes - 1;
    try {
        (void)run_cache_config(c, mc, DType::F32);
        FAIL() << "expected a refusal";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("less than the windowed layers' rings alone (396 slots"), std::string::npos) << e.what();
    }
}

TEST(WindowLayer, H2oEvictsOnlyOnFullAttentionLayers) {
    const ModelConfig mc = preset_config("tiny-gemma3");
    Transformer model(mc, random_weights(mc, 5, DType::F32), ModelOptions{});
    const int64_t T = 256, L = 96, chunk = 16;
    const Tensor ids = random_ids(T, 9);
    KVCacheConfig kc;
    kc.name = "h2o-default";
    kc.cache_length = L;
    kc.max_chunk_size = chunk;
    KVCache cache(kc, mc, Device{}, DType::F32, T);
    const int64_t ring = kWindow - 1 + chunk;  // 79 slots: window - 1 keys before a chunk of 16
    EXPECT_EQ(cache.min_cache_length(), ring);
    feed(model, cache, ids, 64, chunk);  // 64 + 2 chunks fill h2o's 96 slots exactly

    EXPECT_EQ(cache.buffer_bytes(), size_t((4 * ring + 2 * L) * kSlotBytes));
    for (int l = 0; l < mc.num_layers; ++l) {
        const KVPolicy& p = cache.layer(l).policy();
        const std::vector<int32_t>& pos = p.token_positions();
        if (sliding(l)) {
            EXPECT_EQ(std::string(p.name()), "window") << l;
            EXPECT_TRUE(p.slot_scores().empty()) << "a window layer has no eviction scores, layer " << l;
            std::set<int32_t> kept(pos.begin(), pos.begin() + p.current_length()), want;
            for (int64_t t = T - ring; t < T; ++t) want.insert(int32_t(t));
            EXPECT_EQ(kept, want) << "layer " << l;
        } else {
            EXPECT_EQ(std::string(p.name()), "h2o") << l;
            EXPECT_EQ(p.current_length(), L) << l;
            // h2o chose: it kept some token older than the last L (a heavy hitter), so it
            // evicted by score, not by age.
            ASSERT_TRUE(p.per_row_positions());
            const int32_t oldest = *std::min_element(pos.begin(), pos.begin() + L);
            EXPECT_LT(oldest, T - L) << "layer " << l;
        }
    }
}

TEST(WindowLayer, RingRefusesAChunkThatWouldDropVisibleKeys) {
    // After the ring is full, a chunk longer than L - window + 1 would overwrite keys its first
    // query still sees: refused by name, never silently wrong.
    std::unique_ptr<KVPolicy> p = make_window_policy(10, 1, 8);
    p->reset(1);
    p->prefill(10, InsertFeatures{});
    EXPECT_EQ(p->max_forward_length(), 3);
    EXPECT_NO_THROW(p->prepare(3));
    try {
        p->prepare(4);
        ADD_FAILURE() << "a chunk of 4 was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("window - 1 keys"), std::string::npos) << e.what();
    }
    const SlotPlan plan = p->prepare(3);  // positions 10, 11, 12 overwrite the oldest (0, 1, 2)
    EXPECT_EQ(plan.targets, (std::vector<int32_t>{0, 1, 2}));
}

}  // namespace
}  // namespace kv
