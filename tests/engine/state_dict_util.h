// A preset's state dict round trip, for the families whose layers carry tensors of their own
// (latent attention, LFM2's convolutions): model_state_dict holds exactly the random weights the
// model was built from, and loading it into a model with other weights gives the same logits.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "engine/model/presets.h"
#include "engine/model/transformer.h"
#include "engine/train/model_weights.h"
#include "tests/support/test_support.h"

namespace kv::test {

inline void expect_state_dict_round_trip(const std::string& preset, const std::string& seed_name) {
    const ModelConfig cfg = preset_config(preset);
    const TensorMap w = random_weights(cfg, seed_for(seed_name), DType::F32);
    Transformer m(cfg, w, ModelOptions{});
    const TensorMap sd = model_state_dict(m);
    EXPECT_EQ(sd.size(), w.size());
    for (const auto& [name, t] : w) {
        auto it = sd.find(name);
        ASSERT_NE(it, sd.end()) << name;
        ASSERT_EQ(it->second.shape(), t.shape()) << name;
        EXPECT_EQ(it->second.contiguous().to_f32_vector(), t.to_f32_vector()) << name;
    }
    Transformer other(cfg, random_weights(cfg, seed_for(seed_name) + 1, DType::F32), ModelOptions{});
    load_model_state_dict(other, sd);
    other.set_context_width(64);
    m.set_context_width(64);
    const Tensor ids = Tensor::from_i32({1, 12}, {1, 5, 9, 30, 2, 7, 7, 100, 3, 44, 8, 6});
    EXPECT_EQ(m.forward(ids).to_f32_vector(), other.forward(ids).to_f32_vector());
}

}  // namespace kv::test
