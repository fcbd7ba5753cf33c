// LoRA adapters (reference §10.2): y = W x + (alpha / r) * B (A x) on the chosen linear maps,
// A (r, in) kaiming-uniform, B (out, r) zeros, so training starts from the base model. The
// forward and the backward of the adapter branch sit side by side here; the transformer calls
// them through LinearAdapters. Names follow PEFT so saved adapters load in Hugging Face tools.
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
    double dropout = 0.0;                        // only 0 is supported (see lora.cpp)
    std::vector<std::string> targets{"q", "v"};  // any of q, k, v, proj, mlp, head
    uint64_t seed = 0;
};

// Parses "q,v" style target lists; throws kv::Error naming an unknown target.
std::vector<std::string> parse_lora_targets(const std::string& list);

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

    void add(int layer, LinearSite site, const Tensor& x, Tensor& y) const override;
    void backward(int layer, LinearSite site, const Tensor& x, const Tensor& dy, Tensor& dx) const override;

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
    std::vector<LoraAdapter> adapters_;
    std::map<std::pair<int, int>, std::vector<size_t>> index_;
};

}  // namespace kv
