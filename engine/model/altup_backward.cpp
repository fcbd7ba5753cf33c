// Gemma 3n's reverse pass (see altup_backward.h; the forward and its notation are altup.h's).
// Shapes: rows = B n tokens, E width, A streams, P per-layer channels, L layers, W = A E + L P.
#include "engine/model/altup_backward.h"

#include <algorithm>
#include <cmath>

#include "engine/core/error.h"
#include "engine/model/altup.h"
#include "engine/model/packed_weight.h"
#include "engine/model/transformer_backward.h"
#include "engine/ops/ops.h"

namespace kv {

namespace {

std::vector<double> host(const Tensor& t) { return t.contiguous().to_f64_vector(); }

Tensor make(const Shape& s, const std::vector<double>& v, DType dt, Device dev) {
    return Tensor::from_f64(s, v, dt, {dev, MemCategory::ACTIVATIONS, {}});
}

// g += v (a small parameter's gradient gathered on the host).
void add_to(Tensor* g, const std::vector<double>& v) {
    if (!g || !g->defined()) return;
    std::vector<double> cur = host(*g);
    for (size_t i = 0; i < cur.size(); ++i) cur[i] += v[i];
    g->copy_from(Tensor::from_f64(g->shape(), cur, g->dtype(), {g->device(), MemCategory::WORKSPACE, {}}));
}

Tensor* opt(Tensor& t) { return t.defined() ? &t : nullptr; }

double gelu_tanh(double x) { return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }
double gelu_tanh_grad(double x) {
    const double k = std::sqrt(2.0 / M_PI), u = k * (x + 0.044715 * x * x * x), t = std::tanh(u);
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3 * 0.044715 * x * x);
}

// The router of one token's stream v (E): m = tanh(W_router (v c w)), c = rsqrt(mean(v^2) + eps) / E,
// as modalities_of in altup.cpp.
struct Router {
    const ModelConfig& c;
    std::vector<double> nw, R;  // norm weight (E), router (A, E)
    void modalities(const double* v, double* m, std::vector<double>& xn) const {
        const int64_t E = c.hidden_size, A = c.altup.num_inputs;
        double ss = 0;
        for (int64_t e = 0; e < E; ++e) ss += v[e] * v[e];
        const double k = 1.0 / std::sqrt(ss / double(E) + c.rms_norm_eps) / double(E);
        for (int64_t e = 0; e < E; ++e) xn[size_t(e)] = v[e] * k * nw[size_t(e)];
        for (int64_t j = 0; j < A; ++j) {
            double s = 0;
            for (int64_t e = 0; e < E; ++e) s += R[size_t(j * E + e)] * xn[size_t(e)];
            m[j] = std::tanh(s);
        }
    }
    // Given dm (A) and m: dv (E) +=, dR (A E) +=, dnw (E) +=.
    void backward(const double* v, const double* m, const double* dm, std::vector<double>& xn, double* dv, std::vector<double>& dR,
                  std::vector<double>& dnw) const {
        const int64_t E = c.hidden_size, A = c.altup.num_inputs;
        double ss = 0;
        for (int64_t e = 0; e < E; ++e) ss += v[e] * v[e];
        ss = ss / double(E) + c.rms_norm_eps;
        const double k = 1.0 / std::sqrt(ss) / double(E);
        for (int64_t e = 0; e < E; ++e) xn[size_t(e)] = v[e] * k * nw[size_t(e)];
        double dz[16];
        for (int64_t j = 0; j < A; ++j) dz[j] = dm[j] * (1.0 - m[j] * m[j]);
        double S = 0;
        std::vector<double> u(size_t(E), 0.0);
        for (int64_t e = 0; e < E; ++e) {
            double dxn = 0;
            for (int64_t j = 0; j < A; ++j) {
                dR[size_t(j * E + e)] += dz[j] * xn[size_t(e)];
                dxn += dz[j] * R[size_t(j * E + e)];
            }
            dnw[size_t(e)] += dxn * v[e] * k;
            u[size_t(e)] = dxn * nw[size_t(e)];
            S += u[size_t(e)] * v[e];
        }
        const double kk = S / (double(E) * double(E) * ss * std::sqrt(ss));
        for (int64_t e = 0; e < E; ++e) dv[e] += k * u[size_t(e)] - v[e] * kk;
    }
};

// out = y rms(ref) / max(rms(y), sqrt(1e-5)) (altup.cpp's rescale): given dout, dy (E) = and
// dref (E) +=.
void rescale_backward(const double* y, const double* ref, const double* dout, int64_t E, double* dy, double* dref) {
    double sy = 0, sr = 0, dot = 0;
    for (int64_t e = 0; e < E; ++e) sy += y[e] * y[e], sr += ref[e] * ref[e], dot += dout[e] * y[e];
    const double re = std::sqrt(sr / double(E)), my = sy / double(E), ry = std::sqrt(std::max(my, 1e-5));
    const double f = re / ry;
    const double dry = my > 1e-5 ? -dot * re / (ry * ry) / (double(E) * ry) : 0.0;  // times y_e: d ry / d y_e = y_e / (E ry)
    for (int64_t e = 0; e < E; ++e) dy[e] = dout[e] * f + dry * y[e];
    if (re > 0)
        for (int64_t e = 0; e < E; ++e) dref[e] += dot / ry * ref[e] / (double(E) * re);
}

}  // namespace

Tensor altup_block_backward(const ModelConfig& c, const LayerWeights& L, int layer, const Tensor& x, const BlockActivations& a,
                            const Tensor& dnext, LayerGrads* g, const std::function<Tensor(const Tensor&)>& core_backward) {
    if (!a.altup_pred.defined() || !a.altup_out.defined())
        throw Error(str("layer ", layer, ": the AltUp reverse pass needs the block's saved prediction and output"));
    const int64_t B = x.size(0), n = x.size(1), rows = B * n, E = c.hidden_size, A = c.altup.num_inputs, P = c.altup.per_layer_dim,
                  W = c.residual_width(), ai = c.altup.active_idx;
    const DType dt = x.dtype();
    const Device dev = x.device();
    const float eps = float(c.rms_norm_eps);
    const std::vector<double> xv = host(x), pv = host(a.altup_pred), ov = host(a.altup_out), dn = host(dnext);
    const Router router{c, host(L.altup_router_norm), host(L.altup_router)};
    const std::vector<double> cc = host(L.altup_corr), pc = host(L.altup_pred), scale = host(L.altup_out_scale);
    const bool scaled = c.altup.correct_scale;
    std::vector<double> dR(size_t(A * E), 0.0), dnw(size_t(E), 0.0), dcc(size_t(A * A), 0.0), dpc(size_t(A * A * A), 0.0),
        dscale(size_t(E), 0.0);
    std::vector<double> xn(static_cast<size_t>(E));

    // ---- correction: recompute each token's coefficients, next_a and first ----
    std::vector<double> mc(size_t(rows * A)), cf(size_t(rows * A)), next_a(size_t(rows * E)), first(size_t(rows * E));
    for (int64_t t = 0; t < rows; ++t) {
        double* m = mc.data() + t * A;
        router.modalities(ov.data() + t * E, m, xn);
        for (int64_t i = 0; i < A; ++i) {
            double ci = 1.0;
            for (int64_t j = 0; j < A; ++j) ci += cc[size_t(i * A + j)] * m[j];
            cf[size_t(t * A + i)] = ci;
        }
        const double* pa = pv.data() + (t * A + ai) * E;
        for (int64_t e = 0; e < E; ++e) {
            const double v = pa[e] + cf[size_t(t * A + ai)] * (ov[size_t(t * E + e)] - pa[e]);
            next_a[size_t(t * E + e)] = v;
            first[size_t(t * E + e)] = v * (scaled ? scale[size_t(e)] : 1.0);
        }
    }
    // ---- per-layer input: next_i += RMSNorm(W_proj(gelu(W_gate first) * pli)) for i >= 1 ----
    const Tensor first_t = make({B, n, E}, first, dt, dev);
    const std::vector<double> gv = host(linear_any(first_t, L.pli_gate, dt));  // (rows, P)
    std::vector<double> gg(size_t(rows * P));
    for (int64_t t = 0; t < rows; ++t)
        for (int64_t p = 0; p < P; ++p)
            gg[size_t(t * P + p)] = gelu_tanh(gv[size_t(t * P + p)]) * xv[size_t(t * W + A * E + layer * P + p)];
    const Tensor gg_t = make({B, n, P}, gg, dt, dev);
    const Tensor add = linear_any(gg_t, L.pli_proj, dt);  // (B, n, E)
    std::vector<double> dav(size_t(rows * E), 0.0);
    for (int64_t t = 0; t < rows; ++t)
        for (int64_t i = 1; i < A; ++i)
            for (int64_t e = 0; e < E; ++e) dav[size_t(t * E + e)] += dn[size_t(t * W + i * E + e)];
    Tensor dadd = Tensor::empty({B, n, E}, dt, {dev, MemCategory::ACTIVATIONS, {}});
    ops::rmsnorm_backward_(dadd, g ? opt(g->pli_norm) : nullptr, add, L.pli_norm, make({B, n, E}, dav, dt, dev), eps, 0.0f);
    const std::vector<double> dgg = host(linear_input_grad_any(dadd, L.pli_proj, dt));
    if (g && g->pli_proj.defined()) linear_weight_grad(g->pli_proj, nullptr, gg_t, dadd);
    std::vector<double> dg(size_t(rows * P));
    std::vector<double> dx(size_t(rows * W), 0.0);
    for (int64_t t = 0; t < rows; ++t)
        for (int64_t p = 0; p < P; ++p) {
            const double gi = gv[size_t(t * P + p)], pli = xv[size_t(t * W + A * E + layer * P + p)], d = dgg[size_t(t * P + p)];
            dg[size_t(t * P + p)] = d * pli * gelu_tanh_grad(gi);
            dx[size_t(t * W + A * E + layer * P + p)] += d * gelu_tanh(gi);
        }
    const Tensor dg_t = make({B, n, P}, dg, dt, dev);
    const std::vector<double> dfirst = host(linear_input_grad_any(dg_t, L.pli_gate, dt));
    if (g && g->pli_gate.defined()) linear_weight_grad(g->pli_gate, nullptr, first_t, dg_t);

    // ---- correction: next_i = pred_i + c_i (o - pred_a) ----
    std::vector<double> dpred(size_t(rows * A * E), 0.0), dout(size_t(rows * E), 0.0);
    std::vector<double> D(size_t(A * E));
    for (int64_t t = 0; t < rows; ++t) {
        for (int64_t i = 0; i < A; ++i)
            for (int64_t e = 0; e < E; ++e) D[size_t(i * E + e)] = dn[size_t(t * W + i * E + e)];
        for (int64_t e = 0; e < E; ++e) {
            const double df = dfirst[size_t(t * E + e)];
            D[size_t(ai * E + e)] += df * (scaled ? scale[size_t(e)] : 1.0);
            if (scaled) dscale[size_t(e)] += df * next_a[size_t(t * E + e)];
        }
        const double* o = ov.data() + t * E;
        const double* pa = pv.data() + (t * A + ai) * E;
        double* dp = dpred.data() + t * A * E;
        double* dob = dout.data() + t * E;
        double dc[16];
        for (int64_t i = 0; i < A; ++i) {
            const double ci = cf[size_t(t * A + i)];
            double s = 0;
            for (int64_t e = 0; e < E; ++e) {
                const double d = D[size_t(i * E + e)];
                dp[i * E + e] += d;
                dp[ai * E + e] -= ci * d;
                dob[e] += ci * d;
                s += d * (o[e] - pa[e]);
            }
            dc[i] = s;
        }
        const double* m = mc.data() + t * A;
        double dm[16];
        for (int64_t j = 0; j < A; ++j) {
            double s = 0;
            for (int64_t i = 0; i < A; ++i) {
                dcc[size_t(i * A + j)] += dc[i] * m[j];
                s += dc[i] * cc[size_t(i * A + j)];
            }
            dm[j] = s;
        }
        router.backward(o, m, dm, xn, dob, dR, dnw);
    }

    // ---- the block core: its output's gradient to the active stream's ----
    const std::vector<double> dact = host(core_backward(make({B, n, E}, dout, dt, dev)));
    for (int64_t t = 0; t < rows; ++t)
        for (int64_t e = 0; e < E; ++e) dpred[size_t((t * A + ai) * E + e)] += dact[size_t(t * E + e)];

    // ---- prediction: pred_i = x_i + sum_k r_ik x_k, r = W_pred m, m the router of x_a ----
    for (int64_t t = 0; t < rows; ++t) {
        const double* xs = xv.data() + t * W;
        double* dxs = dx.data() + t * W;
        const double* dp = dpred.data() + t * A * E;
        double m[16], r[16 * 16], dr[16 * 16], dm[16];
        router.modalities(xs + ai * E, m, xn);
        for (int64_t o = 0; o < A * A; ++o) {
            double s = 0;
            for (int64_t j = 0; j < A; ++j) s += pc[size_t(o * A + j)] * m[j];
            r[o] = s;
        }
        for (int64_t i = 0; i < A; ++i) {
            for (int64_t e = 0; e < E; ++e) dxs[i * E + e] += dp[i * E + e];
            for (int64_t k = 0; k < A; ++k) {
                double s = 0;
                const double rik = r[i * A + k];
                for (int64_t e = 0; e < E; ++e) {
                    s += dp[i * E + e] * xs[k * E + e];
                    dxs[k * E + e] += rik * dp[i * E + e];
                }
                dr[i * A + k] = s;
            }
        }
        for (int64_t j = 0; j < A; ++j) {
            double s = 0;
            for (int64_t o = 0; o < A * A; ++o) {
                dpc[size_t(o * A + j)] += dr[o] * m[j];
                s += dr[o] * pc[size_t(o * A + j)];
            }
            dm[j] = s;
        }
        router.backward(xs + ai * E, m, dm, xn, dxs + ai * E, dR, dnw);
    }
    // The per-layer inputs pass through the block unchanged.
    for (int64_t t = 0; t < rows; ++t)
        for (int64_t k = A * E; k < W; ++k) dx[size_t(t * W + k)] += dn[size_t(t * W + k)];
    if (g) {
        add_to(opt(g->altup_router), dR);
        add_to(opt(g->altup_router_norm), dnw);
        add_to(opt(g->altup_corr), dcc);
        add_to(opt(g->altup_pred), dpc);
        if (scaled) add_to(opt(g->altup_out_scale), dscale);
    }
    return make({B, n, W}, dx, dt, dev);
}

Tensor altup_embed_backward(const ModelConfig& c, const AltUpWeights& aw, const Tensor& ids, const Tensor& e, const Tensor& dx0,
                            ModelGrads* g) {
    const int64_t B = e.size(0), n = e.size(1), rows = B * n, E = c.hidden_size, A = c.altup.num_inputs, P = c.altup.per_layer_dim,
                  NL = c.num_layers, W = c.residual_width(), LP = NL * P;
    const DType dt = e.dtype();
    const Device dev = e.device();
    const std::vector<double> ev = host(e), dv = host(dx0);
    std::vector<double> de(size_t(rows * E));
    for (int64_t t = 0; t < rows; ++t) std::copy_n(dv.begin() + t * W, E, de.begin() + t * E);
    // streams 1..: x_i = M(W_i e, e)
    for (int64_t i = 1; i < A; ++i) {
        const std::vector<double> y = host(linear_any(e, aw.proj[size_t(i - 1)], dt));
        std::vector<double> dy(size_t(rows * E));
        for (int64_t t = 0; t < rows; ++t)
            rescale_backward(y.data() + t * E, ev.data() + t * E, dv.data() + t * W + i * E, E, dy.data() + t * E, de.data() + t * E);
        const Tensor dy_t = make({B, n, E}, dy, dt, dev);
        const std::vector<double> dd = host(linear_input_grad_any(dy_t, aw.proj[size_t(i - 1)], dt));
        for (size_t k = 0; k < de.size(); ++k) de[k] += dd[k];
        if (g && !g->altup_proj.empty()) linear_weight_grad(g->altup_proj[size_t(i - 1)], nullptr, e, dy_t);
    }
    // per-layer inputs: (RMSNorm_P((W_pl e)_l / sqrt(E)) + table_l sqrt(P)) / sqrt(2)
    const std::vector<double> proj = host(linear_any(e, aw.per_layer_proj, dt));  // (rows, L P)
    const std::vector<double> nw = host(aw.per_layer_norm);
    const double sp = std::sqrt(double(P)), se = 1.0 / std::sqrt(double(E)), half = 1.0 / std::sqrt(2.0), eps = c.rms_norm_eps;
    std::vector<double> dproj(size_t(rows * LP)), dtable(size_t(rows * LP)), dnw(size_t(P), 0.0);
    for (int64_t t = 0; t < rows; ++t)
        for (int64_t l = 0; l < NL; ++l) {
            const double* xp = proj.data() + t * LP + l * P;
            const double* d = dv.data() + t * W + A * E + l * P;
            double ss = 0;
            for (int64_t p = 0; p < P; ++p) ss += xp[p] * se * xp[p] * se;
            const double r = 1.0 / std::sqrt(ss / double(P) + eps);
            double S = 0;
            for (int64_t p = 0; p < P; ++p) {
                const double q = xp[p] * se;
                dtable[size_t(t * LP + l * P + p)] = d[p] * half * sp;
                dnw[size_t(p)] += d[p] * half * q * r;
                S += d[p] * half * nw[size_t(p)] * q;
            }
            for (int64_t p = 0; p < P; ++p) {
                const double q = xp[p] * se, u = d[p] * half * nw[size_t(p)];
                dproj[size_t(t * LP + l * P + p)] = (r * u - q * r * r * r * S / double(P)) * se;
            }
        }
    const Tensor dproj_t = make({B, n, LP}, dproj, dt, dev);
    const std::vector<double> dd = host(linear_input_grad_any(dproj_t, aw.per_layer_proj, dt));
    for (size_t k = 0; k < de.size(); ++k) de[k] += dd[k];
    if (g && g->per_layer_proj.defined()) {
        linear_weight_grad(g->per_layer_proj, nullptr, e, dproj_t);
        add_to(opt(g->per_layer_norm), dnw);
        ops::embedding_backward_(g->embed_per_layer, ids.device() == dev ? ids : ids.to(dev), make({B, n, LP}, dtable, dt, dev), true);
    }
    return make({B, n, E}, de, dt, dev);
}

Tensor altup_unembed_backward(const ModelConfig& c, const AltUpWeights& aw, const Tensor& x, const Tensor& dmerged, ModelGrads* g) {
    const int64_t B = x.size(0), n = x.size(1), rows = B * n, E = c.hidden_size, A = c.altup.num_inputs, W = c.residual_width();
    const DType dt = x.dtype();
    const Device dev = x.device();
    const std::vector<double> xv = host(x);
    std::vector<double> dsum = host(dmerged);
    for (double& v : dsum) v /= double(A);
    std::vector<double> dx(size_t(rows * W), 0.0), x0(size_t(rows * E));
    for (int64_t t = 0; t < rows; ++t) {
        std::copy_n(xv.begin() + t * W, E, x0.begin() + t * E);
        std::copy_n(dsum.begin() + t * E, E, dx.begin() + t * W);
    }
    for (int64_t i = 1; i < A; ++i) {
        const Tensor xi = x.slice(2, i * E, (i + 1) * E).contiguous();
        const std::vector<double> y = host(linear_any(xi, aw.unembed[size_t(i - 1)], dt));
        std::vector<double> dy(size_t(rows * E)), dref(size_t(rows * E), 0.0);
        for (int64_t t = 0; t < rows; ++t)
            rescale_backward(y.data() + t * E, x0.data() + t * E, dsum.data() + t * E, E, dy.data() + t * E, dref.data() + t * E);
        const Tensor dy_t = make({B, n, E}, dy, dt, dev);
        const std::vector<double> dxi = host(linear_input_grad_any(dy_t, aw.unembed[size_t(i - 1)], dt));
        for (int64_t t = 0; t < rows; ++t)
            for (int64_t e = 0; e < E; ++e) {
                dx[size_t(t * W + e)] += dref[size_t(t * E + e)];
                dx[size_t(t * W + i * E + e)] += dxi[size_t(t * E + e)];
            }
        if (g && !g->altup_unembed.empty()) linear_weight_grad(g->altup_unembed[size_t(i - 1)], nullptr, xi, dy_t);
    }
    return make({B, n, W}, dx, dt, dev);
}

Tensor laurel_backward(const ModelConfig& c, const LayerWeights& L, const Tensor& h, const Tensor& left, const Tensor& r,
                       const Tensor& d, LayerGrads* g) {
    const DType dt = h.dtype();
    Tensor dr = Tensor::empty(r.shape(), dt, {h.device(), MemCategory::ACTIVATIONS, {}});
    ops::rmsnorm_backward_(dr, g ? opt(g->laurel_norm) : nullptr, r, L.laurel_norm, d, float(c.rms_norm_eps), 0.0f);
    Tensor dleft = linear_input_grad_any(dr, L.laurel_right, dt);
    if (g && g->laurel_right.defined()) linear_weight_grad(g->laurel_right, nullptr, left, dr);
    if (g && g->laurel_left.defined()) linear_weight_grad(g->laurel_left, nullptr, h, dleft);
    return linear_input_grad_any(dleft, L.laurel_left, dt);
}

void gaussian_topk_backward_(Tensor& dgate, const Tensor& gate_pre, double sparsity) {
    const int64_t I = gate_pre.size(-1), rows = gate_pre.numel() / I;
    const double mult = double(float(normal_quantile(sparsity)));  // as the forward rounds it
    const std::vector<double> gv = host(gate_pre);
    std::vector<double> dv = host(dgate);
    for (int64_t r = 0; r < rows; ++r) {
        const double* v = gv.data() + r * I;
        double* d = dv.data() + r * I;
        double mean = 0, var = 0;
        for (int64_t i = 0; i < I; ++i) mean += v[i];
        mean /= double(I);
        for (int64_t i = 0; i < I; ++i) var += (v[i] - mean) * (v[i] - mean);
        const double sd = std::sqrt(var / double(I)), cut = mean + sd * mult;
        // y_i = relu(v_i - cut): the kept entries pass their gradient and all pull on the cutoff,
        // d cut / d v_i = 1 / I + mult (v_i - mean) / (I sd)
        double D = 0;
        for (int64_t i = 0; i < I; ++i) {
            if (v[i] > cut) D += d[i];
            else d[i] = 0.0;
        }
        for (int64_t i = 0; i < I; ++i) d[i] -= D * (1.0 / double(I) + (sd > 0 ? mult * (v[i] - mean) / (double(I) * sd) : 0.0));
    }
    ops::copy_(dgate, Tensor::from_f64(dgate.shape(), dv, dgate.dtype(), {dgate.device(), MemCategory::WORKSPACE, {}}));
}

}  // namespace kv
