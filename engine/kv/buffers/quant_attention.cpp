// SDPA over quantized rows (see quant_attention.h). A unit is one (batch row, KV head) pair
// and a range of its slots, for all R heads of the group and all n queries. Keys come a tile
// of 32 at a time: each row decoded once into the thread's scratch tile (fp8 by bit
// arithmetic, fp4 codes by a byte -> two values table times the block scale, TurboQuant codes
// through their codebook), dotted with every query row; then the tile's softmax update per
// row (max, sum, weighted V) and its values, decoded likewise, into every row's accumulator.
// The ranges of a pair merge at the end, in range order, so the result does not depend on the
// thread count. Per-row scales (fp8's s, TurboQuant's key
// norm) multiply the dot product once instead of each element.
//
// TurboQuant rows are stored rotated (y = R x, R = H S / sqrt(n) orthogonal): a key's dot
// product is q.x = (R q).y, so the query is rotated once per unit and keys are never rotated
// back; values accumulate sum_t p_t y_t in the rotated frame and the output is rotated back
// once (x = R^T y) per query row.
//
// Weight sums take a second pass over the keys with the final max and sum of each row.
#include "engine/kv/buffers/quant_attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "engine/backend/backend_registry.h"
#include "engine/core/error.h"
#include "kernels/common/element_math.h"

namespace kv {

bool quant_attention_format(QuantFormat f) {
    switch (f) {
        case QuantFormat::FP8_E4M3:
        case QuantFormat::FP8_E5M2:
        case QuantFormat::NVFP4:
        case QuantFormat::MXFP4: return true;
        default: return tq_bits(f) != 0;
    }
}

namespace {

// The unit body is compiled for AVX-512, AVX2 and the build's baseline (the engine's own
// -march is the baseline) and picked at run time; its helpers are inlined into each.
// AddressSanitizer refuses always_inline across target attributes: plain inline there.
#if defined(__SANITIZE_ADDRESS__)
#define KV_QA_INLINE inline
#else
#define KV_QA_INLINE __attribute__((always_inline)) inline
#endif

constexpr int64_t kTileKeys = 32;  // keys decoded together: scores, softmax and values by tile
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int64_t kUnitKeys = 512;       // keys per unit of a decode call
constexpr int64_t kParallelKeys = 16384;  // pair-keys below which one thread runs (a thread costs tens of us)

KV_QA_INLINE float f32_of(uint32_t b) {
    float f;
    std::memcpy(&f, &b, 4);
    return f;
}

// Finite FP8 codes by bit arithmetic (the compiler vectorises it, a table lookup it would not):
// a normal code's exponent and mantissa fields move into an f32's and the exponent is
// rebiased; a subnormal code is its mantissa times the smallest step. The specials (E4M3's
// NaN, E5M2's inf/NaN) only come from non-finite inputs and decode as large finite values.
KV_QA_INLINE float e4m3_value(uint8_t c) {
    const uint32_t mag = c & 0x7fu;
    const float normal = f32_of((mag << 20) + (120u << 23));  // bias 127 - 7
    const float sub = float(int(mag)) * 0x1p-9f;               // m 2^(1 - 7 - 3)
    const float v = (mag >> 3) ? normal : sub;
    return (c & 0x80u) ? -v : v;
}
KV_QA_INLINE float e5m2_value(uint8_t c) {
    const uint32_t mag = c & 0x7fu;
    const float normal = f32_of((mag << 21) + (112u << 23));  // bias 127 - 15
    const float sub = float(int(mag)) * 0x1p-16f;              // m 2^(1 - 15 - 2)
    const float v = (mag >> 2) ? normal : sub;
    return (c & 0x80u) ? -v : v;
}

// Decodes one stored row of a format into D floats (rotated frame for TurboQuant) and returns
// the factor the row's dot products take.
struct RowDecoder {
    QuantFormat f = QuantFormat::FP8_E4M3;
    int64_t D = 0;
    int bits = 0;
    float lv[16] = {};       // TQK: codebook levels
    float pair[256][2] = {};  // a byte's two 4-bit codes (low nibble first) as values

    RowDecoder(QuantFormat fmt, int64_t d, const QuantLevels& levels) : f(fmt), D(d), bits(tq_bits(fmt)) {
        for (int i = 0; i < 16; ++i) lv[i] = levels.v[i];
        for (int b = 0; b < 256; ++b)
            for (int h = 0; h < 2; ++h) {
                const uint8_t c = uint8_t((b >> (4 * h)) & 15);
                pair[b][h] = f == QuantFormat::NVFP4 || f == QuantFormat::MXFP4 ? e2m1_to_f32(c) : tq_codebook(f) ? lv[c] : float(c);
            }
    }

    KV_QA_INLINE float decode(const uint8_t* r, float* out) const {
        switch (f) {
            case QuantFormat::FP8_E4M3:
                for (int64_t i = 0; i < D; ++i) out[i] = e4m3_value(r[i]);
                return get_f32(r + D);
            case QuantFormat::FP8_E5M2:
                for (int64_t i = 0; i < D; ++i) out[i] = e5m2_value(r[i]);
                return get_f32(r + D);
            case QuantFormat::NVFP4: {
                const float sg = get_f32(r + D / 2 + D / 16);
                for (int64_t b = 0; b < D / 16; ++b) {
                    const float d = e4m3_to_f32(r[D / 2 + b]) * sg;
                    for (int64_t j = 0; j < 8; ++j) {
                        const float* p = pair[r[b * 8 + j]];
                        out[b * 16 + 2 * j] = p[0] * d;
                        out[b * 16 + 2 * j + 1] = p[1] * d;
                    }
                }
                return 1.0f;
            }
            case QuantFormat::MXFP4:
                for (int64_t b = 0; b < D / 32; ++b) {
                    const uint8_t* blk = r + b * 17;
                    const float X = e8m0_to_f32(blk[0]);
                    for (int64_t j = 0; j < 16; ++j) {
                        const float* p = pair[blk[1 + j]];
                        out[b * 32 + j] = p[0] * X;
                        out[b * 32 + j + 16] = p[1] * X;
                    }
                }
                return 1.0f;
            default: break;
        }
        const int64_t payload = (D * bits + 7) / 8;
        if (tq_codebook(f)) {  // levels[code] * g
            if (bits == 4) {
                for (int64_t i = 0; i < D / 2; ++i) std::memcpy(out + 2 * i, pair[r[i]], 8);
            } else {
                for (int64_t i = 0; i < D; ++i) out[i] = lv[tq_get_code(r, i, bits)];
            }
            return get_f32(r + payload);
        }
        const float lo = get_f32(r + payload), s = get_f32(r + payload + 4);  // lo + code * s
        if (bits == 4) {
            for (int64_t i = 0; i < D / 2; ++i) std::memcpy(out + 2 * i, pair[r[i]], 8);
            for (int64_t i = 0; i < D; ++i) out[i] = lo + out[i] * s;
        } else {
            for (int64_t i = 0; i < D; ++i) out[i] = lo + float(tq_get_code(r, i, bits)) * s;
        }
        return 1.0f;
    }
};

typedef float qa_f32x4 __attribute__((vector_size(16)));
typedef float qa_f32x8 __attribute__((vector_size(32)));
typedef float qa_f32x16 __attribute__((vector_size(64)));

// Horizontal sums by halving (a tree: the ordered lane-by-lane sum of an omp simd reduction is
// a chain of dependent adds per dot product).
KV_QA_INLINE float hsum(const qa_f32x4& v) { return (v[0] + v[2]) + (v[1] + v[3]); }
KV_QA_INLINE float hsum(const qa_f32x8& v) {
    const qa_f32x4 lo = __builtin_shufflevector(v, v, 0, 1, 2, 3), hi = __builtin_shufflevector(v, v, 4, 5, 6, 7);
    return hsum(qa_f32x4(lo + hi));
}
KV_QA_INLINE float hsum(const qa_f32x16& v) {
    const qa_f32x8 lo = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7), hi = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
    return hsum(qa_f32x8(lo + hi));
}

// a . b in vectors of V (the caller's register width), two accumulators.
template <class V>
KV_QA_INLINE float dot(const float* a, const float* b, int64_t n) {
    constexpr int64_t W = int64_t(sizeof(V) / sizeof(float));
    V s0 = {}, s1 = {};
    int64_t i = 0;
    for (; i + 2 * W <= n; i += 2 * W) {
        V x0, y0, x1, y1;
        std::memcpy(&x0, a + i, sizeof(V));
        std::memcpy(&y0, b + i, sizeof(V));
        std::memcpy(&x1, a + i + W, sizeof(V));
        std::memcpy(&y1, b + i + W, sizeof(V));
        s0 += x0 * y0;
        s1 += x1 * y1;
    }
    float r = hsum(V(s0 + s1));
    for (; i < n; ++i) r += a[i] * b[i];
    return r;
}

// x = S H y / sqrt(n): the inverse of the TurboQuant rotation (H symmetric, H H = n I).
void unrotate(float* y, int64_t n) {
    tq_hadamard(y, n);
    for (int64_t i = 0; i < n; ++i) y[i] *= tq_sign(i);
}

// Everything a unit reads.
struct Call {
    const QuantRowsView* kv;
    const RowDecoder *kdec, *vdec;
    const float* qv;
    const int32_t *kpv, *qpv;
    int64_t kpB, kpG, qpB, NH, n, D, G, R, rows, T, ranges, ntile, per_unit, per_thread;
    float scale;
    int window;
    bool rot_k;
    float* mem;    // per unit: max, sum, accumulator per row
    float* local;  // per thread: queries, a tile of keys and values, scores
};

KV_QA_INLINE bool visible(int64_t kp, int64_t qp, int window) { return kp <= qp && (window <= 0 || kp > qp - window); }

KV_QA_INLINE void prepare_queries(const Call& c, int64_t b, int64_t g, float* qs) {
    const int64_t D = c.D;
    for (int64_t r = 0; r < c.R; ++r)
        for (int64_t i = 0; i < c.n; ++i) {
            float* o = qs + (r * c.n + i) * D;
            const float* src = c.qv + ((b * c.NH + g * c.R + r) * c.n + i) * D;
            for (int64_t d = 0; d < D; ++d) o[d] = src[d] * c.scale;
            if (c.rot_k) {  // R q: the rotation the keys were stored with
                for (int64_t d = 0; d < D; ++d) o[d] *= tq_sign(d);
                tq_hadamard(o, D);
            }
        }
}

KV_QA_INLINE void key_range(const Call& c, int64_t rr, int64_t* t0, int64_t* t1) {
    *t0 = std::min(c.T, (c.ntile * rr / c.ranges) * kUnitKeys);
    *t1 = std::min(c.T, (c.ntile * (rr + 1) / c.ranges) * kUnitKeys);
}

// Scores of a tile of nk keys (decoded into Kt) for every row: S[row * kTileKeys + t], -inf
// where the key is masked. Returns whether any score is visible.
template <class V>
KV_QA_INLINE bool tile_scores(const Call& c, int64_t b, int64_t g, int64_t t0, int64_t nk, const float* qs, float* Kt, float* kfac,
                              float* S) {
    const QuantRowsView& kv = *c.kv;
    const int64_t D = c.D;
    int32_t kp[kTileKeys];
    bool any = false;
    for (int64_t t = 0; t < nk; ++t) {
        kp[t] = c.kpv[b * c.kpB + g * c.kpG + t0 + t];
        for (int64_t i = 0; i < c.n; ++i) any = any || visible(kp[t], c.qpv[b * c.qpB + i], c.window);
    }
    if (!any) return false;
    const uint8_t* krow = kv.k + ((b * c.G + g) * kv.L + t0) * kv.rbk;
    for (int64_t t = 0; t < nk; ++t) kfac[t] = c.kdec->decode(krow + t * kv.rbk, Kt + t * D);
    for (int64_t row = 0; row < c.rows; ++row) {
        const int64_t qp = c.qpv[b * c.qpB + row % c.n];
        const float* q = qs + row * D;
        float* sr = S + row * kTileKeys;
        for (int64_t t = 0; t < nk; ++t) sr[t] = visible(kp[t], qp, c.window) ? kfac[t] * dot<V>(q, Kt + t * D, D) : kNegInf;
    }
    return true;
}

template <class V>
KV_QA_INLINE void unit_body(const Call& c, int64_t u, int thread) {
    const QuantRowsView& kv = *c.kv;
    const int64_t pair = u / c.ranges, rr = u % c.ranges, b = pair / c.G, g = pair % c.G, D = c.D, rows = c.rows;
    float* m = c.mem + u * c.per_unit;
    float* l = m + rows;
    float* acc = l + rows;
    float* qs = c.local + int64_t(thread) * c.per_thread;
    float* Kt = qs + rows * D;
    float* Vt = Kt + kTileKeys * D;
    float* S = Vt + kTileKeys * D;
    float* kfac = S + rows * kTileKeys;
    float* vfac = kfac + kTileKeys;
    std::fill(m, m + rows, kNegInf);
    std::fill(l, l + rows, 0.0f);
    std::fill(acc, acc + rows * D, 0.0f);
    prepare_queries(c, b, g, qs);
    int64_t ta, tb;
    key_range(c, rr, &ta, &tb);
    for (int64_t t0 = ta; t0 < tb; t0 += kTileKeys) {
        const int64_t nk = std::min(kTileKeys, tb - t0);
        if (!tile_scores<V>(c, b, g, t0, nk, qs, Kt, kfac, S)) continue;
        for (int64_t row = 0; row < rows; ++row) {
            float* sr = S + row * kTileKeys;
            float mt = kNegInf;
            for (int64_t t = 0; t < nk; ++t) mt = std::max(mt, sr[t]);
            if (mt == kNegInf) {
                for (int64_t t = 0; t < nk; ++t) sr[t] = 0.0f;
                continue;
            }
            if (mt > m[row]) {  // a new maximum rescales what was accumulated
                const float corr = m[row] == kNegInf ? 0.0f : kv_expf_poly(m[row] - mt);
                l[row] *= corr;
                float* a = acc + row * D;
                for (int64_t d = 0; d < D; ++d) a[d] *= corr;
                m[row] = mt;
            }
            const float mx = m[row];
            float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
            for (int64_t t = 0; t < nk; ++t) {
                sr[t] = kv_expf_poly(sr[t] - mx);  // exp(-inf) = 0
                sum += sr[t];
            }
            l[row] += sum;
        }
        const uint8_t* vrow = kv.v + ((b * c.G + g) * kv.L + t0) * kv.rbv;
        for (int64_t t = 0; t < nk; ++t) vfac[t] = c.vdec->decode(vrow + t * kv.rbv, Vt + t * D);
        // Each row's accumulator stays in registers over the tile, a vector of channels at a time.
        constexpr int64_t W = int64_t(sizeof(V) / sizeof(float));
        for (int64_t row = 0; row < rows; ++row) {
            float* sr = S + row * kTileKeys;
            for (int64_t t = 0; t < nk; ++t) sr[t] *= vfac[t];
            float* a = acc + row * D;
            int64_t d0 = 0;
            for (; d0 + W <= D; d0 += W) {
                V av;
                std::memcpy(&av, a + d0, sizeof(V));
                for (int64_t t = 0; t < nk; ++t) {
                    V vv;
                    std::memcpy(&vv, Vt + t * D + d0, sizeof(V));
                    av += sr[t] * vv;
                }
                std::memcpy(a + d0, &av, sizeof(V));
            }
            for (; d0 < D; ++d0)
                for (int64_t t = 0; t < nk; ++t) a[d0] += sr[t] * Vt[t * D + d0];
        }
    }
}

// Weight sums of a unit's keys with each row's final max and 1 / sum (fin: 2 per row).
template <class V>
KV_QA_INLINE void weight_body(const Call& c, int64_t u, int thread, const float* fin, float* wv) {
    const int64_t pair = u / c.ranges, rr = u % c.ranges, b = pair / c.G, g = pair % c.G, D = c.D, rows = c.rows;
    float* qs = c.local + int64_t(thread) * c.per_thread;
    float* Kt = qs + rows * D;
    float* S = Kt + 2 * kTileKeys * D;
    float* kfac = S + rows * kTileKeys;
    prepare_queries(c, b, g, qs);
    int64_t ta, tb;
    key_range(c, rr, &ta, &tb);
    const float* fr = fin + pair * rows * 2;
    for (int64_t t0 = ta; t0 < tb; t0 += kTileKeys) {
        const int64_t nk = std::min(kTileKeys, tb - t0);
        if (!tile_scores<V>(c, b, g, t0, nk, qs, Kt, kfac, S)) continue;
        float* w = wv + (b * c.G + g) * c.T + t0;
        for (int64_t row = 0; row < rows; ++row) {
            if (fr[2 * row + 1] == 0.0f) continue;
            const float M = fr[2 * row], il = fr[2 * row + 1] / float(c.R);
            const float* sr = S + row * kTileKeys;
            for (int64_t t = 0; t < nk; ++t) w[t] += kv_expf_poly(sr[t] - M) * il;
        }
    }
}

#if defined(__x86_64__)
__attribute__((target("arch=x86-64-v4"))) void unit_v4(const Call& c, int64_t u, int th) { unit_body<qa_f32x16>(c, u, th); }
__attribute__((target("arch=x86-64-v3"))) void unit_v3(const Call& c, int64_t u, int th) { unit_body<qa_f32x8>(c, u, th); }
__attribute__((target("arch=x86-64-v4"))) void weight_v4(const Call& c, int64_t u, int th, const float* f, float* w) { weight_body<qa_f32x16>(c, u, th, f, w); }
__attribute__((target("arch=x86-64-v3"))) void weight_v3(const Call& c, int64_t u, int th, const float* f, float* w) { weight_body<qa_f32x8>(c, u, th, f, w); }

// 4 = AVX-512 (F, BW, DQ, VL), 3 = AVX2 + FMA, 2 = the build's baseline; KVLAB_CPU_VARIANT=avx2 /
// base caps it as it does the kernels.
int cpu_level() {
    static const int level = [] {
        const char* forced = std::getenv("KVLAB_CPU_VARIANT");
        const int cap = forced && std::strcmp(forced, "base") == 0 ? 2 : forced && std::strcmp(forced, "avx2") == 0 ? 3 : 4;
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
            __builtin_cpu_supports("avx512vl"))
            return std::min(cap, 4);
        if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return std::min(cap, 3);
        return 2;
    }();
    return level;
}
#endif
void unit_base(const Call& c, int64_t u, int th) { unit_body<qa_f32x4>(c, u, th); }
void weight_base(const Call& c, int64_t u, int th, const float* f, float* w) { weight_body<qa_f32x4>(c, u, th, f, w); }

void run_unit(const Call& c, int64_t u, int th) {
#if defined(__x86_64__)
    const int lv = cpu_level();
    if (lv >= 4) return unit_v4(c, u, th);
    if (lv == 3) return unit_v3(c, u, th);
#endif
    unit_base(c, u, th);
}
void run_weights(const Call& c, int64_t u, int th, const float* f, float* w) {
#if defined(__x86_64__)
    const int lv = cpu_level();
    if (lv >= 4) return weight_v4(c, u, th, f, w);
    if (lv == 3) return weight_v3(c, u, th, f, w);
#endif
    weight_base(c, u, th, f, w);
}

// Units over nt threads (the caller and nt - 1 started for the call) taking the next unit in
// turn. Threads of their own rather than OpenMP's: OpenMP's workers spin after a region and
// take the cores from the kernels' thread pool that runs the rest of the step.
template <class F>
void run_parallel(int nt, int64_t units, const F& f) {
    if (nt <= 1) {
        for (int64_t u = 0; u < units; ++u) f(u, 0);
        return;
    }
    std::atomic<int64_t> next{0};
    auto work = [&](int th) {
        for (int64_t u = next++; u < units; u = next++) f(u, th);
    };
    std::vector<std::thread> pool;
    for (int th = 1; th < nt; ++th) pool.emplace_back(work, th);
    work(0);
    for (std::thread& t : pool) t.join();
}

}  // namespace

void sdpa_quant_rows(Tensor& y, const Tensor& q, const QuantRowsView& kv, int64_t T, const Tensor& kpos, const Tensor& qpos,
                     float scale, int window, Tensor* wsum) {
    const int64_t B = q.size(0), NH = q.size(1), n = q.size(2), D = q.size(3), G = kv.G;
    if (!q.device().is_cpu() || q.dtype() != DType::F32 || y.dtype() != DType::F32 || D != kv.D || NH % G != 0 || B > kv.B ||
        T > kv.L || kpos.size(2) < T)
        throw Error(str("quantized-row attention: q ", q.shape().str(), " over ", T, " of ", kv.L, " slots of ", G,
                        " KV heads of size ", kv.D, "; expected f32 CPU queries of that head size, NH a multiple of G"));
    const int64_t R = NH / G, rows = R * n, pairs = B * G;
    const int64_t ntile = (T + kUnitKeys - 1) / kUnitKeys;
    const int threads = std::max(1, num_threads());
    const int64_t ranges =
        n <= 4 && T > 0 ? std::max<int64_t>(1, std::min<int64_t>(ntile, (int64_t(threads) * 4 + pairs - 1) / pairs)) : 1;
    const int64_t units = pairs * ranges;
    const int nt = pairs * T >= kParallelKeys ? int(std::min<int64_t>(threads, units)) : 1;

    const Tensor qc = q.contiguous(), kp_c = kpos.contiguous(), qp_c = qpos.contiguous();
    const RowDecoder kdec(kv.kf, D, kv.klevels), vdec(kv.vf, D, kv.klevels);
    Call c{};
    c.kv = &kv, c.kdec = &kdec, c.vdec = &vdec;
    c.qv = qc.data<float>(), c.kpv = kp_c.data<int32_t>(), c.qpv = qp_c.data<int32_t>();
    const int64_t kpT = kp_c.size(2);
    c.kpB = kp_c.size(0) == 1 ? 0 : kp_c.size(1) * kpT, c.kpG = kp_c.size(1) == 1 ? 0 : kpT, c.qpB = qp_c.size(0) == 1 ? 0 : n;
    c.NH = NH, c.n = n, c.D = D, c.G = G, c.R = R, c.rows = rows, c.T = T, c.ranges = ranges, c.ntile = ntile;
    c.scale = scale, c.window = window, c.rot_k = tq_bits(kv.kf) != 0;
    // Scratch: per unit its partials (max, sum, accumulator per row); per thread the prepared
    // queries, a tile of decoded keys and values, their scores and row factors.
    c.per_unit = rows * (D + 2);
    c.per_thread = rows * D + 2 * kTileKeys * D + rows * kTileKeys + 2 * kTileKeys;
    Tensor scratch = Tensor::empty({units * c.per_unit + int64_t(nt) * c.per_thread}, DType::F32,
                                   {Device{}, MemCategory::WORKSPACE, "quantized-row attention scratch"});
    c.mem = scratch.data<float>();
    c.local = c.mem + units * c.per_unit;

    run_parallel(nt, units, [&](int64_t u, int th) { run_unit(c, u, th); });

    // Merge each pair's ranges in order; keep each row's final max and 1 / sum for the weights.
    // Straight into y when it is a plain f32 tensor (a decode step's), else through a copy.
    const bool y_direct = y.is_contiguous();
    Tensor out = y_direct ? y : Tensor::empty({B, NH, n, D}, DType::F32, {Device{}, MemCategory::WORKSPACE, "quantized-row attention output"});
    float* ov = out.data<float>();
    std::vector<float> fin(size_t(pairs * rows * 2));
    const float* mem = c.mem;
    for (int64_t pair = 0; pair < pairs; ++pair) {
        const int64_t b = pair / G, g = pair % G;
        for (int64_t row = 0; row < rows; ++row) {
            float M = kNegInf;
            for (int64_t rr = 0; rr < ranges; ++rr) M = std::max(M, mem[(pair * ranges + rr) * c.per_unit + row]);
            const int64_t r = row / n, i = row % n;
            float* o = ov + ((b * NH + g * R + r) * n + i) * D;
            std::fill(o, o + D, 0.0f);
            float Ls = 0.0f;
            if (M != kNegInf)
                for (int64_t rr = 0; rr < ranges; ++rr) {
                    const float* um = mem + (pair * ranges + rr) * c.per_unit;
                    if (um[row] == kNegInf) continue;
                    const float f = std::exp(um[row] - M);
                    Ls += um[rows + row] * f;
                    const float* a = um + 2 * rows + row * D;
                    for (int64_t d = 0; d < D; ++d) o[d] += f * a[d];
                }
            const float il = Ls > 0.0f ? 1.0f / Ls : 0.0f;
            for (int64_t d = 0; d < D; ++d) o[d] *= il;
            if (tq_bits(kv.vf) && il > 0.0f) unrotate(o, D);
            fin[size_t((pair * rows + row) * 2)] = M;
            fin[size_t((pair * rows + row) * 2 + 1)] = il;
        }
    }
    if (!y_direct) y.copy_from(out);
    if (!wsum) return;

    // Weight sums: the scores again, weighted by each row's final softmax.
    const bool w_direct = wsum->is_contiguous() && wsum->dtype() == DType::F32;
    Tensor w = w_direct ? *wsum : Tensor::empty({B, G, T}, DType::F32, {Device{}, MemCategory::WORKSPACE, "quantized-row attention weight sums"});
    float* wv = w.data<float>();
    std::fill(wv, wv + B * G * T, 0.0f);
    run_parallel(nt, units, [&](int64_t u, int th) { run_weights(c, u, th, fin.data(), wv); });
    if (!w_direct) wsum->copy_from(w);
}

}  // namespace kv
