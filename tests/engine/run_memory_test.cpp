// The memory preflight (engine/run/run_memory.h, issue 17) counts what a run will allocate
// before it allocates it. Checked against the allocator itself: the KV bytes it sizes (K and
// V, paged blocks with their padding) never exceed what a real cache of that configuration
// allocates on the tiny model; and a paged block size far beyond the cache is refused up front,
// naming the block size, instead of by the allocator mid-run.
#include <gtest/gtest.h>

#include <random>

#include "engine/core/error.h"
#include "engine/kv/kv_cache.h"
#include "engine/memory/memory_tracker.h"
#include "engine/model/presets.h"
#include "engine/model/transformer.h"
#include "engine/run/run_memory.h"

namespace kv::test {
namespace {

// What the preflight sizes as the KV cache itself (KV, and block padding when paged).
uint64_t kv_items(const std::vector<SizedItem>& items) {
    uint64_t n = 0;
    for (const auto& it : items)
        if (it.what == "KV" || it.what == "KV block padding") n += it.bytes;
    return n;
}

RunConfig run_cfg(const std::string& name, int64_t L, int64_t T, int64_t block) {
    RunConfig c;
    c.kv_cache.name = name;
    c.kv_cache.cache_length = L;
    c.kv_cache.paged_block_size = block;
    c.data.seq_length = T;
    c.driver.chunk_size = 16;
    return c;
}

// KV_CACHE bytes the allocator holds after a T-token pass through the tiny model's cache.
int64_t allocated_kv(const ModelConfig& m, const RunConfig& c) {
    Transformer model{m, random_weights(m, 3, DType::F32), ModelOptions{}};
    MemoryTracker tr;
    MemoryTrackerScope scope(tr);
    {
        KVCache cache(c.kv_cache, m, Device{}, DType::F32, c.data.seq_length);
        std::mt19937_64 rng(4);
        std::vector<int32_t> v(size_t(c.data.seq_length));
        for (auto& x : v) x = int32_t(rng() % 256);
        const Tensor ids = Tensor::from_i32({1, c.data.seq_length}, v);
        for (int64_t P = 0; P < c.data.seq_length; P += 16) {
            Tensor x = model.embed(ids.slice(1, P, P + 16));
            for (int l = 0; l < int(m.num_layers); ++l) x = model.block(l, x, P, cache);
        }
        return tr.peak(Device{}, MemCategory::KV_CACHE);
    }
}

TEST(RunMemory, KvIsSizedAsBothKAndV) {
    const ModelConfig m = preset_config("tiny");
    // Hand count: layers * L * G * D * 4 bytes, twice (K and V).
    const uint64_t want = uint64_t(m.num_layers) * 64 * uint64_t(m.num_kv_heads) * uint64_t(m.head_dim) * 4 * 2;
    EXPECT_EQ(kv_items(run_memory_items(run_cfg("h2o-default", 64, 256, 0), m)), want);
}

TEST(RunMemory, PreflightNeverExceedsWhatTheCacheAllocates) {
    const ModelConfig m = preset_config("tiny");
    struct Case {
        const char* name;
        int64_t L, T, block;
    };
    // Plain; paged with blocks dividing L; paged with a partial last block (48 = 32 + 16);
    // paged with one block far larger than L; a cache longer than the sequence (paged fills
    // only T slots).
    for (const Case& k : {Case{"h2o-default", 64, 128, 0}, Case{"h2o-default", 64, 128, 16}, Case{"lastrec-default", 48, 128, 32},
                          Case{"h2o-default", 32, 96, 512}, Case{"lastrec-default", 256, 64, 48}}) {
        SCOPED_TRACE(testing::Message() << k.name << " L=" << k.L << " T=" << k.T << " block=" << k.block);
        const RunConfig c = run_cfg(k.name, k.L, k.T, k.block);
        const uint64_t sized = kv_items(run_memory_items(c, m));
        const int64_t real = allocated_kv(m, c);
        EXPECT_GT(sized, 0u);
        EXPECT_LE(sized, uint64_t(real)) << "the preflight sized more than the cache allocated";
        // Not a vacuous bound: at least the cache's own blocks (the policy's extras aside).
        EXPECT_GE(sized, uint64_t(real) / 2);
    }
}

TEST(RunMemory, AHugePagedBlockIsRefusedBeforeAnyAllocationNamingTheBlockSize) {
    const ModelConfig m = preset_config("tiny");
    RunConfig c = run_cfg("h2o-default", 64, 256, int64_t(1) << 20);
    c.memory_budget = "64MiB";
    // One block per layer of 2^20 slots: layers * 2^20 * G * D * 4 bytes * 2, minus the 64
    // slots the cache really uses, is padding.
    const uint64_t per_slot = uint64_t(m.num_kv_heads) * uint64_t(m.head_dim) * 4 * 2;
    const auto items = run_memory_items(c, m);
    uint64_t padding = 0;
    for (const auto& it : items)
        if (it.what == "KV block padding") {
            EXPECT_EQ(it.cause, "paged_block_size 1048576");
            padding += it.bytes;
        }
    EXPECT_EQ(padding, uint64_t(m.num_layers) * ((uint64_t(1) << 20) - 64) * per_slot);
    MemoryTracker tr;
    MemoryTrackerScope scope(tr);
    try {
        check_run_memory(c, m);
        FAIL() << "a 1 Mi-slot paged block passed a 64 MiB budget";
    } catch (const Error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("paged_block_size 1048576 needs"), std::string::npos) << msg;
        EXPECT_NE(msg.find("of KV block padding"), std::string::npos) << msg;
        EXPECT_NE(msg.find("(budget 64.00 MiB)"), std::string::npos) << msg;
    }
    EXPECT_EQ(tr.peak_total(Device{}), 0) << "the preflight allocated";
    // A block size that fits passes.
    c.kv_cache.paged_block_size = 16;
    EXPECT_NO_THROW(check_run_memory(c, m));
}

TEST(RunMemory, BlockCountsCannotOverflow) {
    const ModelConfig m = preset_config("tiny");
    RunConfig c = run_cfg("h2o-default", int64_t(1) << 40, int64_t(1) << 40, int64_t(1) << 20);
    c.driver.micro_batch_size = int64_t(1) << 30;
    try {
        run_memory_items(c, m);
        FAIL() << "sizes beyond 64 bits were not refused";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("overflows 64 bits"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace kv::test
