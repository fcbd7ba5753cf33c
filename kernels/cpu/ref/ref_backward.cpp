// Naive f64 references for the gradient ops, the cross-entropy loss and the optimizer step
// (contract: ref_ops.h). Gradients are written from their definitions (full Jacobians and
// chain rules over plain loops), not from the kernels' closed forms, so the two are
// independent; optimizer steps follow PyTorch's documented torch.optim algorithms line by line.
//
// Index
//   [SECTION] helpers
//   [SECTION] normalisation, position encoding, activations, embedding
//   [SECTION] cross-entropy
//   [SECTION] attention
//   [SECTION] optimizer step, gradient norm
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ref_common.h"

namespace kv::ref::detail {

namespace {

// =========================================================================================
// [SECTION] helpers
// =========================================================================================
bool acc_bit(const OpCall& c, int bit) { return (c.p.accumulate & bit) != 0; }

// out[idx] = (accumulate ? out[idx] : 0) + v
void put(const TensorView& out, const Index& idx, double v, bool accumulate) { set(out, idx, (accumulate ? get(out, idx) : 0.0) + v); }

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// =========================================================================================
// [SECTION] normalisation, position encoding, activations, embedding
// =========================================================================================
// dx_k = sum_i dy_i dy_i/dx_k with y_i = x_i r w'_i, r = (sum x^2 / n + eps)^-1/2:
// dy_i/dx_k = w'_i (delta_ik r + x_i dr/dx_k), dr/dx_k = -r^3 x_k / n.
void rmsnorm_backward(const OpCall& c) {
    const TensorView &x = c.src[0], &dy = c.src[1];
    const bool has_w = c.nsrc > 2 && c.src[2].data;
    const int64_t n = x.ne[x.ndim - 1];
    std::vector<double> dw((size_t)n, 0.0);
    for_each_row(x, [&](Index idx) {
        std::vector<double> xv((size_t)n), gv((size_t)n), wv((size_t)n);
        double ss = 0;
        for (int64_t i = 0; i < n; ++i) {
            idx.back() = i;
            xv[size_t(i)] = get(x, idx);
            gv[size_t(i)] = get(dy, idx);
            wv[size_t(i)] = has_w ? double(c.p.weight_offset) + get(c.src[2], Index{i}) : 1.0;
            ss += xv[size_t(i)] * xv[size_t(i)];
        }
        const double r = 1.0 / std::sqrt(ss / double(n) + double(c.p.eps));
        for (int64_t k = 0; k < n; ++k) {
            const double dr = -r * r * r * xv[size_t(k)] / double(n);
            double sum = 0;
            for (int64_t i = 0; i < n; ++i) sum += gv[size_t(i)] * wv[size_t(i)] * ((i == k ? r : 0.0) + xv[size_t(i)] * dr);
            idx.back() = k;
            put(c.dst, idx, sum, acc_bit(c, KV_ACC_DST));
            dw[size_t(k)] += gv[size_t(k)] * xv[size_t(k)] * r;
        }
    });
    if (c.dst2.data)
        for (int64_t k = 0; k < n; ++k) put(c.dst2, Index{k}, dw[size_t(k)], acc_bit(c, KV_ACC_DST2));
}

// y = J x per channel pair with J = [[c, -s], [s, c]]; dx = J^T dy.
void rope_backward(const OpCall& c) {
    const TensorView& dy = c.src[0];
    const int64_t half = c.p.n_rot / 2, HS = dy.ne[3];
    for_each_index(3, dy.ne, [&](const Index& bht) {
        const int64_t b = bht[0], t = bht[2];
        const int64_t p = int64_t(get(c.src[1], Index{c.src[1].ne[0] == 1 ? 0 : b, t}));
        for (int64_t i = 0; i < HS; ++i) {
            Index idx{bht[0], bht[1], bht[2], i};
            double g;
            if (i < 2 * half) {
                const int64_t j = i % half;
                const double cs = get(c.src[2], Index{p, j}), sn = get(c.src[3], Index{p, j});
                const double J[2][2] = {{cs, -sn}, {sn, cs}};  // rows: y1, y2; columns: x1, x2
                const double dy1 = get(dy, Index{bht[0], bht[1], bht[2], j});
                const double dy2 = get(dy, Index{bht[0], bht[1], bht[2], j + half});
                const int col = i < half ? 0 : 1;
                g = J[0][col] * dy1 + J[1][col] * dy2;
            } else {
                g = get(dy, idx);
            }
            put(c.dst, idx, g, acc_bit(c, KV_ACC_DST));
        }
    });
}

void silu_swiglu_backward(const OpCall& c) {
    const TensorView& d = c.dst;
    const bool swiglu = c.op == OpKind::SWIGLU_BACKWARD;
    for_each_index(d.ndim, d.ne, [&](const Index& idx) {
        const double x = get(c.src[0], idx);
        const double sg = sigmoid(x);
        const double silu = x * sg;
        const double dsilu = sg + x * sg * (1.0 - sg);  // product rule on x * sigmoid(x)
        if (!swiglu) {
            put(d, idx, get(c.src[1], idx) * dsilu, acc_bit(c, KV_ACC_DST));
            return;
        }
        const double up = get(c.src[1], idx), g = get(c.src[2], idx);
        if (c.p.act == int(GateAct::GELU_TANH)) {
            // d/dx 0.5 x (1 + tanh(u)) = 0.5 (1 + t) + 0.5 x (1 - t^2) u', u = k (x + 0.044715 x^3)
            const double k = std::sqrt(2.0 / M_PI), t = std::tanh(k * (x + 0.044715 * x * x * x));
            const double gelu = 0.5 * x * (1.0 + t), dgelu = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3 * 0.044715 * x * x);
            put(d, idx, g * up * dgelu, acc_bit(c, KV_ACC_DST));
            put(c.dst2, idx, g * gelu, acc_bit(c, KV_ACC_DST2));
            return;
        }
        put(d, idx, g * up * dsilu, acc_bit(c, KV_ACC_DST));
        put(c.dst2, idx, g * silu, acc_bit(c, KV_ACC_DST2));
    });
}

void embedding_backward(const OpCall& c) {
    const TensorView &dy = c.src[0], &ids = c.src[1], &dt = c.dst;
    const int64_t V = dt.ne[0], C = dt.ne[1];
    std::vector<double> sum((size_t)(V * C), 0.0);
    for (int64_t i = 0; i < ids.numel(); ++i) {
        const Index ix = unflatten(ids, i);
        const int64_t id = int64_t(get(ids, ix));
        Index o = ix;
        o.push_back(0);
        for (int64_t k = 0; k < C; ++k) {
            o.back() = k;
            sum[size_t(id * C + k)] += get(dy, o);
        }
    }
    for (int64_t v = 0; v < V; ++v)
        for (int64_t k = 0; k < C; ++k) put(dt, Index{v, k}, sum[size_t(v * C + k)], acc_bit(c, KV_ACC_DST));
}

// =========================================================================================
// [SECTION] cross-entropy
// =========================================================================================
void cross_entropy(const OpCall& c, bool backward) {
    const TensorView &logits = c.src[0], &targets = c.src[1];
    const bool subset = c.nsrc > 2 && c.src[2].data;
    const bool has_dloss = backward && c.nsrc > 3 && c.src[3].data;
    const int64_t V = logits.ne[logits.ndim - 1];
    const int64_t K = subset ? c.src[2].numel() : V;
    int64_t r = 0;
    for_each_row(logits, [&](Index idx) {
        const Index tix = unflatten(targets, r++);
        const int64_t t = int64_t(get(targets, tix));
        const bool ignored = t == c.p.ignore_index;
        std::vector<int64_t> col((size_t)K);
        std::vector<double> z((size_t)K);
        for (int64_t k = 0; k < K; ++k) {
            col[size_t(k)] = subset ? int64_t(get(c.src[2], unflatten(c.src[2], k))) : k;
            idx.back() = col[size_t(k)];
            z[size_t(k)] = get(logits, idx);
        }
        const double m = *std::max_element(z.begin(), z.end());
        double s = 0;
        for (double v : z) s += std::exp(v - m);
        const double lse = m + std::log(s);
        if (!backward) {
            set(c.dst, tix, ignored ? 0.0 : lse - z[size_t(t)]);
            return;
        }
        const double scale = double(c.p.alpha) * (has_dloss ? get(c.src[3], tix) : 1.0);
        std::vector<double> g((size_t)V, 0.0);
        if (!ignored)
            for (int64_t k = 0; k < K; ++k) g[size_t(col[size_t(k)])] += scale * (std::exp(z[size_t(k)] - lse) - (k == t ? 1.0 : 0.0));
        for (int64_t v = 0; v < V; ++v) {
            idx.back() = v;
            put(c.dst, idx, g[size_t(v)], acc_bit(c, KV_ACC_DST));
        }
    });
}

// =========================================================================================
// [SECTION] attention
// =========================================================================================
// Per (b, h, i): A_i = softmax(s_i) with s_ij = alpha q_i.k_j over visible slots. With
// dA_ij = dy_i.v_j and the softmax Jacobian dA/ds = diag(A) - A A^T:
// dS_ij = A_ij (dA_ij - sum_k A_ik dA_ik); dq_i = alpha sum_j dS_ij k_j;
// dk_j += alpha dS_ij q_i; dv_j += A_ij dy_i (summed over the heads of the group).
void sdpa_backward(const OpCall& c) {
    const TensorView &q = c.src[0], &k = c.src[1], &v = c.src[2], &kpos = c.src[3], &qpos = c.src[4], &dy = c.src[5];
    const int64_t B = q.ne[0], NH = q.ne[1], n = q.ne[2], HS = q.ne[3], G = k.ne[1], T = k.ne[2], R = NH / G;
    const double alpha = c.p.alpha;
    std::vector<double> dk((size_t)(B * G * T * HS), 0.0), dv((size_t)(B * G * T * HS), 0.0), dsink((size_t)NH, 0.0);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < NH; ++h) {
            const int64_t g = h / R;
            for (int64_t i = 0; i < n; ++i) {
                const double qp = get(qpos, Index{b, i});
                std::vector<char> ok((size_t)T);
                std::vector<double> a((size_t)T, 0.0), da((size_t)T, 0.0), dcap((size_t)T, 1.0);
                const double cap = c.p.softcap;
                double mx = -std::numeric_limits<double>::infinity();
                for (int64_t j = 0; j < T; ++j) {
                    const double kp = get(kpos, Index{b, g, j});
                    ok[size_t(j)] = kp <= qp && (c.p.window <= 0 || kp > qp - c.p.window);
                    if (!ok[size_t(j)]) continue;
                    double dot = 0;
                    for (int64_t d = 0; d < HS; ++d) dot += get(q, Index{b, h, i, d}) * get(k, Index{b, g, j, d});
                    a[size_t(j)] = alpha * dot;
                    if (cap > 0) {  // s -> cap tanh(s / cap), d/ds = 1 - tanh^2
                        const double t = std::tanh(a[size_t(j)] / cap);
                        a[size_t(j)] = cap * t;
                        dcap[size_t(j)] = 1 - t * t;
                    }
                    mx = std::max(mx, a[size_t(j)]);
                }
                double sum = 0;
                for (int64_t j = 0; j < T; ++j)
                    if (ok[size_t(j)]) sum += (a[size_t(j)] = std::exp(a[size_t(j)] - mx));
                // Sink (src6): one more softmax term with no value; its probability a_sink.
                const bool sink = has_src(c, 6) && sum > 0;
                double a_sink = 0;
                if (sink) {
                    const double sl = get(c.src[6], Index{h}), m2 = std::max(mx, sl), f = std::exp(mx - m2);
                    for (int64_t j = 0; j < T; ++j)
                        if (ok[size_t(j)]) a[size_t(j)] *= f;
                    sum = sum * f + std::exp(sl - m2);
                    a_sink = std::exp(sl - m2) / sum;
                }
                double adot = 0;
                for (int64_t j = 0; j < T; ++j) {
                    if (!ok[size_t(j)]) continue;
                    a[size_t(j)] /= sum;
                    for (int64_t d = 0; d < HS; ++d) da[size_t(j)] += get(dy, Index{b, h, i, d}) * get(v, Index{b, g, j, d});
                    adot += a[size_t(j)] * da[size_t(j)];
                }
                std::vector<double> dq((size_t)HS, 0.0);
                for (int64_t j = 0; j < T; ++j) {
                    if (!ok[size_t(j)]) continue;
                    const double ds = a[size_t(j)] * (da[size_t(j)] - adot) * dcap[size_t(j)];
                    for (int64_t d = 0; d < HS; ++d) {
                        const size_t at = size_t(((b * G + g) * T + j) * HS + d);
                        dq[size_t(d)] += alpha * ds * get(k, Index{b, g, j, d});
                        dk[at] += alpha * ds * get(q, Index{b, h, i, d});
                        dv[at] += a[size_t(j)] * get(dy, Index{b, h, i, d});
                    }
                }
                for (int64_t d = 0; d < HS; ++d) put(c.dst, Index{b, h, i, d}, dq[size_t(d)], acc_bit(c, KV_ACC_DST));
                dsink[size_t(h)] += a_sink * (0.0 - adot);  // the sink's dS: its dA is 0
            }
        }
    if (c.dst4.data)
        for (int64_t h = 0; h < NH; ++h) put(c.dst4, Index{h}, dsink[size_t(h)], acc_bit(c, KV_ACC_DST4));
    for (int64_t b = 0; b < B; ++b)
        for (int64_t g = 0; g < G; ++g)
            for (int64_t j = 0; j < T; ++j)
                for (int64_t d = 0; d < HS; ++d) {
                    const size_t at = size_t(((b * G + g) * T + j) * HS + d);
                    put(c.dst2, Index{b, g, j, d}, dk[at], acc_bit(c, KV_ACC_DST2));
                    put(c.dst3, Index{b, g, j, d}, dv[at], acc_bit(c, KV_ACC_DST3));
                }
}

// =========================================================================================
// [SECTION] optimizer step, gradient norm
// =========================================================================================
// theta, g and the state slots (s1 = dst2, s2 = dst3) of one element, per PyTorch's docs.
void optimizer_element(const OptimParams& o, double& theta, double g, double& s1, double& s2) {
    const double lr = o.lr, b1 = o.beta1, b2 = o.beta2, eps = o.eps, wd = o.weight_decay, mu = o.momentum;
    const double t = double(o.step);
    g *= double(o.grad_scale);
    switch (OptimKind(o.kind)) {
        case OptimKind::ADAMW: {
            theta = theta - lr * wd * theta;
            s1 = b1 * s1 + (1 - b1) * g;
            s2 = b2 * s2 + (1 - b2) * g * g;
            const double mhat = s1 / (1 - std::pow(b1, t)), vhat = s2 / (1 - std::pow(b2, t));
            theta = theta - lr * mhat / (std::sqrt(vhat) + eps);
            break;
        }
        case OptimKind::ADAM: {
            if (wd != 0) g = g + wd * theta;
            s1 = b1 * s1 + (1 - b1) * g;
            s2 = b2 * s2 + (1 - b2) * g * g;
            const double mhat = s1 / (1 - std::pow(b1, t)), vhat = s2 / (1 - std::pow(b2, t));
            theta = theta - lr * mhat / (std::sqrt(vhat) + eps);
            break;
        }
        case OptimKind::ADAMAX: {
            if (wd != 0) g = g + wd * theta;
            s1 = b1 * s1 + (1 - b1) * g;
            s2 = std::max(b2 * s2, std::fabs(g) + eps);
            theta = theta - lr * s1 / ((1 - std::pow(b1, t)) * s2);
            break;
        }
        case OptimKind::SGD: {
            if (wd != 0) g = g + wd * theta;
            if (mu != 0) {
                s1 = t > 1 ? mu * s1 + (1 - double(o.dampening)) * g : g;
                g = o.nesterov ? g + mu * s1 : s1;
            }
            theta = theta - lr * g;
            break;
        }
        case OptimKind::RMSPROP: {
            if (wd != 0) g = g + wd * theta;
            s1 = double(o.alpha) * s1 + (1 - double(o.alpha)) * g * g;
            if (mu > 0) {
                s2 = mu * s2 + g / (std::sqrt(s1) + eps);
                theta = theta - lr * s2;
            } else {
                theta = theta - lr * g / (std::sqrt(s1) + eps);
            }
            break;
        }
        case OptimKind::ADADELTA: {
            const double rho = o.rho;
            if (wd != 0) g = g + wd * theta;
            s1 = s1 * rho + g * g * (1 - rho);
            const double dx = std::sqrt(s2 + eps) / std::sqrt(s1 + eps) * g;
            s2 = s2 * rho + dx * dx * (1 - rho);
            theta = theta - lr * dx;
            break;
        }
        default: break;
    }
}

void optimizer_step(const OpCall& c) {
    const TensorView& p = c.dst;
    for_each_index(p.ndim, p.ne, [&](const Index& idx) {
        double theta = get(p, idx), s1 = c.dst2.data ? get(c.dst2, idx) : 0.0, s2 = c.dst3.data ? get(c.dst3, idx) : 0.0;
        optimizer_element(c.p.opt, theta, get(c.src[0], idx), s1, s2);
        set(p, idx, theta);
        if (c.dst2.data) set(c.dst2, idx, s1);
        if (c.dst3.data) set(c.dst3, idx, s2);
    });
}

void grad_norm_sq(const OpCall& c) {
    const TensorView& x = c.src[0];
    double s = 0;
    for_each_index(x.ndim, x.ne, [&](const Index& idx) {
        const double v = get(x, idx);
        s += v * v;
    });
    put(c.dst, unflatten(c.dst, 0), s, acc_bit(c, KV_ACC_DST));
}

}  // namespace

bool compute_backward(const OpCall& c) {
    switch (c.op) {
        case OpKind::RMSNORM_BACKWARD: rmsnorm_backward(c); return true;
        case OpKind::ROPE_BACKWARD: rope_backward(c); return true;
        case OpKind::SILU_BACKWARD:
        case OpKind::SWIGLU_BACKWARD: silu_swiglu_backward(c); return true;
        case OpKind::EMBEDDING_BACKWARD: embedding_backward(c); return true;
        case OpKind::CROSS_ENTROPY: cross_entropy(c, false); return true;
        case OpKind::CROSS_ENTROPY_BACKWARD: cross_entropy(c, true); return true;
        case OpKind::SDPA_BACKWARD: sdpa_backward(c); return true;
        case OpKind::AXPY:
            for_each_index(c.dst.ndim, c.dst.ne, [&](const Index& idx) {
                set(c.dst, idx, get(c.dst, idx) + double(c.p.alpha) * get(c.src[0], idx));
            });
            return true;
        case OpKind::OPTIMIZER_STEP: optimizer_step(c); return true;
        case OpKind::GRAD_NORM_SQ: grad_norm_sq(c); return true;
        default: return false;
    }
}

}  // namespace kv::ref::detail
