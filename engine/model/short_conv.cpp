// LFM2's gated short convolution (see short_conv.h).
#include "engine/model/short_conv.h"

#include <algorithm>
#include <vector>

#include "engine/core/error.h"
#include "engine/model/packed_weight.h"
#include "engine/model/transformer_backward.h"
#include "engine/ops/ops.h"

namespace kv {

namespace {

const Tensor& float_weight(const TensorMap& w, const std::string& name, const Shape& shape) {
    auto it = w.find(name);
    if (it == w.end()) throw Error(str("model weights: missing tensor '", name, "' (expected shape ", shape.str(), ")"));
    if (is_packed(it->second))
        throw Error(str("model weights: tensor '", name, "' is quantized; the short convolution loads float weights only (a Hugging Face folder)"));
    if (it->second.shape() != shape)
        throw Error(str("model weights: tensor '", name, "' has shape ", it->second.shape().str(), ", expected ", shape.str()));
    if (!dtype_is_float(it->second.dtype())) throw Error(str("model weights: tensor '", name, "' is not a float tensor"));
    return it->second;
}

Tensor make(const Shape& s, const std::vector<double>& v, DType dtype, Device device, const std::string& label) {
    return Tensor::from_f64(s, v, dtype, {device, MemCategory::WEIGHTS, label});
}

}  // namespace

void load_short_conv(const ModelConfig& cfg, const TensorMap& w, const std::string& p, DType dtype, Device device, LayerWeights& L) {
    const int64_t E = cfg.hidden_size, K = cfg.conv_kernel;
    auto load = [&](const std::string& name, const Shape& shape, const Shape& as) {
        return make(as, float_weight(w, p + name, shape).contiguous().to_f64_vector(), dtype, device, p + name);
    };
    L.conv_in = load("conv.in_proj.weight", {3 * E, E}, {3 * E, E});
    L.conv_taps = load("conv.conv.weight", {E, 1, K}, {E, K});  // nn.Conv1d's (out, in / groups, kernel)
    L.conv_out = load("conv.out_proj.weight", {E, E}, {E, E});
}

Tensor short_conv(const ModelConfig& cfg, const LayerWeights& L, int layer, const Tensor& h, int64_t input_pos, LayerState* state,
                  DType act, const LinearAdapters* adapters, BlockActivations* save) {
    const int64_t B = h.size(0), n = h.size(1), E = cfg.hidden_size, K = cfg.conv_kernel, P = K - 1;
    if (input_pos > 0 && (!state || state->next_pos != input_pos))
        throw Error(str("layer ", layer, " (short convolution) continues at position ", input_pos, " but ",
                        state ? str("its state ends at position ", state->next_pos) : std::string("this attention keeps no layer state"),
                        "; expected the calls of one sequence in order from position 0"));
    Tensor bcx_t = linear_any(h, L.conv_in, act);  // (B, n, 3E): b, c, x
    if (adapters) adapters->add(layer, LinearSite::QKV, h, input_pos, bcx_t);
    const std::vector<double> bcx = bcx_t.contiguous().to_f64_vector();
    const std::vector<double> taps = L.conv_taps.contiguous().to_f64_vector();  // (E, K)
    // u over the P positions before this call (the state; zeros at the start) and this call's n
    std::vector<double> u(size_t(B * (P + n) * E), 0.0);
    const bool carried = input_pos > 0 && P > 0 && state->values.defined();
    if (carried) {
        if (state->values.size(0) != B) throw Error(str("layer ", layer, " (short convolution): the state holds ", state->values.size(0),
                                                       " rows, this call ", B, "; expected one batch per sequence"));
        const std::vector<double> prev = state->values.contiguous().to_f64_vector();  // (B, P, E)
        for (int64_t b = 0; b < B; ++b)
            std::copy_n(prev.begin() + b * P * E, P * E, u.begin() + b * (P + n) * E);
    }
    for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < n; ++t) {
            const double* r = bcx.data() + (b * n + t) * 3 * E;
            double* ut = u.data() + (b * (P + n) + P + t) * E;
            for (int64_t e = 0; e < E; ++e) ut[e] = r[e] * r[2 * E + e];
        }
    std::vector<double> y(size_t(B * n * E)), sv(save ? size_t(B * n * E) : 0);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < n; ++t) {
            const double* c = bcx.data() + (b * n + t) * 3 * E + E;
            for (int64_t e = 0; e < E; ++e) {
                double s = 0;
                for (int64_t k = 0; k < K; ++k) s += taps[size_t(e * K + k)] * u[size_t((b * (P + n) + t + k) * E + e)];
                y[size_t((b * n + t) * E + e)] = c[e] * s;
                if (save) sv[size_t((b * n + t) * E + e)] = s;
            }
        }
    if (state) {
        // the last P positions of u, in the activation dtype (as transformers' conv_cache holds them)
        std::vector<double> keep(size_t(B * P * E));
        for (int64_t b = 0; b < B; ++b)
            std::copy_n(u.begin() + (b * (P + n) + n) * E, P * E, keep.begin() + b * P * E);
        if (P > 0)
            state->values = Tensor::from_f64({B, P, E}, keep, act, {h.device(), MemCategory::KV_CACHE, str("layer ", layer, " short-conv state")});
        state->next_pos = input_pos + n;
    }
    const Tensor ys = Tensor::from_f64({B, n, E}, y, act, {h.device(), MemCategory::ACTIVATIONS, {}});
    if (save) {
        const TensorOptions ao{h.device(), MemCategory::ACTIVATIONS, {}};
        save->h1 = h;
        save->conv_bcx = bcx_t;
        save->conv_u = Tensor::from_f64({B, P + n, E}, u, act, ao);
        save->conv_s = Tensor::from_f64({B, n, E}, sv, act, ao);
        save->conv_y = ys;
    }
    Tensor o = linear_any(ys, L.conv_out, act);
    if (adapters) adapters->add(layer, LinearSite::O, ys, input_pos, o);
    return o;
}

Tensor short_conv_backward(const ModelConfig& cfg, const LayerWeights& L, int layer, const BlockActivations& a, const Tensor& dout,
                           int64_t input_pos, Tensor* dstate, const LinearAdapters* adapters, LayerGrads* g) {
    const int64_t B = dout.size(0), n = dout.size(1), E = cfg.hidden_size, K = cfg.conv_kernel, P = K - 1;
    const DType dt = dout.dtype();
    const TensorOptions go{dout.device(), MemCategory::ACTIVATIONS, {}};
    if (!dstate && input_pos > 0 && P > 0)
        throw Error(str("layer ", layer, " (short convolution): the reverse pass of a chunk at position ", input_pos,
                        " must carry its state's gradient to the chunk before, and this backward keeps none; expected the "
                        "gradient pipeline (engine/grad), or one chunk from position 0"));
    if (!a.conv_u.defined() || a.conv_u.size(1) != P + n)
        throw Error(str("layer ", layer, " (short convolution): the saved activations do not belong to a chunk of ", n,
                        " tokens; expected the forward's BlockActivations of the same chunk"));
    // ---- out_proj: o = W_out y ----
    Tensor dy_t = linear_input_grad_any(dout, L.conv_out, dt);
    if (adapters) adapters->backward(layer, LinearSite::O, a.conv_y, input_pos, dout, dy_t);
    if (g && g->conv_out.defined()) linear_weight_grad(g->conv_out, nullptr, a.conv_y, dout);
    // ---- y = c * s, s_t = sum_k w[e, k] u_{t - P + k}, u = b * x (in double on the host) ----
    const std::vector<double> dy = dy_t.contiguous().to_f64_vector(), bcx = a.conv_bcx.contiguous().to_f64_vector(),
                              u = a.conv_u.contiguous().to_f64_vector(), s = a.conv_s.contiguous().to_f64_vector(),
                              taps = L.conv_taps.contiguous().to_f64_vector();
    std::vector<double> dbcx(size_t(B * n * 3 * E), 0.0), du(size_t(B * (P + n) * E), 0.0), dtaps(size_t(E * K), 0.0);
    // the state this chunk left is u's last P positions (which overlap the state it started
    // from when n < P): its gradient from the chunk after lands there
    if (dstate && dstate->defined() && P > 0) {
        if (dstate->shape() != Shape{B, P, E})
            throw Error(str("layer ", layer, " (short convolution): a state gradient of shape ", dstate->shape().str(),
                            "; expected (", B, ", ", P, ", ", E, ")"));
        const std::vector<double> ds = dstate->contiguous().to_f64_vector();
        for (int64_t b = 0; b < B; ++b)
            for (int64_t i = 0; i < P * E; ++i) du[size_t((b * (P + n) + n) * E + i)] += ds[size_t(b * P * E + i)];
    }
    for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < n; ++t) {
            const size_t row = size_t(b * n + t);
            for (int64_t e = 0; e < E; ++e) {
                const double g_y = dy[row * E + e], c = bcx[row * 3 * E + E + e];
                dbcx[row * 3 * E + E + e] = g_y * s[row * E + e];  // dc
                const double ds = g_y * c;
                for (int64_t k = 0; k < K; ++k) {
                    const size_t ui = size_t((b * (P + n) + t + k) * E + e);
                    du[ui] += taps[size_t(e * K + k)] * ds;
                    dtaps[size_t(e * K + k)] += ds * u[ui];
                }
            }
        }
    for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < n; ++t) {
            const size_t row = size_t(b * n + t);
            for (int64_t e = 0; e < E; ++e) {
                const double g_u = du[size_t((b * (P + n) + P + t) * E + e)];
                dbcx[row * 3 * E + e] = g_u * bcx[row * 3 * E + 2 * E + e];          // db = du x
                dbcx[row * 3 * E + 2 * E + e] = g_u * bcx[row * 3 * E + e];          // dx = du b
            }
        }
    if (dstate) {
        if (input_pos > 0 && P > 0) {
            std::vector<double> out(size_t(B * P * E));
            for (int64_t b = 0; b < B; ++b) std::copy_n(du.begin() + b * (P + n) * E, P * E, out.begin() + b * P * E);
            *dstate = Tensor::from_f64({B, P, E}, out, dt, {dout.device(), MemCategory::GRADIENTS, str("layer ", layer, " short-conv state gradient")});
        } else {
            *dstate = Tensor();  // the zeros before the sequence take no gradient
        }
    }
    if (g && g->conv_taps.defined()) {
        Tensor d = Tensor::from_f64({E, K}, dtaps, g->conv_taps.dtype(), {g->conv_taps.device(), MemCategory::WORKSPACE, {}});
        ops::add_(g->conv_taps, g->conv_taps, d);
    }
    // ---- in_proj: [b ; c ; x] = W_in h ----
    const Tensor dbcx_t = Tensor::from_f64({B, n, 3 * E}, dbcx, dt, go);
    Tensor dh = linear_input_grad_any(dbcx_t, L.conv_in, dt);
    if (adapters) adapters->backward(layer, LinearSite::QKV, a.h1, input_pos, dbcx_t, dh);
    if (g && g->conv_in.defined()) linear_weight_grad(g->conv_in, nullptr, a.h1, dbcx_t);
    return dh;
}

}  // namespace kv
