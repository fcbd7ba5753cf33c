// Which InsertFeatures (kv_policy.h) a policy reads, as one value: KVPolicy::needs_features()
// and a Python policy's declared needs (ExternalNeeds, policy_runtime.h).
#pragma once

#include <cstdint>
#include <initializer_list>

namespace kv {

// LayerCache::features computes only the features a policy names. A new feature is one entry
// here, its InsertFeatures field and its line in LayerCache::features (and, for Python
// policies, its row in python/src/policies.cpp's name table and its ExternalFeatures field).
enum class Feature : uint32_t {
    ValueNorm = 1u << 0,     // value_norm
    KeyNorm = 1u << 1,       // key_norm
    QuantError = 1u << 2,    // quant_error
    KeyVectors = 1u << 3,    // keys, head_dim
    ValueVectors = 1u << 4,  // values, head_dim
    QueryVectors = 1u << 5,  // queries, query_heads, rope_inv_freq, attn_scale
    HiddenStates = 1u << 6,  // hidden, hidden_size: the layer's attention input (after its norm)
};

// A set of Features: `return {Feature::KeyVectors, Feature::ValueNorm};`, `inner | Feature::X`.
class FeatureSet {
   public:
    constexpr FeatureSet() = default;
    constexpr FeatureSet(Feature f) : bits_(uint32_t(f)) {}
    constexpr FeatureSet(std::initializer_list<Feature> fs) {
        for (Feature f : fs) bits_ |= uint32_t(f);
    }
    constexpr bool has(Feature f) const { return (bits_ & uint32_t(f)) != 0; }
    constexpr bool empty() const { return bits_ == 0; }
    constexpr FeatureSet operator|(FeatureSet o) const { return from_bits(bits_ | o.bits_); }
    constexpr FeatureSet& operator|=(FeatureSet o) { return bits_ |= o.bits_, *this; }
    constexpr bool operator==(const FeatureSet&) const = default;

   private:
    static constexpr FeatureSet from_bits(uint32_t b) {
        FeatureSet s;
        s.bits_ = b;
        return s;
    }
    uint32_t bits_ = 0;
};

}  // namespace kv
