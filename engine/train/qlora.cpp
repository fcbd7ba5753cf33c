// QLoRA's NF4 base weights (see qlora.h).
#include "qlora.h"

#include <algorithm>
#include <cmath>

#include "engine/model/packed_weight.h"
#include "engine/ops/ops.h"
#include "kernels/common/quant_formats.h"
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

constexpr int64_t kNf4Block = 64;

// Whether the base can be kept packed: the packed matmuls run on the CPU with f32 activations,
// and row blocks equal bitsandbytes' flat blocks only when each row is whole blocks.
bool packs_nf4(const Transformer& model) {
    if (!model.options().device.is_cpu() || model.act_dtype() != DType::F32) return false;
    for (int l = 0; l < int(model.config().num_layers); ++l) {
        const LayerWeights& L = model.layer(l);
        for (const Tensor* w : {&L.wqkv, &L.wo, &L.w_gate_up, &L.w_down})
            if (is_packed(*w) || w->dtype() != DType::F32 || w->ndim() != 2 || w->size(1) % kNf4Block != 0) return false;
    }
    return true;
}

// W (out, in) f32 -> NF4 blocks u8 (out, in / 64, 36); the stats count `parts` HF tensors.
Tensor pack_nf4(const Tensor& w, int parts, const std::string& name, QloraStats& st) {
    const int64_t out = w.size(0), in = w.size(1), nb = in / kNf4Block, bb = packed_block_bytes(PackedFormat::NF4);
    const std::vector<float> v = w.to_f32_vector();
    std::vector<uint8_t> bytes(size_t(out * nb * bb));
    float back[kNf4Block];
    for (int64_t r = 0; r < out; ++r)
        for (int64_t b = 0; b < nb; ++b) {
            const float* x = v.data() + r * in + b * kNf4Block;
            uint8_t* q = bytes.data() + (r * nb + b) * bb;
            quantize_block_nf4(x, kNf4Block, q);
            dequantize_block_nf4(q, kNf4Block, back);
            for (int64_t i = 0; i < kNf4Block; ++i) st.max_abs_error = std::max(st.max_abs_error, double(std::fabs(back[i] - x[i])));
        }
    Tensor p = Tensor::empty({out, nb, bb}, DType::U8, {w.device(), MemCategory::WEIGHTS, name + " (nf4)"});
    std::copy(bytes.begin(), bytes.end(), static_cast<uint8_t*>(p.data_ptr()));
    st.tensors += parts;
    st.dense_bytes += w.nbytes();
    st.nf4_bytes += bytes.size();
    return p;
}

}  // namespace

QloraStats qlora_quantize_base(Transformer& model, bool keep_packed) {
    QloraStats st;
    if (model.config().latent_attention())  // its projections are not in the four matrices packed here
        throw Error(str(model.config().name,
                        ": QLoRA through multi-head latent attention (DeepSeek-V2) is not implemented; "
                        "train latent-attention models with finetune_long_lora or finetune_long_full (float base weights)"));
    for (int64_t l = 0; l < model.config().num_layers; ++l)
        if (model.config().short_conv_layer(l))  // its in_proj / out_proj are not in the four matrices packed here either
            throw Error(str(model.config().name, ": layer ", l,
                            " is a short convolution (LFM2); QLoRA through it is not implemented; "
                            "train LFM2 models with finetune_long_lora or finetune_long_full (float base weights)"));
    if (model.config().has_experts())  // the experts are not among the four matrices packed here
        throw Error(str(model.config().name, ": QLoRA through a mixture-of-experts MLP (gpt-oss) is not implemented; "
                        "train it with finetune_long_lora or finetune_long_full (float base weights)"));
    if (keep_packed && packs_nf4(model)) {
        st.packed = true;
        for (int l = 0; l < int(model.config().num_layers); ++l) {
            LayerWeights& L = model.mutable_layer(l);
            const std::string p = str("model.layers.", l, ".");
            L.wqkv = pack_nf4(L.wqkv, 3, p + "self_attn.qkv_proj", st);
            L.wo = pack_nf4(L.wo, 1, p + "self_attn.o_proj", st);
            L.w_gate_up = pack_nf4(L.w_gate_up, 2, p + "mlp.gate_up_proj", st);
            L.w_down = pack_nf4(L.w_down, 1, p + "mlp.down_proj", st);
        }
        return st;
    }
    constexpr int64_t kBlock = kNf4Block;
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
