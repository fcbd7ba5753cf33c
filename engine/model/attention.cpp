// PlainAttention and position helpers.
#include "attention.h"

#include <vector>

#include "engine/core/error.h"
#include "engine/ops/ops.h"

namespace kv {

Tensor position_range(int64_t start, int64_t n, Device device) {
    std::vector<int32_t> p((size_t)n);
    for (int64_t i = 0; i < n; ++i) p[size_t(i)] = int32_t(start + i);
    return Tensor::from_i32({1, n}, p, {device, MemCategory::ACTIVATIONS, "positions"});
}

void LayerAttention::attend_shared(int layer, int source, const Tensor&, int64_t, float, int, Tensor&) {
    throw Error(str("layer ", layer, " reads the keys and values of layer ", source,
                    " (cross-layer KV sharing), which this attention does not implement"),
                "run the model through a KV cache (KVCache) or a plain forward");
}

void PlainAttention::attend(int layer, const Tensor& q, const Tensor& k, const Tensor& v, int64_t input_pos, float scale, int window,
                            Tensor& y) {
    const int64_t n = q.size(2);
    if (auto it = kept_.find(layer); it != kept_.end()) it->second = {k, v};
    Tensor pos = position_range(input_pos, n, q.device());
    Tensor kpos = pos.unsqueeze(0);  // (1, 1, n)
    ops::sdpa_(y, q, k, v, kpos, pos, scale, window);
}

void PlainAttention::attend_shared(int layer, int source, const Tensor& q, int64_t input_pos, float scale, int window, Tensor& y) {
    auto it = kept_.find(source);
    if (it == kept_.end() || !it->second.first.defined() || it->second.first.size(2) != q.size(2))
        throw Error(str("layer ", layer, " shares the keys and values of layer ", source, ", which this plain attention did not keep"),
                    "call retain() with the source layers before the forward");
    Tensor pos = position_range(input_pos, q.size(2), q.device());
    ops::sdpa_(y, q, it->second.first, it->second.second, pos.unsqueeze(0), pos, scale, window);
}

}  // namespace kv
