// LFM2's gated short convolution (ModelConfig::short_conv_layer; transformers' Lfm2ShortConv):
// the token mixer of a layer that has no attention. With L = ModelConfig::conv_kernel,
//
//   [b ; c ; x] = W_in h                       three blocks of E channels (conv.in_proj)
//   u_t = b_t * x_t                            per channel
//   s_t = sum_{k<L} w[e, k] u_{t - (L-1) + k}  causal depthwise convolution (conv.conv, zeros before 0)
//   o_t = W_out (c_t * s_t)                    (conv.out_proj)
//
// Its only memory of earlier tokens is u of the last L - 1 positions per channel, kept in the
// LayerState the attention hands out (the KV cache holds it beside the token caches of the
// attention layers, and no policy acts on it). CPU only: computed on the host in double, and so
// is its reverse pass, whose state gradient crosses chunks the other way.
#pragma once

#include <string>

#include "engine/core/model_config.h"
#include "engine/model/attention.h"
#include "engine/model/model_grads.h"
#include "engine/model/transformer.h"

namespace kv {

// conv_in (3E, E), conv_taps (E, L) and conv_out (E, E) of one layer from their checkpoint names
// (prefix "model.layers.L."). Throws kv::Error naming a missing or mis-shaped tensor.
void load_short_conv(const ModelConfig& cfg, const TensorMap& w, const std::string& prefix, DType dtype, Device device,
                     LayerWeights& L);

// h (B, n, E) at positions input_pos.. -> the mixer's output (B, n, E) in `act`. `state` carries
// u of the last L - 1 positions between calls (reset at input_pos 0); null is allowed only at
// input_pos 0. Throws kv::Error naming the layer when the state does not end at input_pos.
// Adapters sit on in_proj (LinearSite::QKV, the layer's input projection) and out_proj
// (LinearSite::O); with `save`, keeps h and the conv_* activations short_conv_backward reads.
Tensor short_conv(const ModelConfig& cfg, const LayerWeights& L, int layer, const Tensor& h, int64_t input_pos, LayerState* state,
                  DType act, const LinearAdapters* adapters = nullptr, BlockActivations* save = nullptr);

// Reverse of short_conv over one chunk: dout (B, n, E) w.r.t. its output -> dh (B, n, E) w.r.t.
// its input a.h1. Weight gradients accumulate into g's conv_* tensors when given, adapter
// gradients through `adapters`. `dstate` carries the state's gradient between chunks reversed
// right to left: in, w.r.t. the state this chunk left (undefined = zero); out, w.r.t. the state it
// started from (undefined at position 0). Null dstate is refused past position 0, where the
// gradient would have to reach the chunk before.
Tensor short_conv_backward(const ModelConfig& cfg, const LayerWeights& L, int layer, const BlockActivations& a, const Tensor& dout,
                           int64_t input_pos, Tensor* dstate, const LinearAdapters* adapters, LayerGrads* g);

}  // namespace kv
