// MATMUL with a packed weight (op.h): the weight stays in its ggml block format
// (kernels/common/packed_blocks.h) and is dequantized where it is used, never as a whole.
//   Decode (M <= kPackedSmallM rows): each weight row is streamed once; every block is turned
//     into its 32/256 floats in an L1-resident buffer by the loader's own block function and
//     multiplied into f32 vector accumulators at once (gemv_tile.h's vectors, one width per
//     ISA variant). Bound by reading the packed bytes, not the f32 bytes.
//   Prefill (more rows): panels of kPanelRows weight rows are dequantized into a per-thread
//     f32 panel (L2-resident) and multiplied by the f32 matmul path (oneDNN) with one thread
//     per panel; the panels' columns of the output are disjoint, so no reduction is needed.
//   Transposed (p.axis = 1, gradients w.r.t. activations): dst = x @ W, panel by panel of
//     weight rows, accumulating into dst through the f32 matmul path (multi-threaded there).
// Every weight value used equals the dequantize-at-load value bit for bit (this file is
// compiled with -ffp-contract=off, like the loader); only the summation order differs.
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "cpu_common.h"
#include "gemv_tile.h"
#include "kernels/common/packed_blocks.h"
#include "unit_pool.h"

namespace kv::cpu {

namespace {

// Decode rows up to this many tokens stream the packed rows (gemv); more go through panels.
// Measured with `kvlab bench model` (docs/PERFORMANCE.md): at M = 4 the streaming kernel still
// reads each block once for all rows, while a panel costs a full dequantization per call.
constexpr int64_t kPackedSmallM = 4;
constexpr int64_t kChunkBytes = int64_t(32) << 10;     // packed bytes per decode work unit
constexpr int64_t kParallelBytes = int64_t(256) << 10;  // below this, one thread
constexpr int64_t kPanelBytes = int64_t(192) << 10;    // f32 bytes of one prefill panel (L2)

template <PackedFormat F>
inline void dequant(const uint8_t* b, float* y) {
    namespace B = gguf_blocks;
    if constexpr (F == PackedFormat::Q8_0) B::dequant_q8_0(b, y);
    else if constexpr (F == PackedFormat::Q4_0) B::dequant_q4_0(b, y);
    else if constexpr (F == PackedFormat::Q4_1) B::dequant_q4_1(b, y);
    else if constexpr (F == PackedFormat::Q5_0) B::dequant_q5_0(b, y);
    else if constexpr (F == PackedFormat::Q5_1) B::dequant_q5_1(b, y);
    else if constexpr (F == PackedFormat::Q4_K) B::dequant_q4_k(b, y);
    else if constexpr (F == PackedFormat::Q5_K) B::dequant_q5_k(b, y);
    else B::dequant_q6_k(b, y);
}

// y[m * ldy + r] = sum_k x[m * ldx + k] w_r[k] for rows r in [0, n) of packed W.
template <PackedFormat F, int M>
void gemv_packed_rows(int64_t n, int64_t nblocks, const uint8_t* w, int64_t row_bytes, const float* x, int64_t ldx, float* y,
                      int64_t ldy) {
    constexpr int BE = packed_block_elems(F), BB = packed_block_bytes(F), NV = BE / kW;
    alignas(64) float buf[BE];
    for (int64_t r = 0; r < n; ++r) {
        const uint8_t* wr = w + r * row_bytes;
        vf32 acc[M][2];
        for (int m = 0; m < M; ++m) acc[m][0] = acc[m][1] = vf32{};
        for (int64_t b = 0; b < nblocks; ++b) {
            __builtin_prefetch(wr + (b + 8) * BB, 0, 2);
            const uint8_t* blk = wr + b * BB;
            // Q8_0 is widened in registers: w = d * q is the same single f32 multiply as the
            // block function's (bit-identical), without the round trip through `buf` that made
            // the generic form slower than f32 weights for this format.
            [[maybe_unused]] float d8 = 0;
            if constexpr (F == PackedFormat::Q8_0) d8 = f16_to_f32(uint16_t(blk[0] | (blk[1] << 8)));
            else dequant<F>(blk, buf);
            const float* xb = x + b * BE;
#pragma GCC unroll 16
            for (int v = 0; v < NV; ++v) {
                vf32 wv;
                if constexpr (F == PackedFormat::Q8_0) {
                    typedef int8_t vi8 __attribute__((vector_size(kW)));
                    vi8 q;
                    std::memcpy(&q, blk + 2 + v * kW, sizeof(q));
                    wv = __builtin_convertvector(q, vf32) * d8;
                } else {
                    vload(wv, buf + v * kW);
                }
#pragma GCC unroll 4
                for (int m = 0; m < M; ++m) {
                    vf32 xv;
                    vload(xv, xb + m * ldx + v * kW);
                    fma_acc(acc[m][v & 1], xv, wv);
                }
            }
        }
        for (int m = 0; m < M; ++m) {
            const vf32 t = acc[m][0] + acc[m][1];
            y[m * ldy + r] = hsum(t);
        }
    }
}

template <PackedFormat F>
void gemv_packed(int M, int64_t n, int64_t nblocks, const uint8_t* w, int64_t row_bytes, const float* x, int64_t ldx, float* y,
                 int64_t ldy) {
    switch (M) {
        case 1: gemv_packed_rows<F, 1>(n, nblocks, w, row_bytes, x, ldx, y, ldy); break;
        case 2: gemv_packed_rows<F, 2>(n, nblocks, w, row_bytes, x, ldx, y, ldy); break;
        case 3: gemv_packed_rows<F, 3>(n, nblocks, w, row_bytes, x, ldx, y, ldy); break;
        default: gemv_packed_rows<F, 4>(n, nblocks, w, row_bytes, x, ldx, y, ldy); break;
    }
}

using GemvFn = void (*)(int, int64_t, int64_t, const uint8_t*, int64_t, const float*, int64_t, float*, int64_t);
using DequantFn = void (*)(const uint8_t*, float*);

GemvFn gemv_fn(PackedFormat f) {
    switch (f) {
        case PackedFormat::Q8_0: return gemv_packed<PackedFormat::Q8_0>;
        case PackedFormat::Q4_0: return gemv_packed<PackedFormat::Q4_0>;
        case PackedFormat::Q4_1: return gemv_packed<PackedFormat::Q4_1>;
        case PackedFormat::Q5_0: return gemv_packed<PackedFormat::Q5_0>;
        case PackedFormat::Q5_1: return gemv_packed<PackedFormat::Q5_1>;
        case PackedFormat::Q4_K: return gemv_packed<PackedFormat::Q4_K>;
        case PackedFormat::Q5_K: return gemv_packed<PackedFormat::Q5_K>;
        case PackedFormat::Q6_K: return gemv_packed<PackedFormat::Q6_K>;
        default: return nullptr;
    }
}

DequantFn dequant_fn(PackedFormat f) {
    switch (f) {
        case PackedFormat::Q8_0: return dequant<PackedFormat::Q8_0>;
        case PackedFormat::Q4_0: return dequant<PackedFormat::Q4_0>;
        case PackedFormat::Q4_1: return dequant<PackedFormat::Q4_1>;
        case PackedFormat::Q5_0: return dequant<PackedFormat::Q5_0>;
        case PackedFormat::Q5_1: return dequant<PackedFormat::Q5_1>;
        case PackedFormat::Q4_K: return dequant<PackedFormat::Q4_K>;
        case PackedFormat::Q5_K: return dequant<PackedFormat::Q5_K>;
        case PackedFormat::Q6_K: return dequant<PackedFormat::Q6_K>;
        default: return nullptr;
    }
}

// Rows [r0, r1) of packed W to f32, row-major with leading dimension C.
void dequant_rows(DequantFn fn, int be, int bb, const uint8_t* w, int64_t row_bytes, int64_t r0, int64_t r1, int64_t nblocks,
                  float* out) {
    for (int64_t r = r0; r < r1; ++r)
        for (int64_t b = 0; b < nblocks; ++b) fn(w + r * row_bytes + b * bb, out + (r - r0) * nblocks * be + b * be);
}

// An f32 row-major matrix view (rows x cols, leading dimension ld elements), optionally seen
// transposed (cols x rows).
TensorView f32_view(float* p, int64_t rows, int64_t cols, int64_t ld, bool transposed) {
    TensorView v{};
    v.data = p;
    v.dtype = DType::F32;
    v.device = Device{};
    v.ndim = 2;
    if (!transposed) {
        v.ne[0] = rows, v.ne[1] = cols;
        v.nb[0] = ld * 4, v.nb[1] = 4;
    } else {
        v.ne[0] = cols, v.ne[1] = rows;
        v.nb[0] = 4, v.nb[1] = ld * 4;
    }
    return v;
}

OpCall f32_matmul(const TensorView& a, const TensorView& b, const TensorView& d, float alpha, float beta) {
    OpCall c;
    c.op = OpKind::MATMUL;
    c.p.alpha = alpha;
    c.p.beta = beta;
    c.dst = d;
    c.src[0] = a;
    c.src[1] = b;
    c.nsrc = 2;
    return c;
}

}  // namespace

bool matmul_packed_supported(const OpCall& c) {
    if (c.nsrc != 2 || c.src[1].dtype != DType::U8) return false;
    const TensorView &x = c.src[0], &w = c.src[1], &d = c.dst;
    if (x.dtype != DType::F32 || d.dtype != DType::F32 || x.ndim != 2 || w.ndim != 2 || d.ndim != 2) return false;
    if (x.nb[1] != 4 || w.nb[1] != 1 || w.nb[0] != w.ne[1] || d.nb[1] != 4 || x.ne[0] != d.ne[0]) return false;
    const bool tr = c.p.axis == 1;
    const int64_t k = tr ? d.ne[1] : x.ne[1];  // elements per packed row
    if (packed_format_checked(c.p.qformat, k, w.ne[1]) == PackedFormat::NONE) return false;
    return tr ? x.ne[1] == w.ne[0] : d.ne[1] == w.ne[0];
}

void matmul_packed(const OpContext& ctx, const OpCall& c) {
    if (!matmul_packed_supported(c))
        throw KernelError("matmul: a packed weight needs f32 2-D x and dst with unit inner strides, a contiguous u8 weight "
                          "[rows, row bytes] and a known block format whose rows hold the matching element count");
    const TensorView &x = c.src[0], &w = c.src[1], &d = c.dst;
    const float alpha = c.p.alpha, beta = c.p.beta;
    const bool tr = c.p.axis == 1;
    const int64_t M = d.ne[0], R = w.ne[0], row_bytes = w.ne[1];
    const int64_t C = tr ? d.ne[1] : x.ne[1];
    const PackedFormat f = packed_format_checked(c.p.qformat, C, row_bytes);
    const int be = packed_block_elems(f), bb = packed_block_bytes(f);
    const int64_t nblocks = C / be;
    const uint8_t* wp = static_cast<const uint8_t*>(w.data);
    const float* xp = static_cast<const float*>(x.data);
    const int64_t ldx = x.nb[0] / 4, ldd = d.nb[0] / 4;
    float* dp = static_cast<float*>(d.data);
    if (M == 0 || R == 0 || C == 0) return;
    const int threads = std::max(1, kernel_threads(ctx));

    if (tr) {
        // dst (M, C) = alpha x (M, R) @ W (R, C) + beta dst: weight-row panels, accumulated.
        const int64_t rows = std::clamp<int64_t>((int64_t(1) << 20) / (C * 4), 1, R);
        KernelScratch panel(ctx, size_t(rows * C) * 4);
        DequantFn fn = dequant_fn(f);
        for (int64_t r0 = 0; r0 < R; r0 += rows) {
            const int64_t r1 = std::min(R, r0 + rows);
            dequant_rows(fn, be, bb, wp, row_bytes, r0, r1, nblocks, panel.as<float>());
            const TensorView a = f32_view(const_cast<float*>(xp) + r0, M, r1 - r0, ldx, false);
            const TensorView b = f32_view(panel.as<float>(), r1 - r0, C, C, false);
            matmul_forward(ctx, f32_matmul(a, b, d, alpha, r0 == 0 ? beta : 1.0f));
        }
        return;
    }

    if (M <= kPackedSmallM) {
        GemvFn fn = gemv_fn(f);
        const int64_t chunk = std::clamp<int64_t>(kChunkBytes / row_bytes, 1, R);
        const int64_t units = (R + chunk - 1) / chunk;
        const bool acc = beta != 0.0f;
        auto run_unit = [&](int64_t u) {
            const int64_t r0 = u * chunk, n = std::min(chunk, R - r0);
            float* y = scratch<float>(4, M * chunk);
            fn(int(M), n, nblocks, wp + r0 * row_bytes, row_bytes, xp, ldx, y, chunk);
            for (int64_t m = 0; m < M; ++m) {
                float* dr = dp + m * ldd + r0;
                const float* yr = y + m * chunk;
                if (acc)
                    for (int64_t j = 0; j < n; ++j) dr[j] = alpha * yr[j] + beta * dr[j];
                else
                    for (int64_t j = 0; j < n; ++j) dr[j] = alpha * yr[j];
            }
        };
        const int nt = R * row_bytes >= kParallelBytes ? int(std::min<int64_t>(threads, units)) : 1;
        run_units(nt, units, run_unit);
        return;
    }

    // Prefill: per-thread panels of weight rows; each panel's output columns are its own.
    const int64_t prow = std::clamp<int64_t>(kPanelBytes / (C * 4) / 16 * 16, 16, R);
    const int64_t panels = (R + prow - 1) / prow;
    const int nt = int(std::min<int64_t>(threads, panels));
    KernelScratch buf(ctx, size_t(nt) * size_t(prow * C) * 4);
    DequantFn fn = dequant_fn(f);
    OpContext one = ctx;
    one.threads = 1;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1)
    for (int64_t pi = 0; pi < panels; ++pi) {
        float* panel = buf.as<float>() + size_t(omp_get_thread_num()) * size_t(prow * C);
        const int64_t r0 = pi * prow, r1 = std::min(R, r0 + prow);
        dequant_rows(fn, be, bb, wp, row_bytes, r0, r1, nblocks, panel);
        const TensorView b = f32_view(panel, r1 - r0, C, C, true);  // W_panel^T (C, rows)
        const TensorView dd = f32_view(dp + r0, M, r1 - r0, ldd, false);
        matmul_forward(one, f32_matmul(x, b, dd, alpha, beta));
    }
}

}  // namespace kv::cpu
