// gpt-oss's mixture-of-experts MLP (ModelConfig::experts_layer, MixtureOfExperts; transformers'
// GptOssMLP = GptOssTopKRouter + GptOssExperts). For each token h (E), with N experts of width I:
//
//   z = W_r h + b_r                                  router logits (N)
//   S = the top_k indices of z                       (ties: the lower index first)
//   w_e = softmax over e in S of z_e                 the selected experts' weights
//   [g ; u] = W_gu[e] h + b_gu[e]                    each selected expert's gate and up (I each)
//   g' = min(g, limit), u' = clamp(u, -limit, limit)
//   y_e = W_d[e] ((u' + 1) * g' * sigmoid(alpha g')) + b_d[e]
//   out = sum over e in S of w_e y_e
//
// The selection is piecewise constant: the reverse pass treats S as fixed and differentiates the
// softmax over the selected logits (so the router's weights and bias get their gradient through
// w). The experts' matrices run through the model's linear kernels on the tokens routed to each
// expert; routing, the clamped SwiGLU and the weighted sum are host loops in double (CPU only).
// Weights are held per expert in Linear layout: the checkpoint's x @ W matrices transposed and
// its interleaved gate/up columns (gate0, up0, gate1, ...) split into gate rows then up rows.
#pragma once

#include <string>

#include "engine/core/model_config.h"
#include "engine/model/model_grads.h"
#include "engine/model/transformer.h"

namespace kv {

// The router and the experts of one layer from their checkpoint names (prefix
// "model.layers.L."; formats/io/weight_names.h), converted to `dtype` on `device`. Throws
// kv::Error naming a missing or mis-shaped tensor, or MXFP4 blocks in place of the float experts.
void load_experts(const ModelConfig& cfg, const TensorMap& w, const std::string& prefix, DType dtype, Device device, LayerWeights& L);

// The layer's router and experts under their checkpoint names and in the checkpoint's layout
// (new tensors): what load_experts reads back.
TensorMap experts_state_dict(const ModelConfig& cfg, const LayerWeights& L, const std::string& prefix);

// h (B, n, E) -> the MLP's output (B, n, E) in `act`. With `save`, keeps the router logits
// (moe_logits), and in dispatch order (the selected (token, expert) pairs grouped by expert, tokens
// ascending) the gate/up pre-activations (gu), the SwiGLU outputs (a) and the experts' outputs
// (moe_out), which moe_mlp_backward reads beside h2.
Tensor moe_mlp(const ModelConfig& cfg, const LayerWeights& L, int layer, const Tensor& h, DType act, BlockActivations* save = nullptr);

// Reverse of moe_mlp: dout (B, n, E) w.r.t. its output -> dh (B, n, E) w.r.t. its input a.h2.
// Weight gradients accumulate into g's router_* and experts_* tensors when given.
Tensor moe_mlp_backward(const ModelConfig& cfg, const LayerWeights& L, int layer, const BlockActivations& a, const Tensor& dout,
                        LayerGrads* g);

}  // namespace kv
