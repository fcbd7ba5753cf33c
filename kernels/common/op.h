// The op set: one enum, one parameter block, one call record. Every backend implements
// `compute(const OpContext&, const OpCall&)` with a single switch over OpKind and answers
// `supports_op` for each call. The semantics below are the contract all backends and the
// f64 reference in kernels/cpu/ref/ follow.
//
// Index
//   [SECTION] op kinds and their semantics
//   [SECTION] parameters, call record, context
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

#include "tensor_view.h"

namespace kv {

// =========================================================================================
// [SECTION] op kinds and their semantics
// All views of one call share ndim unless stated. "Broadcast" means a dimension of size 1
// (or byte stride 0) in a source is repeated to the destination's size.
//
// MATMUL   dst[..., M, N] = alpha * src0[..., M, K] @ src1[..., K, N] + beta * dst
//          Batch dims broadcast. Transposes are strided views (e.g. a PyTorch Linear weight
//          W[out, in] used as x @ W^T is src1 = W viewed as [in, out] with nb swapped).
//          Inputs f32/f32, bf16/bf16 or f16/f16 (f32 accumulation), or f64/f64.
// ADD      dst = src0 + src1             (src0, src1 broadcast to dst)
// MUL      dst = src0 * src1             (src0, src1 broadcast to dst)
// SCALE    dst = alpha * src0
// RMSNORM  dst = src0 * rsqrt(mean_last(src0^2) + eps) * (weight_offset + src1)
//          src1 = weight[last] (optional: nsrc == 1 means no weight)
// SOFTMAX  dst = softmax(alpha * src0) over the last dim
// SILU     dst = src0 * sigmoid(src0)
// SWIGLU   dst = silu(src0) * src1       (src0 = gate, src1 = up)
// ROPE     dst[b,h,t,:] = rotate_half(src0[b,h,t,:]) with angle table rows src1[b|0, t]
//          src0 x (B, NH, T, HS); src1 pos int32 (B|1, T); src2 cos f32 (P, n_rot/2);
//          src3 sin f32 (P, n_rot/2). Channels [0, n_rot) are rotated (pairs i, i + n_rot/2),
//          channels [n_rot, HS) are copied.
// EMBEDDING dst[i..., :] = src0[src1[i...], :]  (src0 table (V, C); src1 ids int32/int64)
// GATHER   dst[i.., j, k..] = src0[i.., src1[i.., j, k..], k..]   along dim `axis`
//          src1 int32/int64 index with dst's shape (broadcast allowed)
// SCATTER  dst[i.., src1[i.., j, k..], k..] = src0[i.., j, k..]   along dim `axis`, in place
//          src0 values, src1 index with src0's shape (broadcast allowed). Duplicate targets
//          are undefined.
// COPY     dst = convert(src0) elementwise (any float dtypes, any strides; int->int)
// SUM      dst[r] = sum over last dim of src0 row r    (dst holds rows(src0) elements)
// MAX      dst[r] = max over last dim
// NORM     dst[r] = sqrt(sum of squares over last dim)
// SDPA     scaled dot-product attention with masking by token position (the KV-cache form):
//          src0 q (B, NH, n, HS); src1 k (B, G, T, HS); src2 v (B, G, T, HS);
//          src3 kpos int32 (B|1, G|1, T) position of the token in each slot;
//          src4 qpos int32 (B|1, n) position of each query.
//          Query i may attend slot j iff kpos[j] <= qpos[i] (and, with window w > 0,
//          kpos[j] > qpos[i] - w). dst y (B, NH, n, HS) = softmax(alpha q k^T) v per head,
//          head h using KV group h / (NH / G). A query that sees no slot gets zeros.
//          dst2 (optional, f32 (B, G, T)): attention-weight sums
//          w[b,g,j] = (1/R) sum_{h in g} sum_i A[b,h,i,j]  (R = NH / G), so sum_j w = n.
// QUANTIZE   dst u8 (..., quant_row_bytes(f, n)) = rows of src0 float (..., n) in format f
// DEQUANTIZE dst float (..., n) = rows of src0 u8 (..., quant_row_bytes(f, n)) decoded
//          (formats and layouts: kernels/common/quant_formats.h; f = p.qformat)
// =========================================================================================
enum class OpKind : uint8_t {
    MATMUL = 0,
    ADD,
    MUL,
    SCALE,
    RMSNORM,
    SOFTMAX,
    SILU,
    SWIGLU,
    ROPE,
    EMBEDDING,
    GATHER,
    SCATTER,
    COPY,
    SUM,
    MAX,
    NORM,
    SDPA,
    QUANTIZE,
    DEQUANTIZE,
    COUNT
};

inline const char* op_kind_name(OpKind k) {
    static const char* const names[] = {"matmul", "add",  "mul",       "scale",  "rmsnorm", "softmax",
                                        "silu",   "swiglu", "rope",    "embedding", "gather", "scatter",
                                        "copy",   "sum",  "max",       "norm",   "sdpa",    "quantize",  "dequantize"};
    static_assert(sizeof(names) / sizeof(names[0]) == size_t(OpKind::COUNT), "op name table out of date");
    return names[size_t(k)];
}

// =========================================================================================
// [SECTION] parameters, call record, context
// =========================================================================================
struct OpParams {
    float alpha = 1.0f;          // MATMUL, SCALE, SOFTMAX
    float beta = 0.0f;           // MATMUL accumulate factor
    float eps = 1e-6f;           // RMSNORM
    float weight_offset = 0.0f;  // RMSNORM (Gemma-style 1 + w)
    int axis = 0;                // GATHER, SCATTER
    int n_rot = 0;               // ROPE: rotated channels (0 = all)
    int window = 0;              // SDPA: sliding window in positions (0 = none)
    int qformat = 0;             // QUANTIZE/DEQUANTIZE: a QuantFormat
};

constexpr int KV_MAX_SRC = 6;

struct OpCall {
    OpKind op = OpKind::COUNT;
    OpParams p{};
    TensorView dst{};
    TensorView dst2{};  // second output of ops that have one (SDPA weight sums); data null = none
    TensorView src[KV_MAX_SRC]{};
    int nsrc = 0;
};

// Temporary memory for kernels, provided by the engine so it is tracked (category workspace).
class WorkspaceAllocator {
   public:
    virtual ~WorkspaceAllocator() = default;
    virtual void* alloc(size_t bytes) = 0;
    virtual void free(void* p, size_t bytes) = 0;
};

struct OpContext {
    int threads = 0;                         // CPU: 0 = all cores
    WorkspaceAllocator* workspace = nullptr;  // may be null (kernels then use plain malloc)
    void* stream = nullptr;                  // CUDA: cudaStream_t
};

// Thrown by kernels and backends for unsupported calls or device failures.
struct KernelError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

}  // namespace kv
