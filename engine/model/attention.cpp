// PlainAttention and position helpers.
#include "attention.h"

#include <vector>

#include "engine/ops/ops.h"

namespace kv {

Tensor position_range(int64_t start, int64_t n, Device device) {
    std::vector<int32_t> p((size_t)n);
    for (int64_t i = 0; i < n; ++i) p[size_t(i)] = int32_t(start + i);
    return Tensor::from_i32({1, n}, p, {device, MemCategory::ACTIVATIONS, "positions"});
}

void PlainAttention::attend(int, const Tensor& q, const Tensor& k, const Tensor& v, int64_t input_pos, float scale, int window,
                            Tensor& y) {
    const int64_t n = q.size(2);
    Tensor pos = position_range(input_pos, n, q.device());
    Tensor kpos = pos.unsqueeze(0);  // (1, 1, n)
    ops::sdpa_(y, q, k, v, kpos, pos, scale, window);
}

}  // namespace kv
