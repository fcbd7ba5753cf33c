// Fidelity of a cache policy against the dense cache, per (layer, chunk): a LayerAttention that
// wraps a KVCache, keeps an uncompressed shadow of every K and V the layer received (memory
// category kv_fidelity) and, after the policy's attention, also attends over the full context
// with the same queries. It records how far the policy's attention output is from the full
// one and how much of the full attention mass falls on the tokens the policy kept.
// It only observes: the policy's output y is what the model continues with.
#pragma once

#include <vector>

#include "engine/kv/kv_cache.h"

namespace kv {

// One (layer, chunk) step of a fidelity run. Means are over batch rows, query heads and the
// chunk's queries.
struct FidelityStep {
    int layer = 0;
    int64_t chunk = 0;      // chunk index within the sequence (0 = prefill)
    int64_t input_pos = 0;  // first position of the chunk
    int64_t n = 0;          // tokens in the chunk
    // ||y_policy - y_full||_F / ||y_full||_F over the chunk's (B, NH, n, HS) attention output,
    // y_full = softmax attention over every position up to each query (same q, raw K/V).
    double attn_rel_error = 0;
    // Mean over (b, head, query) of the full attention's weight on the positions the policy
    // held when it attended (1 when it kept everything).
    double kept_mass = 1;
};

class FidelityAttention final : public LayerAttention {
   public:
    // seq_length: the longest sequence to be fed (sizes the shadow); batch B.
    FidelityAttention(KVCache& cache, const ModelConfig& model, int64_t batch, int64_t seq_length, Device device, DType dtype);

    void attend(int layer, const Tensor& q, const Tensor& k, const Tensor& v, int64_t input_pos, float scale, Tensor& y) override;
    void set_rope_frequencies(const std::vector<double>* inv_freq) override;

    // Steps recorded since construction (or the last take_steps), in call order.
    const std::vector<FidelityStep>& steps() const { return steps_; }
    std::vector<FidelityStep> take_steps() { return std::move(steps_); }
    // Bytes of the shadow K/V (all layers).
    size_t shadow_bytes() const;

   private:
    KVCache& cache_;
    int64_t T_ = 0;
    std::vector<Tensor> k_shadow_, v_shadow_;  // per layer (B, G, T, HS)
    std::vector<int64_t> chunk_;               // per layer: chunks seen in this sequence
    std::vector<FidelityStep> steps_;
};

// Per-layer means over chunks of a set of steps (layers with no step are absent: index by
// .layer). Chunk 0 (the prefill attends over its raw K/V) is included.
struct FidelityLayerSummary {
    int layer = 0;
    int64_t steps = 0;
    double attn_rel_error = 0, kept_mass = 0;
};
std::vector<FidelityLayerSummary> summarize_fidelity(const std::vector<FidelityStep>& steps);

}  // namespace kv
