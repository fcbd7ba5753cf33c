// Equal-byte budgets (--kv_cache.budget_bytes / budget_ratio, engine/kv/kv_config.h): the cache
// length a budget gives each policy x buffer, against slot bytes written out here from the
// formats' definitions; the refusals; and asymmetric K/V buffers (k8v4, k8v4_0, kfp8vfp4)
// storing keys and values exactly as the symmetric buffers of their two formats do.
#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "engine/core/error.h"
#include "engine/kv/buffers/buffer_common.h"
#include "engine/kv/buffers/quant_attention.h"
#include "engine/kv/kv_cache.h"
#include "engine/memory/memory_tracker.h"
#include "engine/model/presets.h"
#include "engine/run/run_plan.h"
#include "kv_test_util.h"
#include "tests/support/test_support.h"

namespace kv::test {
namespace {

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

// The tiny preset with head size 32, so every block format stores one head per row.
ModelConfig model32() {
    ModelConfig m = preset_config("tiny");
    m.head_dim = 32;
    return m;
}

KVCacheConfig budget_cfg(const std::string& name, int64_t bytes) {
    KVCacheConfig c;
    c.name = name;
    c.budget_bytes = bytes;
    return c;
}

// Bytes of one slot (K and V, all G heads) per buffer, from the row layouts: f32 4 D, bf16 2 D;
// q8 D + 8, q4 D/2 + 8 (scale, zero point); q8_0 34 per 32; fp8 D + 4; nvfp4 D/2 + D/16 + 4.
TEST(KVBudget, LengthIsTheBudgetOverTheExactSlotBytes) {
    const ModelConfig m = model32();
    const int64_t N = m.num_layers, G = m.num_kv_heads, D = m.head_dim;
    ASSERT_GE(D, 32);
    ASSERT_EQ(D % 32, 0);
    struct Want {
        std::string buffer;
        int64_t slot;
    };
    const std::vector<Want> wants = {{"default", 2 * G * D * 4},
                                     {"bf16", 2 * G * D * 2},
                                     {"q8", 2 * G * (D + 8)},
                                     {"q4", 2 * G * (D / 2 + 8)},
                                     {"q8_0", 2 * G * (D / 32 * 34)},
                                     {"fp8_e4m3", 2 * G * (D + 4)},
                                     {"nvfp4", 2 * G * (D / 2 + D / 16 + 4)},
                                     {"mxfp4", 2 * G * (D / 32 * 17)},
                                     {"k8v4", G * ((D + 8) + (D / 2 + 8))},
                                     {"kfp8vfp4", G * ((D + 4) + (D / 2 + D / 16 + 4))}};
    for (const Want& w : wants)
        for (int64_t budget : {int64_t(1) << 20, int64_t(3000000), N * w.slot * 37 + N * w.slot - 1}) {
            const std::string name = "h2o-" + w.buffer;
            EXPECT_EQ(kv_slot_bytes(budget_cfg(name, budget), G, D, DType::F32), w.slot) << name;
            const KVCacheConfig c = apply_kv_budget(budget_cfg(name, budget), N, G, D, DType::F32, 0);
            EXPECT_EQ(c.cache_length, budget / (N * w.slot)) << name << " budget " << budget;
            EXPECT_EQ(c.budget_bytes, 0) << "the budget is consumed";
            EXPECT_EQ(apply_kv_budget(c, N, G, D, DType::F32, 0).cache_length, c.cache_length) << "applying twice";
            // The cache built from the budget has that length in every layer.
            KVCache cache(budget_cfg(name, budget), m, Device{}, DType::F32, 0);
            EXPECT_EQ(cache.min_cache_length(), c.cache_length) << name;
        }
    // One scale per token over all heads: rows of G D values.
    KVCacheConfig t = budget_cfg("h2o-fp8_e4m3", 1 << 20);
    t.scale_granularity = "token";
    EXPECT_EQ(kv_slot_bytes(t, G, D, DType::F32), 2 * (G * D + 4));
    // A ratio of the dense cache (seq_length tokens of f32): half of it for q8 holds
    // floor(0.5 * 4 D * seq / (D + 8)) slots.
    KVCacheConfig r;
    r.name = "h2o-q8";
    r.budget_ratio = 0.5;
    const int64_t seq = 1000;
    EXPECT_EQ(apply_kv_budget(r, N, G, D, DType::F32, seq).cache_length, (N * seq * 2 * G * D * 4 / 2) / (N * 2 * G * (D + 8)));
}

TEST(KVBudget, RefusalsNameTheOptionAndWhatFits) {
    const ModelConfig m = model32();
    const int64_t N = m.num_layers, G = m.num_kv_heads, D = m.head_dim;
    const int64_t slot = N * 2 * G * D * 4;
    std::string msg = error_of([&] { apply_kv_budget(budget_cfg("h2o-default", slot - 1), N, G, D, DType::F32, 0); });
    EXPECT_NE(msg.find("--kv_cache.budget_bytes"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(slot)), std::string::npos) << msg;  // what one slot takes
    msg = error_of([&] { apply_kv_budget(budget_cfg("dense-default", slot * 99), N, G, D, DType::F32, 100); });
    EXPECT_NE(msg.find("keeps every token"), std::string::npos) << msg;
    EXPECT_EQ(apply_kv_budget(budget_cfg("dense-default", slot * 100), N, G, D, DType::F32, 100).cache_length, 0);  // fits: unchanged
    msg = error_of([&] { apply_kv_budget(budget_cfg("h2o-kivi2", 1 << 20), N, G, D, DType::F32, 0); });
    EXPECT_NE(msg.find("residual pool"), std::string::npos) << msg;
    KVCacheConfig both = budget_cfg("h2o-q8", 1 << 20);
    both.cache_length = 32;
    msg = error_of([&] { apply_kv_budget(both, N, G, D, DType::F32, 0); });
    EXPECT_NE(msg.find("--kv_cache.cache_length"), std::string::npos) << msg;
    KVCacheConfig ratio;
    ratio.name = "h2o-q8";
    ratio.budget_ratio = 0.5;
    msg = error_of([&] { apply_kv_budget(ratio, N, G, D, DType::F32, 0); });
    EXPECT_NE(msg.find("--kv_cache.budget_ratio"), std::string::npos) << msg;
}

// A run's cache configuration takes the budgeted length, so its chunk plan fills exactly that
// many slots first (h2o-q8 at a quarter of the dense f32 bytes of 512 tokens).
TEST(KVBudget, RunPlanUsesTheBudgetedLength) {
    const ModelConfig m = model32();
    const int64_t N = m.num_layers, G = m.num_kv_heads, D = m.head_dim;
    RunConfig c;
    c.mode = "eval_long";
    c.data.seq_length = 512;
    c.kv_cache.name = "h2o-q8";
    c.kv_cache.budget_ratio = 0.25;
    c.driver.chunk_size = 32;
    const KVCacheConfig kc = run_cache_config(c, m, DType::F32);
    const int64_t L = (N * 512 * 2 * G * D * 4 / 4) / (N * 2 * G * (D + 8));
    EXPECT_EQ(kc.cache_length, L);
    const std::vector<int64_t> chunks = run_chunk_plan(c, kc, m, 512, 0).chunks;
    ASSERT_FALSE(chunks.empty());
    EXPECT_EQ(chunks[0], L) << "the first chunk fills the budgeted cache";
    EXPECT_TRUE(run_config_problems(c).empty()) << "a budget stands for the cache length";
}

Tensor random_kv(int64_t B, int64_t G, int64_t n, int64_t D, std::mt19937_64& rng) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> v(size_t(B * G * n * D));
    for (float& x : v) x = nd(rng);
    return Tensor::from_f32({B, G, n, D}, v);
}

// k8v4 = q8 keys + q4 values: after a write-back the stored keys are byte for byte those of a
// q8 buffer and the values those of a q4 buffer fed the same tokens (likewise the other pairs),
// and the memory tracker holds exactly both row sizes.
TEST(KVBudget, AsymmetricBuffersStoreKeysAndValuesInTheirOwnFormats) {
    struct Pair {
        std::string buffer, keys, values;
    };
    for (const Pair& pr : {Pair{"k8v4", "q8", "q4"}, Pair{"k8v4_0", "q8_0", "q4_0"}, Pair{"kfp8vfp4", "fp8_e4m3", "nvfp4"}}) {
        const int64_t B = 2, G = 2, L = 24, D = 32;
        auto build = [&](const std::string& b, MemoryTracker* t) {
            (void)t;
            KVCacheConfig c;
            c.name = "dense-" + b;
            BufferParams p;
            p.L = L, p.G = G, p.D = D;
            auto shared = make_buffer_shared(c, L, G, D, Device{}, DType::F32);
            auto buf = make_buffer(c, p, shared);
            std::mt19937_64 rng(seed_for("asymmetric " + pr.buffer));
            buf->prefill(random_kv(B, G, L, D, rng), random_kv(B, G, L, D, rng));
            buf->flush();
            return std::make_pair(std::move(buf), shared);
        };
        MemoryTracker tracker;
        std::pair<std::unique_ptr<KVBuffer>, std::shared_ptr<BufferShared>> a;
        {
            MemoryTrackerScope scope(tracker);
            a = build(pr.buffer, &tracker);
        }
        auto k = build(pr.keys, nullptr), v = build(pr.values, nullptr);
        auto bytes = [](const Tensor& t) {
            const Tensor c = t.contiguous();
            return std::vector<uint8_t>(c.data<uint8_t>(), c.data<uint8_t>() + c.numel());
        };
        EXPECT_EQ(a.first->name(), pr.buffer);
        EXPECT_EQ(bytes(*a.first->storage_tensors()[0]), bytes(*k.first->storage_tensors()[0])) << pr.buffer << " keys";
        EXPECT_EQ(bytes(*a.first->storage_tensors()[1]), bytes(*v.first->storage_tensors()[1])) << pr.buffer << " values";
        const int64_t kb = quant_row_bytes(ops::quant_format_from_name(pr.keys), D), vb = quant_row_bytes(ops::quant_format_from_name(pr.values), D);
        EXPECT_EQ(int64_t(a.first->bytes()), B * G * L * (kb + vb)) << pr.buffer;
        // The deployed formats (kfp8vfp4) are written and attended as codes: no f32 working buffer.
        const bool working = !(quant_attention_format(ops::quant_format_from_name(pr.keys)) &&
                               quant_attention_format(ops::quant_format_from_name(pr.values)));
        EXPECT_EQ(tracker.current(Device{}, MemCategory::KV_CACHE), B * G * L * (kb + vb) + (working ? 2 * B * G * L * D * 4 : 0))
            << pr.buffer;
        EXPECT_DOUBLE_EQ(a.first->bits_per_element(), 8.0 * double(kb + vb) / double(2 * D)) << pr.buffer;
    }
}

}  // namespace
}  // namespace kv::test
