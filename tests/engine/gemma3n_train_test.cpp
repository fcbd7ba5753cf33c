// Training through Gemma 3n's particulars (the tiny-gemma3n preset: AltUp, LAUREL, per-layer
// inputs, the gaussian top-k gate, KV-shared layers): LoRA and full fine-tuning steps through an
// h2o cache lower the loss, and every particular's weights receive a gradient. Gradients against
// finite differences and against the whole sequence: grad_fd_test (Gemma3nGradient.*,
// DenseGradient and LoraLayerTypeGradient "gemma3n").
#include <gtest/gtest.h>

#include <cmath>

#include <random>

#include "engine/backend/backend_registry.h"
#include "engine/grad/lora.h"
#include "engine/model/model_loader.h"
#include "engine/model/presets.h"
#include "engine/train/model_weights.h"
#include "engine/train/trainer.h"
#include "tests/engine/state_dict_util.h"
#include "tests/engine/family_train_util.h"
#include "tests/support/test_support.h"

namespace kv::test {
namespace {

RunConfig gemma3n_run(const std::string& mode) { return family_train_run(mode, "tiny-gemma3n", 12); }

TEST(Gemma3nTrain, LoraAndFullStepsThroughH2oLowerTheLoss) {
    SingleThread st;
    const ModelConfig cfg = preset_config("tiny-gemma3n");
    ASSERT_TRUE(cfg.altup_enabled());
    ASSERT_TRUE(cfg.kv_shared(4) && cfg.kv_shared(5));
    for (const std::string mode : {"finetune_long_lora", "finetune_long_full"}) {
        RunConfig c = gemma3n_run(mode);
        c.train.lr = mode == "finetune_long_lora" ? 1e-2 : 1e-3;
        LoadedModel lm = load_model("tiny-gemma3n", ModelOptions{}, seed_for("gemma3n-train-" + mode));
        Trainer t(c, lm);
        const TrainStepRecord s1 = t.step();
        ASSERT_TRUE(std::isfinite(s1.loss)) << mode;
        EXPECT_GT(s1.grad_norm, 0.0) << mode;
        int particular = 0, shared_q = 0;
        for (const auto& p : t.params()) {
            if (mode == "finetune_long_lora") {
                // q on the shared layers 4 and 5 (they have no k_proj or v_proj); B's gradient only (A's is B^T(...) = 0 at B = 0)
                if (p.name.find("lora_B") == std::string::npos) continue;
                EXPECT_TRUE(any_nonzero(*p.grad)) << mode << " " << p.name;
                shared_q += p.name.find("layers.4.self_attn.q_proj") != std::string::npos ||
                            p.name.find("layers.5.self_attn.q_proj") != std::string::npos;
                EXPECT_EQ(p.name.find("layers.4.self_attn.k_proj"), std::string::npos) << p.name;
                continue;
            }
            bool is_particular = false;
            for (const char* k : {".altup.", ".laurel.", "per_layer", "altup_"}) is_particular = is_particular || p.name.find(k) != std::string::npos;
            if (!is_particular) continue;
            EXPECT_TRUE(any_nonzero(*p.grad)) << mode << " " << p.name;
            ++particular;
        }
        if (mode == "finetune_long_lora") EXPECT_EQ(shared_q, 2);
        else EXPECT_EQ(particular, 6 * 11 + 3 + 2 * 3) << mode;  // per layer 11; table, projection, norm; 3 + 3 stream maps
        const TrainStepRecord s2 = t.step();
        std::printf("%s on tiny-gemma3n through h2o: loss %.5f -> %.5f\n", mode.c_str(), s1.loss, s2.loss);
        EXPECT_LT(s2.loss, s1.loss) << mode;
    }
}

// A fine-tuned model is saved with every Gemma 3n tensor under its checkpoint name: the state
// dict holds exactly the weights the model was built from (a KV-shared layer's k_proj / v_proj,
// never read, as loaded), and loading it into a model with other weights gives the same logits.
TEST(Gemma3nWeights, StateDictIsTheCheckpointAndLoadsBackExactly) {
    test::expect_state_dict_round_trip("tiny-gemma3n", "gemma3n-state-dict");
    // Gemma 3n's own tensors are among the weights the round trip found in the state dict
    const TensorMap w = random_weights(preset_config("tiny-gemma3n"), seed_for("gemma3n-state-dict"), DType::F32);
    EXPECT_TRUE(w.count("model.altup_projections.2.weight") && w.count("model.embed_tokens_per_layer.weight") &&
                w.count("model.layers.5.laurel.linear_left.weight") && w.count("model.layers.4.self_attn.k_proj.weight"));
}

// LoRA on q of the KV-shared layers (their wqkv is q_proj alone) merges into a model whose
// logits are the adapted model's.
TEST(Gemma3nWeights, MergedLoraModelHasTheAdaptedLogits) {
    const ModelConfig cfg = preset_config("tiny-gemma3n");
    Transformer m(cfg, random_weights(cfg, seed_for("gemma3n-merge"), DType::F32), ModelOptions{});
    LoraConfig lc;
    lc.r = 4;
    lc.alpha = 8;
    lc.targets = {"q", "k", "v", "proj", "mlp"};
    Lora lora(m, lc);
    EXPECT_EQ(lora.adapters().size(), size_t(5 * 6 + 2 * 4));  // q, proj and the MLP's 3 everywhere; k, v on layers 0-3
    // 3e-5: Gemma 3n's random decoder amplifies rounding (tools/reference/gemma3n_sensitivity.py);
    // the merged and the adapted f32 forwards were up to 1.12e-5 of max |logit| apart over test
    // seeds 1-30 (AVX2), above the other families' 1e-5.
    expect_merged_lora_logits(m, cfg, lora, "gemma3n-merge-b", 3e-5);
}

}  // namespace
}  // namespace kv::test
