// A preset's state dict round trip, for the families whose layers carry tensors of their own
// (latent attention, LFM2's convolutions, Gemma 3n's AltUp): model_state_dict holds exactly the
// random weights the model was built from, and loading it into a model with other weights gives
// the same logits. And a merged LoRA model's logits are the adapted model's.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

#include "engine/grad/lora.h"
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

// m's adapters (lora) given random B (seed `seed_name`): the model built from
// merged_lora_state_dict has the adapted model's logits within tol of max |logit| (1e-5: two f32
// forwards that differ in rounding only), and the adapters move the logits far more than that
// (so the comparison could fail).
inline void expect_merged_lora_logits(Transformer& m, const ModelConfig& cfg, Lora& lora, const std::string& seed_name,
                                      double tol = 1e-5) {
    std::mt19937_64 rng(seed_for(seed_name));
    for (auto& a : lora.adapters()) a.B.copy_from(random_tensor(a.B.shape(), a.B.dtype(), rng, -0.2, 0.2));
    m.set_context_width(64);
    const Tensor ids = Tensor::from_i32({1, 12}, {1, 5, 9, 30, 2, 7, 7, 100, 3, 44, 8, 6});
    const std::vector<float> base = m.forward(ids).to_f32_vector();
    m.set_adapters(&lora);
    const Tensor adapted = m.forward(ids);
    m.set_adapters(nullptr);
    Transformer merged(cfg, merged_lora_state_dict(m, lora), ModelOptions{});
    merged.set_context_width(64);
    const Comparison cmp = compare(merged.forward(ids), adapted);
    EXPECT_LE(cmp.max_abs_err, tol * cmp.ref_scale) << cmp.report;
    const std::vector<float> av = adapted.to_f32_vector();
    double diff = 0;
    for (size_t i = 0; i < av.size(); ++i) diff = std::max(diff, double(std::fabs(av[i] - base[i])));
    EXPECT_GT(diff, 100 * cmp.max_abs_err + 1e-4);
}

}  // namespace kv::test
