// Physical against logical KV bytes: a paged buffer holds whole blocks, so what eviction keeps
// (logical: slots with a token) and what the allocator holds (physical) differ; compaction
// (--kv_cache.compact) moves kept slots so whole blocks are freed without changing any value
// attention reads. Expected byte counts are computed here from the shapes, not by the code.
#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "engine/core/error.h"
#include "engine/kv/buffers/kv_buffer.h"
#include "engine/kv/kv_cache.h"
#include "engine/model/presets.h"
#include "engine/model/transformer.h"
#include "tests/support/test_support.h"

namespace kv::test {
namespace {

struct Tiny {
    ModelConfig cfg = preset_config("tiny");
    Transformer model{cfg, random_weights(cfg, 11, DType::F32), ModelOptions{}};
};

Tiny& tiny() {
    static Tiny m;
    m.model.set_context_width(m.cfg.max_position_embeddings);
    return m;
}

KVCacheConfig paged(const std::string& name, int64_t L, int64_t bs, bool compact) {
    KVCacheConfig c;
    c.name = name;
    c.cache_length = L;
    c.paged_block_size = bs;
    c.compact = compact;
    return c;
}

Tensor ids_of(int64_t B, int64_t T, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<int32_t> v((size_t)(B * T));
    for (auto& x : v) x = int32_t(rng() % 256);
    return Tensor::from_i32({B, T}, v);
}

// Every layer's output of every chunk; hook(layer, tokens seen) after each layer's chunk.
std::vector<std::vector<float>> run(KVCache& cache, const Tensor& ids, const std::vector<int64_t>& chunks,
                                    const std::function<void(int, int64_t)>& hook = {}) {
    Transformer& m = tiny().model;
    std::vector<std::vector<float>> outs;
    int64_t P = 0;
    for (int64_t n : chunks) {
        Tensor x = m.embed(ids.slice(1, P, P + n));
        for (int l = 0; l < int(m.config().num_layers); ++l) {
            x = m.block(l, x, P, cache);
            outs.push_back(x.to_f32_vector());
            if (hook) hook(l, P + n);
        }
        P += n;
    }
    return outs;
}

TEST(KVPhysicalBytes, PagedH2oHoldsWholeBlocksAtEveryChunk) {
    Tiny& t = tiny();
    const int64_t L = 40, bs = 16, G = t.cfg.num_kv_heads, D = t.cfg.head_dim;
    const int64_t slot_head = 2 * D * 4;  // K and V of one head's slot in f32
    const int64_t block = G * bs * slot_head;
    for (bool compact : {false, true}) {
        KVCache cache(paged("h2o-default", L, bs, compact), t.cfg, Device{}, DType::F32, 150);
        int checks = 0;
        run(cache, ids_of(1, 150, 3), {24, 8, 8, 10, 30, 10, 20, 16, 24}, [&](int l, int64_t seen) {
            // h2o keeps min(seen, L) tokens in every head; they fill slots [0, T) of the blocks.
            const int64_t T = std::min(seen, L);
            const int64_t logical = G * T * slot_head;
            const int64_t physical = (T + bs - 1) / bs * block;
            EXPECT_EQ(int64_t(cache.layer(l).logical_bytes()), logical) << "layer " << l << " after " << seen;
            EXPECT_EQ(int64_t(cache.layer(l).buffer().bytes()), physical) << "layer " << l << " after " << seen;
            EXPECT_GE(physical, logical);
            EXPECT_LT(physical - logical, block);
            ++checks;
        });
        EXPECT_EQ(checks, 9 * int(t.cfg.num_layers));
        EXPECT_EQ(cache.physical_bytes(), size_t(t.cfg.num_layers * ((L + bs - 1) / bs) * block));
        EXPECT_EQ(cache.logical_bytes(), size_t(t.cfg.num_layers * G * L * slot_head));
    }
}

TEST(KVPhysicalBytes, CompactionKeepsEveryOutputBitIdentical) {
    Tiny& t = tiny();
    const Tensor ids = ids_of(2, 150, 4);
    const std::vector<int64_t> chunks = {40, 10, 10, 30, 10, 20, 10, 20};
    for (const char* name : {"h2o-default", "tova-default", "lastrec-default"}) {
        KVCacheConfig plain_cfg;
        plain_cfg.name = name;
        plain_cfg.cache_length = 40;
        KVCache plain(plain_cfg, t.cfg, Device{}, DType::F32, 150);
        KVCache compacted(paged(name, 40, 16, true), t.cfg, Device{}, DType::F32, 150);
        const auto want = run(plain, ids, chunks), got = run(compacted, ids, chunks);
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << name << ": output " << i;
    }
}

// The buffer alone, with holes a policy could leave: unkept slots are unmapped, kept ones move
// out of the emptiest blocks, and reads return the kept values bit for bit.
TEST(KVPhysicalBytes, CompactionFreesWholeBlocksAndMovesKeptSlots) {
    const int64_t B = 2, G = 2, L = 64, D = 4, bs = 8;
    KVCacheConfig c = paged("h2o-default", L, bs, true);
    BufferParams p{0, L, G, D, Device{}, DType::F32};
    auto buf = make_buffer(c, p, make_buffer_shared(c, L, G, D, Device{}, DType::F32));
    ASSERT_TRUE(buf->compacts());
    std::mt19937_64 rng(9);
    const Tensor k = random_tensor({B, G, L, D}, DType::F32, rng), v = random_tensor({B, G, L, D}, DType::F32, rng);
    buf->prefill(k, v);
    const int64_t block = G * bs * D * 4 * 2;
    EXPECT_EQ(int64_t(buf->bytes()), B * (L / bs) * block);
    // Row 0 keeps every 4th slot (16 slots spread over all 8 blocks), row 1 slots 5..14 (10).
    std::vector<uint8_t> kept(size_t(B * L), 0);
    for (int64_t s = 0; s < L; s += 4) kept[size_t(s)] = 1;
    for (int64_t s = 5; s < 15; ++s) kept[size_t(L + s)] = 1;
    const int64_t moved = buf->compact(kept);
    EXPECT_EQ(int64_t(buf->bytes()), (2 + 2) * block);  // ceil(16 / 8) + ceil(10 / 8) blocks
    EXPECT_GT(moved, 0);
    auto [K, V] = buf->read(L);
    const std::vector<float> k0 = k.to_f32_vector(), v0 = v.to_f32_vector(), k1 = K.to_f32_vector(), v1 = V.to_f32_vector();
    for (int64_t b = 0; b < B; ++b)
        for (int64_t g = 0; g < G; ++g)
            for (int64_t s = 0; s < L; ++s)
                for (int64_t d = 0; d < D; ++d) {
                    const size_t i = size_t(((b * G + g) * L + s) * D + d);
                    const bool keep = kept[size_t(b * L + s)];
                    ASSERT_EQ(k1[i], keep ? k0[i] : 0.0f) << b << " " << g << " " << s;
                    ASSERT_EQ(v1[i], keep ? v0[i] : 0.0f) << b << " " << g << " " << s;
                }
    // New tokens into unkept slots 1, 2, 63 of both rows fill free offsets before new blocks:
    // row 0 (16 kept, its 2 blocks full) takes one new block, row 1 (10 kept) none.
    SlotPlan plan;
    plan.n = 3;
    plan.rows = 1;
    plan.targets = {1, 2, 63};
    const Tensor nk = random_tensor({B, G, 3, D}, DType::F32, rng), nv = random_tensor({B, G, 3, D}, DType::F32, rng);
    buf->write(plan, nk, nv);
    auto [K2, V2] = buf->read(L);
    const std::vector<float> k2 = K2.to_f32_vector(), nk0 = nk.to_f32_vector();
    for (int64_t b = 0; b < B; ++b)
        for (int64_t g = 0; g < G; ++g)
            for (int64_t s = 0; s < L; ++s)
                for (int64_t d = 0; d < D; ++d) {
                    const size_t i = size_t(((b * G + g) * L + s) * D + d);
                    const int64_t t = s == 1 ? 0 : s == 2 ? 1 : s == 63 ? 2 : -1;
                    const float want = t >= 0 ? nk0[size_t(((b * G + g) * 3 + t) * D + d)] : kept[size_t(b * L + s)] ? k0[i] : 0.0f;
                    ASSERT_EQ(k2[i], want) << b << " " << g << " " << s;
                }
    EXPECT_EQ(int64_t(buf->bytes()), (3 + 2) * block);  // ceil(19 / 8) + ceil(13 / 8)
}

TEST(KVPhysicalBytes, CompactionWithoutPagedStorageIsRefused) {
    Tiny& t = tiny();
    KVCacheConfig c;
    c.name = "h2o-default";
    c.cache_length = 32;
    c.compact = true;
    try {
        KVCache cache(c, t.cfg, Device{}, DType::F32, 64);
        FAIL() << "compact without paged storage was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("--kv_cache.compact"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("paged_block_size > 0"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace kv::test
