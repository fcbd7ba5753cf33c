// The re-layout of gguf_experts.h: element copies of the dtype's size (F32 or BF16 alike).
#include "formats/gguf/gguf_experts.h"

#include <cstring>

#include "engine/core/error.h"

namespace kv {

namespace {

Tensor take(TensorMap& tensors, const std::string& name) {
    auto it = tensors.find(name);
    if (it == tensors.end()) throw Error(str("gguf experts: tensor '", name, "' is missing"));
    Tensor t = it->second.contiguous();
    tensors.erase(it);
    return t;
}

Tensor like(const Tensor& src, const Shape& shape, const std::string& label) {
    TensorOptions o;
    o.category = MemCategory::WEIGHTS;
    o.label = label;
    return Tensor::empty(shape, src.dtype(), o);
}

// dst[n, e, 2 i + half] = src[n, i, e] for one half (gate 0, up 1): [N, I, E] rows -> columns.
void interleave_columns(const Tensor& src, int64_t src_row0, int64_t src_rows, Tensor& dst, int half, int64_t N, int64_t I,
                        int64_t E) {
    const size_t es = size_t(dtype_size(src.dtype()));
    const uint8_t* s = static_cast<const uint8_t*>(src.data_ptr());
    uint8_t* d = static_cast<uint8_t*>(dst.data_ptr());
    for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < I; ++i)
            for (int64_t e = 0; e < E; ++e)
                std::memcpy(d + size_t((n * E + e) * 2 * I + 2 * i + half) * es,
                            s + size_t((n * src_rows + src_row0 + i) * E + e) * es, es);
}

// dst[n, 2 i + half] = src[n, off + i]: one half of a bias.
void interleave_bias(const Tensor& src, int64_t off, int64_t src_width, Tensor& dst, int half, int64_t N, int64_t I) {
    const size_t es = size_t(dtype_size(src.dtype()));
    const uint8_t* s = static_cast<const uint8_t*>(src.data_ptr());
    uint8_t* d = static_cast<uint8_t*>(dst.data_ptr());
    for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < I; ++i)
            std::memcpy(d + size_t(n * 2 * I + 2 * i + half) * es, s + size_t(n * src_width + off + i) * es, es);
}

}  // namespace

void gguf_experts_to_hf(TensorMap& tensors, const std::string& p, int64_t N, int64_t I, int64_t E) {
    const std::string x = p + "mlp.experts.";
    Tensor gate_up = Tensor(), bias = Tensor();
    if (tensors.count(x + "gate_up_proj.weight")) {
        const Tensor w = take(tensors, x + "gate_up_proj.weight"), b = take(tensors, x + "gate_up_proj.bias");
        gate_up = like(w, {N, E, 2 * I}, x + "gate_up_proj");
        interleave_columns(w, 0, 2 * I, gate_up, 0, N, I, E);
        interleave_columns(w, I, 2 * I, gate_up, 1, N, I, E);
        bias = like(b, {N, 2 * I}, x + "gate_up_proj_bias");
        interleave_bias(b, 0, 2 * I, bias, 0, N, I);
        interleave_bias(b, I, 2 * I, bias, 1, N, I);
    } else {
        const Tensor g = take(tensors, x + "gate_proj.weight"), u = take(tensors, x + "up_proj.weight");
        const Tensor gb = take(tensors, x + "gate_proj.bias"), ub = take(tensors, x + "up_proj.bias");
        gate_up = like(g, {N, E, 2 * I}, x + "gate_up_proj");
        interleave_columns(g, 0, I, gate_up, 0, N, I, E);
        interleave_columns(u, 0, I, gate_up, 1, N, I, E);
        bias = like(gb, {N, 2 * I}, x + "gate_up_proj_bias");
        interleave_bias(gb, 0, I, bias, 0, N, I);
        interleave_bias(ub, 0, I, bias, 1, N, I);
    }
    // down: [N, E, I] -> [N, I, E]
    const Tensor dw = take(tensors, x + "down_proj.weight");
    Tensor down = like(dw, {N, I, E}, x + "down_proj");
    const size_t es = size_t(dtype_size(dw.dtype()));
    const uint8_t* s = static_cast<const uint8_t*>(dw.data_ptr());
    uint8_t* d = static_cast<uint8_t*>(down.data_ptr());
    for (int64_t n = 0; n < N; ++n)
        for (int64_t e = 0; e < E; ++e)
            for (int64_t i = 0; i < I; ++i)
                std::memcpy(d + size_t((n * I + i) * E + e) * es, s + size_t((n * E + e) * I + i) * es, es);
    tensors[x + "gate_up_proj"] = gate_up;
    tensors[x + "gate_up_proj_bias"] = bias;
    tensors[x + "down_proj"] = down;
    tensors[x + "down_proj_bias"] = take(tensors, x + "down_proj.bias");
}

}  // namespace kv
