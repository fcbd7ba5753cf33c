// gpt-oss's mixture-of-experts MLP (see moe_mlp.h). Shapes: R = B n tokens, E width, N experts,
// I expert width, K top_k, S = R K selected (token, expert) pairs.
#include "engine/backend/host_parallel.h"
#include "engine/model/moe_mlp.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "engine/core/error.h"
#include "engine/model/packed_weight.h"
#include "engine/model/transformer_backward.h"
#include "engine/ops/ops.h"

namespace kv {

namespace {

const Tensor& float_weight(const TensorMap& w, const std::string& name, const Shape& shape) {
    auto it = w.find(name);
    if (it == w.end()) {
        if (w.count(name + "_blocks"))
            throw Error(str("model weights: '", name, "' is stored as MXFP4 blocks ('", name,
                            "_blocks' / '_scales'), which kvlab does not read; expected the float tensor of shape ", shape.str()),
                        "dequantize the checkpoint first (transformers: Mxfp4Config(dequantize=True), then save_pretrained)");
        throw Error(str("model weights: missing tensor '", name, "' (expected shape ", shape.str(), ")"));
    }
    if (is_packed(it->second))
        throw Error(str("model weights: tensor '", name, "' is quantized; the experts load float weights only (a Hugging Face folder)"));
    if (it->second.shape() != shape)
        throw Error(str("model weights: tensor '", name, "' has shape ", it->second.shape().str(), ", expected ", shape.str()));
    if (!dtype_is_float(it->second.dtype())) throw Error(str("model weights: tensor '", name, "' is not a float tensor"));
    return it->second;
}

// A copy of `view` (any strides, any float dtype) as a new contiguous tensor of `shape`.
Tensor copy_as(const Tensor& view, const Shape& shape, DType dtype, Device device, const std::string& label) {
    Tensor out = Tensor::empty(shape, dtype, {device, MemCategory::WEIGHTS, label});
    out.copy_from(view.device() == device ? view : view.contiguous().to(device));
    return out;
}

// The routing of R tokens: for token r its K selected experts (descending logit, ties to the lower
// index), their softmax weights and their rows in dispatch order (grouped by expert, tokens ascending).
struct Routing {
    int64_t R = 0, K = 0, N = 0;
    std::vector<int64_t> expert, pos;  // (R, K)
    std::vector<double> weight;        // (R, K)
    std::vector<int64_t> offset;       // (N + 1): expert e's rows are [offset[e], offset[e + 1])
    std::vector<int32_t> token;        // (S): the token of each dispatch row
    int64_t rows(int64_t e) const { return offset[size_t(e + 1)] - offset[size_t(e)]; }
};

Routing route(const std::vector<double>& logits, int64_t R, int64_t N, int64_t K) {
    Routing rt;
    rt.R = R, rt.K = K, rt.N = N;
    rt.expert.resize(size_t(R * K));
    rt.pos.resize(size_t(R * K));
    rt.weight.resize(size_t(R * K));
    std::vector<int64_t> order(static_cast<size_t>(N)), count(static_cast<size_t>(N), 0);
    for (int64_t r = 0; r < R; ++r) {
        const double* z = logits.data() + r * N;
        std::iota(order.begin(), order.end(), 0);
        std::partial_sort(order.begin(), order.begin() + K, order.end(),
                          [&](int64_t a, int64_t b) { return z[a] > z[b] || (z[a] == z[b] && a < b); });
        const double m = z[order[0]];
        double sum = 0;
        for (int64_t j = 0; j < K; ++j) sum += std::exp(z[order[size_t(j)]] - m);
        for (int64_t j = 0; j < K; ++j) {
            const int64_t e = order[size_t(j)];
            rt.expert[size_t(r * K + j)] = e;
            rt.weight[size_t(r * K + j)] = std::exp(z[e] - m) / sum;
            ++count[size_t(e)];
        }
    }
    rt.offset.assign(size_t(N + 1), 0);
    for (int64_t e = 0; e < N; ++e) rt.offset[size_t(e + 1)] = rt.offset[size_t(e)] + count[size_t(e)];
    rt.token.resize(size_t(R * K));
    std::vector<int64_t> next(rt.offset.begin(), rt.offset.end() - 1);
    for (int64_t r = 0; r < R; ++r)  // tokens ascending within each expert's rows
        for (int64_t j = 0; j < K; ++j) {
            const int64_t p = next[size_t(rt.expert[size_t(r * K + j)])]++;
            rt.pos[size_t(r * K + j)] = p;
            rt.token[size_t(p)] = int32_t(r);
        }
    return rt;
}

// The dispatch rows' inputs: row p of the result is token rt.token[p] of h2 (R, E).
Tensor dispatch_inputs(const Tensor& h2, const Routing& rt, DType act) {
    const Tensor ids = Tensor::from_i32({int64_t(rt.token.size())}, rt.token, {h2.device(), MemCategory::WORKSPACE, "moe tokens"});
    return ops::embedding(h2, ids, act);
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// The host loops below run on f32 or f64 data; bf16 activations pass through f32 copies.
DType host_dtype(DType act) { return act == DType::F64 ? DType::F64 : DType::F32; }

// The clamped SwiGLU as the SiLU gate of ops::gated: with G = alpha min(g, limit) and
// U = (clamp(u, -limit, limit) + 1) / alpha, silu(G) U = (u' + 1) g' sigmoid(alpha g'). Rewrites
// the (S, 2I) rows [g ; u] of t in place into [G ; U], after adding each row's expert bias (the
// rows of bias (N, 2I) at `expert_of`; null: t holds it already).
template <class T>
void to_silu_form(T* t, int64_t S, int64_t I, double limit, double alpha, const T* bias, const Routing& rt) {
    const T lim = T(limit), a = T(alpha), inv = T(1.0 / alpha);
    host_parallel_rows(S, [&](int64_t s0, int64_t s1) {
        for (int64_t s = s0; s < s1; ++s) {
            T* g = t + s * 2 * I;
            T* u = g + I;
            if (bias) {
                const int64_t e = int64_t(std::upper_bound(rt.offset.begin(), rt.offset.end(), s) - rt.offset.begin()) - 1;
                const T* bg = bias + e * 2 * I;
                const T* bu = bg + I;
                for (int64_t i = 0; i < I; ++i) {
                    g[i] = a * std::min(g[i] + bg[i], lim);
                    u[i] = (std::clamp(u[i] + bu[i], -lim, lim) + T(1)) * inv;
                }
            } else {
                for (int64_t i = 0; i < I; ++i) {
                    g[i] = a * std::min(g[i], lim);
                    u[i] = (std::clamp(u[i], -lim, lim) + T(1)) * inv;
                }
            }
        }
    });
}

// out (R, E) = sum over each token's K selected rows of y (S, E) plus their experts' biases
// (bias (N, E); null: y holds them), weighted.
template <class T>
void combine(const Routing& rt, const T* y, const T* bias, int64_t E, T* out) {
    const int64_t K = rt.K;
    // One token's row: the first selected expert stores, the others add (restrict rows vectorize).
    const auto acc = [=](T* __restrict o, const T* __restrict yr, const T* __restrict b, T w, bool first) {
        if (first) {
            if (b) for (int64_t c = 0; c < E; ++c) o[c] = w * (yr[c] + b[c]);
            else for (int64_t c = 0; c < E; ++c) o[c] = w * yr[c];
        } else {
            if (b) for (int64_t c = 0; c < E; ++c) o[c] += w * (yr[c] + b[c]);
            else for (int64_t c = 0; c < E; ++c) o[c] += w * yr[c];
        }
    };
    host_parallel_rows(rt.R, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r)
            for (int64_t j = 0; j < K; ++j) {
                const size_t rk = size_t(r * K + j);
                acc(out + r * E, y + rt.pos[rk] * E, bias ? bias + rt.expert[rk] * E : nullptr, T(rt.weight[rk]), j == 0);
            }
    });
}

}  // namespace

void load_experts(const ModelConfig& cfg, const TensorMap& w, const std::string& p, DType dtype, Device device, LayerWeights& L) {
    const int64_t E = cfg.hidden_size, I = cfg.intermediate_size, N = cfg.moe.num_experts;
    L.router = copy_as(float_weight(w, p + "mlp.router.weight", {N, E}), {N, E}, dtype, device, p + "mlp.router.weight");
    L.router_bias = copy_as(float_weight(w, p + "mlp.router.bias", {N}), {N}, dtype, device, p + "mlp.router.bias");
    // gate_up_proj (N, E, 2I), column 2j gate j and 2j + 1 up j -> (N, [gate ; up] = 2I, E)
    const Tensor gu = float_weight(w, p + "mlp.experts.gate_up_proj", {N, E, 2 * I}).contiguous();
    L.experts_gate_up = copy_as(gu.as_strided({N, 2, I, E}, {E * 2 * I, 1, 2, 2 * I}, gu.offset()), {N, 2, I, E}, dtype, device,
                                p + "mlp.experts.gate_up_proj")
                            .reshape({N, 2 * I, E});
    const Tensor gub = float_weight(w, p + "mlp.experts.gate_up_proj_bias", {N, 2 * I}).contiguous();
    L.experts_gate_up_bias =
        copy_as(gub.as_strided({N, 2, I}, {2 * I, 1, 2}, gub.offset()), {N, 2, I}, dtype, device, p + "mlp.experts.gate_up_proj_bias")
            .reshape({N, 2 * I});
    // down_proj (N, I, E) -> (N, E, I)
    L.experts_down = copy_as(float_weight(w, p + "mlp.experts.down_proj", {N, I, E}).transpose(1, 2), {N, E, I}, dtype, device,
                             p + "mlp.experts.down_proj");
    L.experts_down_bias =
        copy_as(float_weight(w, p + "mlp.experts.down_proj_bias", {N, E}), {N, E}, dtype, device, p + "mlp.experts.down_proj_bias");
}

TensorMap experts_state_dict(const ModelConfig& cfg, const LayerWeights& L, const std::string& p) {
    const int64_t E = cfg.hidden_size, I = cfg.intermediate_size, N = cfg.moe.num_experts;
    const DType dt = L.router.dtype();
    const Device dev = L.router.device();
    TensorMap out;
    out[p + "mlp.router.weight"] = L.router.clone();
    out[p + "mlp.router.bias"] = L.router_bias.clone();
    Tensor gu = Tensor::empty({N, E, 2 * I}, dt, {dev, MemCategory::WEIGHTS, p + "mlp.experts.gate_up_proj"});
    gu.as_strided({N, 2, I, E}, {E * 2 * I, 1, 2, 2 * I}, 0).copy_from(L.experts_gate_up.reshape({N, 2, I, E}));
    out[p + "mlp.experts.gate_up_proj"] = gu;
    Tensor gub = Tensor::empty({N, 2 * I}, dt, {dev, MemCategory::WEIGHTS, p + "mlp.experts.gate_up_proj_bias"});
    gub.as_strided({N, 2, I}, {2 * I, 1, 2}, 0).copy_from(L.experts_gate_up_bias.reshape({N, 2, I}));
    out[p + "mlp.experts.gate_up_proj_bias"] = gub;
    Tensor down = Tensor::empty({N, I, E}, dt, {dev, MemCategory::WEIGHTS, p + "mlp.experts.down_proj"});
    down.transpose(1, 2).copy_from(L.experts_down);
    out[p + "mlp.experts.down_proj"] = down;
    out[p + "mlp.experts.down_proj_bias"] = L.experts_down_bias.clone();
    return out;
}

Tensor moe_mlp(const ModelConfig& cfg, const LayerWeights& L, int layer, const Tensor& h, DType act, BlockActivations* save) {
    (void)layer;
    const int64_t B = h.size(0), n = h.size(1), R = B * n, E = cfg.hidden_size, I = cfg.intermediate_size, N = cfg.moe.num_experts,
                  K = cfg.moe.top_k;
    const TensorOptions ao{h.device(), MemCategory::ACTIVATIONS, {}};
    const Tensor h2 = h.contiguous().reshape({R, E});
    Tensor logits = linear_any(h2, L.router, act);  // (R, N)
    ops::add_(logits, logits, L.router_bias.reshape({1, N}));
    const Routing rt = route(logits.to_f64_vector(), R, N, K);
    const int64_t S = R * K;
    const Tensor x = dispatch_inputs(h2, rt, act);  // (S, E)
    // Each expert's rows x W^T; the biases join in the host passes below (to_silu_form,
    // combine), except where save keeps the pre-activations and outputs with them.
    const DType hd = host_dtype(act);
    const bool fold = !save && L.experts_gate_up_bias.dtype() == hd && L.experts_down_bias.dtype() == hd &&
                      L.experts_gate_up_bias.is_contiguous() && L.experts_down_bias.is_contiguous();
    Tensor gu = Tensor::empty({S, 2 * I}, act, ao);
    for (int64_t e = 0; e < N; ++e) {
        if (rt.rows(e) == 0) continue;
        const int64_t o0 = rt.offset[size_t(e)], o1 = rt.offset[size_t(e + 1)];
        Tensor dst = gu.slice(0, o0, o1);
        if (!fold) ops::copy_(dst, L.experts_gate_up_bias.select(0, e).reshape({1, 2 * I}).expand({o1 - o0, 2 * I}));
        ops::matmul_(dst, x.slice(0, o0, o1), L.experts_gate_up.select(0, e).transpose(0, 1), 1.0f, fold ? 0.0f : 1.0f);
    }
    // The clamped SwiGLU a = (u' + 1) g' sigmoid(alpha g'), through the SiLU gate (to_silu_form).
    Tensor t = gu.to(hd);
    if (t.storage() == gu.storage() && save) t = gu.clone();  // save keeps the raw pre-activations
    if (hd == DType::F64)
        to_silu_form(t.data<double>(), S, I, cfg.moe.limit, cfg.moe.alpha, fold ? L.experts_gate_up_bias.data<double>() : nullptr, rt);
    else
        to_silu_form(t.data<float>(), S, I, cfg.moe.limit, cfg.moe.alpha, fold ? L.experts_gate_up_bias.data<float>() : nullptr, rt);
    const Tensor a = ops::gated(t.slice(1, 0, I), t.slice(1, I, 2 * I), GateAct::SILU).to(act);
    Tensor y = Tensor::empty({S, E}, act, ao);
    for (int64_t e = 0; e < N; ++e) {
        if (rt.rows(e) == 0) continue;
        const int64_t o0 = rt.offset[size_t(e)], o1 = rt.offset[size_t(e + 1)];
        Tensor dst = y.slice(0, o0, o1);
        if (!fold) ops::copy_(dst, L.experts_down_bias.select(0, e).reshape({1, E}).expand({o1 - o0, E}));
        ops::matmul_(dst, a.slice(0, o0, o1), L.experts_down.select(0, e).transpose(0, 1), 1.0f, fold ? 0.0f : 1.0f);
    }
    // out = sum over the selected experts of w_e y_e
    const Tensor yh = y.to(hd);
    Tensor out = Tensor::empty({B, n, E}, hd, ao);
    if (hd == DType::F64)
        combine(rt, yh.data<double>(), fold ? L.experts_down_bias.data<double>() : nullptr, E, out.data<double>());
    else
        combine(rt, yh.data<float>(), fold ? L.experts_down_bias.data<float>() : nullptr, E, out.data<float>());
    if (save) save->moe_logits = logits, save->gu = gu, save->a = a, save->moe_out = y;
    return out.to(act);
}

Tensor moe_mlp_backward(const ModelConfig& cfg, const LayerWeights& L, int layer, const BlockActivations& a, const Tensor& dout,
                        LayerGrads* g) {
    (void)layer;
    const int64_t B = dout.size(0), n = dout.size(1), R = B * n, E = cfg.hidden_size, I = cfg.intermediate_size,
                  N = cfg.moe.num_experts, K = cfg.moe.top_k, S = R * K;
    const DType act = dout.dtype();
    const TensorOptions ao{dout.device(), MemCategory::ACTIVATIONS, {}};
    const Routing rt = route(a.moe_logits.to_f64_vector(), R, N, K);
    const std::vector<double> dov = dout.to_f64_vector(), yv = a.moe_out.to_f64_vector();
    // out = sum w_e y_e: dy_e = w_e dout; dw_e = dout . y_e; the softmax over the selected logits
    // gives dz_e = w_e (dw_e - sum_j w_j dw_j), the other logits none (the selection is constant).
    std::vector<double> dyv(size_t(S * E)), dz(size_t(R * N), 0.0), dw(static_cast<size_t>(K));
    for (int64_t r = 0; r < R; ++r) {
        const double* d = dov.data() + r * E;
        double mean = 0;
        for (int64_t j = 0; j < K; ++j) {
            const int64_t p = rt.pos[size_t(r * K + j)];
            const double w = rt.weight[size_t(r * K + j)];
            double dot = 0;
            for (int64_t c = 0; c < E; ++c) {
                dyv[size_t(p * E + c)] = w * d[c];
                dot += d[c] * yv[size_t(p * E + c)];
            }
            dw[size_t(j)] = dot;
            mean += w * dot;
        }
        for (int64_t j = 0; j < K; ++j)
            dz[size_t(r * N + rt.expert[size_t(r * K + j)])] = rt.weight[size_t(r * K + j)] * (dw[size_t(j)] - mean);
    }
    const Tensor dy = Tensor::from_f64({S, E}, dyv, act, ao);
    // down_proj: da (S, I), and the experts' down weights and biases
    Tensor da = Tensor::empty({S, I}, act, ao);
    for (int64_t e = 0; e < N; ++e) {
        if (rt.rows(e) == 0) continue;
        const int64_t o0 = rt.offset[size_t(e)], o1 = rt.offset[size_t(e + 1)];
        const Tensor dye = dy.slice(0, o0, o1);
        Tensor dst = da.slice(0, o0, o1);
        ops::copy_(dst, linear_input_grad_any(dye, L.experts_down.select(0, e), act));
        if (g && g->experts_down.defined()) {
            Tensor gw = g->experts_down.select(0, e), gb = g->experts_down_bias.select(0, e);
            linear_weight_grad(gw, &gb, a.a.slice(0, o0, o1), dye);
        }
    }
    // The clamped SwiGLU: the clamps pass the gradient only inside their range.
    const double limit = cfg.moe.limit, alpha = cfg.moe.alpha;
    const std::vector<double> guv = a.gu.to_f64_vector(), dav = da.to_f64_vector();
    std::vector<double> dguv(size_t(S * 2 * I));
#pragma omp parallel for schedule(static)
    for (int64_t s = 0; s < S; ++s)
        for (int64_t i = 0; i < I; ++i) {
            const double g0 = guv[size_t(s * 2 * I + i)], u0 = guv[size_t(s * 2 * I + I + i)];
            const double gc = std::min(g0, limit), uc = std::clamp(u0, -limit, limit);
            const double sg = sigmoid(alpha * gc), glu = gc * sg, d = dav[size_t(s * I + i)];
            dguv[size_t(s * 2 * I + i)] = g0 <= limit ? d * (uc + 1.0) * (sg + alpha * gc * sg * (1.0 - sg)) : 0.0;
            dguv[size_t(s * 2 * I + I + i)] = u0 >= -limit && u0 <= limit ? d * glu : 0.0;
        }
    const Tensor dgu = Tensor::from_f64({S, 2 * I}, dguv, act, ao);
    // gate_up_proj: dx (S, E) per dispatch row, and the experts' gate/up weights and biases
    const Tensor h2 = a.h2.contiguous().reshape({R, E});
    const Tensor x = g && g->experts_gate_up.defined() ? dispatch_inputs(h2, rt, act) : Tensor();
    Tensor dx = Tensor::empty({S, E}, act, ao);
    for (int64_t e = 0; e < N; ++e) {
        if (rt.rows(e) == 0) continue;
        const int64_t o0 = rt.offset[size_t(e)], o1 = rt.offset[size_t(e + 1)];
        const Tensor dge = dgu.slice(0, o0, o1);
        Tensor dst = dx.slice(0, o0, o1);
        ops::copy_(dst, linear_input_grad_any(dge, L.experts_gate_up.select(0, e), act));
        if (x.defined()) {
            Tensor gw = g->experts_gate_up.select(0, e), gb = g->experts_gate_up_bias.select(0, e);
            linear_weight_grad(gw, &gb, x.slice(0, o0, o1), dge);
        }
    }
    // dh: the router's share, then each dispatch row added to its token
    const Tensor dzt = Tensor::from_f64({R, N}, dz, act, ao);
    if (g && g->router.defined()) linear_weight_grad(g->router, &g->router_bias, h2, dzt);
    std::vector<double> dh = linear_input_grad_any(dzt, L.router, act).to_f64_vector();
    const std::vector<double> dxv = dx.to_f64_vector();
    for (int64_t s = 0; s < S; ++s) {
        double* o = dh.data() + int64_t(rt.token[size_t(s)]) * E;
        const double* d = dxv.data() + s * E;
        for (int64_t c = 0; c < E; ++c) o[c] += d[c];
    }
    return Tensor::from_f64({B, n, E}, dh, act, ao);
}

}  // namespace kv
