// Fidelity of a cache policy against the dense cache, per (layer, chunk): a LayerAttention that
// wraps a KVCache, keeps an uncompressed shadow of every K and V the layer received (memory
// category kv_fidelity) and, after the policy's attention, also attends over the full context
// with the same queries. It records how far the policy's attention output is from the full
// one and how much of the full attention mass falls on the tokens the policy kept.
// It only observes: the policy's output y is what the model continues with.
// Where the policy's attention is the plain SDPA over a buffer that stores the raw K/V (a
// full-precision buffer of the activations' dtype, e.g. `default` on an f32 model; not pooled
// per-head lengths (ada, duo), KIVI, quest's page reads or quantized buffers) and the device
// gives SDPA's log-sum-exp (CPU), full attention is not recomputed: the policy's output and
// log-sum-exp over the held positions are merged with attention over the evicted positions
// alone (merge_attention), and the kept mass is the held share of that merge. Elsewhere full
// attention runs over the shadow with attention-weight sums for the mass.
// With the oracle (set_oracle) a step also records the kept mass of the best set of the same size
// (the positions the chunk's queries weigh most, known in hindsight) and the policy's efficiency
// against it; it reads the weight on every position, so steps that dropped something take the
// full-attention path.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "chunk_plan.h"
#include "engine/kv/kv_cache.h"
#include "engine/model/transformer.h"

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
    // The oracle (set_oracle): the kept mass of the best set of the same size per (b, KV head)
    // row, known in hindsight: the positions the chunk's queries give the most full-attention
    // weight. Always >= kept_mass (both sum the same f32 weights in ascending order), 1 when
    // nothing was dropped. efficiency = kept_mass / oracle_mass (1 when the oracle keeps 0).
    double oracle_mass = 1;
    double efficiency = 1;
};

class FidelityAttention final : public CacheAttention {
   public:
    // seq_length: the longest sequence to be fed (sizes the shadow); batch B.
    FidelityAttention(KVCache& cache, const ModelConfig& model, int64_t batch, int64_t seq_length, Device device, DType dtype);

    // The cache's call with the chunk's inputs (its lse is this observer's own).
    using CacheAttention::attend;
    void attend(int layer, const Tensor& q, const Tensor& k, const Tensor& v, int64_t input_pos, float scale, int window, Tensor& y,
                const ChunkInput& in) override;
    void set_rope_frequencies(const std::vector<double>* inv_freq) override;
    void set_output_projection(int layer, const Tensor& wo) override;
    void set_layer_input(int layer, const Tensor& h) override;

    // Steps recorded since construction (or the last take_steps), in call order.
    const std::vector<FidelityStep>& steps() const { return steps_; }
    std::vector<FidelityStep> take_steps() { return std::move(steps_); }
    // Bytes of the shadow K/V (all layers).
    size_t shadow_bytes() const;
    // True when chunk `chunk` (index within the sequence) and every chunk before it had the
    // policy's attention output exactly equal to full attention in every layer seen so far:
    // the policy's residual stream then equals the dense-cache stream there (bit for bit, or to
    // the rounding of another slot order where the policy held every position on raw K/V).
    bool prefix_exact(int64_t chunk) const;
    // The raw K or V the layer received at positions [p0, p1), (B, G, p1 - p0, HS).
    Tensor shadow_k(int layer, int64_t p0, int64_t p1) const { return k_shadow_[size_t(layer)].slice(2, p0, p1); }
    Tensor shadow_v(int layer, int64_t p0, int64_t p1) const { return v_shadow_[size_t(layer)].slice(2, p0, p1); }
    // Layer 0's full-attention output at positions [p0, p1), (B, NH, p1 - p0, HS). Layer 0 sees
    // the embeddings, the same in every stream, so this is also the dense stream's layer 0
    // attention (DenseReference takes it instead of attending again).
    Tensor full_output0(int64_t p0, int64_t p1) const { return y0_.slice(2, p0, p1); }
    // Tests: false makes every step take the full-attention path (default true).
    void set_merge(bool on) { merge_ = on; }
    // Also the oracle's kept mass per step (FidelityStep::oracle_mass; default false). It needs
    // the full attention's weight on every position, so steps that dropped something take the
    // full-attention path instead of the merge.
    void set_oracle(bool on) { oracle_ = on; }
    // Steps that took the merge path so far (tests check that a case exercised it).
    int64_t merged_steps() const { return merged_steps_; }

   private:
    KVCache& cache_;
    std::vector<char> chunk_exact_;            // per chunk of the sequence: error exactly 0 in every layer
    int64_t T_ = 0;
    std::vector<Tensor> k_shadow_, v_shadow_;  // per layer (B, G, T, HS)
    Tensor y0_;                                // layer 0's full attention (B, NH, T, HS)
    std::vector<int64_t> chunk_;               // per layer: chunks seen in this sequence
    std::vector<FidelityStep> steps_;
    bool merge_ = true;
    bool oracle_ = false;
    int64_t merged_steps_ = 0;
};

// Online-softmax merge of two attentions of the same query rows over disjoint key sets A and
// E, each given with its per-row log-sum-exp (-inf where a row sees no key of the set): the
// attention over A and E together is wa y_a + we y_e with wa = exp(lse_a - lse), we =
// exp(lse_e - lse), lse = log(exp(lse_a) + exp(lse_e)), and wa is the share of its softmax
// mass on A. rows x HS values; y_out (rows x HS) and mass_out (rows) may be null.
struct AttentionMerge {
    double diff_sq = 0;  // sum over rows of |y_a - y_merged|^2 (= we^2 |y_a - y_e|^2)
    double full_sq = 0;  // sum over rows of |y_merged|^2
    double mass_a = 0;   // sum over rows of wa
};
// The kept mass of one (b, KV head) row and of its oracle: w[t] the full attention's weight on
// position t (summed over the chunk's queries, averaged over the group's heads), held[t] whether
// the policy kept t. Returns the weight on the dropped positions and (oracle_lost) on the
// end - kept lightest positions, each summed in f64 in ascending order: with the same values
// summed the same way, oracle_lost <= dropped exactly (rounding is monotone), so the oracle's
// kept mass is never below the policy's.
double dropped_weight(const float* w, const char* held, int64_t end, double* oracle_lost);

AttentionMerge merge_attention(const double* ya, const double* lse_a, const double* ye, const double* lse_e, int64_t rows, int64_t HS,
                               double* y_out = nullptr, double* mass_out = nullptr);

// Per-layer means over chunks of a set of steps (layers with no step are absent: index by
// .layer). Chunk 0 (the prefill attends over its raw K/V) is included.
struct FidelityLayerSummary {
    int layer = 0;
    int64_t steps = 0;
    double attn_rel_error = 0, kept_mass = 0, oracle_mass = 0, efficiency = 0;
};
std::vector<FidelityLayerSummary> summarize_fidelity(const std::vector<FidelityStep>& steps);

// Next-token KL of one chunk: mean over (b, position) of KL(p_dense || p_policy) in nats, where
// p_dense is the model's next-token distribution with dense attention in every layer and
// p_policy the one the policy's run produced (its residual stream, its final norm and lm_head).
// Not per layer: the divergence is a property of the whole stack.
struct FidelityKLStep {
    int64_t chunk = 0;      // index in the chunk plan
    int64_t input_pos = 0;  // first position of the chunk
    int64_t n = 0;
    double next_token_kl = 0;  // mean over the positions it was computed at (all n, or a sample)
};

// The dense reference for the next-token KL: a second residual stream that runs the same
// tokens through every layer with attention over its own uncompressed K/V (memory category
// kv_fidelity). It is the dense-cache model exactly, not an approximation from the policy's
// stream (whose K/V already carry the policy's error from the layers below).
// Given the policy run's FidelityAttention, the chunks of the exact prefix (policy output equal
// to full attention in every layer, FidelityAttention::prefix_exact) are not recomputed: the
// dense stream is the policy's stream there, so their K/V are copied from its shadow and their
// KL is exactly 0 (no lm_head). Until a policy first drops something, that is every chunk.
// The dense stream does not depend on the policy, so it runs after the policy's last cell, from
// the first chunk past the exact prefix, as prefills of up to 1024 tokens (large matmuls: far
// cheaper per token than the policy's chunk-sized steps); until then the policy's final-layer
// outputs of those chunks wait in a (B, T, E) buffer (kv_fidelity). Each chunk's KL then takes
// both streams' rows through one lm_head call.
class DenseReference {
   public:
    // kl_positions > 0: the KL of a chunk over that many evenly spaced positions (the chunk's
    // last included; every position when the chunk is no longer), so the lm_head covers
    // 2 x kl_positions rows per chunk instead of 2 x n; 0: every position.
    DenseReference(const Transformer& model, int64_t batch, int64_t seq_length, const FidelityAttention* policy = nullptr,
                   int64_t kl_positions = 0);
    ~DenseReference();
    // Takes the cell's policy final-layer outputs (before the final norm, DriverCallbacks::
    // final_output); after the plan's last cell, runs the dense stream and the KL of every chunk.
    void run_cell(const Tensor& ids, const ChunkPlan& plan, size_t cell, const std::vector<Tensor>& policy_outputs);
    // In chunk order, complete once run_cell has seen the plan's last cell.
    const std::vector<FidelityKLStep>& steps() const { return steps_; }
    std::vector<FidelityKLStep> take_steps() { return std::move(steps_); }
    size_t shadow_bytes() const;
    // Tokens per prefill of the dense stream (whole chunks, at least one; default 1024).
    void set_block_tokens(int64_t n) { block_tokens_ = n; }
    // Progress of the work after the last cell, in units of (layer, chunk) of the dense stream
    // and one per chunk's KL: progress_units(plan) in all, reported as they are done (the exact
    // prefix's at once), with the phase's name ("fidelity reference", "KL heads").
    using Progress = std::function<void(int64_t units, const char* phase)>;
    void set_progress(Progress p) { progress_ = std::move(p); }
    int64_t progress_units(const ChunkPlan& plan) const;

   private:
    class Shadow;
    void finish(const Tensor& ids, const ChunkPlan& plan);
    double chunk_kl(Tensor hd, Tensor hp, int64_t input_pos) const;
    const Transformer& model_;
    const FidelityAttention* policy_;
    int64_t kl_positions_;
    int64_t B_, T_;
    std::unique_ptr<Shadow> shadow_;
    Tensor policy_out_;       // (B, T, E): the policy's final-layer outputs past the exact prefix
    int64_t exact_end_ = 0;   // chunks [0, exact_end_) are the exact prefix
    int64_t block_tokens_ = 1024;
    std::vector<FidelityKLStep> steps_;
    Progress progress_;
};

// Mean over rows of KL(softmax(p) || softmax(q)) in nats, both (rows, V) logits, in f64.
double mean_kl_of_logits(const std::vector<float>& p, const std::vector<float>& q, int64_t rows, int64_t V);

// Means over every step of a run (samples and chunks): -1 when there is none.
double mean_next_token_kl(const std::vector<FidelityKLStep>& steps);

}  // namespace kv
