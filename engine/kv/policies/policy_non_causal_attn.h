// The tile attention of policy_non_causal_attn.cpp (docs/POLICIES.md#non-causal-attn), shared
// with compactor, which blends it with key leverage.
#pragma once

#include <cstdint>
#include <vector>

namespace kv {

struct InsertFeatures;

// Tiles of C positions; the open tile keeps its queries, keys and value norms until complete.
class NonCausalTiles {
   public:
    explicit NonCausalTiles(int64_t C) : C_(C) {}
    void reset() { tile_start_ = m_ = D_ = NH_ = 0; }
    // After the chunk [P, P + n) is placed: append its queries, keys and value norms to the
    // open tile(s) and score every tile it completed, and the open one when `read` (the scores
    // are read after this chunk: the cache is full; a later call rescores the open tile anyway);
    // raw[r * L + s] = A_j |v_j| for the slots s (of T, positions pos (rows, L)) that hold those
    // tiles' tokens.
    void observe(const InsertFeatures& f, int64_t P, int64_t n, int64_t B, int64_t G, const std::vector<int32_t>& pos, int64_t L,
                 int64_t T, std::vector<double>& raw, bool read);

   private:
    void score_tile(int64_t B, int64_t G, const std::vector<int32_t>& pos, int64_t L, int64_t T, std::vector<double>& raw);
    int64_t C_;
    int64_t tile_start_ = 0, m_ = 0, D_ = 0, NH_ = 0;  // the open tile: positions [tile_start_, tile_start_ + m_)
    std::vector<float> q_, k_, vn_;                    // (B, NH, C, D), (B*G, D, C) transposed, (B*G, C)
    std::vector<uint8_t> hasq_;                        // (C) whether the tile's query i was seen
    std::vector<double> A_, acc_;                      // scratch of score_tile, kept (no allocation per chunk)
    std::vector<float> strip_;
};

// avg_pool1d(3) in position order per row (zero padding counted) of v (rows, L) over the slots
// listed in idx[r] (sorted by position): out[r][i] for idx[r][i].
void pool3(const std::vector<double>& v, int64_t L, const std::vector<std::vector<int32_t>>& idx, std::vector<double>& out);

}  // namespace kv
