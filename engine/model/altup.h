// Gemma 3n's residual stream (ModelConfig::altup; transformers' Gemma3nTextAltUp,
// Gemma3nTextLaurelBlock and the per-layer inputs of Gemma3nTextModel). With A streams of E, P
// per-layer channels and L layers, the hidden state between blocks is packed as
// (B, n, A E + L P): the streams x_0 .. x_{A-1}, then every layer's per-layer input.
//
//   embed:   x_0 = e = embed(ids) sqrt(E); x_i = M(W_i e, e) for i >= 1, where M(y, r) rescales
//            y to r's RMS (RMS floored at sqrt(1e-5)); per-layer input of layer l:
//            (RMSNorm_P((W_pl e)_l / sqrt(E)) + embed_pl(ids)_l sqrt(P)) / sqrt(2)
//   predict: m = tanh(W_router RMSNorm(x_a) / E); r = W_pred m as (A, A);
//            pred_i = x_i + sum_k r_ik x_k; the block runs on pred_a (block_core)
//   correct: c = W_corr tanh(W_router RMSNorm(out) / E) + 1; x_i = pred_i + c_i (out - pred_a);
//            then x_i += RMSNorm(W_proj(gelu(W_gate(x_a * s)) * pli_l)) for i >= 1
//   unembed: the mean of x_0 and M(U_i x_i, x_0), i >= 1, before the final norm
//
// LAUREL (inside the block): h + RMSNorm(W_right W_left h) beside attention, the sum with the
// attention's residual divided by sqrt(2). The small per-token maps (router, coefficients) run on
// the CPU over the activations in place, tokens in parallel: for f64 activations each token's
// arithmetic in double; for f32 / bf16 on f32 data (the sums, the mix and the correction's
// update in double lanes), vectorised per ISA level (altup_rows.h); the matrices through the usual kernels.
// CPU only.
#pragma once

#include <string>
#include <vector>

#include "engine/core/model_config.h"
#include "engine/model/transformer.h"

namespace kv {

// Layer and model tensors from their checkpoint names; throws kv::Error naming a missing or
// mis-shaped tensor. Correction coefficients are clamped to altup_coef_clip, as transformers
// clamps them before every correction.
void load_altup_layer(const ModelConfig& cfg, const TensorMap& w, const std::string& prefix, DType dtype, Device device,
                      LayerWeights& L);
AltUpWeights load_altup_model(const ModelConfig& cfg, const TensorMap& w, DType dtype, Device device);

// ids (B, T) and their scaled embeddings e (B, T, E) -> the packed state (B, T, A E + L P).
Tensor altup_embed(const ModelConfig& cfg, const AltUpWeights& aw, const Tensor& ids, const Tensor& e, DType act);

// AltUp's prediction for one layer: every stream predicted ((B n, A, E) in f32, f64 for f64
// activations) and the active one as the block's input (B, n, E) in `act`. For f32 / bf16
// activations without keep_pred (no reverse pass to feed) pred stays undefined: the correction
// recomputes each stream's prediction from x and the coefficients, saving a pass over memory.
struct AltUpPrediction {
    Tensor pred;
    Tensor active;
    Tensor active_host;          // active in the host dtype (f32 / f64)
    std::vector<double> coefs;   // f32 / bf16: the prediction coefficients r (B n, A, A)
};
AltUpPrediction altup_predict(const ModelConfig& cfg, const LayerWeights& L, const Tensor& x, DType act, bool keep_pred = true);

// The correction's coefficients (rows, A) and its scaled active stream `first` (B, n, E), made by
// the block's last residual add while each row is in cache (altup_post_mlp); altup_correct then
// takes them instead of a pass of its own over the block's output.
struct AltUpCoefs {
    std::vector<float> coef;
    Tensor first;
};
// out += RMSNorm(d) (norm_weight_offset + mlp_post_norm) in place, then c from out and active
// (the block's input, pred_a): f32 activations on the CPU with a post-MLP norm only; otherwise
// false, and nothing is done.
bool altup_post_mlp(const ModelConfig& cfg, const LayerWeights& L, const Tensor& active, const Tensor& d, Tensor& out, DType act,
                    AltUpCoefs* c);

// The correction after the block's output `out` (B, n, E), with layer `layer`'s per-layer input
// from x's packed tail -> the next packed state. With follow_layer (f32 activations only:
// altup_can_follow), follow receives follow_layer's prediction from that state, made row by row
// while each row is in cache: what altup_predict(cfg, *follow_layer, next, act, false) returns.
// pre: the coefficients altup_post_mlp made for this `out` (f32), used as they are.
Tensor altup_correct(const ModelConfig& cfg, const LayerWeights& L, int layer, const Tensor& x, const AltUpPrediction& p,
                     const Tensor& out, DType act, const LayerWeights* follow_layer = nullptr, AltUpPrediction* follow = nullptr,
                     const AltUpCoefs* pre = nullptr);
bool altup_can_follow(const ModelConfig& cfg, DType act);

// The packed state -> the merged stream (B, n, E), before the final norm.
Tensor altup_unembed(const ModelConfig& cfg, const AltUpWeights& aw, const Tensor& x, DType act);

// The attention's residual with LAUREL beside it: (x + PostNorm(o) + h + RMSNorm(W_right W_left h))
// / sqrt(2), x the block's input, o the attention's output projection (before its post-norm,
// when the layer has one), h the attention's input (after its norm), all (B, n, E). left and r,
// when given, receive W_left h and W_right W_left h (the reverse pass's inputs). f32 on the CPU
// in one pass over the rows (altup_rows), in the separate ops' order; otherwise through the ops.
Tensor laurel_residual(const ModelConfig& cfg, const LayerWeights& L, const Tensor& x, const Tensor& o, const Tensor& h, DType act,
                       Tensor* left = nullptr, Tensor* r = nullptr);

// Gaussian top-k of the MLP gate in place (ModelConfig activation_sparsity s > 0): per token,
// g -> relu(g - mean(g) - std(g) Phi^-1(s)), std over the row (population), Phi^-1(s) rounded to
// float32 as transformers evaluates it.
void gaussian_topk_(Tensor& gate, double sparsity);
// Phi^-1(p), the standard normal quantile, in double.
double normal_quantile(double p);

}  // namespace kv
