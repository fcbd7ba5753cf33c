// SmolLM2-135M-Instruct's own attention inputs, captured once per test binary: the post-RoPE
// queries, keys and values that layers 0, 14 and 29 hand to attention over the first tokens of
// the GPL-3 licence text, with each layer's output projection and the RoPE frequencies, so the
// per-policy f64 references (policy_references.h) can be compared on a real model's activations
// as well as on random ones.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "kv_test_util.h"

namespace kv::test {

struct Smollm2Activations {
    std::string missing;                     // why there are none (the tests skip saying so); empty when captured
    std::map<int, LayerActivations> layers;  // by layer index
    std::map<int, std::vector<float>> wo;    // each captured layer's W_o (E, NH D), f32 row-major
    int64_t hidden = 0;                      // E
    std::vector<double> inv_freq;            // RoPE theta_i of the pairs (i, i + D/2)
};

inline constexpr int kSmollm2CapturedLayers[] = {0, 14, 29};
inline constexpr int64_t kSmollm2CapturedTokens = 256;

// Loads the model (dequantized to f32) and runs one forward; later calls return the same capture.
const Smollm2Activations& smollm2_activations();

}  // namespace kv::test
