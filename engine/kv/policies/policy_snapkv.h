// SnapKV's pooled votes (policy_snapkv.cpp), shared with the scorers built on them (chunkkv
// pools them over chunks of tokens).
#pragma once

#include <cstdint>
#include <vector>

namespace kv {

struct SnapKVVotes {
    int64_t window = 32;        // voting queries (snapkv_window)
    int64_t kernel = 5;         // average-pooling width (snapkv_kernel, odd)
    bool pool_window = false;   // true: kvlab's earlier rule (the window's own tokens pooled too)

    // Scores of `rows` rows of T slots: w (rows, T) the chunk's weight sums of its last
    // min(window, n) queries, pos (rows, stride) the slots' token positions (-1 empty), P the
    // input position after the chunk, n its length; out (rows, stride), slots [0, T) written.
    // Published rule (SnapKV's code, kvpress): votes average-pooled (zero padding counted) over
    // the positions before the window only; the window's tokens take the maximum over all rows.
    void score(const std::vector<float>& w, const int32_t* pos, int64_t rows, int64_t stride, int64_t T, int64_t P, int64_t n,
               float* out) const;

   private:
    mutable std::vector<int32_t> order_, table_;  // scratch: one row's slots in position order; slots by position
    mutable std::vector<float> sorted_;
};

}  // namespace kv
