// The reverse pass of one transformer block over one chunk (Transformer::block is the
// forward): MLP, output projection, attention through the cache, RoPE, q/k norm, the q/k/v
// projection and both norms, or a short convolution (short_conv.h) in attention's place;
// Gemma 3n's AltUp, LAUREL and gaussian top-k through altup_backward.h. Weight gradients accumulate when a LayerGrads is given (full fine-tuning); adapter gradients
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
    // Cross-layer KV sharing (ModelConfig::kv_layer): layer `layer`'s queries q attended over
    // layer `source`'s cache as it stood after the same chunk (window as the forward's); dq
    // (B, NH, n, HS) is written and the cached keys' and values' gradient joins the source's,
    // so the source's own reverse of that chunk, which runs after, carries it to its k/v
    // projection. This default refuses by name.
    virtual void backward_shared(int layer, int source, const Tensor& q, const Tensor& dy, float scale, int window, Tensor& dq);
};

// dx (B, n, E) of block(layer, x) at positions input_pos.. given dout (B, n, E).
Tensor block_backward(const Transformer& model, int layer, const Tensor& x, const BlockActivations& a, const Tensor& dout,
                      int64_t input_pos, AttentionBackward& attention, LayerGrads* grads);

// block_backward without Gemma 3n's AltUp around it: x is the block core's input (B, n, E).
Tensor block_core_backward(const Transformer& model, int layer, const Tensor& x, const BlockActivations& a, const Tensor& dout,
                           int64_t input_pos, AttentionBackward& attention, LayerGrads* grads);

// dW (out, in) += dy (..., out)^T x (..., in) over all rows; db (out) += column sums of dy.
void linear_weight_grad(Tensor& dw, Tensor* db, const Tensor& x, const Tensor& dy);

}  // namespace kv
