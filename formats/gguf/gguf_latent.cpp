// The join of gguf_latent.h: element copies of the dtype's size (F32 or BF16 alike).
#include "formats/gguf/gguf_latent.h"

#include <cstring>

#include "engine/core/error.h"

namespace kv {

void gguf_join_kv_b(TensorMap& tensors, const std::string& p, int64_t NH, int64_t r, int64_t D_nope, int64_t D_v) {
    const std::string kn = p + "self_attn.k_b_proj.weight", vn = p + "self_attn.v_b_proj.weight";
    if (!tensors.count(kn) || !tensors.count(vn)) throw Error(str("gguf latent: '", kn, "' or '", vn, "' is missing"));
    const Tensor kb = tensors.at(kn).contiguous(), vb = tensors.at(vn).contiguous();
    TensorOptions o;
    o.category = MemCategory::WEIGHTS;
    o.label = p + "self_attn.kv_b_proj.weight";
    Tensor out = Tensor::empty({NH * (D_nope + D_v), r}, kb.dtype(), o);
    const size_t es = size_t(dtype_size(kb.dtype()));
    const uint8_t* k = static_cast<const uint8_t*>(kb.data_ptr());
    const uint8_t* v = static_cast<const uint8_t*>(vb.data_ptr());
    uint8_t* d = static_cast<uint8_t*>(out.data_ptr());
    for (int64_t h = 0; h < NH; ++h) {
        const int64_t row0 = h * (D_nope + D_v);
        for (int64_t j = 0; j < D_nope; ++j)  // key row j of head h = column j of k_b[h]
            for (int64_t c = 0; c < r; ++c)
                std::memcpy(d + size_t((row0 + j) * r + c) * es, k + size_t((h * r + c) * D_nope + j) * es, es);
        std::memcpy(d + size_t((row0 + D_nope) * r) * es, v + size_t(h * D_v * r) * es, size_t(D_v * r) * es);
    }
    tensors.erase(kn);
    tensors.erase(vn);
    tensors[p + "self_attn.kv_b_proj.weight"] = out;
}

}  // namespace kv
