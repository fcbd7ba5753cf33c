// Training through multi-head latent attention (DeepSeek-V2's tiny-mla preset): LoRA and full
// fine-tuning steps through an h2o cache, and the weights a fine-tuned model is saved with: the
// checkpoint's own tensors (loader permutations undone, W_o unpadded), loaded back exactly, and
// a merged LoRA model whose logits are the adapted model's. (Gradients against finite
// differences: grad_fd_test, DenseGradient and LoraLayerTypeGradient "mla", "mla_qlora".)
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

RunConfig mla_run(const std::string& mode) { return family_train_run(mode, "tiny-mla", 11); }

TEST(LatentAttentionTrain, LoraAndFullStepsThroughH2oLowerTheLoss) {
    SingleThread st;
    for (const std::string mode : {"finetune_long_lora", "finetune_long_full"}) {
        RunConfig c = mla_run(mode);
        c.train.lr = mode == "finetune_long_lora" ? 1e-2 : 1e-3;
        LoadedModel lm = load_model("tiny-mla", ModelOptions{}, seed_for("mla-train-" + mode));
        Trainer t(c, lm);
        const TrainStepRecord s1 = t.step();
        ASSERT_TRUE(std::isfinite(s1.loss)) << mode;
        EXPECT_GT(s1.grad_norm, 0.0) << mode;
        // Every latent projection (and, for LoRA, every adapter's B: A's gradient is B^T(...) = 0
        // at B = 0) received a gradient through the cache's replay.
        int latent = 0;
        for (const auto& p : t.params()) {
            const bool is_latent =
                p.name.find("kv_a_proj") != std::string::npos || p.name.find("kv_b_proj") != std::string::npos ||
                p.name.find("q_b_proj") != std::string::npos || p.name.find("q_a_proj") != std::string::npos ||
                p.name.find("_a_layernorm") != std::string::npos;
            const bool lora_b = p.name.find("lora_B") != std::string::npos;
            if (mode == "finetune_long_lora" ? lora_b : is_latent) {
                EXPECT_TRUE(any_nonzero(*p.grad)) << mode << " " << p.name;
                latent += is_latent;
            }
        }
        EXPECT_GE(latent, 4 * 3) << mode << ": q_b, kv_a and kv_b of every layer";
        const TrainStepRecord s2 = t.step();
        std::printf("%s on tiny-mla through h2o: loss %.5f -> %.5f\n", mode.c_str(), s1.loss, s2.loss);
        EXPECT_LT(s2.loss, s1.loss) << mode;
    }
}

TEST(LatentAttentionWeights, StateDictIsTheCheckpointAndLoadsBackExactly) {
    expect_state_dict_round_trip("tiny-mla", "mla-state-dict");
}

TEST(LatentAttentionWeights, MergedLoraModelHasTheAdaptedLogits) {
    const ModelConfig cfg = preset_config("tiny-mla");
    Transformer m(cfg, random_weights(cfg, seed_for("mla-merge"), DType::F32), ModelOptions{});
    LoraConfig lc;
    lc.r = 4;
    lc.alpha = 8;
    lc.targets = {"q", "k", "v", "proj"};
    Lora lora(m, lc);
    expect_merged_lora_logits(m, cfg, lora, "mla-merge-b");
}

}  // namespace
}  // namespace kv::test
