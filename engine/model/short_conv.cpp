// LFM2's gated short convolution (see short_conv.h).
#include "engine/model/short_conv.h"

#include <algorithm>
#include <vector>

#include "engine/core/error.h"
#include "engine/model/packed_weight.h"

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
                  DType act) {
    const int64_t B = h.size(0), n = h.size(1), E = cfg.hidden_size, K = cfg.conv_kernel, P = K - 1;
    if (input_pos > 0 && (!state || state->next_pos != input_pos))
        throw Error(str("layer ", layer, " (short convolution) continues at position ", input_pos, " but ",
                        state ? str("its state ends at position ", state->next_pos) : std::string("this attention keeps no layer state"),
                        "; expected the calls of one sequence in order from position 0"));
    const std::vector<double> bcx = linear_any(h, L.conv_in, act).contiguous().to_f64_vector();  // (B, n, 3E): b, c, x
    const std::vector<double> taps = L.conv_taps.contiguous().to_f64_vector();                 // (E, K)
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
    std::vector<double> y(size_t(B * n * E));
    for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < n; ++t) {
            const double* c = bcx.data() + (b * n + t) * 3 * E + E;
            for (int64_t e = 0; e < E; ++e) {
                double s = 0;
                for (int64_t k = 0; k < K; ++k) s += taps[size_t(e * K + k)] * u[size_t((b * (P + n) + t + k) * E + e)];
                y[size_t((b * n + t) * E + e)] = c[e] * s;
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
    return linear_any(ys, L.conv_out, act);
}

}  // namespace kv
