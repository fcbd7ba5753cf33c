// SDPA over quantized rows (see quant_attention.h). A unit is one (batch row, KV head) pair
// and a range of its slots, for all R heads of the group and all n queries: each key row is
// decoded once into a D-float scratch row (fp8 by bit arithmetic, fp4 codes a byte -> two
// values table times the block scale, TurboQuant codes through their codebook) and dotted with
// every query row; each value row likewise feeds every row's accumulator. Online softmax per
// query row (max, sum, weighted V); the ranges of a pair merge at the end, in range order, so
// the result does not depend on the thread count. Per-row scales (fp8's s, TurboQuant's key
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
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "engine/backend/backend_registry.h"
#include "engine/core/error.h"

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

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int64_t kUnitKeys = 512;       // keys per unit of a decode call
constexpr int64_t kParallelKeys = 4096;  // pair-keys below which one thread runs

inline float f32_of(uint32_t b) {
    float f;
    std::memcpy(&f, &b, 4);
    return f;
}

// Finite FP8 codes by bit arithmetic (the compiler vectorises it, a table lookup it would not):
// a normal code's exponent and mantissa fields move into an f32's and the exponent is
// rebiased; a subnormal code is its mantissa times the smallest step. The specials (E4M3's
// NaN, E5M2's inf/NaN) only come from non-finite inputs and decode as large finite values.
inline float e4m3_value(uint8_t c) {
    const uint32_t mag = c & 0x7fu;
    const float normal = f32_of((mag << 20) + (120u << 23));  // bias 127 - 7
    const float sub = float(int(mag)) * 0x1p-9f;               // m 2^(1 - 7 - 3)
    const float v = (mag >> 3) ? normal : sub;
    return (c & 0x80u) ? -v : v;
}
inline float e5m2_value(uint8_t c) {
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

    float decode(const uint8_t* r, float* out) const {
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

inline float dot(const float* a, const float* b, int64_t n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
    return s;
}

// x = S H y / sqrt(n): the inverse of the TurboQuant rotation (H symmetric, H H = n I).
void unrotate(float* y, int64_t n) {
    tq_hadamard(y, n);
    for (int64_t i = 0; i < n; ++i) y[i] *= tq_sign(i);
}

}  // namespace

void sdpa_quant_rows(Tensor& y, const Tensor& q, const QuantRowsView& kv, int64_t T, const Tensor& kpos, const Tensor& qpos,
                     float scale, int window, Tensor* wsum) {
    const int64_t B = q.size(0), NH = q.size(1), n = q.size(2), D = q.size(3), G = kv.G;
    if (!q.device().is_cpu() || q.dtype() != DType::F32 || y.dtype() != DType::F32 || D != kv.D || NH % G != 0 || B > kv.B ||
        T > kv.L || kpos.size(2) < T)
        throw Error(str("quantized-row attention: q ", q.shape().str(), " over ", T, " of ", kv.L,
                        " slots of ", G, " KV heads of size ", kv.D, "; expected f32 CPU queries of that head size, NH a multiple of G"));
    const int64_t R = NH / G, rows = R * n, pairs = B * G;
    const int64_t ntile = (T + kUnitKeys - 1) / kUnitKeys;
    const int threads = std::max(1, num_threads());
    const int64_t ranges =
        n <= 4 && T > 0 ? std::max<int64_t>(1, std::min<int64_t>(ntile, (int64_t(threads) * 4 + pairs - 1) / pairs)) : 1;
    const int64_t units = pairs * ranges;
    const bool rot_k = tq_bits(kv.kf) != 0, rot_v = tq_bits(kv.vf) != 0;

    const Tensor qc = q.contiguous(), kp_c = kpos.contiguous(), qp_c = qpos.contiguous();
    const float* qv = qc.data<float>();
    const int32_t* kpv = kp_c.data<int32_t>();
    const int32_t* qpv = qp_c.data<int32_t>();
    const int64_t kpT = kp_c.size(2), kpB = kp_c.size(0) == 1 ? 0 : kp_c.size(1) * kpT, kpG = kp_c.size(1) == 1 ? 0 : kpT;
    const int64_t qpB = qp_c.size(0) == 1 ? 0 : n;

    // Scratch per unit: its partials (max, sum, accumulator per row), the prepared queries, one
    // decoded key and value row, the row probabilities of the current key.
    const int64_t state = rows * (D + 2), per_unit = state + rows * D + 2 * D + rows;
    Tensor scratch = Tensor::empty({units * per_unit}, DType::F32, {Device{}, MemCategory::WORKSPACE, "quantized-row attention scratch"});
    float* mem = scratch.data<float>();
    const RowDecoder kdec(kv.kf, D, kv.klevels), vdec(kv.vf, D, kv.klevels);

    auto prepare_queries = [&](int64_t b, int64_t g, float* qs) {
        for (int64_t r = 0; r < R; ++r)
            for (int64_t i = 0; i < n; ++i) {
                float* o = qs + (r * n + i) * D;
                const float* src = qv + ((b * NH + g * R + r) * n + i) * D;
                for (int64_t d = 0; d < D; ++d) o[d] = src[d] * scale;
                if (rot_k) {  // R q: the rotation the keys were stored with
                    for (int64_t d = 0; d < D; ++d) o[d] *= tq_sign(d);
                    tq_hadamard(o, D);
                }
            }
    };
    auto visible = [&](int64_t kp, int64_t qp) { return kp <= qp && (window <= 0 || kp > qp - window); };
    auto key_range = [&](int64_t rr, int64_t* t0, int64_t* t1) {
        *t0 = std::min(T, (ntile * rr / ranges) * kUnitKeys);
        *t1 = std::min(T, (ntile * (rr + 1) / ranges) * kUnitKeys);
    };

    auto run_unit = [&](int64_t u) {
        const int64_t pair = u / ranges, rr = u % ranges, b = pair / G, g = pair % G;
        float* m = mem + u * per_unit;
        float* l = m + rows;
        float* acc = l + rows;
        float* qs = m + state;
        float* kb = qs + rows * D;
        float* vb = kb + D;
        float* pv = vb + D;
        std::fill(m, m + rows, kNegInf);
        std::fill(l, l + rows, 0.0f);
        std::fill(acc, acc + rows * D, 0.0f);
        prepare_queries(b, g, qs);
        int64_t t0, t1;
        key_range(rr, &t0, &t1);
        const uint8_t* krow = kv.k + (b * G + g) * kv.L * kv.rbk;
        const uint8_t* vrow = kv.v + (b * G + g) * kv.L * kv.rbv;
        for (int64_t t = t0; t < t1; ++t) {
            const int64_t kp = kpv[b * kpB + g * kpG + t];
            bool any = false;
            for (int64_t i = 0; i < n; ++i) any = any || visible(kp, qpv[b * qpB + i]);
            if (!any) continue;
            const float kf = kdec.decode(krow + t * kv.rbk, kb);
            for (int64_t row = 0; row < rows; ++row) {
                pv[row] = 0.0f;
                if (!visible(kp, qpv[b * qpB + row % n])) continue;
                const float sc = kf * dot(qs + row * D, kb, D);
                if (sc > m[row]) {  // a new maximum rescales what was accumulated
                    const float corr = m[row] == kNegInf ? 0.0f : std::exp(m[row] - sc);
                    l[row] *= corr;
                    float* a = acc + row * D;
                    for (int64_t d = 0; d < D; ++d) a[d] *= corr;
                    m[row] = sc;
                }
                pv[row] = std::exp(sc - m[row]);
                l[row] += pv[row];
            }
            const float vf = vdec.decode(vrow + t * kv.rbv, vb);
            for (int64_t row = 0; row < rows; ++row) {
                if (pv[row] == 0.0f) continue;
                const float p = pv[row] * vf;
                float* a = acc + row * D;
#pragma omp simd
                for (int64_t d = 0; d < D; ++d) a[d] += p * vb[d];
            }
        }
    };
    const int nt = pairs * T >= kParallelKeys ? int(std::min<int64_t>(threads, units)) : 1;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int64_t u = 0; u < units; ++u) run_unit(u);

    // Merge each pair's ranges in order; keep each row's final max and 1 / sum for the weights.
    // Straight into y when it is a plain f32 tensor (a decode step's), else through a copy.
    const bool y_direct = y.is_contiguous();
    Tensor out = y_direct ? y : Tensor::empty({B, NH, n, D}, DType::F32, {Device{}, MemCategory::WORKSPACE, "quantized-row attention output"});
    float* ov = out.data<float>();
    std::vector<float> fin(size_t(pairs * rows * 2));
    for (int64_t pair = 0; pair < pairs; ++pair) {
        const int64_t b = pair / G, g = pair % G;
        for (int64_t row = 0; row < rows; ++row) {
            float M = kNegInf;
            for (int64_t rr = 0; rr < ranges; ++rr) M = std::max(M, mem[(pair * ranges + rr) * per_unit + row]);
            const int64_t r = row / n, i = row % n;
            float* o = ov + ((b * NH + g * R + r) * n + i) * D;
            std::fill(o, o + D, 0.0f);
            float Ls = 0.0f;
            if (M != kNegInf)
                for (int64_t rr = 0; rr < ranges; ++rr) {
                    const float* um = mem + (pair * ranges + rr) * per_unit;
                    if (um[row] == kNegInf) continue;
                    const float f = std::exp(um[row] - M);
                    Ls += um[rows + row] * f;
                    const float* a = um + 2 * rows + row * D;
                    for (int64_t d = 0; d < D; ++d) o[d] += f * a[d];
                }
            const float il = Ls > 0.0f ? 1.0f / Ls : 0.0f;
            for (int64_t d = 0; d < D; ++d) o[d] *= il;
            if (rot_v && il > 0.0f) unrotate(o, D);
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
    auto weight_unit = [&](int64_t u) {
        const int64_t pair = u / ranges, rr = u % ranges, b = pair / G, g = pair % G;
        float* qs = mem + u * per_unit + state;
        float* kb = qs + rows * D;
        prepare_queries(b, g, qs);
        int64_t t0, t1;
        key_range(rr, &t0, &t1);
        const uint8_t* krow = kv.k + (b * G + g) * kv.L * kv.rbk;
        const float* fr = fin.data() + pair * rows * 2;
        for (int64_t t = t0; t < t1; ++t) {
            const int64_t kp = kpv[b * kpB + g * kpG + t];
            bool any = false;
            for (int64_t i = 0; i < n; ++i) any = any || visible(kp, qpv[b * qpB + i]);
            if (!any) continue;
            const float kf = kdec.decode(krow + t * kv.rbk, kb);
            float s = 0.0f;
            for (int64_t row = 0; row < rows; ++row) {
                if (fr[2 * row + 1] == 0.0f || !visible(kp, qpv[b * qpB + row % n])) continue;
                s += std::exp(kf * dot(qs + row * D, kb, D) - fr[2 * row]) * fr[2 * row + 1];
            }
            wv[(b * G + g) * T + t] = s / float(R);
        }
    };
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int64_t u = 0; u < units; ++u) weight_unit(u);
    if (!w_direct) wsum->copy_from(w);
}

}  // namespace kv
