// Gemma 3n's per-token AltUp maps for f32 activations (altup.cpp's f32 path): channel loops
// innermost in f32, each body compiled for x86-64-v4, v3 and the baseline and chosen at run time
// by the CPU kernel variant in use (KVLAB_CPU_VARIANT=avx2 / base selects the narrower ones).
// engine/ is built for the baseline, where these loops would run 4 lanes wide; the matrices
// stay with the kernels. Tokens in parallel; no allocation per token.
#pragma once

#include <cstdint>

namespace kv::altup_rows {

struct Dims {
    int64_t E = 0, A = 0, W = 0, a = 0;  // stream width, streams, packed row width, active stream
    double eps = 0;                      // the router norm's eps
};

// The prediction from the packed state x (rows, W): m = tanh(rw x_a / (rms(x_a) E)), coefs
// r = pc m (rows, A A; pc is (A A, A) row-major), pred_i = x_i + sum_k r_ik x_k. Writes coefs
// and active = pred_a (rows, E), and every stream's pred (rows, A, E) unless pred is nullptr
// (correct_apply then recomputes them from x and coefs). rw (A, E): the router with the norm
// weight folded in, rounded to f32 and held in double (widened once per layer, not per token).
void predict(const Dims& d, const float* x, const double* rw, const double* pc, int64_t rows, float* pred, float* active,
             double* coefs);

// The correction's coefficients c_i = 1 + sum_j cc_ij m_j(out) (rows, A) and the active
// stream's corrected value times scale (nullptr: no scale) into first (rows, E).
void correct_coefs(const Dims& d, const float* out, const float* active, const double* rw, const double* cc, const float* scale,
                   int64_t rows, float* coef, float* first);

// The block's last residual add and then correct_coefs of each row while it is in cache:
// out += RMSNorm(dv) pw (f32, as ops::rmsnorm and ops::add_ compute it; pw offset already), then
// coef and first from the updated out.
void post_mlp(const Dims& d, const float* dv, const float* pw, float eps, const float* active, const double* rw, const double* cc,
              const float* scale, int64_t rows, float* out, float* coef, float* first);

// next_i = pred_i + c_i (out - pred_a) (+ av for streams 1..), that update in double, and the
// per-layer tail x[A E, W) copied through: the next packed state (rows, W) in one pass. av is
// RMSNorm(proj) with weight nw and eps, in f32 as ops::rmsnorm computes it, made per token here
// (proj (rows, E) is the per-layer projection before its norm). pred may be nullptr (see predict).
// follow, when given, makes the next layer's prediction from each row of next as soon as it is
// written (predict with pred nullptr, the same bits): rw and pc are that layer's, active and
// coefs receive its prediction.
struct Follow {
    const double* rw = nullptr;
    const double* pc = nullptr;
    float* active = nullptr;
    double* coefs = nullptr;
};
void correct_apply(const Dims& d, const float* x, const float* out, const float* pred, const double* coefs, const float* active,
                   const float* coef, const float* proj, const float* nw, float eps, int64_t rows, float* next,
                   const Follow* follow = nullptr);

// M(y, ref) of altup.h per row: out_t (+)= y_t rms(ref_t) / max(rms(y_t), sqrt(1e-5)) (plain
// RMS, no eps), in double per element; y (rows, E), ref and out at their row strides.
void rescale(const float* y, const float* ref, int64_t ref_stride, int64_t rows, int64_t E, float* out, int64_t out_stride,
             bool accumulate);

// The attention's residual with LAUREL beside it, per row of E:
// out = ((x + RMSNorm(o) pw) + (h + RMSNorm(r) lw)) s, in f32 in the order the separate ops
// (rmsnorm, add, add, scale) take; x, o, h, r and out (rows, E).
void laurel_residual(int64_t E, int64_t rows, const float* x, const float* o, const float* pw, const float* h, const float* r,
                     const float* lw, float eps, float s, float* out);

// Gaussian top-k of rows of I f32 values (row r at base + r / n * s0 + r % n * s1), in place:
// v -> max(0, v - (mean + std mult)), the mean and std summed in double.
void topk(float* base, int64_t rows, int64_t n, int64_t s0, int64_t s1, int64_t I, double mult);

}  // namespace kv::altup_rows
