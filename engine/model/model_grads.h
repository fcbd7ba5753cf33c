// Gradients of the model's own weights (full fine-tuning), laid out like the weights they
// belong to (stacked q/k/v and gate/up included), in the gradients memory category.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "engine/model/transformer.h"

namespace kv {

struct LayerGrads {
    Tensor attn_norm, wqkv, bqkv, q_norm, k_norm, wo, bo, attn_post_norm, mlp_norm, mlp_post_norm, w_gate_up, w_down,
        sinks;  // undefined = none
    Tensor wq_a, q_a_norm, wq, wkv_a, kv_a_norm, wkv_b;  // latent attention's (LayerWeights), else undefined
    Tensor conv_in, conv_taps, conv_out;                 // a short convolution's (LayerWeights), else undefined
    Tensor router, router_bias, experts_gate_up, experts_gate_up_bias, experts_down,
        experts_down_bias;  // a mixture of experts' (LayerWeights), else undefined
    Tensor laurel_left, laurel_right, laurel_norm, altup_router_norm, altup_router, altup_pred, altup_corr, altup_out_scale,
        pli_gate, pli_proj, pli_norm;  // Gemma 3n's (LayerWeights), else undefined
};

struct ModelGrads {
    Tensor embed, norm, lm_head;  // lm_head undefined when tied (its gradient goes to embed)
    // Gemma 3n's model-level tensors (AltUpWeights), else undefined / empty
    Tensor embed_per_layer, per_layer_proj, per_layer_norm;
    std::vector<Tensor> altup_proj, altup_unembed;
    std::vector<LayerGrads> layers;
    bool tied = false;

    static ModelGrads zeros_like(const Transformer& model);
    void zero();
    // (weight, gradient) pairs with the weight's name, for optimizers and norms. Weight
    // tensors are the model's own (updated in place).
    std::vector<std::pair<std::string, std::pair<Tensor*, Tensor*>>> pairs(Transformer& model);
};

}  // namespace kv
