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
//          Packed weight (CPU): src1 u8 (R, row bytes) holds R rows of a weight W (R, C) in
//          block format p.qformat (a PackedFormat, packed_blocks.h); src0, dst f32 2-D:
//          p.axis 0: dst (M, R) = alpha src0 (M, C) @ W^T + beta dst   (a Linear's forward)
//          p.axis 1: dst (M, C) = alpha src0 (M, R) @ W + beta dst     (its input gradient)
// ADD      dst = src0 + src1             (src0, src1 broadcast to dst)
// MUL      dst = src0 * src1             (src0, src1 broadcast to dst)
// SCALE    dst = alpha * src0
// RMSNORM  dst = src0 * rsqrt(mean_last(src0^2) + eps) * (weight_offset + src1)
//          src1 = weight[last] (optional: nsrc == 1 means no weight)
// SOFTMAX  dst = softmax(alpha * src0) over the last dim
// SILU     dst = src0 * sigmoid(src0)
// SWIGLU   dst = act(src0) * src1        (src0 = gate, src1 = up; act = p.act, a GateAct:
//          silu, or GELU's tanh form 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (Gemma))
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
//          With softcap c > 0 each score s = alpha q.k becomes c tanh(s / c) before the
//          mask and softmax (weights, log-sum-exp and SDPA_BACKWARD follow; CPU only).
//          dst2 (optional, f32 (B, G, T)): attention-weight sums
//          w[b,g,j] = (1/R) sum_{h in g} sum_i A[b,h,i,j]  (R = NH / G), so sum_j w = n.
//          dst3 (optional, f32|f64 (B, NH, n); CPU backend only): per query row, the
//          log-sum-exp log sum_j exp(alpha q.k_j) over the slots it sees (-inf if none).
//          src5 (optional, float (NH); CPU backend only): a learned sink logit per query head
//          (gpt-oss) that joins every row's softmax denominator with no value:
//          A[h,i,j] = exp(s_ij) / (sum_j' exp(s_ij') + exp(sink_h)), so each row's weights sum to
//          less than 1 (the weight sums dst2 too: sum_j w < n); dst3 then includes the sink's
//          term, and a row that sees no slot still gets zeros.
// SDPA_KIVI  SDPA (same masking, GQA, alpha, window, weight sums dst2) over a KIVI cache,
//          dequantized on read (layout and arithmetic: kernels/common/kivi_math.h), S =
//          p.kivi_group slots per group, p.kivi_bits 2 or 4:
//          src0 q (B, NH, n, HS); src1 kcodes u8 (B, G, NG, HS, S*bits/8); src2 kscales f16
//          (B, G, NG, HS, 2); src3 vcodes u8 (B, G, L, HS*bits/8); src4 vscales f16
//          (B, G, L, HS/VG, 2); src5 residual f32 (P, 2, S, HS) (K then V of full-precision
//          groups); src6 map int32 (B, G, NG): residual block of group j, or -1 = packed;
//          src7 kpos int32 (B|1, G|1, T); src8 qpos int32 (B|1, n). Slots [0, T) are read.
// SDPA_QUEST SDPA (same masking, GQA, alpha, weight sums dst2; window must be 0) over the
//          pages each query selects (Quest; selection math in kernels/common/quest_math.h):
//          src0 q (B, NH, n, HS); src1 k, src2 v (B, G, T, HS); src3 kpos int32 (B|1, G|1, T),
//          nondecreasing along T; src4 qpos int32 (B|1, n); src5 kmin, src6 kmax f32
//          (B, G, NP, HS), NP = ceil(T / p.quest_page): per page the element-wise min / max of
//          its keys. Query i of head h reads the p.quest_pages pages of bound order among the
//          pages whose first slot it may see, plus the last such page; unselected slots get
//          probability 0 (and weight 0 in dst2). dst3 (optional, int32 (B, NH, n, p.quest_pages + 1)):
//          the selected pages ascending, -1 after the last.
// SDPA_QROWS SDPA (same masking, GQA, alpha, window, weight sums dst2) over rows stored in
//          a QuantFormat (kernels/common/quant_formats.h; p.qformat keys, p.qformat_v values:
//          FP8_E4M3, FP8_E5M2, NVFP4, MXFP4, TQK*, TQV*), decoded on read:
//          src0 q f32 (B, NH, n, HS); src1 k u8 (B, G, L, quant_row_bytes(kf, HS)); src2 v u8
//          (B, G, L, quant_row_bytes(vf, HS)); src3 kpos int32 (B|1, G|1, T); src4 qpos
//          int32 (B|1, n); p.qlevels: the TQK codebook. Slots [0, T) are read. dst f32; dst2 f32.
//          TurboQuant rows are rotated: scores use the rotated query, outputs are rotated back.
// QUANTIZE   dst u8 (..., quant_row_bytes(f, n)) = rows of src0 float (..., n) in format f
// DEQUANTIZE dst float (..., n) = rows of src0 u8 (..., quant_row_bytes(f, n)) decoded
//          (formats and layouts: kernels/common/quant_formats.h; f = p.qformat)
//
// ---- gradients (each the reverse of the forward op of the same name; `d` = gradient) ----
// Outputs of these ops are overwritten, unless bit k of p.accumulate is set (KV_ACC_DST,
// KV_ACC_DST2, KV_ACC_DST3): then output k receives `out += result` (rows of many chunks and
// heads add up). An optional source is absent when nsrc stops before it or its data is null.
// RMSNORM_BACKWARD  src0 x (..., C); src1 dy (..., C); src2 weight (C) (optional).
//          r = rsqrt(mean_last(x^2) + eps), w' = weight_offset + weight (1 without weight),
//          g = dy * w':
//          dst  dx (..., C) = r g - x r^3 mean_last(g x)
//          dst2 dweight (C) (optional, needs weight) = sum over rows of dy x r
// ROPE_BACKWARD  dst dx (B, NH, T, HS) = the transposed rotation of src0 dy per channel pair:
//          dx1 = dy1 cos + dy2 sin,  dx2 = dy2 cos - dy1 sin;  channels >= n_rot copied.
//          src1 pos, src2 cos, src3 sin exactly as ROPE (so YaRN-scaled tables work too).
// SILU_BACKWARD  src0 x, src1 dy: dst dx = dy * silu'(x),  silu'(x) = s (1 + x (1 - s)), s = sigmoid(x)
// SWIGLU_BACKWARD  src0 gate, src1 up, src2 dy (all one shape), act = p.act:
//          dst dgate = dy * up * act'(gate);  dst2 dup = dy * act(gate)
// EMBEDDING_BACKWARD  src0 dy (ids..., C); src1 ids int32/int64 (ids...):
//          dst dtable (V, C): dtable[ids[i], :] += dy[i, :] (duplicate ids add up; on the CPU
//          in the order of i, so results do not depend on the thread count; CUDA adds with
//          atomics and needs an f32/f64 table)
// CROSS_ENTROPY  src0 logits (..., V) float; src1 targets int32/int64 (...);
//          src2 class subset int32/int64 (K) (optional: classification on logits).
//          z = logits[r, subset[0..K)] (K classes) or logits[r, :] (K = V); t = targets[r] in [0, K).
//          dst loss (...) f32/f64 = logsumexp(z) - z[t]; 0 where t == p.ignore_index (-100).
// CROSS_ENTROPY_BACKWARD  src0..src2 as CROSS_ENTROPY; src3 dloss (...) float (optional, 1).
//          dst dlogits (..., V): columns of z get alpha * dloss[r] * (softmax(z) - onehot(t)),
//          other columns and ignored rows get 0.
// SDPA_BACKWARD  the gradients of SDPA (same masking, GQA grouping, alpha, window), recomputed
//          blockwise in f32 (f64 for f64 calls): src0 q (B, NH, n, HS); src1 k (B, G, T, HS);
//          src2 v (B, G, T, HS); src3 kpos; src4 qpos (as SDPA); src5 dy (B, NH, n, HS).
//          Per head h of group g, A = masked softmax(alpha q k^T) (n, T), dP = dy v^T,
//          dS = A * (dP - rowsum(dP * A)):
//          dst  dq (B, NH, n, HS) = alpha dS k
//          dst2 dk (B, G, T, HS)  = alpha sum_{h in g} dS^T q
//          dst3 dv (B, G, T, HS)  = sum_{h in g} A^T dy
//          With sinks src6 (float (NH), as SDPA's src5) A is the sink softmax and dst4 (optional,
//          float (NH)) receives d sink_h = -sum_i A_sink[h,i] rowsum(dP * A)[h,i] (summed over
//          the batch; KV_ACC_DST4 accumulates), A_sink = exp(sink_h) / the row's denominator.
//          p.max_temp_bytes bounds the (R * queries, T) f32 score blocks all threads hold at once
//          (0 = 64 MiB); a block never has less than one query row. No (n, T) matrix is formed.
//          (CUDA recomputes per query and holds no score blocks; dk/dv are atomic sums there
//          and must be f32, f64 for f64 calls.)
// AXPY     dst = dst + alpha * src0        (src0 broadcast to dst)
// OPTIMIZER_STEP  one in-place update by PyTorch's formula for p.opt.kind (OptimKind):
//          dst param (...) read and written; src0 grad (same shape); dst2, dst3 optimizer state
//          (same shape, f32; f64 for f64 calls), read and written. g = grad_scale * grad, t = step:
//          ADAMW    dst2 m, dst3 v:  param *= 1 - lr wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
//                   param -= lr (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
//          ADAM     as ADAMW but with no decoupled decay and g += wd param first (L2)
//          ADAMAX   dst2 m, dst3 u:  g += wd param; m = b1 m + (1-b1) g; u = max(b2 u, |g| + eps);
//                   param -= lr / (1-b1^t) * m / u
//          SGD      dst2 b (needed when momentum != 0): g += wd param; if momentum != 0:
//                   b = (t == 1 ? g : momentum b + (1 - dampening) g); g = nesterov ? g + momentum b : b;
//                   param -= lr g
//          RMSPROP  dst2 v, dst3 b (needed when momentum > 0): g += wd param; v = alpha v + (1-alpha) g^2;
//                   momentum > 0: b = momentum b + g / (sqrt(v) + eps), param -= lr b;
//                   else param -= lr g / (sqrt(v) + eps)          (centered = false)
//          ADADELTA dst2 v, dst3 u:  g += wd param; v = rho v + (1-rho) g^2;
//                   delta = sqrt(u + eps) / sqrt(v + eps) g; u = rho u + (1-rho) delta^2; param -= lr delta
// GRAD_NORM_SQ  dst (1 element, f32/f64) = sum over every element of src0^2 (any shape; f64
//          accumulation on the CPU). With KV_ACC_DST, several tensors add into one scalar.
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
    RMSNORM_BACKWARD,
    ROPE_BACKWARD,
    SILU_BACKWARD,
    SWIGLU_BACKWARD,
    EMBEDDING_BACKWARD,
    CROSS_ENTROPY,
    CROSS_ENTROPY_BACKWARD,
    SDPA_BACKWARD,
    AXPY,
    OPTIMIZER_STEP,
    GRAD_NORM_SQ,
    SDPA_KIVI,
    SDPA_QUEST,
    SDPA_QROWS,
    COUNT
};

inline const char* op_kind_name(OpKind k) {
    static const char* const names[] = {"matmul", "add",  "mul",       "scale",  "rmsnorm", "softmax",
                                        "silu",   "swiglu", "rope",    "embedding", "gather", "scatter",
                                        "copy",   "sum",  "max",       "norm",   "sdpa",    "quantize",  "dequantize",
                                        "rmsnorm_backward", "rope_backward", "silu_backward", "swiglu_backward",
                                        "embedding_backward", "cross_entropy", "cross_entropy_backward",
                                        "sdpa_backward", "axpy", "optimizer_step", "grad_norm_sq", "sdpa_kivi",
                                        "sdpa_quest", "sdpa_qrows"};
    static_assert(sizeof(names) / sizeof(names[0]) == size_t(OpKind::COUNT), "op name table out of date");
    return names[size_t(k)];
}

// =========================================================================================
// [SECTION] parameters, call record, context
// =========================================================================================
// Activations of the gated MLP ops SWIGLU and SWIGLU_BACKWARD (p.act).
enum class GateAct : uint8_t { SILU = 0, GELU_TANH, COUNT };

// Optimizers of OPTIMIZER_STEP (PyTorch's torch.optim classes of the same names).
enum class OptimKind : uint8_t { ADAMW = 0, ADAM, ADAMAX, SGD, RMSPROP, ADADELTA, COUNT };

inline const char* optim_kind_name(OptimKind k) {
    static const char* const names[] = {"adamw", "adam", "adamax", "sgd", "rmsprop", "adadelta"};
    static_assert(sizeof(names) / sizeof(names[0]) == size_t(OptimKind::COUNT), "optimizer name table out of date");
    return size_t(k) < size_t(OptimKind::COUNT) ? names[size_t(k)] : "?";
}

// Hyperparameters of one OPTIMIZER_STEP (defaults: PyTorch's AdamW). Unused fields are ignored.
struct OptimParams {
    int kind = 0;               // an OptimKind
    float lr = 1e-3f;
    float beta1 = 0.9f;         // ADAMW, ADAM, ADAMAX
    float beta2 = 0.999f;       // ADAMW, ADAM, ADAMAX
    float eps = 1e-8f;          // ADAMW, ADAM, ADAMAX, RMSPROP, ADADELTA
    float weight_decay = 0.0f;  // decoupled for ADAMW, L2 (added to the gradient) for the others
    float momentum = 0.0f;      // SGD, RMSPROP
    float dampening = 0.0f;     // SGD
    int nesterov = 0;           // SGD
    float alpha = 0.99f;        // RMSPROP smoothing constant
    float rho = 0.9f;           // ADADELTA
    float grad_scale = 1.0f;    // the gradient is multiplied by this first (clipping, loss scaling)
    int64_t step = 1;           // t >= 1: the step being taken (bias corrections, SGD's first step)
};

// p.accumulate bits: output k is accumulated into (`out += result`) instead of overwritten.
constexpr int KV_ACC_DST = 1;
constexpr int KV_ACC_DST2 = 2;
constexpr int KV_ACC_DST3 = 4;
constexpr int KV_ACC_DST4 = 8;

struct OpParams {
    float alpha = 1.0f;          // MATMUL, SCALE, SOFTMAX, AXPY, CROSS_ENTROPY_BACKWARD
    float beta = 0.0f;           // MATMUL accumulate factor
    float eps = 1e-6f;           // RMSNORM, RMSNORM_BACKWARD
    float weight_offset = 0.0f;  // RMSNORM, RMSNORM_BACKWARD (Gemma-style 1 + w)
    int axis = 0;                // GATHER, SCATTER; MATMUL with a packed weight: 1 = not transposed
    int n_rot = 0;               // ROPE, ROPE_BACKWARD: rotated channels (0 = all)
    int window = 0;              // SDPA, SDPA_BACKWARD: sliding window in positions (0 = none)
    float softcap = 0.0f;        // SDPA, SDPA_BACKWARD: scores s -> softcap tanh(s / softcap) (0 = none; Gemma 2)
    int act = 0;                 // SWIGLU, SWIGLU_BACKWARD: a GateAct
    int qformat = 0;             // QUANTIZE/DEQUANTIZE: a QuantFormat; MATMUL: a PackedFormat (u8 weight); SDPA_QROWS: keys'
    int qformat_v = 0;           // SDPA_QROWS: the values' QuantFormat
    float qlevels[16] = {};      // QUANTIZE/DEQUANTIZE/SDPA_QROWS of TurboQuant keys: the codebook (QuantLevels)
    int accumulate = 0;          // gradient ops, GRAD_NORM_SQ: KV_ACC_* bits
    int ignore_index = -100;     // CROSS_ENTROPY, CROSS_ENTROPY_BACKWARD: target of rows to skip
    int64_t max_temp_bytes = 0;  // SDPA_BACKWARD: bound on score blocks held at once (0 = 64 MiB)
    int kivi_bits = 0;           // SDPA_KIVI: 2 or 4
    int kivi_group = 0;          // SDPA_KIVI: slots per group S
    int quest_page = 0;          // SDPA_QUEST: slots per page P
    int quest_pages = 0;         // SDPA_QUEST: pages each query selects by bound (+ its own page)
    OptimParams opt{};           // OPTIMIZER_STEP
};

constexpr int KV_MAX_SRC = 10;  // SDPA_KIVI reads ten sources with sinks

// One op invocation. Outputs: dst always; dst2 and dst3 for ops with more than one output
// (SDPA weight sums; the extra gradients of RMSNORM_BACKWARD, SWIGLU_BACKWARD and
// SDPA_BACKWARD; optimizer state). An output or source whose data is null is absent.
struct OpCall {
    OpKind op = OpKind::COUNT;
    OpParams p{};
    TensorView dst{};
    TensorView dst2{};  // second output; data null = none
    TensorView dst3{};  // third output; data null = none
    TensorView dst4{};  // fourth output (SDPA_BACKWARD's sink gradient); data null = none
    TensorView src[KV_MAX_SRC]{};
    int nsrc = 0;
};

// State tensors OPTIMIZER_STEP reads and writes for these hyperparameters (dst2, then dst3);
// -1 for an unknown kind.
inline int optimizer_state_slots(const OptimParams& o) {
    switch (OptimKind(o.kind)) {
        case OptimKind::ADAMW:
        case OptimKind::ADAM:
        case OptimKind::ADAMAX:
        case OptimKind::ADADELTA: return 2;
        case OptimKind::SGD: return o.momentum != 0.0f ? 1 : 0;
        case OptimKind::RMSPROP: return o.momentum > 0.0f ? 2 : 1;
        default: return -1;
    }
}

// Whether optional source i is present (nsrc covers it and it has data).
inline bool has_src(const OpCall& c, int i) { return i < c.nsrc && c.src[i].data != nullptr; }

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

// Thrown by kernels and backends for unsupported calls or device failures. Default
// visibility: it crosses from the plugin libraries (CUDA, CPU kernel variants, built with
// hidden symbols) into the engine, which catches it by type.
struct __attribute__((visibility("default"))) KernelError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

}  // namespace kv
