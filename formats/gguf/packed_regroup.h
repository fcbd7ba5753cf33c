// Packed weights regrouped into the layout the CPU kernels multiply fastest
// (KernelBackend::preferred_packed_format), in place, at load.
#pragma once

#include "engine/core/tensor.h"

namespace kv {

// A contiguous host Q4_1 weight [rows, blocks, 20] regrouped in place into Q4_1_R16
// [rows / 16, blocks, 320] (packed_blocks.h: the same bytes per 16 rows, only reordered);
// returns the regrouped view of the same storage. Requires rows % 16 == 0. Every weight value
// stays bit for bit what it was.
Tensor regroup_q4_1_rows(const Tensor& w);

}  // namespace kv
