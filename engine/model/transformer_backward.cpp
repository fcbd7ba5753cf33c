// Block reverse pass (see transformer_backward.h; the forward is transformer.cpp). Shapes: B batch, n chunk tokens, E width, NH
// query heads, G KV heads, HS head size, I MLP width, W = (NH + 2G) HS.
#include "transformer_backward.h"

#include <cmath>

#include "engine/core/error.h"
#include "engine/memory/memory_tracker.h"
#include "engine/ops/ops.h"
#include "engine/telemetry/trace.h"
#include "altup_backward.h"
#include "grad_math.h"
#include "latent_attention.h"
#include "moe_mlp.h"
#include "packed_weight.h"
#include "short_conv.h"

namespace kv {

namespace {

// dx (B, n, in) = dy (B, n, out) @ W (out, in), plus the adapter's share (tokens at input_pos..).
Tensor linear_input_grad(const Transformer& m, int layer, LinearSite site, const Tensor& w, const Tensor& x, int64_t input_pos,
                         const Tensor& dy) {
    Tensor dx = linear_input_grad_any(dy, w, x.dtype());  // packed bases too (never updated)
    if (m.adapters()) m.adapters()->backward(layer, site, x, input_pos, dy, dx);
    return dx;
}

}  // namespace

void linear_weight_grad(Tensor& dw, Tensor* db, const Tensor& x, const Tensor& dy) {
    Tensor x2 = grad::rows2d(x), dy2 = grad::rows2d(dy);
    ops::matmul_(dw, dy2.transpose(0, 1), x2, 1.0f, 1.0f);
    if (db && db->defined()) {
        Tensor ones = Tensor::full({1, dy2.size(0)}, dy2.dtype(), 1.0, {dy2.device(), MemCategory::WORKSPACE, "ones"});
        Tensor dbr = db->reshape({1, db->numel()});
        ops::matmul_(dbr, ones, dy2, 1.0f, 1.0f);
    }
}

void AttentionBackward::backward_shared(int layer, int source, const Tensor&, const Tensor&, float, int, Tensor&) {
    throw Error(str("layer ", layer, " reads the keys and values of layer ", source,
                    " (cross-layer KV sharing), whose reverse pass this attention does not implement"));
}

Tensor block_backward(const Transformer& m, int l, const Tensor& x, const BlockActivations& a, const Tensor& dout,
                      int64_t input_pos, AttentionBackward& attention, LayerGrads* g) {
    if (!m.config().altup_enabled()) return block_core_backward(m, l, x, a, dout, input_pos, attention, g);
    // Gemma 3n: the core runs on the active stream AltUp predicted (altup_backward.h)
    return altup_block_backward(m.config(), m.layer(l), l, x, a, dout, g, [&](const Tensor& dcore) {
        return block_core_backward(m, l, a.altup_active, a, dcore, input_pos, attention, g);
    });
}

Tensor block_core_backward(const Transformer& m, int l, const Tensor& x, const BlockActivations& a, const Tensor& dout,
                           int64_t input_pos, AttentionBackward& attention, LayerGrads* g) {
    const ModelConfig& c = m.config();
    const LayerWeights& L = m.layer(l);
    const int64_t B = x.size(0), n = x.size(1), NH = c.num_heads, G = c.num_kv_heads, HS = c.head_dim, I = c.intermediate_size,
                  W = (NH + 2 * G) * HS;
    const float eps = float(c.rms_norm_eps);
    const DType dt = x.dtype();
    const Device dev = x.device();
    const TensorOptions go{dev, MemCategory::ACTIVATIONS, {}};
    MemoryLabelScope label(str("layer ", l, " backward"));
    const float off = float(c.norm_weight_offset);

    // ---- MLP: out = out1 + post(down(act(gate) up(pre(out1)))) or post(experts(pre(out1))), pre/post optional norms ----
    Tensor dout1;
    {
        KV_TRACE_SPAN(trace::SpanCategory::MLP, "mlp backward", .layer = l);
        Tensor dd = dout;
        if (L.mlp_post_norm.defined()) {  // Gemma, OLMo 2: norm on the MLP output
            dd = Tensor::empty(dout.shape(), dt, go);
            ops::rmsnorm_backward_(dd, g && g->mlp_post_norm.defined() ? &g->mlp_post_norm : nullptr, a.d, L.mlp_post_norm, dout, eps,
                                   off);
        }
        Tensor dh2;
        if (c.experts_layer(l)) {  // gpt-oss's experts (moe_mlp.h)
            dh2 = moe_mlp_backward(c, L, l, a, dd, g);
        } else {
            Tensor da = linear_input_grad(m, l, LinearSite::DOWN, L.w_down, a.a, input_pos, dd);  // (B, n, I)
            if (g && g->w_down.defined()) linear_weight_grad(g->w_down, nullptr, a.a, dd);
            Tensor dgu = Tensor::empty({B, n, 2 * I}, dt, go);
            Tensor dgate = dgu.slice(2, 0, I), dup = dgu.slice(2, I, 2 * I);
            ops::swiglu_backward_(dgate, dup, a.gu.slice(2, 0, I), a.gu.slice(2, I, 2 * I), da, false,
                                  c.mlp_act == MlpAct::GELU_TANH ? GateAct::GELU_TANH : GateAct::SILU);
            // Gemma 3n's gaussian top-k sat between the gate projection and its activation
            if (const double sp = c.layer_spec(l).activation_sparsity; sp > 0) gaussian_topk_backward_(dgate, a.gate_pre, sp);
            dh2 = linear_input_grad(m, l, LinearSite::GATE_UP, L.w_gate_up, a.h2, input_pos, dgu);
            if (g && g->w_gate_up.defined()) linear_weight_grad(g->w_gate_up, nullptr, a.h2, dgu);
        }
        dout1 = dout.clone();
        if (L.mlp_norm.defined())
            ops::rmsnorm_backward_(dout1, g && g->mlp_norm.defined() ? &g->mlp_norm : nullptr, a.out1, L.mlp_norm, dh2, eps, off,
                                   /*accumulate_dx=*/true);
        else
            ops::add_(dout1, dout1, dh2);
    }

    // ---- attention: out1 = x + o_proj(attention(rope(q), rope(k), v)) ----
    // dqkv: the q/k/v projection's output gradient; latent attention's projections and the short
    // convolution instead give the attention norm's output gradient, dh_mixer.
    const bool conv = c.short_conv_layer(l);
    // A KV-shared layer projects queries only: its dqkv is the queries' (B, n, NH HS).
    const bool shared = c.kv_shared(l);
    const int64_t Wp = shared ? NH * HS : W;
    Tensor dqkv = c.latent_attention() || conv ? Tensor() : Tensor::empty({B, n, Wp}, dt, go), dh_mixer;
    Tensor dh_laurel;  // Gemma 3n: LAUREL's share of the attention norm's output gradient
    if (conv) {
        // ---- short convolution in place of attention: out1 = x + post(conv(pre(x))) ----
        KV_TRACE_SPAN(trace::SpanCategory::ATTENTION, "short conv backward", .layer = l);
        Tensor dob = dout1;
        if (L.attn_post_norm.defined()) {
            dob = Tensor::empty(dout1.shape(), dt, go);
            ops::rmsnorm_backward_(dob, g && g->attn_post_norm.defined() ? &g->attn_post_norm : nullptr, a.o, L.attn_post_norm, dout1,
                                   eps, off);
        }
        dh_mixer = short_conv_backward(c, L, l, a, dob, input_pos, attention.layer_state_grad(l), m.adapters(), g);
    } else {
        KV_TRACE_SPAN(trace::SpanCategory::ATTENTION, "attention backward", .layer = l);
        Tensor yf = a.y.reshape({B, n, NH * HS});
        if (L.laurel_left.defined()) {
            // Gemma 3n: out1 = (x + post(o) + h + RMSNorm(W_right W_left h)) / sqrt(2), h the attention norm's output
            dout1 = ops::scale(dout1, float(1.0 / std::sqrt(2.0)));
            dh_laurel = laurel_backward(c, L, a.h1, a.laurel_left, a.laurel_r, dout1, g);
            ops::add_(dh_laurel, dh_laurel, dout1);
        }
        Tensor dob = dout1;
        if (L.attn_post_norm.defined()) {  // Gemma, OLMo 2: norm on the attention output
            dob = Tensor::empty(dout1.shape(), dt, go);
            ops::rmsnorm_backward_(dob, g && g->attn_post_norm.defined() ? &g->attn_post_norm : nullptr, a.o, L.attn_post_norm, dout1,
                                   eps, off);
        }
        Tensor dyf = linear_input_grad(m, l, LinearSite::O, L.wo, yf, input_pos, dob);  // (B, n, NH HS)
        if (g && g->wo.defined()) linear_weight_grad(g->wo, g->bo.defined() ? &g->bo : nullptr, yf, dob);
        Tensor dy = dyf.reshape({B, n, NH, HS}).permute({0, 2, 1, 3});  // (B, NH, n, HS) view
        Tensor dqr = Tensor::empty({B, NH, n, HS}, dt, go);
        Tensor dkr = Tensor::empty({B, G, n, HS}, dt, go);
        Tensor dv = Tensor::empty({B, G, n, HS}, dt, go);
        const auto& r = m.rope(l);
        {
            const ops::AttentionSoftcap cap(c.attn_logit_softcap);  // as the forward capped the scores
            const ops::AttentionSinks sinks(&L.sinks, g && g->sinks.defined() ? &g->sinks : nullptr);
            if (shared)  // the keys' and values' gradient goes to the source's cache
                attention.backward_shared(l, int(c.kv_layer(l)), a.qr, dy, r.attn_scale, c.layer_window(l), dqr);
            else
                attention.backward(l, a.qr, dy, r.attn_scale, dqr, dkr, dv);
        }
        if (c.latent_attention()) {
            dh_mixer = latent_qkv_backward(c, L, a, r, input_pos, dqr, dkr, dv, l, m.adapters(), g);
        } else if (shared) {
            if (L.q_norm.defined() && c.qk_norm_whole)
                throw Error(str("layer ", l, ": the reverse pass of a KV-shared layer with a q norm over the whole projection is not implemented"));
            const Tensor pos = position_range(input_pos, n, dev);
            Tensor dq = dqkv.as_strided({B, NH, n, HS}, {n * Wp, HS, Wp, 1}, dqkv.offset());
            Tensor tq = dq;
            if (L.q_norm.defined()) tq = Tensor::empty({B, NH, n, HS}, dt, go);
            if (r.n_rot > 0)
                ops::rope_backward_(tq, dqr, pos, r.cos, r.sin, r.n_rot);
            else
                ops::copy_(tq, dqr);
            if (L.q_norm.defined()) {
                Tensor q_pre = a.qkv.as_strided({B, NH, n, HS}, {n * Wp, HS, Wp, 1}, a.qkv.offset());
                ops::rmsnorm_backward_(dq, g && g->q_norm.defined() ? &g->q_norm : nullptr, q_pre, L.q_norm, tq, eps, off);
            }
        } else {
            // Undo RoPE into the (B, n, heads, HS) layout of the projection output.
            const Tensor pos = position_range(input_pos, n, dev);
            Tensor dq = dqkv.as_strided({B, NH, n, HS}, {n * W, HS, W, 1}, dqkv.offset());
            Tensor dk = dqkv.as_strided({B, G, n, HS}, {n * W, HS, W, 1}, dqkv.offset() + NH * HS);
            Tensor dvv = dqkv.as_strided({B, G, n, HS}, {n * W, HS, W, 1}, dqkv.offset() + (NH + G) * HS);
            // A NoPE layer's "rotation" is the identity.
            auto unrotate = [&](Tensor& dst, const Tensor& src) {
                if (r.n_rot > 0)
                    ops::rope_backward_(dst, src, pos, r.cos, r.sin, r.n_rot);
                else
                    ops::copy_(dst, src);
            };
            if (!L.q_norm.defined()) {
                unrotate(dq, dqr);
                unrotate(dk, dkr);
            } else if (c.qk_norm_whole) {
                // OLMo 2: one RMSNorm over all heads of the projection, before the head split
                Tensor tq = Tensor::empty({B, n, NH, HS}, dt, go), tk = Tensor::empty({B, n, G, HS}, dt, go);
                Tensor tqv = tq.permute({0, 2, 1, 3}), tkv = tk.permute({0, 2, 1, 3});
                unrotate(tqv, dqr);
                unrotate(tkv, dkr);
                Tensor q_pre = a.qkv.as_strided({B, n, NH * HS}, {n * W, W, 1}, a.qkv.offset());
                Tensor k_pre = a.qkv.as_strided({B, n, G * HS}, {n * W, W, 1}, a.qkv.offset() + NH * HS);
                Tensor dqf = dqkv.as_strided({B, n, NH * HS}, {n * W, W, 1}, dqkv.offset());
                Tensor dkf = dqkv.as_strided({B, n, G * HS}, {n * W, W, 1}, dqkv.offset() + NH * HS);
                ops::rmsnorm_backward_(dqf, g && g->q_norm.defined() ? &g->q_norm : nullptr, q_pre, L.q_norm,
                                       tq.reshape({B, n, NH * HS}), eps, off);
                ops::rmsnorm_backward_(dkf, g && g->k_norm.defined() ? &g->k_norm : nullptr, k_pre, L.k_norm,
                                       tk.reshape({B, n, G * HS}), eps, off);
            } else {
                // q/k RMSNorm over HS sat between the projection and RoPE
                Tensor tq = Tensor::empty({B, NH, n, HS}, dt, go), tk = Tensor::empty({B, G, n, HS}, dt, go);
                unrotate(tq, dqr);
                unrotate(tk, dkr);
                Tensor q_pre = a.qkv.as_strided({B, NH, n, HS}, {n * W, HS, W, 1}, a.qkv.offset());
                Tensor k_pre = a.qkv.as_strided({B, G, n, HS}, {n * W, HS, W, 1}, a.qkv.offset() + NH * HS);
                ops::rmsnorm_backward_(dq, g && g->q_norm.defined() ? &g->q_norm : nullptr, q_pre, L.q_norm, tq, eps, off);
                ops::rmsnorm_backward_(dk, g && g->k_norm.defined() ? &g->k_norm : nullptr, k_pre, L.k_norm, tk, eps, off);
            }
            if (L.v_norm.defined()) {  // Gemma 3n: the values' RMSNorm without weight (a ones vector)
                Tensor v_pre = a.qkv.as_strided({B, G, n, HS}, {n * W, HS, W, 1}, a.qkv.offset() + (NH + G) * HS);
                ops::rmsnorm_backward_(dvv, nullptr, v_pre, L.v_norm, dv, eps, 0.0f);
            } else {
                ops::copy_(dvv, dv);
            }
        }
    }

    // ---- q/k/v projection and the attention norm ----
    Tensor dx;
    {
        KV_TRACE_SPAN(trace::SpanCategory::NORM, "qkv backward", .layer = l);
        Tensor dh1 = dh_mixer;
        if (!dh1.defined()) {
            dh1 = linear_input_grad(m, l, LinearSite::QKV, L.wqkv, a.h1, input_pos, dqkv);
            if (g && g->wqkv.defined()) linear_weight_grad(g->wqkv, g->bqkv.defined() ? &g->bqkv : nullptr, a.h1, dqkv);
        }
        if (dh_laurel.defined()) ops::add_(dh1, dh1, dh_laurel);
        dx = dout1.clone();
        if (L.attn_norm.defined())
            ops::rmsnorm_backward_(dx, g && g->attn_norm.defined() ? &g->attn_norm : nullptr, x, L.attn_norm, dh1, eps, off, true);
        else
            ops::add_(dx, dx, dh1);
    }
    return dx;
}

}  // namespace kv
