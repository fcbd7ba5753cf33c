// Gemma 3n's AltUp streams, LAUREL and per-layer inputs (see altup.h).
#include "engine/model/altup.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "engine/core/error.h"
#include "engine/model/altup_rows.h"
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

namespace {

// The per-token loops run on f32 or f64 data in place (bf16 activations through f32 copies),
// tokens in parallel: no conversion of the packed state. f64 data: the templates below, each
// token's arithmetic in double; f32 data: altup_rows (f32, vectorised per ISA level).
DType host_dtype(DType act) { return act == DType::F64 ? DType::F64 : DType::F32; }
Tensor on_host(const Tensor& x, DType hd) { return x.dtype() == hd ? x.contiguous() : x.contiguous().to(hd); }

template <class T>
double sum_sq(const T* x, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += double(x[i]) * double(x[i]);
    return s;
}

// f32 rows: the squares summed in double lanes the compiler vectorises (the order changes
// nothing at f32 precision).
inline double sum_sq(const float* x, int64_t n) {
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; ++i) s += double(x[i]) * double(x[i]);
    return s;
}

// sum a_i b_i in eight interleaved partial sums: the compiler vectorises it (a strict left-to-right
// sum it may not reorder), and in double the order changes nothing a test can see.
inline double dot8(const double* a, const double* b, int64_t n) {
    double p[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; ++l) p[l] += a[i + l] * b[i + l];
    for (; i < n; ++i) p[0] += a[i] * b[i];
    return ((p[0] + p[4]) + (p[1] + p[5])) + ((p[2] + p[6]) + (p[3] + p[7]));
}

// tanh(W_router (RMSNorm(x) w) / E) of one token's stream x (E): the router's A modalities;
// xn is scratch of E.
template <class T>
void modalities_of(const ModelConfig& cfg, const T* x, const std::vector<double>& norm_w, const std::vector<double>& router, double* m,
                   double* xn) {
    const int64_t E = cfg.hidden_size, A = cfg.altup.num_inputs;
    for (int64_t e = 0; e < E; ++e) xn[e] = double(x[e]);
    const double r = 1.0 / std::sqrt(dot8(xn, xn, E) / double(E) + cfg.rms_norm_eps) / double(E);
    for (int64_t e = 0; e < E; ++e) xn[e] *= r * norm_w[size_t(e)];
    for (int64_t j = 0; j < A; ++j) m[j] = std::tanh(dot8(router.data() + j * E, xn, E));
}

// out[t, col..col+E) = y[t] rescaled to ref[t]'s plain RMS (y's floored at sqrt(1e-5)).
template <class T>
void rescale_rows(const T* y, const T* ref, int64_t ref_stride, int64_t rows, int64_t E, T* out, int64_t out_stride) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < rows; ++t) {
        const T* yt = y + t * E;
        const double f = std::sqrt(sum_sq(ref + t * ref_stride, E) / double(E)) / std::sqrt(std::max(sum_sq(yt, E) / double(E), 1e-5));
        for (int64_t c = 0; c < E; ++c) out[t * out_stride + c] = T(double(yt[c]) * f);
    }
}

template <class T>
void embed_rows(const ModelConfig& cfg, const AltUpWeights& aw, const Tensor& e, const Tensor& table_rows, DType act, Tensor& out) {
    const int64_t rows = e.size(0) * e.size(1), E = cfg.hidden_size, A = cfg.altup.num_inputs, P = cfg.altup.per_layer_dim,
                  NL = cfg.num_layers, W = cfg.residual_width(), LP = NL * P;
    const DType hd = out.dtype();
    const Tensor eh = on_host(e, hd);
    const T* ev = eh.data<T>();
    T* o = out.data<T>();
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < rows; ++t) std::copy_n(ev + t * E, E, o + t * W);
    for (int64_t i = 1; i < A; ++i) {
        const Tensor y = on_host(linear_any(e, aw.proj[size_t(i - 1)], act), hd);
        if constexpr (std::is_same_v<T, float>)
            altup_rows::rescale(y.data<float>(), ev, E, rows, E, o + i * E, W, false);
        else
            rescale_rows(y.data<T>(), ev, E, rows, E, o + i * E, W);
    }
    // Per-layer inputs: the projection of e (scaled, normalised per layer) plus the token's own table row.
    const Tensor proj = on_host(linear_any(e, aw.per_layer_proj, act), hd);  // (B n, L P)
    const std::vector<double> nw = host(aw.per_layer_norm);
    const T* pv = proj.data<T>();
    const T* tr = table_rows.data<T>();
    const double sp = std::sqrt(double(P)), se = 1.0 / std::sqrt(double(E)), half = 1.0 / std::sqrt(2.0), eps = cfg.rms_norm_eps;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < rows; ++t)
        for (int64_t l = 0; l < NL; ++l) {
            const T* x = pv + t * LP + l * P;
            const double r = 1.0 / std::sqrt(sum_sq(x, P) * se * se / double(P) + eps);
            for (int64_t c = 0; c < P; ++c)
                o[t * W + A * E + l * P + c] = T((double(x[c]) * se * r * nw[size_t(c)] + double(tr[t * LP + l * P + c]) * sp) * half);
        }
}

template <class T>
void predict_rows(const ModelConfig& cfg, const T* xv, const std::vector<double>& nw, const std::vector<double>& router,
                  const std::vector<double>& pc, int64_t rows, T* pred, T* active) {
    const int64_t E = cfg.hidden_size, A = cfg.altup.num_inputs, W = cfg.residual_width(), a = cfg.altup.active_idx;
#pragma omp parallel
    {
        std::vector<double> xn(static_cast<size_t>(E)), acc(static_cast<size_t>(E)), xd(static_cast<size_t>(A * E));
#pragma omp for schedule(static)
        for (int64_t t = 0; t < rows; ++t) {
            double m[16], r[16 * 16];  // altup_num_inputs <= 16 (ModelConfig::validate)
            const T* xs = xv + t * W;
            for (int64_t c = 0; c < A * E; ++c) xd[size_t(c)] = double(xs[c]);  // each stream converted once
            modalities_of(cfg, xs + a * E, nw, router, m, xn.data());
            for (int64_t o = 0; o < A * A; ++o) {  // r = W_pred m, row o = i A + k
                double s = 0;
                for (int64_t j = 0; j < A; ++j) s += pc[size_t(o * A + j)] * m[j];
                r[o] = s;
            }
            T* pr = pred + t * A * E;
            for (int64_t i = 0; i < A; ++i) {  // pred_i = x_i + sum_k r_ik x_k, every channel at once
                const double* xi = xd.data() + i * E;
                for (int64_t c = 0; c < E; ++c) acc[size_t(c)] = xi[c];
                for (int64_t k = 0; k < A; ++k) {
                    const double rk = r[i * A + k];
                    const double* xk = xd.data() + k * E;
                    for (int64_t c = 0; c < E; ++c) acc[size_t(c)] += rk * xk[c];
                }
                for (int64_t c = 0; c < E; ++c) pr[i * E + c] = T(acc[size_t(c)]);
            }
            std::copy_n(pr + a * E, E, active + t * E);
        }
    }
}

template <class T>
void correct_rows(const ModelConfig& cfg, const T* xv, const T* ov, const T* pred, const std::vector<double>& nw,
                  const std::vector<double>& router, const std::vector<double>& cc, const std::vector<double>& scale, int64_t rows,
                  T* next, T* first) {
    const int64_t E = cfg.hidden_size, A = cfg.altup.num_inputs, W = cfg.residual_width(), a = cfg.altup.active_idx;
#pragma omp parallel
    {
    std::vector<double> xn(static_cast<size_t>(E)), diff(static_cast<size_t>(E));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < rows; ++t) {
        double m[16];
        const T* o = ov + t * E;
        const T* pr = pred + t * A * E;
        T* nx = next + t * W;
        modalities_of(cfg, o, nw, router, m, xn.data());
        for (int64_t c = 0; c < E; ++c) diff[size_t(c)] = double(o[c]) - double(pr[a * E + c]);  // once for every stream
        for (int64_t i = 0; i < A; ++i) {
            double ci = 1.0;
            for (int64_t j = 0; j < A; ++j) ci += cc[size_t(i * A + j)] * m[j];
            for (int64_t c = 0; c < E; ++c) {
                const double v = double(pr[i * E + c]) + ci * diff[size_t(c)];
                nx[i * E + c] = T(v);
                if (i == a) first[t * E + c] = T(v * (cfg.altup.correct_scale ? scale[size_t(c)] : 1.0));
            }
        }
        std::copy(xv + t * W + A * E, xv + (t + 1) * W, nx + A * E);  // the per-layer inputs pass through unchanged
    }
    }
}

// Streams 1.. of next gain the normalised per-layer projection av (rows, E).
template <class T>
void add_per_layer_rows(const ModelConfig& cfg, const T* av, int64_t rows, T* next) {
    const int64_t E = cfg.hidden_size, A = cfg.altup.num_inputs, W = cfg.residual_width();
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < rows; ++t)
        for (int64_t i = 1; i < A; ++i)
            for (int64_t c = 0; c < E; ++c) next[t * W + i * E + c] = T(double(next[t * W + i * E + c]) + double(av[t * E + c]));
}

// The router with its norm weight folded in, for the f32 rows: rw[j E + e] = router[j, e] nw[e],
// rounded to f32 (the rows' precision) and kept in double so no token widens it again.
std::vector<double> router_weighted(const ModelConfig& cfg, const std::vector<double>& nw, const std::vector<double>& router) {
    const int64_t E = cfg.hidden_size, A = cfg.altup.num_inputs;
    std::vector<double> rw(size_t(A * E));
    for (int64_t j = 0; j < A; ++j)
        for (int64_t e = 0; e < E; ++e) rw[size_t(j * E + e)] = float(router[size_t(j * E + e)] * nw[size_t(e)]);
    return rw;
}

altup_rows::Dims dims_of(const ModelConfig& cfg) {
    return {cfg.hidden_size, cfg.altup.num_inputs, cfg.residual_width(), cfg.altup.active_idx, cfg.rms_norm_eps};
}

template <class T>
void unembed_rows(const T* x0, int64_t x0_stride, const T* y, int64_t rows, int64_t E, T* sum) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < rows; ++t) {
        const T* yt = y + t * E;
        const double f = std::sqrt(sum_sq(x0 + t * x0_stride, E) / double(E)) / std::sqrt(std::max(sum_sq(yt, E) / double(E), 1e-5));
        for (int64_t c = 0; c < E; ++c) sum[t * E + c] = T(double(sum[t * E + c]) + double(yt[c]) * f);
    }
}

}  // namespace

Tensor altup_embed(const ModelConfig& cfg, const AltUpWeights& aw, const Tensor& ids, const Tensor& e, DType act) {
    const int64_t B = e.size(0), n = e.size(1), W = cfg.residual_width();
    for (const int64_t id : ids.to_i64_vector())
        if (id < 0 || id >= cfg.altup.per_layer_vocab)
            throw Error(str("per-layer embedding: token id ", id, " is outside vocab_size_per_layer_input ", cfg.altup.per_layer_vocab));
    const DType hd = host_dtype(act);
    const TensorOptions ao{e.device(), MemCategory::ACTIVATIONS, {}};
    const Tensor rows = ops::embedding(aw.embed_per_layer, ids, hd).contiguous();  // (B, n, L P): each token's own table row
    Tensor out = Tensor::empty({B, n, W}, hd, ao);
    if (hd == DType::F64)
        embed_rows<double>(cfg, aw, e, rows, act, out);
    else
        embed_rows<float>(cfg, aw, e, rows, act, out);
    return out.to(act);
}

AltUpPrediction altup_predict(const ModelConfig& cfg, const LayerWeights& L, const Tensor& x, DType act, bool keep_pred) {
    const int64_t B = x.size(0), n = x.size(1), E = cfg.hidden_size, A = cfg.altup.num_inputs;
    const DType hd = host_dtype(act);
    const TensorOptions ao{x.device(), MemCategory::ACTIVATIONS, {}};
    const std::vector<double> nw = host(L.altup_router_norm), router = host(L.altup_router), pc = host(L.altup_pred);
    const Tensor xh = on_host(x, hd);
    AltUpPrediction out;
    if (hd == DType::F64 || keep_pred) out.pred = Tensor::empty({B * n, A, E}, hd, ao);
    Tensor active = Tensor::empty({B, n, E}, hd, ao);
    if (hd == DType::F64) {
        predict_rows(cfg, xh.data<double>(), nw, router, pc, B * n, out.pred.data<double>(), active.data<double>());
    } else {
        out.coefs.resize(size_t(B * n * A * A));
        altup_rows::predict(dims_of(cfg), xh.data<float>(), router_weighted(cfg, nw, router).data(), pc.data(), B * n,
                            keep_pred ? out.pred.data<float>() : nullptr, active.data<float>(), out.coefs.data());
    }
    out.active_host = active;
    out.active = active.to(act);
    return out;
}

bool altup_can_follow(const ModelConfig& cfg, DType act) { return act == DType::F32 && cfg.altup_enabled(); }

Tensor altup_correct(const ModelConfig& cfg, const LayerWeights& L, int layer, const Tensor& x, const AltUpPrediction& p,
                     const Tensor& out, DType act, const LayerWeights* follow_layer, AltUpPrediction* follow, const AltUpCoefs* pre) {
    if (follow_layer && !altup_can_follow(cfg, act))
        throw Error("altup_correct: the next layer's prediction is made in the correction for f32 activations only; expected f32");
    const int64_t B = x.size(0), n = x.size(1), E = cfg.hidden_size, W = cfg.residual_width(), rows = B * n;
    const DType hd = host_dtype(act);
    const TensorOptions ao{x.device(), MemCategory::ACTIVATIONS, {}};
    const std::vector<double> nw = host(L.altup_router_norm), router = host(L.altup_router), cc = host(L.altup_corr),
                              scale = host(L.altup_out_scale);
    const Tensor xh = on_host(x, hd), oh = on_host(out, hd);
    const bool given = pre && pre->first.defined() && hd == DType::F32;
    Tensor next = Tensor::empty({B, n, W}, hd, ao), first = given ? pre->first : Tensor::empty({B, n, E}, hd, ao);
    const int64_t A = cfg.altup.num_inputs, P = cfg.altup.per_layer_dim, pli = A * E + int64_t(layer) * P;
    if (hd == DType::F32) {  // coefficients and `first`, the per-layer term, then one pass writing next
        std::vector<float> coef = given ? pre->coef : std::vector<float>(size_t(rows * A)), sf(scale.begin(), scale.end());
        const altup_rows::Dims d = dims_of(cfg);
        if (!given)
            altup_rows::correct_coefs(d, oh.data<float>(), p.active_host.data<float>(), router_weighted(cfg, nw, router).data(),
                                      cc.data(), cfg.altup.correct_scale ? sf.data() : nullptr, rows, coef.data(), first.data<float>());
        const Tensor g = ops::gated(linear_any(first.to(act), L.pli_gate, act), x.slice(2, pli, pli + P), GateAct::GELU_TANH);
        // The projection's norm is made per token inside the update (one pass fewer over it).
        const Tensor proj = on_host(linear_any(g, L.pli_proj, act), hd);
        const Tensor nwt = on_host(L.pli_norm, hd);
        altup_rows::Follow fw;
        std::vector<double> rw_next, pc_next;
        if (follow_layer) {
            rw_next = router_weighted(cfg, host(follow_layer->altup_router_norm), host(follow_layer->altup_router));
            pc_next = host(follow_layer->altup_pred);
            follow->pred = Tensor();
            follow->active = Tensor::empty({B, n, E}, hd, ao);
            follow->active_host = follow->active;
            follow->coefs.assign(size_t(rows * A * A), 0.0);
            fw = {rw_next.data(), pc_next.data(), follow->active.data<float>(), follow->coefs.data()};
        }
        altup_rows::correct_apply(d, xh.data<float>(), oh.data<float>(), p.pred.defined() ? p.pred.data<float>() : nullptr,
                                  p.coefs.data(), p.active_host.data<float>(), coef.data(), proj.data<float>(), nwt.data<float>(),
                                  float(cfg.rms_norm_eps), rows, next.data<float>(), follow_layer ? &fw : nullptr);
        return next.to(act);
    }
    correct_rows(cfg, xh.data<double>(), oh.data<double>(), p.pred.data<double>(), nw, router, cc, scale, rows, next.data<double>(),
                 first.data<double>());
    // The per-layer input's contribution to streams 1..: RMSNorm(W_proj(gelu(W_gate first) * pli)).
    // gelu(W_gate first) * the layer's per-layer input (a view into x's packed tail), one kernel.
    const Tensor g = ops::gated(linear_any(first.to(act), L.pli_gate, act), x.slice(2, pli, pli + P), GateAct::GELU_TANH);
    const Tensor add = linear_any(g, L.pli_proj, act);
    const Tensor av = on_host(ops::rmsnorm(add, L.pli_norm, float(cfg.rms_norm_eps), 0.0f), hd);
    add_per_layer_rows<double>(cfg, av.data<double>(), rows, next.data<double>());
    return next.to(act);
}

bool altup_post_mlp(const ModelConfig& cfg, const LayerWeights& L, const Tensor& active, const Tensor& d, Tensor& out, DType act,
                    AltUpCoefs* c) {
    if (act != DType::F32 || !L.mlp_post_norm.defined() || out.device().type != DeviceType::CPU) return false;
    for (const Tensor* t : {&active, &d, static_cast<const Tensor*>(&out)})
        if (t->dtype() != DType::F32 || !t->is_contiguous()) return false;
    const int64_t E = cfg.hidden_size, A = cfg.altup.num_inputs, rows = out.numel() / E;
    const std::vector<double> nw = host(L.altup_router_norm), router = host(L.altup_router), cc = host(L.altup_corr),
                              scale = host(L.altup_out_scale);
    const std::vector<float> sf(scale.begin(), scale.end());
    std::vector<float> pw = L.mlp_post_norm.to_f32_vector();
    for (float& v : pw) v += float(cfg.norm_weight_offset);  // in f32, as ops::rmsnorm adds it
    c->coef.assign(size_t(rows * A), 0.0f);
    c->first = Tensor::empty(out.shape(), DType::F32, {out.device(), MemCategory::ACTIVATIONS, {}});
    altup_rows::post_mlp(dims_of(cfg), d.data<float>(), pw.data(), float(cfg.rms_norm_eps), active.data<float>(),
                         router_weighted(cfg, nw, router).data(), cc.data(), cfg.altup.correct_scale ? sf.data() : nullptr, rows,
                         out.data<float>(), c->coef.data(), c->first.data<float>());
    return true;
}

Tensor altup_unembed(const ModelConfig& cfg, const AltUpWeights& aw, const Tensor& x, DType act) {
    const int64_t B = x.size(0), n = x.size(1), E = cfg.hidden_size, A = cfg.altup.num_inputs, W = cfg.residual_width();
    const DType hd = host_dtype(act);
    const Tensor xh = on_host(x, hd);
    Tensor sum = xh.slice(2, 0, E).contiguous();
    if (sum.storage() == xh.storage()) sum = sum.clone();
    for (int64_t i = 1; i < A; ++i) {
        const Tensor xi = x.slice(2, i * E, (i + 1) * E).contiguous();
        const Tensor y = on_host(linear_any(xi, aw.unembed[size_t(i - 1)], act), hd);
        if (hd == DType::F64)
            unembed_rows(xh.data<double>(), W, y.data<double>(), B * n, E, sum.data<double>());
        else
            altup_rows::rescale(y.data<float>(), xh.data<float>(), W, B * n, E, sum.data<float>(), E, true);
    }
    return ops::scale(sum, float(1.0 / double(A))).to(act);
}

Tensor laurel_residual(const ModelConfig& cfg, const LayerWeights& L, const Tensor& x, const Tensor& o, const Tensor& h, DType act,
                       Tensor* left, Tensor* right) {
    const float eps = float(cfg.rms_norm_eps), off = float(cfg.norm_weight_offset), s = float(1.0 / std::sqrt(2.0));
    const Tensor lf = linear_any(h, L.laurel_left, act);
    const Tensor r = linear_any(lf, L.laurel_right, act);
    if (left) *left = lf;
    if (right) *right = r;
    bool fused = act == DType::F32 && x.device().type == DeviceType::CPU && L.attn_post_norm.defined();
    for (const Tensor* t : {&x, &o, &h, &r}) fused = fused && t->dtype() == DType::F32 && t->is_contiguous();
    if (fused) {  // one pass instead of two norms, two adds and a scale, each over memory
        const int64_t E = cfg.hidden_size, rows = x.numel() / E;
        std::vector<float> pw = L.attn_post_norm.to_f32_vector(), lw = L.laurel_norm.to_f32_vector();
        for (float& v : pw) v += off;  // as ops::rmsnorm adds the offset: in f32
        Tensor out = Tensor::empty(x.shape(), DType::F32, {x.device(), MemCategory::ACTIVATIONS, {}});
        altup_rows::laurel_residual(E, rows, x.data<float>(), o.data<float>(), pw.data(), h.data<float>(), r.data<float>(), lw.data(), eps,
                                    s, out.data<float>());
        return out;
    }
    const Tensor on = L.attn_post_norm.defined() ? ops::rmsnorm(o, L.attn_post_norm, eps, off) : o;
    Tensor out = ops::add(x, on);
    Tensor lr = ops::rmsnorm(r, L.laurel_norm, eps, 0.0f);
    ops::add_(lr, h, lr);  // in place: one temporary fewer
    ops::add_(out, out, lr);
    ops::scale_(out, out, s);
    return out;
}

namespace {

// relu(v - mean - std mult) over each row of I channels (rows at `row(r)`), in place; each row's
// sums in double in channel order, rows in parallel.
template <class T, class RowAt>
void topk_rows(int64_t rows, int64_t I, double mult, RowAt row) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        T* v = row(r);
        double mean = 0, var = 0;
        for (int64_t i = 0; i < I; ++i) mean += double(v[i]);
        mean /= double(I);
        for (int64_t i = 0; i < I; ++i) var += (double(v[i]) - mean) * (double(v[i]) - mean);
        const double cut = mean + std::sqrt(var / double(I)) * mult;
        for (int64_t i = 0; i < I; ++i) v[i] = T(std::max(0.0, double(v[i]) - cut));
    }
}

template <class T>
void topk_in_place(Tensor& gate, double mult) {
    const int64_t I = gate.size(-1);
    T* base = gate.data<T>();
    if (gate.ndim() == 3) {
        const int64_t n = gate.size(1), s0 = gate.stride(0), s1 = gate.stride(1);
        topk_rows<T>(gate.size(0) * n, I, mult, [=](int64_t r) { return base + (r / n) * s0 + (r % n) * s1; });
    } else {
        const int64_t s0 = gate.stride(0);
        topk_rows<T>(gate.size(0), I, mult, [=](int64_t r) { return base + r * s0; });
    }
}

}  // namespace

void gaussian_topk_(Tensor& gate, double sparsity) {
    const int64_t I = gate.size(-1), rows = gate.numel() / I;
    const double mult = double(float(normal_quantile(sparsity)));
    // The MLP's gate half (a strided view of the gate/up projection) in place on the host.
    if (gate.device().type == DeviceType::CPU && (gate.ndim() == 2 || gate.ndim() == 3) && gate.stride(gate.ndim() - 1) == 1 &&
        (gate.dtype() == DType::F32 || gate.dtype() == DType::F64)) {
        if (gate.dtype() == DType::F32) {
            const int64_t n = gate.ndim() == 3 ? gate.size(1) : 1, s1 = gate.ndim() == 3 ? gate.stride(1) : 0;
            altup_rows::topk(gate.data<float>(), rows, n, gate.stride(0), s1, I, mult);
        } else
            topk_in_place<double>(gate, mult);
        return;
    }
    std::vector<double> g = host(gate);  // other dtypes and layouts through a double copy
    topk_rows<double>(rows, I, mult, [&](int64_t r) { return g.data() + r * I; });
    gate.copy_from(Tensor::from_f64(gate.shape(), g, gate.dtype(), {gate.device(), MemCategory::ACTIVATIONS, {}}));
}

}  // namespace kv
