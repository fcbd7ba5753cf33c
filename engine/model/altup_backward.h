// The reverse pass of Gemma 3n's layer particulars (altup.h is the forward): AltUp's embedding,
// prediction, correction (with the per-layer input's gate and projection) and unembedding,
// LAUREL, and the MLP gate's gaussian top-k, whose cutoff mean + z std is differentiated as the
// forward defines it (the graph kept through the mean and the standard deviation, as
// transformers' Gemma3nTextMLP keeps it). The per-token maps run on the host in double; the
// matrices through the usual kernels. Weight gradients accumulate when grads are given.
#pragma once

#include <functional>

#include "engine/model/model_grads.h"
#include "engine/model/transformer.h"

namespace kv {

// dx (B, n, W) of Transformer::block(layer, x) given dnext (B, n, W): the correction's reverse
// gives the core's output gradient, `core_backward` (the block core's reverse) turns it into the
// active stream's, and the prediction's reverse takes it to x. `a` holds the forward's
// altup_pred, altup_active and altup_out.
Tensor altup_block_backward(const ModelConfig& c, const LayerWeights& L, int layer, const Tensor& x, const BlockActivations& a,
                            const Tensor& dnext, LayerGrads* g, const std::function<Tensor(const Tensor&)>& core_backward);

// d e (B, n, E) of altup_embed(ids, e) given dx0 (B, n, W), e = the scaled embeddings of ids;
// the model-level gradients (altup projections, per-layer table, projection and norm)
// accumulate into g when given.
Tensor altup_embed_backward(const ModelConfig& c, const AltUpWeights& aw, const Tensor& ids, const Tensor& e, const Tensor& dx0,
                            ModelGrads* g);

// dx (B, n, W) of altup_unembed(x) given dmerged (B, n, E); the unembedding projections'
// gradients accumulate into g when given.
Tensor altup_unembed_backward(const ModelConfig& c, const AltUpWeights& aw, const Tensor& x, const Tensor& dmerged, ModelGrads* g);

// LAUREL's branch RMSNorm(W_right W_left h) given the gradient d of its output (B, n, E):
// returns its share of dh (without the identity's) and accumulates the branch's weights'.
// left = W_left h, r = W_right left as the forward computed them.
Tensor laurel_backward(const ModelConfig& c, const LayerWeights& L, const Tensor& h, const Tensor& left, const Tensor& r,
                       const Tensor& d, LayerGrads* g);

// dgate in place: from the gradient w.r.t. gaussian_topk_'s output to the one w.r.t. its input
// gate_pre (..., I), the cutoff's mean and standard deviation included.
void gaussian_topk_backward_(Tensor& dgate, const Tensor& gate_pre, double sparsity);

}  // namespace kv
