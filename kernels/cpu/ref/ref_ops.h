// The reference: plain double-precision loops over multi-indices, one per op, written for
// obviousness, never for speed, and never "optimized". Tests compare every backend against
// these. Results are stored in the destination's dtype (tests use f64 destinations).
#pragma once

#include "kernels/common/op.h"

namespace kv::ref {

// Compute `call` exactly as specified in kernels/common/op.h, in f64 arithmetic.
void compute(const OpCall& call);

}  // namespace kv::ref
