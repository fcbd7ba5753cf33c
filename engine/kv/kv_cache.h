// The model-level KV cache: one LayerCache per layer built from "{policy}-{buffer}", the
// shared working buffer of quantized layers, replay logs and size accounting. It is the
// LayerAttention the transformer calls, so the model never knows which policy runs.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/model/attention.h"
#include "engine/core/model_config.h"
#include "engine/kv/chunk_input.h"
#include "engine/kv/layer_cache.h"

namespace kv {

struct BufferShared;

class KVCache final : public CacheAttention {
   public:
    // seq_length sizes dense caches whose cache_length is 0 (= the whole sequence).
    KVCache(const KVCacheConfig& cfg, const ModelConfig& model, Device device, DType act_dtype, int64_t seq_length = 0,
            const TextCodec* text = nullptr);
    ~KVCache() override;

    // Layer `layer`'s call with the chunk's inputs (LayerCache::attend); without them through
    // LayerAttention, or for one chunk of the model through ChunkCall (chunk_input.h).
    using CacheAttention::attend;
    void attend(int layer, const Tensor& q, const Tensor& k, const Tensor& v, int64_t input_pos, float scale, int window, Tensor& y,
                const ChunkInput& in) override;
    // Multi-head latent attention: the layer may run the chunk expanded (LayerCache::attend).
    using CacheAttention::attend_latent;
    void attend_latent(int layer, const Tensor& q, const Tensor& kv, int64_t input_pos, float scale, int window, Tensor& y,
                       LatentExpansion& ex, const ChunkInput& in) override {
        ChunkInput with = in;
        with.expansion = &ex;
        attend(layer, q, kv, kv, input_pos, scale, window, y, with);
    }
    // A KV-shared layer (ModelConfig::kv_layer) reads its source's LayerCache: it has no
    // K/V, bytes or policy of its own (LayerCache::attend_shared).
    void attend_shared(int layer, int source, const Tensor& q, int64_t input_pos, float scale, int window, Tensor& y) override;
    // Whether layer l reads another layer's cache (its own LayerCache stays empty).
    bool shared_layer(int l) const { return kv_source_[size_t(l)] != l; }
    int kv_source(int l) const { return kv_source_[size_t(l)]; }
    void set_rope_frequencies(const std::vector<double>* inv_freq) override {
        for (auto& l : layers_) l->set_rope_frequencies(inv_freq);
    }
    // Handed to layer `layer`'s policy when it reads W_o (policies/output_projection.h).
    void set_output_projection(int layer, const Tensor& wo) override;
    // Handed to layer `layer` for its next call (LayerCache::set_layer_input).
    void set_layer_input(int layer, const Tensor& h) override {
        if (layer >= 0 && layer < num_layers()) layers_[size_t(layer)]->set_layer_input(h);
    }
    // A layer without a token cache (a short convolution, ModelConfig::has_kv_cache) keeps its
    // state here; its LayerCache is never called and no policy acts on it. Null for other layers.
    LayerState* layer_state(int layer) override;
    // Bytes of those states (a few positions per channel, whatever the sequence length).
    size_t state_bytes() const;

    const std::string& name() const { return cfg_.name; }
    const KVCacheConfig& config() const { return cfg_; }
    int num_layers() const { return int(layers_.size()); }
    LayerCache& layer(int l) { return *layers_[size_t(l)]; }
    const LayerCache& layer(int l) const { return *layers_[size_t(l)]; }

    // Whether every layer keeps one slot row per KV head at a length fixed for the sequence, so
    // a copy of its buffer is the layout the gradient replay rebuilds (false when heads share a
    // pool or the policy decides layer lengths during the sequence).
    bool fixed_slot_layout() const;
    // Smallest cache length over layers, and the largest chunk every layer accepts next.
    int64_t min_cache_length() const;
    int64_t max_forward_length() const;

    void set_replay_logging(bool on);
    void set_step_hook(const LayerStepHook& hook);
    // Make the next call of every layer a prefill (new sequence).
    void reset();
    // Persist dirty working rows and offloaded layers (end of a pass).
    void flush();
    // Beam search: batch row b becomes row src[b] in every layer (position-only policies).
    void reorder_batch(const std::vector<int32_t>& src);
    // Free every layer's storage (the next prefill allocates again).
    void release_buffers();

    // Exact bytes of all K/V storage (+ the shared working buffer), and bits per element.
    size_t buffer_bytes() const;
    size_t working_bytes() const;
    // All layers' bytes of the slots kept (logical) and of what their buffers hold for them
    // (physical: whole paged blocks, whole pools; no working buffer).
    size_t logical_bytes() const;
    size_t physical_bytes() const;
    double bits_per_element() const;
    // cpu_offload: restores of a parked layer served by a prefetch, and copied on demand.
    std::pair<int64_t, int64_t> offload_restores() const;

   private:
    KVCacheConfig cfg_;
    std::shared_ptr<BufferShared> shared_;
    std::vector<std::unique_ptr<LayerCache>> layers_;
    std::vector<LayerState> states_;  // per layer; used by the layers without a token cache only
    std::vector<bool> stateful_;      // layer l has no token cache (its state is states_[l])
    std::vector<int> kv_source_;      // the layer whose cache layer l attends over (l itself unless shared)
};

}  // namespace kv
