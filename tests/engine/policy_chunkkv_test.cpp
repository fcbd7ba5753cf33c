// chunkkv against ChunkKV's definition in f64 (kvpress' ChunkKVPress around SnapKVPress):
// SnapKV's published scores (published_snapkv_reference), summed over the batch row's heads and
// the cached tokens of each chunk of C positions, divided by the positions of the chunk the
// sequence has reached (min(C, P - c C)); every slot of the chunk takes that score.
#include <map>

#include "policy_references.h"

namespace kv::test {
namespace {

TEST(ChunkKV, ScoresAndChoicesEqualTheF64Reference) {
    // chunks of 3 positions, SnapKV window 3 and pooling width 3
    check_policy_against_reference(
        "chunkkv-default", [](KVCacheConfig& c) { c.snapkv_window = 3, c.snapkv_kernel = 3, c.policy_options = {{"chunkkv_chunk_size", 3}}; },
        [](const LayerHarness& h, int64_t P, int64_t n) { return chunkkv_reference(h, P, n, 3, 3, 3); });
}

TEST(ChunkKV, TheDefaultChunkIsThePapersTen) {
    KVCacheConfig c;
    EXPECT_EQ(c.policy_option("chunkkv_chunk_size"), 10.0);
}

TEST(ChunkKV, WholeChunksLeaveAndEveryHeadOfARowKeepsTheSame) {
    // 16 slots, chunks of 4 positions, 4 new tokens per call: after every call each batch row
    // holds whole chunks (every position of a chunk the sequence has passed) and its heads hold
    // the same positions.
    LayerHarness h("chunkkv-default", 16, seed_for("chunkkv whole chunks"));
    h.cfg.policy_options = {{"chunkkv_chunk_size", 4}};
    h.cfg.snapkv_window = 2;
    h.cache = std::make_unique<KVCache>(h.cfg, h.model, Device{}, DType::F32, 0, &byte_codec());
    h.cache->set_replay_logging(true);
    h.step(16);
    for (int s = 0; s < 15; ++s) {
        h.step(4);
        const auto& pos = h.layer().policy().token_positions();
        for (int64_t b = 0; b < h.B; ++b) {
            std::vector<int32_t> first;
            for (int64_t g = 0; g < h.G; ++g) {
                std::vector<int32_t> p(pos.begin() + (b * h.G + g) * 16, pos.begin() + (b * h.G + g + 1) * 16);
                std::sort(p.begin(), p.end());
                if (g == 0) first = p;
                EXPECT_EQ(p, first) << "batch row " << b << " head " << g << " at " << h.P;
                std::map<int32_t, int> count;
                for (int32_t x : p) ++count[x / 4];
                for (auto [c, m] : count) EXPECT_EQ(m, 4) << "chunk " << c << " of batch row " << b << " at " << h.P;
            }
        }
    }
}

}  // namespace
}  // namespace kv::test
