// LoRA adapters (reference §10.2): y = W x + (alpha / r) * B A dropout(x) on the chosen linear
// maps, A (r, in) kaiming-uniform, B (out, r) zeros, so training starts from the base model. The
// forward and the backward of the adapter branch sit side by side here; the transformer calls
// them through LinearAdapters. Names follow PEFT so saved adapters load in Hugging Face tools.
// Dropout (inverted: kept inputs scaled by 1 / (1 - p)) acts only inside a training pass
// (begin_training_pass), never in validation, evaluation or generation. Its mask is not drawn
// from a stateful generator but from a hash of (seed, pass, layer, site, batch row, absolute
// token position, input column): phase 1, the phase-2 recompute of every cell and finite
// differences of the same pass all see one mask. One mask per (layer, site) input: q, k and v
// share theirs as in LitGPT's fused qkv LoRA (gate and up share theirs too; LitGPT draws two).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "engine/model/adapters.h"
#include "engine/model/transformer.h"

namespace kv {

struct LoraConfig {
    int64_t r = 8;
    double alpha = 16.0;
    double dropout = 0.0;                        // probability in [0, 1) of dropping an input element
    std::vector<std::string> targets{"q", "v"};  // any of q, k, v, proj, mlp, head
    uint64_t seed = 0;
};

// Parses "q,v" style target lists; throws kv::Error naming an unknown target.
std::vector<std::string> parse_lora_targets(const std::string& list);

// LoRA dropout's draw for input element (row, position, column) of a site: uniform in [0, 1)
// from a counter-based hash; the element is kept when the draw is >= p.
double lora_dropout_uniform(uint64_t seed, uint64_t pass, int layer, LinearSite site, int64_t row, int64_t position,
                            int64_t column);

struct LoraAdapter {
    int layer = 0;  // -1: the head
    LinearSite site = LinearSite::QKV;
    int64_t col0 = 0, col1 = 0;  // output columns of the site this adapter adds to
    std::string module;          // PEFT module path, e.g. "model.layers.3.self_attn.q_proj"
    Tensor A, B;                 // (r, in), (out, r)
    Tensor dA, dB;               // gradients, same shapes
};

class Lora final : public LinearAdapters {
 public:
    // Adapters for every layer and target of `model`, in the model's activation dtype.
    Lora(const Transformer& model, const LoraConfig& cfg);

    void add(int layer, LinearSite site, const Tensor& x, int64_t input_pos, Tensor& y) const override;
    void backward(int layer, LinearSite site, const Tensor& x, int64_t input_pos, const Tensor& dy, Tensor& dx) const override;

    // Dropout masks are drawn between begin and end, keyed on `pass` (the trainer's micro-batch
    // counter: a resumed run draws the same masks). Without dropout these change nothing.
    void begin_training_pass(uint64_t pass);
    void end_training_pass();
    bool in_training_pass() const { return training_; }
    // Inverted-dropout multipliers (B, n, in) of x (B, n, in) at positions input_pos.. (0 or
    // 1 / (1 - p), x's dtype and device); undefined outside a training pass or with p = 0.
    Tensor dropout_mask(int layer, LinearSite site, const Tensor& x, int64_t input_pos) const;

    const LoraConfig& config() const { return cfg_; }
    float scale() const { return float(cfg_.alpha / double(cfg_.r)); }
    std::vector<LoraAdapter>& adapters() { return adapters_; }
    const std::vector<LoraAdapter>& adapters() const { return adapters_; }
    void zero_grad();
    // PEFT-named tensors "base_model.model.<module>.lora_A.weight" / "lora_B.weight".
    TensorMap state_dict() const;
    // Loads adapters saved by state_dict (throws kv::Error on a missing or mis-shaped tensor).
    void load_state_dict(const TensorMap& tensors);
    int64_t parameter_count() const;

 private:
    const std::vector<size_t>& at(int layer, LinearSite site) const;
    LoraConfig cfg_;
    bool training_ = false;
    uint64_t pass_ = 0;
    std::vector<LoraAdapter> adapters_;
    std::map<std::pair<int, int>, std::vector<size_t>> index_;
};

}  // namespace kv
