// Engine-level ops: validate shapes and dtypes (one clear error per misuse), allocate outputs
// from the tracked allocator, and dispatch one OpCall to the backend of the operands' device.
// Semantics of every op are in kernels/common/op.h. Functions ending in `_` write into an
// existing tensor; the others return a new one (category activations unless stated).
#pragma once

#include "engine/core/tensor.h"
#include "kernels/common/op.h"
#include "kernels/common/quant_formats.h"

namespace kv::ops {

// Run a fully built call on the backend of its destination's device (no validation).
void dispatch(OpCall& call);
// Context for calls made from this thread (threads, workspace allocator).
OpContext current_context();

// ---- linear algebra ---------------------------------------------------------------------
// out[..., M, N] = alpha * a[..., M, K] @ b[..., K, N] + beta * out. Batch dims broadcast;
// a and b may be any strided views (transposes included).
void matmul_(Tensor& out, const Tensor& a, const Tensor& b, float alpha = 1.0f, float beta = 0.0f);
Tensor matmul(const Tensor& a, const Tensor& b, DType out_dtype = DType::F32);
// y[..., N] = x[..., K] @ w[N, K]^T  (PyTorch Linear layout)
Tensor linear(const Tensor& x, const Tensor& w, DType out_dtype = DType::F32);

// ---- elementwise ------------------------------------------------------------------------
void add_(Tensor& out, const Tensor& a, const Tensor& b);
void mul_(Tensor& out, const Tensor& a, const Tensor& b);
void scale_(Tensor& out, const Tensor& a, float s);
void silu_(Tensor& out, const Tensor& x);
void swiglu_(Tensor& out, const Tensor& gate, const Tensor& up);
Tensor add(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor scale(const Tensor& a, float s);
Tensor silu(const Tensor& x);
Tensor swiglu(const Tensor& gate, const Tensor& up);
// act(gate) * up: the gated MLP with SiLU (= swiglu) or GELU-tanh (Gemma's GEGLU).
void gated_(Tensor& out, const Tensor& gate, const Tensor& up, GateAct act);
Tensor gated(const Tensor& gate, const Tensor& up, GateAct act);

// ---- normalisation and softmax ----------------------------------------------------------
// weight may be undefined (no weight). weight_offset = 1 gives Gemma's (1 + w).
void rmsnorm_(Tensor& out, const Tensor& x, const Tensor& weight, float eps, float weight_offset = 0.0f);
Tensor rmsnorm(const Tensor& x, const Tensor& weight, float eps, float weight_offset = 0.0f);
void softmax_(Tensor& out, const Tensor& x, float scale = 1.0f);
Tensor softmax(const Tensor& x, float scale = 1.0f);

// ---- position encoding ------------------------------------------------------------------
// x (B, NH, T, HS); pos int32 (B|1, T); cos/sin f32 (P, n_rot/2). n_rot = 0 means HS.
void rope_(Tensor& out, const Tensor& x, const Tensor& pos, const Tensor& cos, const Tensor& sin, int n_rot = 0);
Tensor rope(const Tensor& x, const Tensor& pos, const Tensor& cos, const Tensor& sin, int n_rot = 0);

// ---- indexing ---------------------------------------------------------------------------
// out[..., C] = table[ids[...], :]; ids are checked against the table size.
void embedding_(Tensor& out, const Tensor& table, const Tensor& ids);
Tensor embedding(const Tensor& table, const Tensor& ids, DType out_dtype = DType::F32);
void gather_(Tensor& out, const Tensor& src, int axis, const Tensor& index);
Tensor gather(const Tensor& src, int axis, const Tensor& index);
// dst[.., index[.., j, ..], ..] = src[.., j, ..] along axis (in place).
void scatter_(Tensor& dst, int axis, const Tensor& index, const Tensor& src);

// ---- copies -----------------------------------------------------------------------------
void copy_(Tensor& dst, const Tensor& src);  // same shape, any dtypes/strides, same device
Tensor cast(const Tensor& x, DType dtype);

// ---- attention -------------------------------------------------------------------------
// y (B, NH, n, HS) = softmax(scale q k^T, masked by position) v with GQA (head h uses group
// h / (NH/G)). k, v (B, G, T, HS); kpos int32 (B|1, G|1, T) = position of each slot's token;
// qpos int32 (B|1, n) = position of each query; slot j visible to query i iff
// kpos[j] <= qpos[i] (and kpos[j] > qpos[i] - window when window > 0).
// wsum (optional, f32 (B, G, T)) receives attention-weight sums (summed over queries,
// averaged over the heads of a group).
// lse (optional, f32|f64 (B, NH, n)) receives each query row's log-sum-exp of its scaled
// scores over the slots it sees (-inf if none): two attentions over disjoint slot sets merge
// exactly by it (engine/driver/fidelity.cpp). Only where sdpa_lse_supported(device).
// Scores are soft-capped (c tanh(s / c), Gemma 2) while an AttentionSoftcap scope of c > 0 is
// open on the calling thread (CPU backend only).
void sdpa_(Tensor& y, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& kpos, const Tensor& qpos, float scale,
           int window = 0, Tensor* wsum = nullptr, Tensor* lse = nullptr);
bool sdpa_lse_supported(const Device& device);

// The model's attention-logit soft-capping for every SDPA (and SDPA backward) the calling
// thread runs while the scope is open. The cap belongs to the model, not to the cache: the
// transformer opens it around a layer's attention, so each attention implementation (the KV
// cache with its policy, the gradient replay, fidelity's reference) applies it without
// carrying it through its interface. Attention kernels without a cap (KIVI, Quest) refuse
// while it is open.
class AttentionSoftcap {
   public:
    explicit AttentionSoftcap(double cap);
    ~AttentionSoftcap();
    AttentionSoftcap(const AttentionSoftcap&) = delete;
    AttentionSoftcap& operator=(const AttentionSoftcap&) = delete;
    static float current();  // 0 when none is open

   private:
    float prev_;
};

// The model's learned attention sinks (gpt-oss: a logit per query head in every softmax
// denominator, SDPA's src5 in kernels/common/op.h) for every SDPA and SDPA backward the calling
// thread runs while the scope is open, opened by the transformer around a layer's attention as
// AttentionSoftcap is. sinks: float (NH) on the attention's device; null = none. dsinks (same
// shape, optional): every sdpa_backward_ in the scope adds the sinks' gradient to it. The CPU
// backend only (plain, KIVI and Quest attention take the sinks; a caller that splits the heads
// opens a nested scope over its heads' slice), and the log-sum-exp output is unavailable
// (sdpa_lse_supported is false): with the sink's term in every row's denominator, two
// attentions over disjoint slot sets no longer merge by it.
class AttentionSinks {
   public:
    explicit AttentionSinks(const Tensor* sinks, Tensor* dsinks = nullptr);
    ~AttentionSinks();
    AttentionSinks(const AttentionSinks&) = delete;
    AttentionSinks& operator=(const AttentionSinks&) = delete;
    static const Tensor* current();  // null when none is open
    static Tensor* current_grad();   // the open scope's sink gradient; null when none

   private:
    const Tensor* prev_;
    Tensor* prev_d_;
};

// SDPA over a KIVI cache, dequantized on read (SDPA_KIVI in kernels/common/op.h; layout in
// kernels/common/kivi_math.h): the same masking, GQA and weight sums as sdpa_.
struct KiviCacheViews {
    const Tensor* kcodes = nullptr;   // u8 (B, G, NG, D, S*bits/8)
    const Tensor* kscales = nullptr;  // f16 (B, G, NG, D, 2)
    const Tensor* vcodes = nullptr;   // u8 (B, G, L, D*bits/8)
    const Tensor* vscales = nullptr;  // f16 (B, G, L, D/VG, 2)
    const Tensor* residual = nullptr; // float (P, 2, S, D)
    const Tensor* map = nullptr;      // int32 (B, G, NG)
    int bits = 2;
    int group = 32;
};
void sdpa_kivi_(Tensor& y, const Tensor& q, const KiviCacheViews& kv, const Tensor& kpos, const Tensor& qpos, float scale,
                int window = 0, Tensor* wsum = nullptr);

// SDPA over the pages each query selects by Quest's bound (SDPA_QUEST in kernels/common/op.h;
// math in kernels/common/quest_math.h): the masking, GQA and weight sums of sdpa_ restricted
// to the selected pages. kmin/kmax f32 (B, G, >= ceil(T / page), HS); sel (optional, int32
// (B, NH, n, pages + 1)) receives the selected pages.
void sdpa_quest_(Tensor& y, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& kpos, const Tensor& qpos,
                 const Tensor& kmin, const Tensor& kmax, float scale, int64_t page, int64_t pages, Tensor* wsum = nullptr,
                 Tensor* sel = nullptr);

// ---- quantization (formats in kernels/common/quant_formats.h) ---------------------------
// SDPA over rows stored in a deployed KV format, decoded on read (SDPA_QROWS in
// kernels/common/op.h): the masking, GQA and weight sums (f32 (B, G, T)) of sdpa_. q, y f32
// (B, NH, n, D); k, v u8 (B, G, L, row bytes of kf / vf at D); slots [0, kpos.size(2)) are read;
// levels: the TurboQuant key codebook (TQK keys only).
void sdpa_qrows_(Tensor& y, const Tensor& q, const Tensor& k, const Tensor& v, QuantFormat kf, QuantFormat vf, const QuantLevels& levels,
                 const Tensor& kpos, const Tensor& qpos, float scale, int window = 0, Tensor* wsum = nullptr);

// Rows of x (..., n) -> bytes (..., quant_row_bytes(f, n)).
Tensor quantize(const Tensor& x, QuantFormat f);
void quantize_(Tensor& dst, const Tensor& x, QuantFormat f);
// Bytes (..., row_bytes) -> values (..., n) in out's dtype.
void dequantize_(Tensor& out, const Tensor& q, QuantFormat f);
const char* quant_format_name(QuantFormat f);  // "q8", "q4", "nf4", "q8_0", "q4_0", "fp8_e4m3", ...
QuantFormat quant_format_from_name(const std::string& name);  // throws kv::Error listing names
// The codebook QUANTIZE/DEQUANTIZE of f read for rows of n values: TurboQuant keys' Lloyd-Max
// levels (kernels/common/lloyd_max.h, computed once per n and width); zeros for other formats.
QuantLevels quant_levels(QuantFormat f, int64_t n);

// ---- gradients (the *_BACKWARD ops of kernels/common/op.h) -------------------------------
// Outputs are named d<input>. An `accumulate` flag adds into the existing gradient instead of
// overwriting it (rows of many chunks, heads of one group, and several uses of one tensor add
// up). An accumulated output must not alias an input.

// dx (..., C) of y = rmsnorm(x, weight); dweight (C) (optional, needs a weight; f32/f64) is
// the sum over rows of dy * x * rsqrt(mean(x^2) + eps). dx may alias dy (not when accumulating).
void rmsnorm_backward_(Tensor& dx, Tensor* dweight, const Tensor& x, const Tensor& weight, const Tensor& dy, float eps,
                       float weight_offset = 0.0f, bool accumulate_dx = false, bool accumulate_dweight = true);
// dx (B, NH, T, HS) of y = rope(x, pos, cos, sin, n_rot): the transposed rotation of dy.
void rope_backward_(Tensor& dx, const Tensor& dy, const Tensor& pos, const Tensor& cos, const Tensor& sin, int n_rot = 0,
                    bool accumulate = false);
// dx = dy * silu'(x)
void silu_backward_(Tensor& dx, const Tensor& x, const Tensor& dy, bool accumulate = false);
// y = act(gate) * up:  dgate = dy * up * act'(gate), dup = dy * act(gate)
void swiglu_backward_(Tensor& dgate, Tensor& dup, const Tensor& gate, const Tensor& up, const Tensor& dy, bool accumulate = false,
                      GateAct act = GateAct::SILU);
// dtable (V, C) [ids[i], :] += dy[i, :] (dy = ids' shape + (C,)); without `accumulate` dtable
// is zeroed first. Duplicate ids add up in token order on the CPU (deterministic).
void embedding_backward_(Tensor& dtable, const Tensor& ids, const Tensor& dy, bool accumulate = true);
// dq (B, NH, n, HS), dk and dv (B, G, T, HS) of sdpa_ (same q, k, v, positions, scale and
// window; dk/dv summed over the query heads of each group). Recomputes the attention in f32
// blockwise over queries; opt.max_temp_bytes bounds the score blocks held at once.
struct SdpaBackwardOptions {
    int window = 0;
    bool accumulate_dq = false;
    bool accumulate_dk = false;
    bool accumulate_dv = false;
    int64_t max_temp_bytes = 0;  // 0: 64 MiB
    float softcap = 0.0f;        // > 0: as sdpa_'s soft-capping (0: the open AttentionSoftcap scope, if any)
};
void sdpa_backward_(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& kpos,
                    const Tensor& qpos, const Tensor& dy, float scale, const SdpaBackwardOptions& opt = {});
// y += alpha * x (x broadcast to y)
void axpy_(Tensor& y, const Tensor& x, float alpha);

// ---- losses -----------------------------------------------------------------------------
// Per-row cross-entropy of logits (..., V) against int32/int64 targets (...): logsumexp(z) -
// z[t], 0 where t == ignore_index. With class_subset (K ids, int32/int64), z = logits[...,
// subset] and targets index the subset (classification on logits). f32 (f64 for f64 logits).
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, const Tensor& class_subset = {}, int ignore_index = -100);
void cross_entropy_(Tensor& loss, const Tensor& logits, const Tensor& targets, const Tensor& class_subset = {},
                    int ignore_index = -100);
// dlogits (..., V) = scale * dloss[row] * (softmax(z) - onehot(t)) on the columns of z, 0
// elsewhere and on ignored rows. dloss (...) is optional (all ones).
void cross_entropy_backward_(Tensor& dlogits, const Tensor& logits, const Tensor& targets, float scale, const Tensor& dloss = {},
                             const Tensor& class_subset = {}, int ignore_index = -100, bool accumulate = false);

// ---- optimizer --------------------------------------------------------------------------
// One in-place step of opt.kind (PyTorch's formulas; op.h lists them) on param with grad.
// state1/state2 are the optimizer's state tensors (param's shape, f32; f64 for f64 params),
// as many as optimizer_state_slots(opt) says (Adam: m, v; SGD with momentum: the buffer, ...);
// zero-initialised by the caller before step 1. opt.step is the 1-based step being taken.
void optimizer_step_(Tensor& param, const Tensor& grad, Tensor* state1, Tensor* state2, const OptimParams& opt);
// out (one element, f32/f64) = (accumulate ? out : 0) + sum of g^2 (for clipping by global norm).
void grad_norm_sq_(Tensor& out, const Tensor& g, bool accumulate = true);
const char* optim_name(OptimKind k);                   // "adamw", "adam", "adamax", "sgd", "rmsprop", "adadelta"
OptimKind optim_kind_from_name(const std::string& name);  // throws kv::Error listing the names

// ---- reductions over the last dimension -------------------------------------------------
// Results have the input's shape without its last dimension (f32, or f64 for f64 input).
Tensor sum_last(const Tensor& x);
Tensor max_last(const Tensor& x);
Tensor norm_last(const Tensor& x);

}  // namespace kv::ops
