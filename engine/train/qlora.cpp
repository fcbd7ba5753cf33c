// QLoRA's NF4 base weights (see qlora.h).
#include "qlora.h"

#include <algorithm>
#include <cmath>

#include "engine/ops/ops.h"
#include "model_weights.h"

namespace kv {

namespace {

bool is_block_linear(const std::string& name) {
    static const char* const suffixes[] = {"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight",
                                           "gate_proj.weight", "up_proj.weight", "down_proj.weight"};
    if (name.rfind("model.layers.", 0) != 0) return false;
    for (const char* s : suffixes) {
        const std::string suf(s);
        if (name.size() >= suf.size() && name.compare(name.size() - suf.size(), suf.size(), suf) == 0) return true;
    }
    return false;
}

}  // namespace

QloraStats qlora_quantize_base(Transformer& model) {
    QloraStats st;
    constexpr int64_t kBlock = 64;
    for (auto& [name, w] : model_state_dict(model)) {
        if (!is_block_linear(name)) continue;
        // The tensor flattened (bitsandbytes quantizes the flat weight in blocks of 64); a
        // ragged tail is zero-padded to one more block.
        const int64_t n = w.numel(), blocks = (n + kBlock - 1) / kBlock;
        std::vector<float> flat = w.to_f32_vector();
        flat.resize(size_t(blocks * kBlock), 0.0f);
        Tensor x = Tensor::from_f32({blocks, kBlock}, flat, DType::F32, {w.device(), MemCategory::WORKSPACE, name + " (nf4 staging)"});
        Tensor q = ops::quantize(x, QuantFormat::NF4);
        Tensor y = Tensor::empty({blocks, kBlock}, DType::F32, {w.device(), MemCategory::WORKSPACE, name + " (nf4 dequantized)"});
        ops::dequantize_(y, q, QuantFormat::NF4);
        std::vector<float> back = y.to_f32_vector();
        for (int64_t i = 0; i < n; ++i) st.max_abs_error = std::max(st.max_abs_error, double(std::fabs(back[size_t(i)] - flat[size_t(i)])));
        back.resize(size_t(n));
        Tensor src = Tensor::from_f32(w.shape(), back, DType::F32, {w.device(), MemCategory::WORKSPACE, name});
        w.copy_from(src);  // w is a view into the model's (stacked) weight
        st.tensors++;
        st.dense_bytes += w.nbytes();
        st.nf4_bytes += size_t(q.nbytes());
    }
    return st;
}

}  // namespace kv
