// Gemma 3n's per-token AltUp maps for f32 activations, per ISA level (see altup_rows.h).
#include "engine/backend/host_parallel.h"
#include "engine/model/altup_rows.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "engine/model/host_simd.h"
#include "kernels/common/element_math.h"

namespace kv::altup_rows {

namespace {

// m_j = tanh(rw_j . x / (rms(x) E)) for one token's stream x (E); rw holds f32 values in double.
// The sums in double lanes: f32 sums moved token-by-token logits of the fixture past its bound.
// One pass for the norm and every router row: x is loaded and widened once, and the A + 1
// independent sums hide the adds' latency.
KV_HOST_SIMD_INLINE void modalities(const Dims& d, const float* x, const double* rw, double* m) {
    const int64_t E = d.E;
    double ss = 0, s[16];  // altup_num_inputs <= 16 (ModelConfig::validate)
    if (d.A == 4) {
        const double *w0 = rw, *w1 = rw + E, *w2 = rw + 2 * E, *w3 = rw + 3 * E;
        double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma omp simd reduction(+ : ss, s0, s1, s2, s3)
        for (int64_t e = 0; e < E; ++e) {
            const double v = double(x[e]);
            ss += v * v;
            s0 += w0[e] * v;
            s1 += w1[e] * v;
            s2 += w2[e] * v;
            s3 += w3[e] * v;
        }
        s[0] = s0, s[1] = s1, s[2] = s2, s[3] = s3;
    } else {
#pragma omp simd reduction(+ : ss)
        for (int64_t e = 0; e < E; ++e) ss += double(x[e]) * double(x[e]);
        for (int64_t j = 0; j < d.A; ++j) {
            const double* w = rw + j * E;
            double sj = 0;
#pragma omp simd reduction(+ : sj)
            for (int64_t e = 0; e < E; ++e) sj += w[e] * double(x[e]);
            s[j] = sj;
        }
    }
    const double r = 1.0 / std::sqrt(ss / double(E) + d.eps) / double(E);
    for (int64_t j = 0; j < d.A; ++j) m[j] = double(kv_tanh(float(s[j] * r)));  // f32 tanh in plain arithmetic (a few ulp), no libm call
}

// p = pred_i = x_i + sum_k r_ik x_k of one token's streams xs (A, E); ri = r[i A ..].
KV_HOST_SIMD_INLINE void mix_stream(const float* xs, const double* ri, int64_t A, int64_t E, int64_t i, float* p) {
    const float* xi = xs + i * E;
    if (A == 4) {  // Gemma 3n's four streams: one pass, every stream read once
        const float *x0 = xs, *x1 = xs + E, *x2 = xs + 2 * E, *x3 = xs + 3 * E;
#pragma omp simd
        for (int64_t c = 0; c < E; ++c)
            p[c] = float(double(xi[c]) +
                         (ri[0] * double(x0[c]) + ri[1] * double(x1[c]) + ri[2] * double(x2[c]) + ri[3] * double(x3[c])));
        return;
    }
#pragma omp simd
    for (int64_t c = 0; c < E; ++c) {
        double s = 0;
        for (int64_t k = 0; k < A; ++k) s += ri[k] * double(xs[k * E + c]);
        p[c] = float(double(xi[c]) + s);
    }
}

// mix_stream from the streams already in double (xd, A E): the same sums, the same bits.
KV_HOST_SIMD_INLINE void mix_stream_d(const double* xd, const double* ri, int64_t A, int64_t E, int64_t i, float* p) {
    const double* xi = xd + i * E;
    if (A == 4) {
        const double *x0 = xd, *x1 = xd + E, *x2 = xd + 2 * E, *x3 = xd + 3 * E;
#pragma omp simd
        for (int64_t c = 0; c < E; ++c) p[c] = float(xi[c] + (ri[0] * x0[c] + ri[1] * x1[c] + ri[2] * x2[c] + ri[3] * x3[c]));
        return;
    }
#pragma omp simd
    for (int64_t c = 0; c < E; ++c) {
        double s = 0;
        for (int64_t k = 0; k < A; ++k) s += ri[k] * xd[k * E + c];
        p[c] = float(xi[c] + s);
    }
}

KV_HOST_SIMD_INLINE void predict_body(const Dims& d, const float* xv, const double* rw, const double* pc, int64_t t0, int64_t t1,
                                      float* pred, float* active, double* coefs) {
    const int64_t E = d.E, A = d.A;
    for (int64_t t = t0; t < t1; ++t) {
        double m[16];  // altup_num_inputs <= 16 (ModelConfig::validate)
        double* r = coefs + t * A * A;
        const float* xs = xv + t * d.W;
        modalities(d, xs + d.a * E, rw, m);
        for (int64_t o = 0; o < A * A; ++o) {  // r = W_pred m, row o = i A + k
            double s = 0;
            for (int64_t j = 0; j < A; ++j) s += pc[o * A + j] * m[j];
            r[o] = s;
        }
        if (pred) {
            float* pr = pred + t * A * E;
            for (int64_t i = 0; i < A; ++i) mix_stream(xs, r + i * A, A, E, i, pr + i * E);
            std::memcpy(active + t * E, pr + d.a * E, size_t(E) * sizeof(float));
        } else {
            mix_stream(xs, r + d.a * A, A, E, d.a, active + t * E);
        }
    }
}

KV_HOST_SIMD_INLINE void coefs_body(const Dims& d, const float* ov, const float* active, const double* rw, const double* cc,
                                    const float* scale, int64_t t0, int64_t t1, float* coef, float* first) {
    const int64_t E = d.E, A = d.A;
    for (int64_t t = t0; t < t1; ++t) {
        double m[16];
        const float* o = ov + t * E;
        const float* pa = active + t * E;
        modalities(d, o, rw, m);
        for (int64_t i = 0; i < A; ++i) {
            double ci = 1.0;
            for (int64_t j = 0; j < A; ++j) ci += cc[i * A + j] * m[j];
            coef[t * A + i] = float(ci);
        }
        const float ca = coef[t * A + d.a];
        float* f = first + t * E;
        if (scale) {
#pragma omp simd
            for (int64_t c = 0; c < E; ++c) f[c] = (pa[c] + ca * (o[c] - pa[c])) * scale[c];
        } else {
#pragma omp simd
            for (int64_t c = 0; c < E; ++c) f[c] = pa[c] + ca * (o[c] - pa[c]);
        }
    }
}

// The per-layer term of one token: RMSNorm(proj) with weight nw in f32, as ops::rmsnorm computes it.
KV_HOST_SIMD_INLINE void per_layer_term(const float* pj, const float* nw, int64_t E, float eps, float* at) {
    float ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t c = 0; c < E; ++c) ss += pj[c] * pj[c];
    const float inv = kv_rms_inv(ss, E, eps);
#pragma omp simd
    for (int64_t c = 0; c < E; ++c) at[c] = pj[c] * inv * nw[c];
}

KV_HOST_SIMD_INLINE void apply_body(const Dims& d, const float* xv, const float* ov, const float* pred, const double* coefs,
                                    const float* active, const float* coef, const float* proj, const float* nw, float eps,
                                    int64_t t0, int64_t t1, float* next, float* scratch, double* dscratch, const Follow* f) {
    const int64_t E = d.E, A = d.A, W = d.W;
    float* at = scratch + E;  // the token's per-layer term
    for (int64_t t = t0; t < t1; ++t) {
        const float* o = ov + t * E;
        const float* pa = active + t * E;
        const float* xs = xv + t * W;
        float* nx = next + t * W;
        per_layer_term(proj + t * E, nw, E, eps, at);
        if (!pred && A == 4) {
            // Gemma 3n's four streams: each channel's four predictions (as predict_body made them,
            // from x and the coefficients) and updates at once, every stream read once.
            const double* r = coefs + t * 16;
            const double c0 = double(coef[t * 4]), c1 = double(coef[t * 4 + 1]), c2 = double(coef[t * 4 + 2]),
                         c3 = double(coef[t * 4 + 3]);
            const float *x0 = xs, *x1 = xs + E, *x2 = xs + 2 * E, *x3 = xs + 3 * E;
            float *n0 = nx, *n1 = nx + E, *n2 = nx + 2 * E, *n3 = nx + 3 * E;
#pragma omp simd
            for (int64_t c = 0; c < E; ++c) {
                const double v0 = double(x0[c]), v1 = double(x1[c]), v2 = double(x2[c]), v3 = double(x3[c]);
                const double dc = double(o[c]) - double(pa[c]);
                const float p0 = float(v0 + (r[0] * v0 + r[1] * v1 + r[2] * v2 + r[3] * v3));
                const float p1 = float(v1 + (r[4] * v0 + r[5] * v1 + r[6] * v2 + r[7] * v3));
                const float p2 = float(v2 + (r[8] * v0 + r[9] * v1 + r[10] * v2 + r[11] * v3));
                const float p3 = float(v3 + (r[12] * v0 + r[13] * v1 + r[14] * v2 + r[15] * v3));
                n0[c] = float(double(p0) + c0 * dc);
                n1[c] = float(double(p1) + c1 * dc) + at[c];
                n2[c] = float(double(p2) + c2 * dc) + at[c];
                n3[c] = float(double(p3) + c3 * dc) + at[c];
            }
            std::memcpy(nx + A * E, xs + A * E, size_t(W - A * E) * sizeof(float));  // the per-layer inputs pass through
            if (f) predict_body(d, next, f->rw, f->pc, t, t + 1, nullptr, f->active, f->coefs);  // the row is still in L1
            continue;
        }
        double* diff = dscratch;  // out - pred_a in double, once for every stream
#pragma omp simd
        for (int64_t c = 0; c < E; ++c) diff[c] = double(o[c]) - double(pa[c]);
        double* xd = dscratch + E;  // the token's streams in double, converted once for the A mixes below
        if (!pred) {
#pragma omp simd
            for (int64_t c = 0; c < A * E; ++c) xd[c] = double(xs[c]);
        }
        for (int64_t i = 0; i < A; ++i) {
            const double ci = double(coef[t * A + i]);
            const float* pi = scratch;
            if (pred)
                pi = pred + (t * A + i) * E;
            else
                mix_stream_d(xd, coefs + t * A * A + i * A, A, E, i, scratch);  // the prediction again, as predict_body made it
            float* ni = nx + i * E;
            if (i == 0) {
#pragma omp simd
                for (int64_t c = 0; c < E; ++c) ni[c] = float(double(pi[c]) + ci * diff[c]);
            } else {
#pragma omp simd
                for (int64_t c = 0; c < E; ++c) ni[c] = float(double(pi[c]) + ci * diff[c]) + at[c];
            }
        }
        std::memcpy(nx + A * E, xs + A * E, size_t(W - A * E) * sizeof(float));  // the per-layer inputs pass through
        if (f) predict_body(d, next, f->rw, f->pc, t, t + 1, nullptr, f->active, f->coefs);
    }
}

KV_HOST_SIMD_INLINE double sum_sq(const float* x, int64_t n) {
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; ++i) s += double(x[i]) * double(x[i]);
    return s;
}

KV_HOST_SIMD_INLINE void rescale_body(const float* y, const float* ref, int64_t ref_stride, int64_t t0, int64_t t1, int64_t E,
                                      float* out, int64_t out_stride, bool accumulate) {
    for (int64_t t = t0; t < t1; ++t) {
        const float* yt = y + t * E;
        float* ot = out + t * out_stride;
        const double f =
            std::sqrt(sum_sq(ref + t * ref_stride, E) / double(E)) / std::sqrt(std::max(sum_sq(yt, E) / double(E), 1e-5));
        if (accumulate) {
#pragma omp simd
            for (int64_t c = 0; c < E; ++c) ot[c] = float(double(ot[c]) + double(yt[c]) * f);
        } else {
#pragma omp simd
            for (int64_t c = 0; c < E; ++c) ot[c] = float(double(yt[c]) * f);
        }
    }
}

KV_HOST_SIMD_INLINE void post_mlp_body(const Dims& d, const float* dv, const float* pw, float eps, const float* active,
                                       const double* rw, const double* cc, const float* scale, int64_t t0, int64_t t1, float* out,
                                       float* coef, float* first) {
    const int64_t E = d.E;
    for (int64_t t = t0; t < t1; ++t) {
        const float* dt = dv + t * E;
        float* ot = out + t * E;
        float ss = 0;
#pragma omp simd reduction(+ : ss)
        for (int64_t c = 0; c < E; ++c) ss += dt[c] * dt[c];
        const float inv = kv_rms_inv(ss, E, eps);
#pragma omp simd
        for (int64_t c = 0; c < E; ++c) ot[c] = ot[c] + dt[c] * inv * pw[c];
        coefs_body(d, out, active, rw, cc, scale, t, t + 1, coef, first);  // the row just written, from L1
    }
}

KV_HOST_SIMD_INLINE void laurel_body(int64_t E, int64_t t0, int64_t t1, const float* x, const float* o, const float* pw,
                                     const float* h, const float* r, const float* lw, float eps, float s, float* out) {
    for (int64_t t = t0; t < t1; ++t) {
        const float *xt = x + t * E, *ot = o + t * E, *ht = h + t * E, *rt = r + t * E;
        float so = 0, sr = 0;
#pragma omp simd reduction(+ : so, sr)
        for (int64_t c = 0; c < E; ++c) so += ot[c] * ot[c], sr += rt[c] * rt[c];
        const float io = kv_rms_inv(so, E, eps), ir = kv_rms_inv(sr, E, eps);
        float* y = out + t * E;
#pragma omp simd
        for (int64_t c = 0; c < E; ++c) y[c] = ((xt[c] + ot[c] * io * pw[c]) + (ht[c] + rt[c] * ir * lw[c])) * s;
    }
}

KV_HOST_SIMD_INLINE void topk_body(float* base, int64_t r0, int64_t r1, int64_t n, int64_t s0, int64_t s1, int64_t I,
                                   double mult) {
    for (int64_t r = r0; r < r1; ++r) {
        float* v = base + (r / n) * s0 + (r % n) * s1;
        // One pass for both sums: f32 values squared in double are exact, so E[v^2] - mean^2 loses
        // only what the row's own mean-to-spread ratio costs (gate rows: mean ~ spread).
        double s = 0, q = 0;
#pragma omp simd reduction(+ : s, q)
        for (int64_t i = 0; i < I; ++i) s += double(v[i]), q += double(v[i]) * double(v[i]);
        const double mean = s / double(I);
        const float cut = float(mean + std::sqrt(std::max(q / double(I) - mean * mean, 0.0)) * mult);
#pragma omp simd
        for (int64_t i = 0; i < I; ++i) v[i] = std::max(0.0f, v[i] - cut);
    }
}

KV_HOST_SIMD_VARIANTS(predict,
                      (const Dims& d, const float* x, const double* rw, const double* pc, int64_t t0, int64_t t1, float* pred,
                       float* active, double* coefs),
                      (d, x, rw, pc, t0, t1, pred, active, coefs))
KV_HOST_SIMD_VARIANTS(coefs,
                      (const Dims& d, const float* o, const float* active, const double* rw, const double* cc,
                       const float* scale, int64_t t0, int64_t t1, float* coef, float* first),
                      (d, o, active, rw, cc, scale, t0, t1, coef, first))
KV_HOST_SIMD_VARIANTS(apply,
                      (const Dims& d, const float* x, const float* o, const float* pred, const double* coefs,
                       const float* active, const float* coef, const float* proj, const float* nw, float eps, int64_t t0,
                       int64_t t1, float* next, float* scratch, double* dscratch, const Follow* f),
                      (d, x, o, pred, coefs, active, coef, proj, nw, eps, t0, t1, next, scratch, dscratch, f))
KV_HOST_SIMD_VARIANTS(rescale,
                      (const float* y, const float* ref, int64_t ref_stride, int64_t t0, int64_t t1, int64_t E, float* out,
                       int64_t out_stride, bool accumulate),
                      (y, ref, ref_stride, t0, t1, E, out, out_stride, accumulate))
KV_HOST_SIMD_VARIANTS(post_mlp,
                      (const Dims& d, const float* dv, const float* pw, float eps, const float* active, const double* rw,
                       const double* cc, const float* scale, int64_t t0, int64_t t1, float* out, float* coef, float* first),
                      (d, dv, pw, eps, active, rw, cc, scale, t0, t1, out, coef, first))
KV_HOST_SIMD_VARIANTS(laurel,
                      (int64_t E, int64_t t0, int64_t t1, const float* x, const float* o, const float* pw, const float* h,
                       const float* r, const float* lw, float eps, float s, float* out),
                      (E, t0, t1, x, o, pw, h, r, lw, eps, s, out))
KV_HOST_SIMD_VARIANTS(topk, (float* base, int64_t r0, int64_t r1, int64_t n, int64_t s0, int64_t s1, int64_t I, double mult),
                      (base, r0, r1, n, s0, s1, I, mult))

// fn(t0, t1) over the rows split evenly across the threads: one pass of the unit pool per call.
template <class F>
void split_rows(int64_t rows, F&& fn) {
    host_parallel_rows(rows, fn);
}

}  // namespace

void predict(const Dims& d, const float* x, const double* rw, const double* pc, int64_t rows, float* pred, float* active,
             double* coefs) {
    split_rows(rows, [&](int64_t t0, int64_t t1) { predict_any(d, x, rw, pc, t0, t1, pred, active, coefs); });
}

void correct_coefs(const Dims& d, const float* out, const float* active, const double* rw, const double* cc, const float* scale,
                   int64_t rows, float* coef, float* first) {
    split_rows(rows, [&](int64_t t0, int64_t t1) { coefs_any(d, out, active, rw, cc, scale, t0, t1, coef, first); });
}

void correct_apply(const Dims& d, const float* x, const float* out, const float* pred, const double* coefs, const float* active,
                   const float* coef, const float* proj, const float* nw, float eps, int64_t rows, float* next, const Follow* follow) {
    split_rows(rows, [&](int64_t t0, int64_t t1) {
        std::vector<float> scratch(size_t(2 * d.E));
        std::vector<double> dscratch(size_t((1 + d.A) * d.E));
        apply_any(d, x, out, pred, coefs, active, coef, proj, nw, eps, t0, t1, next, scratch.data(), dscratch.data(), follow);
    });
}

void rescale(const float* y, const float* ref, int64_t ref_stride, int64_t rows, int64_t E, float* out, int64_t out_stride,
             bool accumulate) {
    split_rows(rows, [&](int64_t t0, int64_t t1) { rescale_any(y, ref, ref_stride, t0, t1, E, out, out_stride, accumulate); });
}

void post_mlp(const Dims& d, const float* dv, const float* pw, float eps, const float* active, const double* rw, const double* cc,
              const float* scale, int64_t rows, float* out, float* coef, float* first) {
    split_rows(rows, [&](int64_t t0, int64_t t1) { post_mlp_any(d, dv, pw, eps, active, rw, cc, scale, t0, t1, out, coef, first); });
}

void laurel_residual(int64_t E, int64_t rows, const float* x, const float* o, const float* pw, const float* h, const float* r,
                     const float* lw, float eps, float s, float* out) {
    split_rows(rows, [&](int64_t t0, int64_t t1) { laurel_any(E, t0, t1, x, o, pw, h, r, lw, eps, s, out); });
}

void topk(float* base, int64_t rows, int64_t n, int64_t s0, int64_t s1, int64_t I, double mult) {
    split_rows(rows, [&](int64_t r0, int64_t r1) { topk_any(base, r0, r1, n, s0, s1, I, mult); });
}

}  // namespace kv::altup_rows
