// The reverse pass of one transformer block over one chunk (Transformer::block is the
// forward): MLP, output projection, attention through the cache, RoPE, q/k norm, the q/k/v
// projection and both norms, or a short convolution (short_conv.h) in attention's place.
// Weight gradients accumulate when a LayerGrads is given (full fine-tuning); adapter gradients
// accumulate through the model's LinearAdapters (LoRA).
#pragma once

#include "engine/model/transformer.h"
#include "model_grads.h"

namespace kv {

// Attention's part of the reverse pass: the cache knows which keys/values the chunk's queries
// saw and where gradients w.r.t. the cached entries go.
class AttentionBackward {
 public:
    virtual ~AttentionBackward() = default;
    // q (B, NH, n, HS) as the forward used it, dy (B, NH, n, HS) -> dq (B, NH, n, HS) and
    // dk, dv (B, G, n, HS) for this chunk's new keys and values (all freshly written).
    virtual void backward(int layer, const Tensor& q, const Tensor& dy, float scale, Tensor& dq, Tensor& dk, Tensor& dv) = 0;
    // A layer without a token cache (a short convolution) carries a state between chunks, so its
    // reverse pass carries that state's gradient the other way: the slot holds the gradient
    // w.r.t. the state at the end of the chunk being reversed (undefined = zero) and receives
    // the one w.r.t. the state at its start. Null: none is kept, and only a chunk at position 0
    // can be reversed (the layer's LayerAttention::layer_state counterpart).
    virtual Tensor* layer_state_grad(int layer) { (void)layer; return nullptr; }
};

// dx (B, n, E) of block(layer, x) at positions input_pos.. given dout (B, n, E).
Tensor block_backward(const Transformer& model, int layer, const Tensor& x, const BlockActivations& a, const Tensor& dout,
                      int64_t input_pos, AttentionBackward& attention, LayerGrads* grads);

// dW (out, in) += dy (..., out)^T x (..., in) over all rows; db (out) += column sums of dy.
void linear_weight_grad(Tensor& dw, Tensor* db, const Tensor& x, const Tensor& dy);

}  // namespace kv
