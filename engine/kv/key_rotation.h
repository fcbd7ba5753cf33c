// Key re-rotation (kvpress' KeyRerotationPress; docs/POLICIES.md#key-rerotation): after an
// eviction the kept keys take the RoPE positions 0..K-1 in the order of their token positions
// and the chunk's tokens continue at K. RoPE turns the channel pair (j, j + n_rot/2) by
// p theta'_j, so a key rotated at p is moved to p' by turning it by (p' - p) theta'_j: exact,
// whatever YaRN or partial rotary did to theta' (a NoPE layer has no theta': nothing turns).
// The token positions the cache masks and records by stay the tokens' own; only the RoPE
// angles of the stored keys and of the queries change. Shared by the live cache
// (layer_cache.cpp) and the gradient replay (engine/grad/replay_cache.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/core/tensor.h"
#include "engine/telemetry/replay_plan.h"

namespace kv {

// Turns the rotated channels of the D values at x by `shift` positions (negative: back).
void rotate_by_positions(double* x, int64_t D, const std::vector<double>& inv_freq, int64_t shift);

// One slot row through a plan: rope[s] is the RoPE position slot s's key has (-1 empty);
// the plan's moves carry it, its new tokens arrive at their token positions; then every filled
// slot's target is the rank of its token position pos_after[s] among the row's filled slots.
// shift[s] = target - what it had (0 for empty slots); rope becomes the targets.
void rerotate_row(const SlotPlan& plan, int64_t row, const int32_t* pos_after, int32_t* rope, int64_t slots, int32_t* shift);

// The RoPE positions of a state whose kept keys are already contiguous: the ranks of pos.
void contiguous_rope_row(const int32_t* pos, int64_t slots, int32_t* rope);

// How far a chunk of tokens starting at input_pos turns its queries: the number of kept tokens
// before it (token position < input_pos in pos_after, one row) minus input_pos; every row of a
// layer keeps the same number, else a kv::Error.
int64_t query_shift(const std::vector<int32_t>& pos_after, int64_t rows, int64_t slots, int64_t input_pos);

// x (B, H, S, D), any dtype and device, with row (b, h) slot s turned by shift[r * S + s],
// r = b H + h (rows == 1: one shift row for every (b, h)). A new tensor like x.
Tensor rotate_slots(const Tensor& x, const std::vector<int32_t>& shift, int64_t rows, const std::vector<double>& inv_freq,
                    const TensorOptions& opt);
// x (B, H, n, D) turned by one shift.
Tensor rotate_all(const Tensor& x, int64_t shift, const std::vector<double>& inv_freq, const TensorOptions& opt);

}  // namespace kv
