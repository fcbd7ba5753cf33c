// Gemma 3n's AltUp streams, LAUREL and per-layer inputs (see altup.h).
#include "engine/model/altup.h"

#include <algorithm>
#include <cmath>

#include "engine/core/error.h"
#include "engine/model/packed_weight.h"
#include "engine/ops/ops.h"

namespace kv {

namespace {

Tensor load(const TensorMap& w, const std::string& name, const Shape& shape, DType dtype, Device device) {
    auto it = w.find(name);
    if (it == w.end()) throw Error(str("model weights: missing tensor '", name, "' (expected shape ", shape.str(), ")"));
    if (is_packed(it->second)) throw Error(str("model weights: tensor '", name, "' is quantized; Gemma 3n loads float weights only"));
    if (it->second.shape() != shape)
        throw Error(str("model weights: tensor '", name, "' has shape ", it->second.shape().str(), ", expected ", shape.str()));
    if (!dtype_is_float(it->second.dtype())) throw Error(str("model weights: tensor '", name, "' is not a float tensor"));
    return Tensor::from_f64(shape, it->second.contiguous().to_f64_vector(), dtype, {device, MemCategory::WEIGHTS, name});
}

std::vector<double> host(const Tensor& t) { return t.contiguous().to_f64_vector(); }

Tensor device_tensor(const Shape& s, const std::vector<double>& v, DType act, Device device) {
    return Tensor::from_f64(s, v, act, {device, MemCategory::ACTIVATIONS, {}});
}

// 1 / sqrt(mean(x^2) + eps) over n values.
double inv_rms(const double* x, int64_t n, double eps) {
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += x[i] * x[i];
    return 1.0 / std::sqrt(s / double(n) + eps);
}

// RMS of x, floored at sqrt(1e-5) (Gemma3nTextModel's epsilon on the squared magnitude).
double floored_rms(const double* x, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += x[i] * x[i];
    return std::sqrt(std::max(s / double(n), 1e-5));
}

double gelu_tanh(double x) { return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }

// The router's modalities tanh(W_router (RMSNorm(x) w) / E) of one token's stream x (E).
void modalities(const ModelConfig& cfg, const double* x, const std::vector<double>& norm_w, const std::vector<double>& router,
                double* m) {
    const int64_t E = cfg.hidden_size, A = cfg.altup.num_inputs;
    const double r = inv_rms(x, E, cfg.rms_norm_eps) / double(E);
    for (int64_t j = 0; j < A; ++j) {
        double s = 0;
        for (int64_t e = 0; e < E; ++e) s += router[size_t(j * E + e)] * x[e] * r * norm_w[size_t(e)];
        m[j] = std::tanh(s);
    }
}

}  // namespace

double normal_quantile(double p) {
    if (!(p > 0 && p < 1)) throw Error(str("normal quantile: p = ", p, " is outside (0, 1)"));
    // Acklam's rational approximation (relative error < 1.2e-9), then one Halley step on
    // Phi(x) - p with erfc, which brings it to double precision.
    static const double a[] = {-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
                               1.383577518672690e+02,  -3.066479806614716e+01, 2.506628277459239e+00};
    static const double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02, 6.680131188771972e+01,
                               -1.328068155288572e+01};
    static const double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                               -2.549732539343734e+00, 4.374664141464968e+00,  2.938163982698783e+00};
    static const double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00, 3.754408661907416e+00};
    double x;
    if (p < 0.02425) {
        const double q = std::sqrt(-2 * std::log(p));
        x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
    } else if (p > 1 - 0.02425) {
        const double q = std::sqrt(-2 * std::log(1 - p));
        x = -(((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
    } else {
        const double q = p - 0.5, r = q * q;
        x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
            (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
    }
    const double e = 0.5 * std::erfc(-x / std::sqrt(2.0)) - p;
    const double u = e * std::sqrt(2 * M_PI) * std::exp(x * x / 2);
    return x - u / (1 + x * u / 2);
}

void load_altup_layer(const ModelConfig& cfg, const TensorMap& w, const std::string& p, DType dtype, Device device, LayerWeights& L) {
    const int64_t E = cfg.hidden_size, A = cfg.altup.num_inputs, P = cfg.altup.per_layer_dim, R = cfg.altup.laurel_rank;
    L.laurel_left = load(w, p + "laurel.linear_left.weight", {R, E}, dtype, device);
    L.laurel_right = load(w, p + "laurel.linear_right.weight", {E, R}, dtype, device);
    L.laurel_norm = load(w, p + "laurel.post_laurel_norm.weight", {E}, dtype, device);
    L.altup_router_norm = load(w, p + "altup.router_norm.weight", {E}, dtype, device);
    L.altup_router = load(w, p + "altup.modality_router.weight", {A, E}, dtype, device);
    L.altup_pred = load(w, p + "altup.prediction_coefs.weight", {A * A, A}, dtype, device);
    Tensor corr = load(w, p + "altup.correction_coefs.weight", {A, A}, DType::F64, Device{});
    std::vector<double> cv = corr.to_f64_vector();
    if (cfg.altup.coef_clip > 0)
        for (double& v : cv) v = std::clamp(v, -cfg.altup.coef_clip, cfg.altup.coef_clip);
    L.altup_corr = Tensor::from_f64({A, A}, cv, dtype, {device, MemCategory::WEIGHTS, p + "altup.correction_coefs.weight"});
    L.altup_out_scale = load(w, p + "altup.correct_output_scale", {E}, dtype, device);
    L.pli_gate = load(w, p + "per_layer_input_gate.weight", {P, E}, dtype, device);
    L.pli_proj = load(w, p + "per_layer_projection.weight", {E, P}, dtype, device);
    L.pli_norm = load(w, p + "post_per_layer_input_norm.weight", {E}, dtype, device);
}

AltUpWeights load_altup_model(const ModelConfig& cfg, const TensorMap& w, DType dtype, Device device) {
    const int64_t E = cfg.hidden_size, A = cfg.altup.num_inputs, P = cfg.altup.per_layer_dim, NL = cfg.num_layers;
    AltUpWeights aw;
    aw.embed_per_layer = load(w, "model.embed_tokens_per_layer.weight", {cfg.altup.per_layer_vocab, NL * P}, dtype, device);
    aw.per_layer_proj = load(w, "model.per_layer_model_projection.weight", {NL * P, E}, dtype, device);
    aw.per_layer_norm = load(w, "model.per_layer_projection_norm.weight", {P}, dtype, device);
    for (int64_t i = 0; i + 1 < A; ++i) {
        aw.proj.push_back(load(w, str("model.altup_projections.", i, ".weight"), {E, E}, dtype, device));
        aw.unembed.push_back(load(w, str("model.altup_unembed_projections.", i, ".weight"), {E, E}, dtype, device));
    }
    return aw;
}

Tensor altup_embed(const ModelConfig& cfg, const AltUpWeights& aw, const Tensor& ids, const Tensor& e, DType act) {
    const int64_t B = e.size(0), n = e.size(1), E = cfg.hidden_size, A = cfg.altup.num_inputs, P = cfg.altup.per_layer_dim,
                  NL = cfg.num_layers, W = cfg.residual_width(), LP = NL * P;
    const double eps = cfg.rms_norm_eps;
    const std::vector<double> ev = host(e);
    std::vector<double> out(size_t(B * n * W), 0.0);
    for (int64_t t = 0; t < B * n; ++t) std::copy_n(ev.data() + t * E, E, out.data() + t * W);
    for (int64_t i = 1; i < A; ++i) {
        const std::vector<double> y = host(linear_any(e, aw.proj[size_t(i - 1)], act));
        for (int64_t t = 0; t < B * n; ++t) {
            // the target is the embedding's plain RMS (no floor)
            double s = 0;
            for (int64_t c = 0; c < E; ++c) s += ev[size_t(t * E + c)] * ev[size_t(t * E + c)];
            const double scale = std::sqrt(s / double(E)) / floored_rms(y.data() + t * E, E);
            for (int64_t c = 0; c < E; ++c) out[size_t(t * W + i * E + c)] = y[size_t(t * E + c)] * scale;
        }
    }
    // Per-layer inputs: the projection of e (scaled, normalised per layer) plus the token's own table row.
    const std::vector<double> proj = host(linear_any(e, aw.per_layer_proj, act));  // (B n, L P)
    const std::vector<double> nw = host(aw.per_layer_norm);
    const std::vector<int64_t> id = ids.to_i64_vector();
    const double sp = std::sqrt(double(P)), se = 1.0 / std::sqrt(double(E)), half = 1.0 / std::sqrt(2.0);
    for (int64_t t = 0; t < B * n; ++t) {
        if (id[size_t(t)] < 0 || id[size_t(t)] >= cfg.altup.per_layer_vocab)
            throw Error(str("per-layer embedding: token id ", id[size_t(t)], " is outside vocab_size_per_layer_input ",
                            cfg.altup.per_layer_vocab));
        const std::vector<double> row = host(aw.embed_per_layer.slice(0, id[size_t(t)], id[size_t(t)] + 1));
        for (int64_t l = 0; l < NL; ++l) {
            double pv[1024];
            if (P > 1024) throw Error(str("hidden_size_per_layer_input ", P, " is implausible; expected at most 1024"));
            for (int64_t c = 0; c < P; ++c) pv[c] = proj[size_t(t * LP + l * P + c)] * se;
            const double r = inv_rms(pv, P, eps);
            for (int64_t c = 0; c < P; ++c)
                out[size_t(t * W + A * E + l * P + c)] = (pv[c] * r * nw[size_t(c)] + row[size_t(l * P + c)] * sp) * half;
        }
    }
    return device_tensor({B, n, W}, out, act, e.device());
}

AltUpPrediction altup_predict(const ModelConfig& cfg, const LayerWeights& L, const Tensor& x, DType act) {
    const int64_t B = x.size(0), n = x.size(1), E = cfg.hidden_size, A = cfg.altup.num_inputs, W = cfg.residual_width(),
                  a = cfg.altup.active_idx;
    const std::vector<double> xv = host(x), nw = host(L.altup_router_norm), router = host(L.altup_router), pc = host(L.altup_pred);
    AltUpPrediction out;
    out.pred.assign(size_t(B * n * A * E), 0.0);
    std::vector<double> active(size_t(B * n * E)), m(static_cast<size_t>(A)), r(static_cast<size_t>(A * A));
    for (int64_t t = 0; t < B * n; ++t) {
        const double* xs = xv.data() + t * W;
        modalities(cfg, xs + a * E, nw, router, m.data());
        for (int64_t o = 0; o < A * A; ++o) {  // r = W_pred m, row o = i A + k
            double s = 0;
            for (int64_t j = 0; j < A; ++j) s += pc[size_t(o * A + j)] * m[size_t(j)];
            r[size_t(o)] = s;
        }
        double* pr = out.pred.data() + t * A * E;
        for (int64_t i = 0; i < A; ++i)
            for (int64_t c = 0; c < E; ++c) {
                double s = xs[i * E + c];
                for (int64_t k = 0; k < A; ++k) s += r[size_t(i * A + k)] * xs[k * E + c];
                pr[i * E + c] = s;
            }
        std::copy_n(pr + a * E, E, active.data() + t * E);
    }
    out.active = device_tensor({B, n, E}, active, act, x.device());
    return out;
}

Tensor altup_correct(const ModelConfig& cfg, const LayerWeights& L, int layer, const Tensor& x, const AltUpPrediction& p,
                     const Tensor& out, DType act) {
    const int64_t B = x.size(0), n = x.size(1), E = cfg.hidden_size, A = cfg.altup.num_inputs, W = cfg.residual_width(),
                  a = cfg.altup.active_idx, P = cfg.altup.per_layer_dim;
    const double eps = cfg.rms_norm_eps;
    const std::vector<double> xv = host(x), ov = host(out), nw = host(L.altup_router_norm), router = host(L.altup_router),
                              cc = host(L.altup_corr), scale = host(L.altup_out_scale);
    std::vector<double> next(xv);  // the per-layer inputs pass through unchanged
    std::vector<double> first(size_t(B * n * E)), m(static_cast<size_t>(A));
    for (int64_t t = 0; t < B * n; ++t) {
        const double* o = ov.data() + t * E;
        const double* pr = p.pred.data() + t * A * E;
        modalities(cfg, o, nw, router, m.data());
        for (int64_t i = 0; i < A; ++i) {
            double ci = 1.0;
            for (int64_t j = 0; j < A; ++j) ci += cc[size_t(i * A + j)] * m[size_t(j)];
            for (int64_t c = 0; c < E; ++c) next[size_t(t * W + i * E + c)] = pr[i * E + c] + ci * (o[c] - pr[a * E + c]);
        }
        for (int64_t c = 0; c < E; ++c)
            first[size_t(t * E + c)] = next[size_t(t * W + a * E + c)] * (cfg.altup.correct_scale ? scale[size_t(c)] : 1.0);
    }
    // The per-layer input's contribution to streams 1..: RMSNorm(W_proj(gelu(W_gate first) * pli)).
    std::vector<double> g = host(linear_any(device_tensor({B, n, E}, first, act, x.device()), L.pli_gate, act));  // (B n, P)
    for (int64_t t = 0; t < B * n; ++t)
        for (int64_t c = 0; c < P; ++c) g[size_t(t * P + c)] = gelu_tanh(g[size_t(t * P + c)]) * xv[size_t(t * W + A * E + layer * P + c)];
    Tensor add = linear_any(device_tensor({B, n, P}, g, act, x.device()), L.pli_proj, act);
    const std::vector<double> av = host(ops::rmsnorm(add, L.pli_norm, float(eps), 0.0f));
    for (int64_t t = 0; t < B * n; ++t)
        for (int64_t i = 1; i < A; ++i)
            for (int64_t c = 0; c < E; ++c) next[size_t(t * W + i * E + c)] += av[size_t(t * E + c)];
    return device_tensor({B, n, W}, next, act, x.device());
}

Tensor altup_unembed(const ModelConfig& cfg, const AltUpWeights& aw, const Tensor& x, DType act) {
    const int64_t B = x.size(0), n = x.size(1), E = cfg.hidden_size, A = cfg.altup.num_inputs, W = cfg.residual_width();
    const std::vector<double> xv = host(x);
    std::vector<double> x0(size_t(B * n * E)), sum(size_t(B * n * E));
    for (int64_t t = 0; t < B * n; ++t) std::copy_n(xv.data() + t * W, E, x0.data() + t * E);
    sum = x0;
    for (int64_t i = 1; i < A; ++i) {
        std::vector<double> xi(size_t(B * n * E));
        for (int64_t t = 0; t < B * n; ++t) std::copy_n(xv.data() + t * W + i * E, E, xi.data() + t * E);
        const std::vector<double> y = host(linear_any(device_tensor({B, n, E}, xi, act, x.device()), aw.unembed[size_t(i - 1)], act));
        for (int64_t t = 0; t < B * n; ++t) {
            double s = 0;
            for (int64_t c = 0; c < E; ++c) s += x0[size_t(t * E + c)] * x0[size_t(t * E + c)];
            const double f = std::sqrt(s / double(E)) / floored_rms(y.data() + t * E, E);
            for (int64_t c = 0; c < E; ++c) sum[size_t(t * E + c)] += y[size_t(t * E + c)] * f;
        }
    }
    for (double& v : sum) v /= double(A);
    return device_tensor({B, n, E}, sum, act, x.device());
}

Tensor laurel(const ModelConfig& cfg, const LayerWeights& L, const Tensor& h, DType act) {
    Tensor r = linear_any(linear_any(h, L.laurel_left, act), L.laurel_right, act);
    return ops::add(h, ops::rmsnorm(r, L.laurel_norm, float(cfg.rms_norm_eps), 0.0f));
}

void gaussian_topk_(Tensor& gate, double sparsity) {
    const int64_t I = gate.size(-1), rows = gate.numel() / I;
    const double mult = double(float(normal_quantile(sparsity)));
    std::vector<double> g = host(gate);
    for (int64_t r = 0; r < rows; ++r) {
        double* v = g.data() + r * I;
        double mean = 0, var = 0;
        for (int64_t i = 0; i < I; ++i) mean += v[i];
        mean /= double(I);
        for (int64_t i = 0; i < I; ++i) var += (v[i] - mean) * (v[i] - mean);
        const double cut = mean + std::sqrt(var / double(I)) * mult;
        for (int64_t i = 0; i < I; ++i) v[i] = std::max(0.0, v[i] - cut);
    }
    gate.copy_from(Tensor::from_f64(gate.shape(), g, gate.dtype(), {gate.device(), MemCategory::ACTIVATIONS, {}}));
}

}  // namespace kv
