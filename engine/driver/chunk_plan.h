// How a long sequence is cut into chunks and cells (reference §7.1): the first chunk fills the
// smallest cache (prefill = L), then chunks of chunk_size (or random sizes around it) snap to
// every other cache length so no chunk straddles a cache becoming full. Cells group chunks
// from the left up to max_cell_len = factor * max_L * multiplier tokens (factor = 2 G D / E),
// so the live activations of a cell are about one KV buffer; an over-long chunk (the
// prefill) gets a cell of its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace kv {

// A chunk ending within this many tokens of a cache length is stretched to end on it
// (keys_values' CLOSEBY_THRESHOLD), so with several cache lengths a chunk can be this much
// longer than the chunk size.
inline constexpr int64_t kChunkSnapTokens = 4;

struct ChunkPlan {
    std::vector<int64_t> chunks;  // sizes, summing to the sequence length
    std::vector<int64_t> starts;  // start position of each chunk
    // cells[c] = [first chunk, end chunk) of cell c
    std::vector<std::pair<size_t, size_t>> cells;
    int64_t max_chunk() const;
};

struct ChunkPlanOptions {
    int64_t chunk_size = 16;
    // Tokens of the first chunk; 0: the smallest cache length (keys_values' prefill). A dense
    // cache given the compared policies' cache length steps through the sequence as they do.
    int64_t prefill = 0;
    bool randomize = false;
    uint64_t seed = 0;
    double cell_factor = 1.0;       // 2 G D / E of the model
    double chunks_per_cell_multiplier = 1.0;
};

// cache_lengths: every layer's L (0 entries mean "the whole sequence").
ChunkPlan plan_chunks(int64_t seq_length, const std::vector<int64_t>& cache_lengths, const ChunkPlanOptions& opt);

// Group chunks into cells (also used on its own by the gradient pipeline).
std::vector<std::pair<size_t, size_t>> group_cells(const std::vector<int64_t>& chunks, int64_t max_cell_len);

}  // namespace kv
