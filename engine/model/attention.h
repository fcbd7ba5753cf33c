// What a transformer layer asks of its KV cache: take this chunk's rotated q, k, v, store
// k/v as the cache's policy decides, and write attention over everything the cache holds.
// The KV-cache engine (engine/kv) implements it; PlainAttention (no cache) lives here.
#pragma once

#include <map>
#include <utility>
#include <vector>

#include "engine/core/tensor.h"
#include "engine/model/latent_expansion.h"

namespace kv {

// What a layer without a token cache (a short convolution, ModelConfig::short_conv_layer)
// carries from one call to the next: its few last inputs, valid up to position next_pos.
struct LayerState {
    Tensor values;         // the mixer's own layout (short convolution: (B, conv_kernel - 1, E)); undefined = empty
    int64_t next_pos = 0;  // the position the next call must start at
};

class LayerAttention {
   public:
    virtual ~LayerAttention() = default;
    // q (B, NH, n, HS); k, v (B, G, n, HS) for the n new tokens at positions
    // input_pos .. input_pos + n - 1 (k already rotated). Writes y (B, NH, n, HS) (any strides).
    // window > 0 (the layer's sliding window, ModelConfig::layer_window): a query at position p
    // sees only keys at positions > p - window, whatever the cache still holds; an
    // implementation that cannot mask so must refuse window > 0 rather than ignore it.
    virtual void attend(int layer, const Tensor& q, const Tensor& k, const Tensor& v, int64_t input_pos, float scale, int window,
                        Tensor& y) = 0;
    // Cross-layer KV sharing (ModelConfig::kv_layer): layer `layer` computes no keys or values
    // and attends with its queries q (B, NH, n, HS) over what layer `source`'s call for the same
    // chunk (made just before, by the earlier block) left cached, with the same window. An
    // attention that cannot do so refuses by name (this default).
    virtual void attend_shared(int layer, int source, const Tensor& q, int64_t input_pos, float scale, int window, Tensor& y);
    // Multi-head latent attention's call (latent_attend): attend(q, kv, kv) with the latent
    // [RoPE(k_pe) ; c] as the one KV head's key and value, its queries absorbed. An attention
    // that stores the latents may instead run the chunk in the expanded form `ex` describes,
    // write ex.y and set ex.ran; this default runs the absorbed form.
    virtual void attend_latent(int layer, const Tensor& q, const Tensor& kv, int64_t input_pos, float scale, int window, Tensor& y,
                               LatentExpansion& ex) {
        ex.ensure_queries();
        attend(layer, q, kv, kv, input_pos, scale, window, y);
    }
    // Whether the keys and values handed to attend() are kept for later calls (a cache, or a
    // wrapper of one). False: nothing outlives the call, so a latent-attention layer need not
    // form the latents it would store and runs the expanded form (PlainAttention).
    virtual bool caches_tokens() const { return true; }
    // The RoPE frequencies theta'_d that rotated q and k (n_rot = 2 * size), set before every
    // attend(); caches whose policy reasons about future queries (expected-attention) use them.
    virtual void set_rope_frequencies(const std::vector<double>* inv_freq) { (void)inv_freq; }
    // Layer `layer`'s output projection W_o [E, NH * HS] (nn.Linear layout, packed or float),
    // set before every attend() like the frequencies; caches whose policy weighs a value by what
    // it adds to the layer's output (||W_o v||) read it.
    virtual void set_output_projection(int layer, const Tensor& wo) { (void)layer, (void)wo; }
    // Layer `layer`'s attention input h (B, n, E): the hidden states the q/k/v projections read
    // (after the attention norm), set before every attend() like the projection; caches whose
    // policy scores a token from its hidden state (a learned surrogate) read it.
    virtual void set_layer_input(int layer, const Tensor& h) { (void)layer, (void)h; }
    // The state of layer `layer` when it mixes tokens without attention (no attend() call is made
    // for it), kept between the calls of one sequence; null = this attention keeps none, so such a
    // layer runs only over a whole sequence from position 0.
    virtual LayerState* layer_state(int layer) { (void)layer; return nullptr; }
};

// No cache: causal attention over the n new tokens only (a plain forward over a whole
// sequence with input_pos 0, or a test reference).
// It keeps the last k, v of the layers named in retain(), for the layers that share them.
class PlainAttention final : public LayerAttention {
   public:
    void attend(int layer, const Tensor& q, const Tensor& k, const Tensor& v, int64_t input_pos, float scale, int window,
                Tensor& y) override;
    void attend_shared(int layer, int source, const Tensor& q, int64_t input_pos, float scale, int window, Tensor& y) override;
    bool caches_tokens() const override { return false; }
    // Keep the keys and values of these layers' next calls (the sources of shared layers).
    void retain(const std::vector<int>& layers) {
        for (int l : layers) kept_[l];
    }

   private:
    std::map<int, std::pair<Tensor, Tensor>> kept_;  // source layer -> its last k, v
};

// int32 (1, n) tensor holding start, start + 1, ..., start + n - 1 on `device`.
Tensor position_range(int64_t start, int64_t n, Device device);

}  // namespace kv
