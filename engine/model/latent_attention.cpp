// Multi-head latent attention's projections and weights (see latent_attention.h).
#include "engine/model/latent_attention.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "engine/core/error.h"
#include "engine/model/attention.h"
#include "engine/model/packed_weight.h"
#include "engine/model/transformer_backward.h"
#include "engine/ops/ops.h"

namespace kv {

namespace {

// The tensor's values (f64 on the host), after checking its name and shape.
std::vector<double> values_of(const TensorMap& w, const std::string& name, const Shape& shape) {
    auto it = w.find(name);
    if (it == w.end()) throw Error(str("model weights: missing tensor '", name, "' (expected shape ", shape.str(), ")"));
    if (is_packed(it->second))
        throw Error(str("model weights: tensor '", name, "' is quantized; latent attention loads float weights only (a Hugging Face folder)"));
    if (it->second.shape() != shape)
        throw Error(str("model weights: tensor '", name, "' has shape ", it->second.shape().str(), ", expected ", shape.str()));
    if (!dtype_is_float(it->second.dtype())) throw Error(str("model weights: tensor '", name, "' is not a float tensor"));
    return it->second.contiguous().to_f64_vector();
}

Tensor make(const Shape& s, const std::vector<double>& v, DType dtype, Device device, const std::string& label) {
    return Tensor::from_f64(s, v, dtype, {device, MemCategory::WEIGHTS, label});
}

// Rows of a (rows, cols) matrix in the order `from` (new row i = old row from[i]).
std::vector<double> rows_in_order(const std::vector<double>& m, int64_t cols, const std::vector<int64_t>& from) {
    std::vector<double> out(from.size() * size_t(cols));
    for (size_t i = 0; i < from.size(); ++i)
        std::copy_n(m.begin() + from[i] * cols, cols, out.begin() + int64_t(i) * cols);
    return out;
}

// Old row of each new row of one head [pe (R, pairs interleaved) after nope (D)] laid out as
// [pe pairs (d, d + R/2) ; nope], starting at `base`.
void head_order(int64_t base, int64_t D, int64_t R, std::vector<int64_t>& from) {
    for (int64_t j = 0; j < R; ++j) from.push_back(base + D + (j < R / 2 ? 2 * j : 2 * (j - R / 2) + 1));
    for (int64_t j = 0; j < D; ++j) from.push_back(base + j);
}

}  // namespace

void load_latent_attention(const ModelConfig& cfg, const TensorMap& w, const std::string& p, DType dtype, Device device,
                           LayerWeights& L) {
    const LatentAttention& a = cfg.latent;
    const int64_t E = cfg.hidden_size, NH = cfg.num_heads, HS = cfg.head_dim, R = a.qk_rope_head_dim, D = a.qk_nope_head_dim,
                  VD = a.v_head_dim, r = a.kv_lora_rank;
    std::vector<int64_t> q_rows;
    for (int64_t h = 0; h < NH; ++h) head_order(h * HS, D, R, q_rows);
    if (a.q_lora_rank > 0) {
        const int64_t qr = a.q_lora_rank;
        L.wq_a = make({qr, E}, values_of(w, p + "self_attn.q_a_proj.weight", {qr, E}), dtype, device, p + "self_attn.q_a_proj.weight");
        L.q_a_norm = make({qr}, values_of(w, p + "self_attn.q_a_layernorm.weight", {qr}), dtype, device, p + "self_attn.q_a_layernorm.weight");
        L.wq = make({NH * HS, qr}, rows_in_order(values_of(w, p + "self_attn.q_b_proj.weight", {NH * HS, qr}), qr, q_rows), dtype, device,
                    p + "self_attn.q_b_proj.weight");
    } else {
        L.wq = make({NH * HS, E}, rows_in_order(values_of(w, p + "self_attn.q_proj.weight", {NH * HS, E}), E, q_rows), dtype, device,
                    p + "self_attn.q_proj.weight");
    }
    // The latent's rows stay; k_pe's rows (after them) are de-interleaved as the queries' are.
    std::vector<int64_t> kv_rows;
    for (int64_t j = 0; j < r; ++j) kv_rows.push_back(j);
    for (int64_t j = 0; j < R; ++j) kv_rows.push_back(r + (j < R / 2 ? 2 * j : 2 * (j - R / 2) + 1));
    L.wkv_a = make({r + R, E}, rows_in_order(values_of(w, p + "self_attn.kv_a_proj_with_mqa.weight", {r + R, E}), E, kv_rows), dtype,
                   device, p + "self_attn.kv_a_proj_with_mqa.weight");
    L.kv_a_norm = make({r}, values_of(w, p + "self_attn.kv_a_layernorm.weight", {r}), dtype, device, p + "self_attn.kv_a_layernorm.weight");
    L.wkv_b = make({NH * (D + VD), r}, values_of(w, p + "self_attn.kv_b_proj.weight", {NH * (D + VD), r}), dtype, device,
                   p + "self_attn.kv_b_proj.weight");
    // W_o (E, NH VD) -> (E, NH HS): head h's VD columns at h HS, zeros after them.
    const std::vector<double> wo = values_of(w, p + "self_attn.o_proj.weight", {E, NH * VD});
    std::vector<double> padded(size_t(E * NH * HS), 0.0);
    for (int64_t e = 0; e < E; ++e)
        for (int64_t h = 0; h < NH; ++h)
            std::copy_n(wo.begin() + e * NH * VD + h * VD, VD, padded.begin() + e * NH * HS + h * HS);
    L.wo = make({E, NH * HS}, padded, dtype, device, p + "self_attn.o_proj.weight");
}

namespace {

// What both forms share: the queries before RoPE (B, n, NH, HS), each head [pe ; nope]; W_kv_a h
// (B, n, r + R), the latent before its norm then k_pe; the normalised latent c (B, n, r).
struct LatentProjections {
    Tensor q, ckv, c;
};

LatentProjections project(const ModelConfig& cfg, const LayerWeights& L, const Tensor& h, const RopeTables& rt, int64_t input_pos,
                          DType act, int layer, const LinearAdapters* ad, BlockActivations* save) {
    const LatentAttention& a = cfg.latent;
    const int64_t B = h.size(0), n = h.size(1), NH = cfg.num_heads, HS = cfg.head_dim, R = a.qk_rope_head_dim, r = a.kv_lora_rank;
    const float eps = float(a.latent_norm_eps);
    if (rt.n_rot != R)
        throw Error(str("latent attention rotates ", R, " channels per head, but the layer's RoPE tables rotate ", rt.n_rot));
    Tensor qin = h;
    if (L.wq_a.defined()) {
        Tensor qa = linear_any(h, L.wq_a, act);
        if (save) save->q_a = qa;
        qin = ops::rmsnorm(qa, L.q_a_norm, eps);
    }
    Tensor qf = linear_any(qin, L.wq, act);  // (B, n, NH HS): each head [pe ; nope]
    if (ad) ad->add(layer, LinearSite::QKV, qin, input_pos, qf);
    LatentProjections p;
    p.q = qf.reshape({B, n, NH, HS});
    p.ckv = linear_any(h, L.wkv_a, act);  // (B, n, r + R)
    if (ad) ad->add(layer, LinearSite::KV_A, h, input_pos, p.ckv);
    p.c = ops::rmsnorm(p.ckv.slice(2, 0, r), L.kv_a_norm, eps);
    if (save) save->q_in = qin, save->ckv = p.ckv, save->c = p.c;
    return p;
}

// Head h's W_uk (D, r) and W_uv (VD, r) as (1, NH, rows, r) views of W_kv_b's rows [k_nope ; v]
// per head, given W_kv_b's strides (row, column): the stored matrix, or the transpose of the
// adapted map (latent_attend).
Tensor head_rows(const Tensor& m, int64_t sr, int64_t sc, int64_t NH, int64_t D, int64_t VD, int64_t r, int64_t first, int64_t rows) {
    return m.as_strided({1, NH, rows, r}, {0, (D + VD) * sr, sr, sc}, m.offset() + first * sr);
}

}  // namespace

void latent_qkv(const ModelConfig& cfg, const LayerWeights& L, const Tensor& h, const RopeTables& rt, int64_t input_pos,
                DType act, Tensor& qr, Tensor& kr, Tensor& v, int layer, const LinearAdapters* ad, BlockActivations* save) {
    const LatentAttention& a = cfg.latent;
    const int64_t B = h.size(0), n = h.size(1), NH = cfg.num_heads, HS = cfg.head_dim, R = a.qk_rope_head_dim,
                  D = a.qk_nope_head_dim, VD = a.v_head_dim, r = a.kv_lora_rank;
    const TensorOptions ao{h.device(), MemCategory::ACTIVATIONS, {}};
    const LatentProjections p = project(cfg, L, h, rt, input_pos, act, layer, ad, save);
    const Tensor &q = p.q, &ckv = p.ckv;
    Tensor kv = linear_any(p.c, L.wkv_b, act);  // (B, n, NH (D + VD)): each head [k_nope ; v]
    if (ad) ad->add(layer, LinearSite::KV_B, p.c, input_pos, kv);
    const int64_t W = NH * (D + VD);
    // k (B, n, NH, HS) = [k_pe ; k_nope]: k_pe read once per head through a head stride of 0.
    Tensor k = Tensor::empty({B, n, NH, HS}, act, ao);
    Tensor k_pe = k.slice(3, 0, R), k_nope = k.slice(3, R, HS);
    ops::copy_(k_pe, ckv.as_strided({B, n, NH, R}, {n * (r + R), r + R, 0, 1}, ckv.offset() + r));
    if (D > 0) ops::copy_(k_nope, kv.as_strided({B, n, NH, D}, {n * W, W, D + VD, 1}, kv.offset()));
    v = VD == HS ? Tensor::empty({B, NH, n, HS}, act, ao) : Tensor::zeros({B, NH, n, HS}, act, ao);  // padding only
    Tensor v_part = v.slice(3, 0, VD);
    ops::copy_(v_part, kv.as_strided({B, NH, n, VD}, {n * W, D + VD, W, 1}, kv.offset() + D));
    Tensor pos = position_range(input_pos, n, h.device());
    qr = Tensor::empty({B, NH, n, HS}, act, ao);
    kr = Tensor::empty({B, NH, n, HS}, act, ao);
    ops::rope_(qr, q.permute({0, 2, 1, 3}), pos, rt.cos, rt.sin, rt.n_rot);
    ops::rope_(kr, k.permute({0, 2, 1, 3}), pos, rt.cos, rt.sin, rt.n_rot);
}

int64_t latent_expand_min_queries(const ModelConfig& cfg) {
    const LatentAttention& a = cfg.latent;
    switch (a.chunk_form) {
        case LatentAttention::ChunkForm::EXPANDED: return 0;
        case LatentAttention::ChunkForm::ABSORBED: return -1;
        case LatentAttention::ChunkForm::AUTO: break;
    }
    // Expanded iff n (2C - HS - VD) > r (D + VD) (latent_expansion.h).
    const int64_t C = a.qk_rope_head_dim + a.kv_lora_rank, spare = 2 * C - cfg.head_dim - a.v_head_dim;
    return spare > 0 ? a.kv_lora_rank * (a.qk_nope_head_dim + a.v_head_dim) / spare + 1 : -1;
}

void latent_attend(const ModelConfig& cfg, const LayerWeights& L, const Tensor& h, const RopeTables& rt, int64_t input_pos,
                   DType act, LayerAttention& attention, float scale, int window, Tensor& y, int layer, const LinearAdapters* ad) {
    const LatentAttention& a = cfg.latent;
    const int64_t B = h.size(0), n = h.size(1), NH = cfg.num_heads, HS = cfg.head_dim, R = a.qk_rope_head_dim,
                  D = a.qk_nope_head_dim, VD = a.v_head_dim, r = a.kv_lora_rank, C = R + r, W = NH * (D + VD);
    const TensorOptions ao{h.device(), MemCategory::ACTIVATIONS, {}};
    const LatentProjections p = project(cfg, L, h, rt, input_pos, act, layer, ad, nullptr);
    // W_kv_b as (row stride, column stride) over a matrix: the weight itself, or with a LoRA
    // adapter on it the adapted map read off the identity (I_r -> (r, W) = W_kv_b'^T; the
    // adapter is linear in its input at inference, where no dropout runs).
    Tensor wkv_b = L.wkv_b;
    int64_t sr = r, sc = 1;
    if (ad) {
        std::vector<double> eye(size_t(r * r), 0.0);
        for (int64_t j = 0; j < r; ++j) eye[size_t(j * r + j)] = 1.0;
        const Tensor I = Tensor::from_f64({1, r, r}, eye, act, ao);
        wkv_b = linear_any(I, L.wkv_b, act);  // (1, r, W)
        ad->add(layer, LinearSite::KV_B, I, input_pos, wkv_b);
        sr = 1, sc = W;
    }
    const Tensor pos = position_range(input_pos, n, h.device());
    // Queries (B, NH, n, R + r): [RoPE(q_pe) ; W_uk_h^T q_nope], so q~ . [k_pe ; c] = q_pe . k_pe +
    // q_nope . (W_uk_h c), the expanded score.
    Tensor qrot = Tensor::empty({B, NH, n, HS}, act, ao);
    ops::rope_(qrot, p.q.permute({0, 2, 1, 3}), pos, rt.cos, rt.sin, rt.n_rot);
    // Written on demand (LatentExpansion::write_queries): an expanded chunk may not read them.
    Tensor qt = D > 0 ? Tensor::empty({B, NH, n, C}, act, ao) : Tensor::zeros({B, NH, n, C}, act, ao);
    auto write_queries = [=]() mutable {
        Tensor dst = qt.slice(3, 0, R);
        ops::copy_(dst, qrot.slice(3, 0, R));
        if (D > 0) {
            Tensor lat = qt.slice(3, R, C);  // (B, NH, n, r) = q_nope W_uk_h per head
            ops::matmul_(lat, qrot.slice(3, R, HS), head_rows(wkv_b, sr, sc, NH, D, VD, r, 0, D), 1.0f, 0.0f);
        }
    };
    // The cached vector (B, 1, n, R + r): [RoPE(k_pe) ; c]; it is the value too.
    // k_pe is rotated straight out of W_kv_a h, the latent copied in after it.
    Tensor kt = Tensor::empty({B, 1, n, C}, act, ao);
    {
        Tensor pe = kt.slice(3, 0, R), lat = kt.slice(3, R, C);
        ops::rope_(pe, p.ckv.as_strided({B, 1, n, R}, {n * (r + R), 0, r + R, 1}, p.ckv.offset() + r), pos, rt.cos, rt.sin, rt.n_rot);
        ops::copy_(lat, p.c.reshape({B, 1, n, r}));
    }
    // The expanded form, for an attention that finds it cheaper (latent_expansion.h): the
    // queries qrot, and each held latent decompressed per head by W_kv_b (adapted or not).
    LatentExpansion ex;
    ex.q = qrot;
    ex.y = y.permute({0, 2, 1, 3});
    ex.min_queries = latent_expand_min_queries(cfg);
    ex.write_queries = write_queries;
    if (ex.min_queries >= 0) {
        // (W, r) in nn.Linear layout: the weight, or the adapted map's transpose.
        const Tensor wkv = ad ? wkv_b.reshape({r, W}).transpose(0, 1).contiguous() : L.wkv_b;
        ex.expand = [=](const Tensor& latents) {
            const int64_t Bl = latents.size(0), T = latents.size(2);
            const TensorOptions eo{latents.device(), MemCategory::WORKSPACE, "expanded latents"};
            const Tensor lat = latents.contiguous();                                           // (B, 1, T, C)
            const Tensor kv = linear_any(lat.slice(3, R, C).contiguous().reshape({Bl, T, r}), wkv, act);  // (B, T, NH (D + VD))
            Tensor K = Tensor::empty({Bl, NH, T, HS}, act, eo);
            Tensor k_pe = K.slice(3, 0, R);
            ops::copy_(k_pe, lat.as_strided({Bl, NH, T, R}, {T * C, 0, C, 1}, lat.offset()));  // shared by the heads
            if (D > 0) {
                Tensor k_nope = K.slice(3, R, HS);
                ops::copy_(k_nope, kv.as_strided({Bl, NH, T, D}, {T * W, D + VD, W, 1}, kv.offset()));
            }
            const Tensor v_view = kv.as_strided({Bl, NH, T, VD}, {T * W, D + VD, W, 1}, kv.offset() + D);
            // Values as wide as the heads are read in place (SDPA takes any row stride); narrower
            // ones are padded with zeros to head_dim.
            if (VD == HS) return std::make_pair(K, v_view);
            Tensor V = Tensor::zeros({Bl, NH, T, HS}, act, eo);
            Tensor v_part = V.slice(3, 0, VD);
            ops::copy_(v_part, v_view);
            return std::make_pair(K, V);
        };
    }
    Tensor yt = Tensor::empty({B, NH, n, C}, act, ao);  // sum_j p_j [k_pe_j ; c_j] per head
    attention.attend_latent(layer, qt, kt, input_pos, scale, window, yt, ex);
    if (ex.ran) return;  // y written through ex.y, zeros past v_head_dim (the values' padding)
    // y_h = W_uv_h (sum_j p_j c_j): the expanded output, zero past v_head_dim.
    const Tensor wuv_t = head_rows(wkv_b, sr, sc, NH, D, VD, r, D, VD).transpose(2, 3);  // (1, NH, r, VD)
    const Tensor out = ops::matmul(yt.slice(3, R, C), wuv_t, act);                         // (B, NH, n, VD)
    Tensor zero = Tensor::zeros({B, n, NH, HS}, act, ao);
    y.copy_from(zero);
    Tensor yv = y.permute({0, 2, 1, 3}).slice(3, 0, VD);
    ops::copy_(yv, out);
}

namespace {

// dx (B, n, in) of a linear map with weight w and input x, its weight gradient into gw (when
// defined) and the adapter's share at `site`.
Tensor linear_back(const Tensor& w, Tensor* gw, const Tensor& x, const Tensor& dy, int layer, LinearSite site,
                   int64_t input_pos, const LinearAdapters* ad) {
    Tensor dx = linear_input_grad_any(dy, w, x.dtype());
    if (ad) ad->backward(layer, site, x, input_pos, dy, dx);
    if (gw && gw->defined()) linear_weight_grad(*gw, nullptr, x, dy);
    return dx;
}

}  // namespace

Tensor latent_qkv_backward(const ModelConfig& cfg, const LayerWeights& L, const BlockActivations& a, const RopeTables& rt,
                           int64_t input_pos, const Tensor& dqr, const Tensor& dkr, const Tensor& dv, int layer,
                           const LinearAdapters* ad, LayerGrads* g) {
    const LatentAttention& la = cfg.latent;
    const int64_t B = a.h1.size(0), n = a.h1.size(1), NH = cfg.num_heads, HS = cfg.head_dim, R = la.qk_rope_head_dim,
                  D = la.qk_nope_head_dim, VD = la.v_head_dim, r = la.kv_lora_rank, W = NH * (D + VD);
    const float eps = float(la.latent_norm_eps);
    const DType dt = a.h1.dtype();
    const TensorOptions go{a.h1.device(), MemCategory::ACTIVATIONS, {}};
    auto grad_of = [&](Tensor LayerGrads::*t) { return g && (g->*t).defined() ? &(g->*t) : nullptr; };

    // Undo RoPE into the projections' (B, n, NH, HS) layout.
    const Tensor pos = position_range(input_pos, n, a.h1.device());
    Tensor dq = Tensor::empty({B, n, NH, HS}, dt, go), dk = Tensor::empty({B, n, NH, HS}, dt, go);
    Tensor dqv = dq.permute({0, 2, 1, 3}), dkv = dk.permute({0, 2, 1, 3});
    ops::rope_backward_(dqv, dqr, pos, rt.cos, rt.sin, rt.n_rot);
    ops::rope_backward_(dkv, dkr, pos, rt.cos, rt.sin, rt.n_rot);

    // ---- queries: q = W_q q_in, q_in = RMSNorm(W_q_a h) or h ----
    Tensor dh =
        linear_back(L.wq, grad_of(&LayerGrads::wq), a.q_in, dq.reshape({B, n, NH * HS}), layer, LinearSite::QKV, input_pos, ad);
    if (L.wq_a.defined()) {
        Tensor dqa = Tensor::empty(a.q_a.shape(), dt, go);
        ops::rmsnorm_backward_(dqa, grad_of(&LayerGrads::q_a_norm), a.q_a, L.q_a_norm, dh, eps);
        dh = linear_input_grad_any(dqa, L.wq_a, dt);
        if (Tensor* gw = grad_of(&LayerGrads::wq_a)) linear_weight_grad(*gw, nullptr, a.h1, dqa);
    }

    // ---- keys and values: [k_nope ; v] per head = W_kv_b c ----
    Tensor dkvb = Tensor::empty({B, n, W}, dt, go);
    if (D > 0) {
        Tensor dst = dkvb.as_strided({B, n, NH, D}, {n * W, W, D + VD, 1}, dkvb.offset());
        ops::copy_(dst, dk.slice(3, R, HS));
    }
    {
        Tensor dst = dkvb.as_strided({B, NH, n, VD}, {n * W, D + VD, W, 1}, dkvb.offset() + D);
        ops::copy_(dst, dv.slice(3, 0, VD));  // the padding channels are constant zeros
    }
    const Tensor dc = linear_back(L.wkv_b, grad_of(&LayerGrads::wkv_b), a.c, dkvb, layer, LinearSite::KV_B, input_pos, ad);

    // ---- the latent and k_pe: W_kv_a h = [c_kv before its norm ; k_pe], k_pe shared by every head ----
    Tensor dckv = Tensor::empty({B, n, r + R}, dt, go);
    Tensor dlat = dckv.slice(2, 0, r), dpe = dckv.slice(2, r, r + R);
    ops::rmsnorm_backward_(dlat, grad_of(&LayerGrads::kv_a_norm), a.ckv.slice(2, 0, r), L.kv_a_norm, dc, eps);
    ops::copy_(dpe, dk.as_strided({B, n, R}, {n * NH * HS, NH * HS, 1}, dk.offset()));
    for (int64_t h = 1; h < NH; ++h)
        ops::add_(dpe, dpe, dk.as_strided({B, n, R}, {n * NH * HS, NH * HS, 1}, dk.offset() + h * HS));
    Tensor dh_kv = linear_back(L.wkv_a, grad_of(&LayerGrads::wkv_a), a.h1, dckv, layer, LinearSite::KV_A, input_pos, ad);
    ops::add_(dh, dh, dh_kv);
    return dh;
}

TensorMap latent_state_dict(const ModelConfig& cfg, const LayerWeights& L, const std::string& p) {
    const LatentAttention& a = cfg.latent;
    const int64_t E = cfg.hidden_size, NH = cfg.num_heads, HS = cfg.head_dim, R = a.qk_rope_head_dim, D = a.qk_nope_head_dim,
                  VD = a.v_head_dim, r = a.kv_lora_rank;
    const DType dt = L.wkv_a.dtype();
    const Device dev = L.wkv_a.device();
    TensorMap w;
    auto put = [&](const std::string& name, const Tensor& t) { w[p + name] = t.clone(); };
    // Rows back in checkpoint order: stored row i is checkpoint row from[i].
    auto unpermute = [&](const std::string& name, const Tensor& t, const std::vector<int64_t>& from) {
        const int64_t cols = t.size(1);
        const std::vector<double> m = t.contiguous().to_f64_vector();
        std::vector<double> out(m.size());
        for (size_t i = 0; i < from.size(); ++i) std::copy_n(m.begin() + int64_t(i) * cols, cols, out.begin() + from[i] * cols);
        w[p + name] = make(t.shape(), out, dt, dev, p + name);
    };
    std::vector<int64_t> q_rows;
    for (int64_t h = 0; h < NH; ++h) head_order(h * HS, D, R, q_rows);
    if (L.wq_a.defined()) {
        put("self_attn.q_a_proj.weight", L.wq_a);
        put("self_attn.q_a_layernorm.weight", L.q_a_norm);
        unpermute("self_attn.q_b_proj.weight", L.wq, q_rows);
    } else {
        unpermute("self_attn.q_proj.weight", L.wq, q_rows);
    }
    std::vector<int64_t> kv_rows;
    for (int64_t j = 0; j < r; ++j) kv_rows.push_back(j);
    for (int64_t j = 0; j < R; ++j) kv_rows.push_back(r + (j < R / 2 ? 2 * j : 2 * (j - R / 2) + 1));
    unpermute("self_attn.kv_a_proj_with_mqa.weight", L.wkv_a, kv_rows);
    put("self_attn.kv_a_layernorm.weight", L.kv_a_norm);
    put("self_attn.kv_b_proj.weight", L.wkv_b);
    const std::vector<double> padded = L.wo.contiguous().to_f64_vector();
    std::vector<double> wo(size_t(E * NH * VD));
    for (int64_t e = 0; e < E; ++e)
        for (int64_t h = 0; h < NH; ++h)
            std::copy_n(padded.begin() + e * NH * HS + h * HS, VD, wo.begin() + e * NH * VD + h * VD);
    w[p + "self_attn.o_proj.weight"] = make({E, NH * VD}, wo, dt, dev, p + "self_attn.o_proj.weight");
    return w;
}

int64_t latent_parameter_count(const ModelConfig& cfg, const LayerWeights& L) {
    int64_t n = cfg.hidden_size * cfg.num_heads * cfg.latent.v_head_dim;  // W_o without its padding
    for (const Tensor* t : {&L.wq_a, &L.q_a_norm, &L.wq, &L.wkv_a, &L.kv_a_norm, &L.wkv_b})
        if (t->defined()) n += t->numel();
    return n;
}

}  // namespace kv
