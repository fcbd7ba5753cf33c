// Transformer forward pass (see transformer.h). Shapes: B batch, n tokens of this call,
// E width, NH query heads, G KV heads, HS head size, I MLP width, V vocabulary.
#include "transformer.h"

#include "engine/core/error.h"
#include "engine/model/altup.h"
#include "engine/model/head_norm_rows.h"
#include "engine/model/softcap_rows.h"
#include "engine/model/latent_attention.h"
#include "engine/model/moe_mlp.h"
#include "engine/memory/memory_tracker.h"
#include "engine/model/packed_weight.h"
#include "engine/model/short_conv.h"
#include "engine/ops/ops.h"
#include "engine/telemetry/trace.h"

namespace kv {

namespace {

const Tensor& need(const TensorMap& w, const std::string& name, const Shape& shape) {
    auto it = w.find(name);
    if (it == w.end()) throw Error(str("model weights: missing tensor '", name, "' (expected shape ", shape.str(), ")"));
    const bool packed = is_packed(it->second);
    if (weight_shape(it->second) != shape)
        throw Error(str("model weights: tensor '", name, "' has shape ", weight_shape(it->second).str(), packed ? " (packed)" : "",
                        ", expected ", shape.str()));
    if (!packed && !dtype_is_float(it->second.dtype())) throw Error(str("model weights: tensor '", name, "' is not a float tensor"));
    return it->second;
}

// Packed weights stay packed where the packed kernels run (f32 activations on the CPU);
// elsewhere (bf16, f64, CUDA) they are dequantized here, at load.
bool keeps_packed(const ModelOptions& opt) { return opt.device.is_cpu() && opt.dtype == DType::F32; }

// Whether `t` can be used as the model's own tensor without a copy (adopted from a map the
// caller handed over): already in the model's storage form, contiguous, counted as weights.
bool adoptable(const Tensor& t, const ModelOptions& opt) {
    const bool form = is_packed(t) ? keeps_packed(opt) : t.dtype() == opt.dtype;
    return form && t.device() == opt.device && t.is_contiguous() && t.category() == MemCategory::WEIGHTS;
}

// A packed tensor as the float tensor the model stores (for options that do not keep packed).
Tensor float_of(const Tensor& t) { return is_packed(t) ? packed_to_f32(t, {t.device(), MemCategory::WEIGHTS, "dequantize"}) : t; }

Tensor convert(const Tensor& t, const ModelOptions& opt, const std::string& label, bool adopt) {
    if (adopt && adoptable(t, opt)) return t;
    if (is_packed(t) && keeps_packed(opt)) {
        Tensor out = Tensor::empty(t.shape(), DType::U8, {opt.device, MemCategory::WEIGHTS, label});
        out.copy_from(t);
        return out;
    }
    const Tensor src = float_of(t);
    Tensor out = Tensor::empty(src.shape(), opt.dtype, {opt.device, MemCategory::WEIGHTS, label});
    out.copy_from(src.device() == opt.device ? src : src.to(opt.device));
    return out;
}

// Rows of several [r_i, E] matrices stacked into one [sum r_i, E] matrix. Parts that already
// lie back to back in one buffer (the GGUF loader stacks them so) are adopted as one view.
Tensor stack_rows(const std::vector<const Tensor*>& parts, const ModelOptions& opt, const std::string& label, bool adopt) {
    int64_t rows = 0;
    for (auto* p : parts) rows += p->size(0);
    Shape s = parts[0]->shape();
    s.d[0] = rows;
    bool adjacent = adopt;
    for (size_t i = 0; adjacent && i < parts.size(); ++i) {
        const Tensor& p = *parts[i];
        adjacent = p.storage() == parts[0]->storage() && p.dtype() == parts[0]->dtype() && p.is_contiguous() &&
                   adoptable(p, opt) && p.ndim() == s.ndim;
        for (int d = 1; adjacent && d < s.ndim; ++d) adjacent = p.size(d) == s.d[d];
        if (adjacent && i > 0) adjacent = p.offset() == parts[i - 1]->offset() + parts[i - 1]->numel();
    }
    if (adjacent) {
        std::vector<int64_t> strides(size_t(s.ndim));
        for (int d = 0; d < s.ndim; ++d) strides[size_t(d)] = parts[0]->stride(d);
        return parts[0]->as_strided(s, strides, parts[0]->offset());
    }
    bool same_packed = keeps_packed(opt) && is_packed(*parts[0]);
    for (auto* p : parts) same_packed = same_packed && is_packed(*p) && p->size(2) == parts[0]->size(2);
    const DType dt = same_packed ? DType::U8 : opt.dtype;
    // Rows of the stored tensors: a row-grouped packed part counts groups, its floats rows.
    auto stored_rows = [&](const Tensor& p) { return same_packed ? p.size(0) : weight_shape(p).d[0]; };
    if (!same_packed && is_packed(*parts[0])) {
        int64_t logical = 0;
        for (auto* p : parts) logical += stored_rows(*p);
        s = Shape{logical, weight_shape(*parts[0]).d[1]};
    }
    Tensor out = Tensor::empty(s, dt, {opt.device, MemCategory::WEIGHTS, label});
    int64_t r = 0;
    for (auto* p : parts) {
        Tensor dst = out.slice(0, r, r + stored_rows(*p));
        const Tensor src = same_packed ? *p : float_of(*p);
        dst.copy_from(src.device() == opt.device ? src : src.to(opt.device));
        r += stored_rows(*p);
    }
    return out;
}

GateAct gate_act_of(MlpAct a) { return a == MlpAct::GELU_TANH ? GateAct::GELU_TANH : GateAct::SILU; }


}  // namespace

Transformer::Transformer(const ModelConfig& cfg, const TensorMap& w, const ModelOptions& opt) : cfg_(cfg), opt_(opt) {
    init(w, false);
}

Transformer::Transformer(const ModelConfig& cfg, TensorMap&& w, const ModelOptions& opt) : cfg_(cfg), opt_(opt) {
    TensorMap own = std::move(w);
    init(own, true);
    // `own` dies here: adopted tensors live on in the model, everything else is freed.
}

void Transformer::init(const TensorMap& w, bool adopt) {
    const ModelOptions& opt = opt_;
    cfg_.validate(cfg_.name.empty() ? "model config" : cfg_.name);
    if (opt.mla_cache) cfg_.latent.cache = *opt.mla_cache;  // the cache form asked for (load_model sets it on its config too)
    if (opt.dtype != DType::F32 && opt.dtype != DType::BF16 && opt.dtype != DType::F64)
        throw Error("model dtype must be f32, bf16 or f64");
    const int64_t E = cfg_.hidden_size, I = cfg_.intermediate_size, Q = cfg_.q_dim(), K = cfg_.kv_dim(), V = cfg_.vocab_size;
    embed_ = convert(need(w, "model.embed_tokens.weight", {V, E}), opt, "model.embed_tokens.weight", adopt);
    norm_ = convert(need(w, "model.norm.weight", {E}), opt, "model.norm.weight", adopt);
    if (cfg_.tie_word_embeddings && !w.count("lm_head.weight")) lm_head_ = embed_;
    else lm_head_ = convert(need(w, "lm_head.weight", {V, E}), opt, "lm_head.weight", adopt);
    // What the forward pass cannot compute yet is refused here, not approximated.
    if (cfg_.attention_sinks && opt.device.type != DeviceType::CPU)
        throw Error(str(cfg_.name, ": attention sinks (a learned logit per head in the softmax, gpt-oss) are computed on the CPU only; "
                        "expected --device cpu"));
    if ((cfg_.attn_logit_softcap > 0 || cfg_.final_logit_softcap > 0) && opt.device.type != DeviceType::CPU)
        throw Error(str(cfg_.name, ": logit soft-capping (attn_logit_softcapping ", cfg_.attn_logit_softcap, ", final_logit_softcapping ",
                        cfg_.final_logit_softcap, ") is computed on the CPU only; expected --device cpu"));
    if (cfg_.latent_attention() && opt.device.type != DeviceType::CPU)
        throw Error(str(cfg_.name, ": multi-head latent attention (DeepSeek-V2) is computed on the CPU only; expected --device cpu"));
    if ((cfg_.altup_enabled() || cfg_.any_kv_shared()) && opt.device.type != DeviceType::CPU)
        throw Error(str(cfg_.name, ": Gemma 3n's AltUp streams, LAUREL, per-layer inputs and cross-layer KV sharing are computed on "
                        "the CPU only; expected --device cpu"));
    for (int64_t l = 0; l < cfg_.num_layers; ++l)
        if (cfg_.short_conv_layer(l) && opt.device.type != DeviceType::CPU)
            throw Error(str(cfg_.name, ": layer ", l, " is a short convolution (LFM2), which is computed on the CPU only; expected --device cpu"));
    if (cfg_.has_experts() && opt.device.type != DeviceType::CPU)
        throw Error(str(cfg_.name, ": the mixture-of-experts MLP (gpt-oss) is computed on the CPU only; expected --device cpu"));
    // Norm tensors by placement: Llama's post_attention_layernorm is the pre-MLP norm; Gemma
    // and OLMo 2 apply it to the attention output and name the MLP's norms *_feedforward_*.
    const NormPlacement np = cfg_.norm_placement;
    const bool pre = np != NormPlacement::POST, post = np != NormPlacement::PRE;
    auto norm = [&](const std::string& name) { return convert(need(w, name, {E}), opt, name, adopt); };
    layers_.resize(size_t(cfg_.num_layers));
    for (int64_t l = 0; l < cfg_.num_layers; ++l) {
        const std::string p = "model.layers." + std::to_string(l) + ".";
        LayerWeights& L = layers_[size_t(l)];
        if (pre) L.attn_norm = norm(p + "input_layernorm.weight");
        if (post) {
            L.attn_post_norm = norm(p + "post_attention_layernorm.weight");
            L.mlp_post_norm = norm(p + "post_feedforward_layernorm.weight");
        }
        if (np == NormPlacement::PRE) L.mlp_norm = norm(p + "post_attention_layernorm.weight");
        if (np == NormPlacement::BOTH) L.mlp_norm = norm(p + "pre_feedforward_layernorm.weight");
        const bool conv = cfg_.short_conv_layer(l);
        if (conv)
            load_short_conv(cfg_, w, p, opt.dtype, opt.device, L);
        else if (cfg_.latent_attention())
            load_latent_attention(cfg_, w, p, opt.dtype, opt.device, L);
        else if (cfg_.fused_projections)
            L.wqkv = convert(need(w, p + "self_attn.qkv_proj.weight", {Q + 2 * K, E}), opt, p + "self_attn.qkv_proj.weight", adopt);
        else if (cfg_.kv_shared(l)) {  // reads another layer's K/V: its own k_proj / v_proj are never used
            L.wqkv = convert(need(w, p + "self_attn.q_proj.weight", {Q, E}), opt, p + "self_attn.q_proj.weight", adopt);
            // kept as the checkpoint holds them, so a saved model is a whole checkpoint again
            if (w.count(p + "self_attn.k_proj.weight") && w.count(p + "self_attn.v_proj.weight"))
                L.kv_unread = stack_rows({&need(w, p + "self_attn.k_proj.weight", {K, E}), &need(w, p + "self_attn.v_proj.weight", {K, E})},
                                         opt, p + "self_attn.kv_unread", adopt);
        } else
            L.wqkv = stack_rows({&need(w, p + "self_attn.q_proj.weight", {Q, E}), &need(w, p + "self_attn.k_proj.weight", {K, E}),
                                 &need(w, p + "self_attn.v_proj.weight", {K, E})},
                                opt, p + "self_attn.qkv", adopt);
        if (cfg_.qkv_bias) {
            Tensor bq = need(w, p + "self_attn.q_proj.bias", {Q}).unsqueeze(1);
            Tensor bk = need(w, p + "self_attn.k_proj.bias", {K}).unsqueeze(1);
            Tensor bv = need(w, p + "self_attn.v_proj.bias", {K}).unsqueeze(1);
            L.bqkv = stack_rows({&bq, &bk, &bv}, opt, p + "self_attn.qkv.bias", adopt).reshape({Q + 2 * K});
        }
        if (cfg_.qk_norm && !conv) {
            const int64_t nq = cfg_.qk_norm_whole ? Q : cfg_.head_dim, nk = cfg_.qk_norm_whole ? K : cfg_.head_dim;
            L.q_norm = convert(need(w, p + "self_attn.q_norm.weight", {nq}), opt, p + "self_attn.q_norm.weight", adopt);
            L.k_norm = convert(need(w, p + "self_attn.k_norm.weight", {nk}), opt, p + "self_attn.k_norm.weight", adopt);
        }
        if (!cfg_.latent_attention() && !conv)
            L.wo = convert(need(w, p + "self_attn.o_proj.weight", {E, Q}), opt, p + "self_attn.o_proj.weight", adopt);
        if (cfg_.o_bias) L.bo = convert(need(w, p + "self_attn.o_proj.bias", {E}), opt, p + "self_attn.o_proj.bias", adopt);
        if (cfg_.experts_layer(l)) {
            load_experts(cfg_, w, p, opt.dtype, opt.device, L);
        } else {
            if (cfg_.fused_projections)
                L.w_gate_up = convert(need(w, p + "mlp.gate_up_proj.weight", {2 * I, E}), opt, p + "mlp.gate_up_proj.weight", adopt);
            else
                L.w_gate_up = stack_rows({&need(w, p + "mlp.gate_proj.weight", {I, E}), &need(w, p + "mlp.up_proj.weight", {I, E})},
                                         opt, p + "mlp.gate_up", adopt);
            L.w_down = convert(need(w, p + "mlp.down_proj.weight", {E, I}), opt, p + "mlp.down_proj.weight", adopt);
        }
        if (cfg_.attention_sinks)
            L.sinks = convert(need(w, p + "self_attn.sinks", {cfg_.num_heads}), opt, p + "self_attn.sinks", adopt);
        if (cfg_.v_norm) L.v_norm = Tensor::full({cfg_.head_dim}, opt.dtype, 1.0, {opt.device, MemCategory::WEIGHTS, p + "v_norm"});
        if (cfg_.altup_enabled()) load_altup_layer(cfg_, w, p, opt.dtype, opt.device, L);
    }
    if (cfg_.altup_enabled()) altup_ = load_altup_model(cfg_, w, opt.dtype, opt.device);
    set_context_width(cfg_.max_position_embeddings);
}

void Transformer::set_context_width(int64_t width) {
    if (!ropes_.empty() && ropes_[0].context_width == width) return;
    ropes_.clear();
    layer_rope_.assign(size_t(cfg_.num_layers), 0);
    std::vector<LayerSpec> seen;
    for (int64_t l = 0; l < cfg_.num_layers; ++l) {
        const LayerSpec s = cfg_.layer_spec(l);
        size_t i = 0;
        while (i < seen.size() && !(seen[i].rope_theta == s.rope_theta && seen[i].rotary_fraction == s.rotary_fraction &&
                                     seen[i].rope_scaled == s.rope_scaled))
            ++i;
        if (i == seen.size()) {
            seen.push_back(s);
            ropes_.push_back(build_rope_tables(cfg_, s, width, opt_.rope, opt_.device, opt_.dtype == DType::F64 && opt_.device.is_cpu() ? DType::F64 : DType::F32));
        }
        layer_rope_[size_t(l)] = i;
    }
}

Tensor Transformer::embed(const Tensor& ids) const {
    MemoryLabelScope label("embedding");
    if (is_packed(embed_)) {
        // A packed table: each token's row is dequantized on the host (a few KiB per token).
        const std::vector<int64_t> id = ids.to_i64_vector();
        Shape s = ids.shape();
        s.d[s.ndim++] = cfg_.hidden_size;
        Tensor out = Tensor::empty(s, DType::F32, {opt_.device, MemCategory::ACTIVATIONS, {}});
        float* o = out.data<float>();
        for (size_t i = 0; i < id.size(); ++i) {
            if (id[i] < 0 || id[i] >= weight_shape(embed_)[0])
                throw Error(str("embedding: token id ", id[i], " is outside the vocabulary of ", weight_shape(embed_)[0]));
            packed_rows_to_f32(embed_, id[i], id[i] + 1, o + int64_t(i) * cfg_.hidden_size);
        }
        if (cfg_.embedding_scale != 1.0) ops::scale_(out, out, embedding_multiplier());
        return out;
    }
    Tensor x = ops::embedding(embed_, ids.device() == opt_.device ? ids : ids.to(opt_.device), opt_.dtype);
    if (cfg_.embedding_scale != 1.0) ops::scale_(x, x, embedding_multiplier());
    if (cfg_.altup_enabled()) return altup_embed(cfg_, altup_, ids, x, opt_.dtype);
    return x;
}

float Transformer::embedding_multiplier() const {
    const float s = float(cfg_.embedding_scale);
    return opt_.dtype == DType::BF16 ? bf16_to_f32(f32_to_bf16(s)) : s;
}

Tensor Transformer::block(int l, const Tensor& x, int64_t input_pos, LayerAttention& attention, BlockActivations* save) const {
    if (!cfg_.altup_enabled()) return block_core(l, x, input_pos, attention, save);
    MemoryLabelScope label(str("layer ", l, " altup"));
    const LayerWeights& L = layers_[size_t(l)];
    const AltUpPrediction p = altup_predict(cfg_, L, x, opt_.dtype, save != nullptr);
    AltUpCoefs c;
    const Tensor out = block_core(l, p.active, input_pos, attention, save, &c);
    if (save) save->altup_pred = p.pred, save->altup_active = p.active, save->altup_out = out;
    return altup_correct(cfg_, L, l, x, p, out, opt_.dtype, nullptr, nullptr, &c);
}

// Every block of Gemma 3n as block() runs them, each correction also making the next layer's
// prediction while its rows are in cache (one pass over the packed state fewer per layer).
Tensor Transformer::altup_blocks(const Tensor& x0, int64_t input_pos, LayerAttention& attention) const {
    Tensor x = x0;
    AltUpPrediction p;
    {
        MemoryLabelScope label("layer 0 altup");
        p = altup_predict(cfg_, layers_[0], x, opt_.dtype, false);
    }
    for (int l = 0; l < int(cfg_.num_layers); ++l) {
        MemoryLabelScope label(str("layer ", l, " altup"));
        AltUpCoefs c;
        const Tensor out = block_core(l, p.active, input_pos, attention, nullptr, &c);
        const bool last = l + 1 == int(cfg_.num_layers);
        AltUpPrediction follow;
        x = altup_correct(cfg_, layers_[size_t(l)], l, x, p, out, opt_.dtype, last ? nullptr : &layers_[size_t(l) + 1], &follow, &c);
        p = std::move(follow);
    }
    return x;
}

Tensor Transformer::block_core(int l, const Tensor& x, int64_t input_pos, LayerAttention& attention, BlockActivations* save,
                               AltUpCoefs* coefs) const {
    const LayerWeights& L = layers_[size_t(l)];
    const int64_t B = x.size(0), n = x.size(1), E = cfg_.hidden_size, NH = cfg_.num_heads, G = cfg_.num_kv_heads,
                  HS = cfg_.head_dim, I = cfg_.intermediate_size;
    const float eps = float(cfg_.rms_norm_eps);
    const RopeTables& rt = this->rope(l);
    const float off = float(cfg_.norm_weight_offset);
    if (input_pos + n > rt.context_width)
        throw Error(str("positions up to ", input_pos + n, " exceed the RoPE context width ", rt.context_width),
                    "set the context width (sequence length) before running the sequence");
    const DType act = opt_.dtype;
    const TensorOptions ao{opt_.device, MemCategory::ACTIVATIONS, {}};

    Tensor out;
    Tensor h_attn;  // the attention's input (after its norm), for LAUREL
    if (cfg_.short_conv_layer(l)) {
        // ---- short convolution in place of attention: no cache call, only the layer's state ----
        KV_TRACE_SPAN(trace::SpanCategory::ATTENTION, "short_conv", .layer = l);
        MemoryLabelScope label(str("layer ", l, " short conv"));
        const Tensor h = L.attn_norm.defined() ? ops::rmsnorm(x, L.attn_norm, eps, off) : x;
        Tensor o = short_conv(cfg_, L, l, h, input_pos, attention.layer_state(l), act, adapters_, save);
        if (L.attn_post_norm.defined()) {
            if (save) save->o = o;
            o = ops::rmsnorm(o, L.attn_post_norm, eps, off);
        }
        out = ops::add(x, o);
        if (save) save->out1 = out.clone();  // `out` gets the MLP added in place below
    } else {
    // ---- attention ----
    Tensor y;  // (B, n, NH, HS)
    {
        KV_TRACE_SPAN(trace::SpanCategory::ATTENTION, "attention", .layer = l);
        MemoryLabelScope label(str("layer ", l, " attention"));
        Tensor h;
        {
            KV_TRACE_SPAN(trace::SpanCategory::NORM, "rmsnorm", .layer = l);
            h = L.attn_norm.defined() ? ops::rmsnorm(x, L.attn_norm, eps, off) : x;
        }
        h_attn = h;
        Tensor qr, kr, vv;  // (B, NH, n, HS), (B, G, n, HS) x 2
        const bool shared = cfg_.kv_shared(l);  // ModelConfig::validate refuses sharing with latent attention
        if (cfg_.latent_cache() && attention.caches_tokens()) {
            // The cache holds latents (latent_attend): inference only, the reverse pass runs the
            // expanded form. An attention that keeps nothing (PlainAttention) runs the expanded
            // form below: there are no latents to store, and it costs less than the absorbed one.
            if (save)
                throw Error(str(cfg_.name, ": the reverse pass through multi-head latent attention runs the expanded form; the model caches "
                                "latents (--model.mla_cache latent); expected --model.mla_cache expanded"));
            y = Tensor::empty({B, n, NH, HS}, act, ao);
            attention.set_rope_frequencies(&rt.inv_freq);
            attention.set_layer_input(l, h);
            latent_attend(cfg_, L, h, rt, input_pos, act, attention, rt.attn_scale, cfg_.layer_window(l), y, l, adapters_);
        } else {
            if (cfg_.latent_attention()) {
                if (save) save->h1 = h;
                latent_qkv(cfg_, L, h, rt, input_pos, act, qr, kr, vv, l, adapters_, save);
            } else {
                Tensor qkv = linear_any(h, L.wqkv, act);  // (B, n, (NH + 2G) HS), or (B, n, NH HS) for a KV-shared layer
                if (adapters_) adapters_->add(l, LinearSite::QKV, h, input_pos, qkv);
                if (L.bqkv.defined()) ops::add_(qkv, qkv, L.bqkv.reshape({1, 1, L.bqkv.size(0)}));
                if (save) save->h1 = h, save->qkv = qkv;
                // A KV-shared layer projects queries only (wqkv is q_proj).
                const int64_t W = (shared ? NH : NH + 2 * G) * HS;
                Tensor q = qkv.as_strided({B, n, NH, HS}, {n * W, W, HS, 1}, qkv.offset());
                Tensor pos = position_range(input_pos, n, opt_.device);
                qr = Tensor::empty({B, NH, n, HS}, act, ao);
                // Gemma 3n (v_norm): every head's norm of the projection in one pass (head_norm_rows),
                // the heads then read as views of its output like the plain projection's.
                const bool head_pass = L.v_norm.defined() && L.q_norm.defined() && !cfg_.qk_norm_whole && act == DType::F32 &&
                                       qkv.device().type == DeviceType::CPU && qkv.is_contiguous();
                Tensor hn;
                if (head_pass) {
                    const int64_t heads = W / HS;
                    std::vector<float> w(size_t(W), 1.0f);  // v's heads: no weight (ones)
                    const std::vector<float> qw = L.q_norm.to_f32_vector();
                    const std::vector<float> kw = shared ? std::vector<float>() : L.k_norm.to_f32_vector();
                    for (int64_t h = 0; h < heads; ++h)
                        for (int64_t i = 0; i < HS && h < NH + (shared ? 0 : G); ++i)  // offset added in f32, as ops::rmsnorm adds it
                            w[size_t(h * HS + i)] = (h < NH ? qw[size_t(i)] : kw[size_t(i)]) + off;
                    hn = Tensor::empty(qkv.shape(), DType::F32, ao);
                    head_norm_rows::normalise(qkv.data<float>(), B * n, heads, HS, w.data(), eps, hn.data<float>());
                    q = hn.as_strided({B, n, NH, HS}, {n * W, W, HS, 1}, hn.offset());
                }
                if (shared) {
                    // The queries' own norm and RoPE; the keys and values are the source layer's.
                    if (L.q_norm.defined() && !head_pass) q = ops::rmsnorm(q, L.q_norm, eps, off);
                    if (rt.n_rot > 0) ops::rope_(qr, q.permute({0, 2, 1, 3}), pos, rt.cos, rt.sin, rt.n_rot);
                    else ops::copy_(qr, q.permute({0, 2, 1, 3}));
                } else {
                    Tensor k = qkv.as_strided({B, n, G, HS}, {n * W, W, HS, 1}, qkv.offset() + NH * HS);
                    Tensor v = qkv.as_strided({B, n, G, HS}, {n * W, W, HS, 1}, qkv.offset() + (NH + G) * HS);
                    if (L.q_norm.defined() && cfg_.qk_norm_whole) {
                        // OLMo 2: one RMSNorm over all heads of the projection
                        Tensor qf = qkv.as_strided({B, n, NH * HS}, {n * W, W, 1}, qkv.offset());
                        Tensor kf = qkv.as_strided({B, n, G * HS}, {n * W, W, 1}, qkv.offset() + NH * HS);
                        q = ops::rmsnorm(qf, L.q_norm, eps, off).reshape({B, n, NH, HS});
                        k = ops::rmsnorm(kf, L.k_norm, eps, off).reshape({B, n, G, HS});
                    } else if (head_pass) {
                        k = hn.as_strided({B, n, G, HS}, {n * W, W, HS, 1}, hn.offset() + NH * HS);
                        v = hn.as_strided({B, n, G, HS}, {n * W, W, HS, 1}, hn.offset() + (NH + G) * HS);
                    } else if (L.q_norm.defined()) {
                        q = ops::rmsnorm(q, L.q_norm, eps, off);
                        k = ops::rmsnorm(k, L.k_norm, eps, off);
                    }
                    if (L.v_norm.defined() && !head_pass) v = ops::rmsnorm(v, L.v_norm, eps, 0.0f);  // Gemma 3n: no weight (a ones vector)
                    kr = Tensor::empty({B, G, n, HS}, act, ao);
                    if (rt.n_rot > 0) {
                        ops::rope_(qr, q.permute({0, 2, 1, 3}), pos, rt.cos, rt.sin, rt.n_rot);
                        ops::rope_(kr, k.permute({0, 2, 1, 3}), pos, rt.cos, rt.sin, rt.n_rot);
                    } else {  // NoPE layer (rope_ with n_rot 0 would rotate every channel)
                        ops::copy_(qr, q.permute({0, 2, 1, 3}));
                        ops::copy_(kr, k.permute({0, 2, 1, 3}));
                    }
                    vv = v.permute({0, 2, 1, 3});  // (B, G, n, HS) strided view into qkv
                }
            }
            y = Tensor::empty({B, n, NH, HS}, act, ao);
            Tensor yv = y.permute({0, 2, 1, 3});
            attention.set_rope_frequencies(&rt.inv_freq);
            attention.set_output_projection(l, L.wo);
            const ops::AttentionSoftcap cap(cfg_.attn_logit_softcap);  // Gemma 2: every SDPA of this attention
            const ops::AttentionSinks sinks(&L.sinks);                 // gpt-oss: likewise (undefined = none)
            if (shared) {
                // The source's cache took its input with the source's call; this layer's input is
                // not handed to it (a shared layer's queries never update the source's policy).
                attention.attend_shared(l, int(cfg_.kv_layer(l)), qr, input_pos, rt.attn_scale, cfg_.layer_window(l), yv);
            } else {
                attention.set_layer_input(l, h);
                attention.attend(l, qr, kr, vv, input_pos, rt.attn_scale, cfg_.layer_window(l), yv);
            }
            if (save) save->qr = qr, save->kr = kr, save->v = vv, save->y = y;
        }
    }
    {
        MemoryLabelScope label(str("layer ", l, " attention output"));
        Tensor yf = y.reshape({B, n, NH * HS});
        Tensor o = linear_any(yf, L.wo, act);
        if (adapters_) adapters_->add(l, LinearSite::O, yf, input_pos, o);
        if (L.bo.defined()) ops::add_(o, o, L.bo.reshape({1, 1, E}));
        if (L.laurel_left.defined()) {  // Gemma 3n: (x + attention + LAUREL(h)) / sqrt(2), the post-norm inside
            if (save && L.attn_post_norm.defined()) save->o = o;
            out = laurel_residual(cfg_, L, x, o, h_attn, act, save ? &save->laurel_left : nullptr, save ? &save->laurel_r : nullptr);
        } else {
            if (L.attn_post_norm.defined()) {
                if (save) save->o = o;
                o = ops::rmsnorm(o, L.attn_post_norm, eps, off);
            }
            out = ops::add(x, o);
        }
        if (save) save->out1 = out.clone();  // `out` gets the MLP added in place below
    }
    }
    // ---- MLP ----
    {
        KV_TRACE_SPAN(trace::SpanCategory::MLP, "mlp", .layer = l);
        MemoryLabelScope label(str("layer ", l, " mlp"));
        Tensor h;
        {
            KV_TRACE_SPAN(trace::SpanCategory::NORM, "rmsnorm", .layer = l);
            h = L.mlp_norm.defined() ? ops::rmsnorm(out, L.mlp_norm, eps, off) : out;
        }
        Tensor d;
        if (cfg_.experts_layer(l)) {  // gpt-oss's experts (no adapters on them): save gets its own activations
            d = moe_mlp(cfg_, L, l, h, act, save);
        } else {
            Tensor gu = linear_any(h, L.w_gate_up, act);  // (B, n, 2I)
            if (adapters_) adapters_->add(l, LinearSite::GATE_UP, h, input_pos, gu);
            if (const double sp = cfg_.layer_spec(l).activation_sparsity; sp > 0) {
                Tensor gate = gu.slice(2, 0, I);
                if (save) save->gate_pre = gate.contiguous().clone();
                gaussian_topk_(gate, sp);
            }
            Tensor a = ops::gated(gu.slice(2, 0, I), gu.slice(2, I, 2 * I), gate_act_of(cfg_.mlp_act));
            d = linear_any(a, L.w_down, act);
            if (adapters_) adapters_->add(l, LinearSite::DOWN, a, input_pos, d);
            if (save) save->gu = gu, save->a = a;
        }
        if (L.mlp_post_norm.defined() && save) save->d = d;
        // Gemma 3n: the post-norm, the add and AltUp's correction coefficients in one pass
        if (!(coefs && altup_post_mlp(cfg_, L, x, d, out, act, coefs))) {
            if (L.mlp_post_norm.defined()) d = ops::rmsnorm(d, L.mlp_post_norm, eps, off);
            ops::add_(out, out, d);
        }
        // Without a pre-MLP norm h is `out`, which just received d: the saved input is out1.
        if (save) save->h2 = L.mlp_norm.defined() ? h : save->out1;
    }
    return out;
}

Tensor Transformer::final_norm(const Tensor& x) const {
    MemoryLabelScope label("final norm");
    if (cfg_.altup_enabled())
        return ops::rmsnorm(altup_unembed(cfg_, altup_, x, opt_.dtype), norm_, float(cfg_.rms_norm_eps), float(cfg_.norm_weight_offset));
    return ops::rmsnorm(x, norm_, float(cfg_.rms_norm_eps), float(cfg_.norm_weight_offset));
}

Tensor Transformer::lm_head(const Tensor& h, int64_t input_pos) const {
    KV_TRACE_SPAN(trace::SpanCategory::HEAD, "lm_head");
    MemoryLabelScope label("lm_head");
    Tensor logits = linear_any(h, lm_head_, opt_.dtype == DType::F64 ? DType::F64 : DType::F32);
    if (adapters_) adapters_->add(-1, LinearSite::HEAD, h, input_pos, logits);
    if (cfg_.final_logit_softcap > 0) {  // Gemma 2: z -> c tanh(z / c) (host loop: CPU logits)
        const double c = cfg_.final_logit_softcap;
        if (logits.dtype() == DType::F64)
            for (double* z = logits.data<double>(), *e = z + logits.numel(); z < e; ++z) *z = c * std::tanh(*z / c);
        else
            softcap_f32_(logits.data<float>(), logits.numel(), c);
    }
    return logits;
}

void Transformer::final_softcap_backward_(Tensor& dlogits, const Tensor& logits) const {
    if (!(cfg_.final_logit_softcap > 0)) return;
    // d/dz c tanh(z / c) = 1 - tanh^2 = 1 - (capped / c)^2, from the capped logits lm_head returned.
    const double c = cfg_.final_logit_softcap;
    const Tensor z = logits.contiguous();
    if (dlogits.dtype() == DType::F64) {
        const std::vector<double> zv = z.to_f64_vector();
        double* d = dlogits.data<double>();
        for (size_t i = 0; i < zv.size(); ++i) d[i] *= 1.0 - (zv[i] / c) * (zv[i] / c);
    } else {
        const std::vector<float> zv = z.to_f32_vector();
        float* d = dlogits.data<float>();
        for (size_t i = 0; i < zv.size(); ++i) d[i] = float(double(d[i]) * (1.0 - (double(zv[i]) / c) * (double(zv[i]) / c)));
    }
}

Tensor Transformer::forward(const Tensor& ids, int64_t input_pos, LayerAttention* attention) const {
    PlainAttention plain;
    if (!attention) {
        if (input_pos != 0) throw Error("forward without a cache must start at position 0");
        attention = &plain;
    }
    std::vector<int> sources;  // layers whose K/V later layers read (cross-layer sharing)
    for (int64_t l = 0; l < cfg_.num_layers; ++l)
        if (cfg_.kv_shared(l)) sources.push_back(int(cfg_.kv_layer(l)));
    plain.retain(sources);
    Tensor x = embed(ids);
    if (altup_can_follow(cfg_, opt_.dtype)) x = altup_blocks(x, input_pos, *attention);
    else
        for (int64_t l = 0; l < cfg_.num_layers; ++l) x = block(int(l), x, input_pos, *attention);
    return lm_head(final_norm(x));
}

int64_t Transformer::parameter_count() const {
    const bool tied = lm_head_.storage() == embed_.storage();
    int64_t n = weight_shape(embed_).numel() + norm_.numel() + (tied ? 0 : weight_shape(lm_head_).numel());
    for (const auto& L : layers_) {
        for (const Tensor* t : {&L.attn_norm, &L.wqkv, &L.bqkv, &L.q_norm, &L.k_norm, &L.wo, &L.bo, &L.attn_post_norm, &L.mlp_norm,
                                &L.mlp_post_norm, &L.w_gate_up, &L.w_down, &L.sinks, &L.conv_in, &L.conv_taps, &L.conv_out,
                                &L.router, &L.router_bias, &L.experts_gate_up, &L.experts_gate_up_bias, &L.experts_down,
                                &L.experts_down_bias})
            if (t->defined() && !(t == &L.wo && cfg_.latent_attention())) n += weight_shape(*t).numel();
        if (cfg_.latent_attention()) n += latent_parameter_count(cfg_, L);
        for (const Tensor* t : {&L.laurel_left, &L.laurel_right, &L.laurel_norm, &L.altup_router_norm, &L.altup_router, &L.altup_pred,
                                &L.altup_corr, &L.altup_out_scale, &L.pli_gate, &L.pli_proj, &L.pli_norm})
            if (t->defined()) n += t->numel();
    }
    for (const Tensor* t : {&altup_.embed_per_layer, &altup_.per_layer_proj, &altup_.per_layer_norm})
        if (t->defined()) n += t->numel();
    for (const auto* v : {&altup_.proj, &altup_.unembed})
        for (const Tensor& t : *v) n += t.numel();
    return n;
}

bool Transformer::has_packed_weights() const {
    if (is_packed(embed_) || is_packed(lm_head_)) return true;
    for (const auto& L : layers_)
        if (is_packed(L.wqkv) || is_packed(L.wo) || is_packed(L.w_gate_up) || is_packed(L.w_down)) return true;
    return false;
}

// Bytes as stored (packed weights count their blocks).
size_t Transformer::weight_bytes() const {
    const bool tied = lm_head_.storage() == embed_.storage();
    size_t n = embed_.nbytes() + norm_.nbytes() + (tied ? 0 : lm_head_.nbytes());
    for (const auto& L : layers_) {
        for (const Tensor* t : {&L.attn_norm, &L.wqkv, &L.bqkv, &L.q_norm, &L.k_norm, &L.wo, &L.bo, &L.attn_post_norm, &L.mlp_norm,
                                &L.mlp_post_norm, &L.w_gate_up, &L.w_down, &L.sinks, &L.wq_a, &L.q_a_norm, &L.wq, &L.wkv_a,
                                &L.kv_a_norm, &L.wkv_b, &L.conv_in, &L.conv_taps, &L.conv_out, &L.router, &L.router_bias,
                                &L.experts_gate_up, &L.experts_gate_up_bias, &L.experts_down, &L.experts_down_bias, &L.laurel_left,
                                &L.laurel_right, &L.laurel_norm, &L.altup_router_norm, &L.altup_router, &L.altup_pred, &L.altup_corr,
                                &L.altup_out_scale, &L.pli_gate, &L.pli_proj, &L.pli_norm, &L.kv_unread})
            if (t->defined()) n += t->nbytes();
    }
    for (const Tensor* t : {&altup_.embed_per_layer, &altup_.per_layer_proj, &altup_.per_layer_norm})
        if (t->defined()) n += t->nbytes();
    for (const auto* v : {&altup_.proj, &altup_.unembed})
        for (const Tensor& t : *v) n += t.nbytes();
    return n;
}

}  // namespace kv
