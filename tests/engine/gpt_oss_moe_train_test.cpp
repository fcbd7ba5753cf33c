// gpt-oss's mixture of experts in training: full fine-tuning through an evicting cache gives the
// router and every expert's matrices a gradient and lowers the loss; LoRA on the attention
// trains through the experts; the state dict is the checkpoint's layout and loads back; QLoRA
// is refused by name. (Forward against PyTorch: ModelFixture/gpt_oss_moe; gradients against finite
// differences: DenseGradient/gpt_oss_moe, LoraLayerTypeGradient/gpt_oss_moe.)
#include <gtest/gtest.h>

#include <cmath>

#include "engine/backend/backend_registry.h"
#include "engine/model/model_loader.h"
#include "engine/model/presets.h"
#include "engine/train/qlora.h"
#include "engine/train/trainer.h"
#include "tests/engine/state_dict_util.h"
#include "tests/engine/family_train_util.h"
#include "tests/support/test_support.h"

namespace kv::test {
namespace {

RunConfig gpt_oss_run(const std::string& mode) { return family_train_run(mode, "tiny-gpt-oss", 11); }

TEST(GptOssMoeTrain, LoraAndFullStepsThroughH2oLowerTheLoss) {
    SingleThread st;
    const ModelConfig cfg = preset_config("tiny-gpt-oss");
    ASSERT_TRUE(cfg.has_experts());
    for (const std::string mode : {"finetune_long_lora", "finetune_long_full"}) {
        RunConfig c = gpt_oss_run(mode);
        c.train.lr = mode == "finetune_long_lora" ? 1e-2 : 1e-3;
        LoadedModel lm = load_model("tiny-gpt-oss", ModelOptions{}, seed_for("gpt-oss-moe-train-" + mode));
        Trainer t(c, lm);
        const TrainStepRecord s1 = t.step();
        ASSERT_TRUE(std::isfinite(s1.loss)) << mode;
        EXPECT_GT(s1.grad_norm, 0.0) << mode;
        if (mode == "finetune_long_full") {
            // the router's weight and bias and the experts' four tensors in every layer
            int moe = 0;
            for (const auto& p : t.params()) {
                if (p.name.find(".mlp.router.") == std::string::npos && p.name.find(".mlp.experts.") == std::string::npos) continue;
                EXPECT_TRUE(any_nonzero(*p.grad)) << p.name;
                ++moe;
            }
            EXPECT_EQ(moe, 6 * cfg.num_layers);
        }
        const TrainStepRecord s2 = t.step();
        std::printf("%s on tiny-gpt-oss through h2o: loss %.5f -> %.5f\n", mode.c_str(), s1.loss, s2.loss);
        EXPECT_LT(s2.loss, s1.loss) << mode;
    }
}

// The experts' tensors go out in the checkpoint's layout (gate and up interleaved, x @ W) and
// come back exactly.
TEST(GptOssMoeWeights, StateDictIsTheCheckpointAndLoadsBackExactly) {
    expect_state_dict_round_trip("tiny-gpt-oss", "gpt-oss-moe-state-dict");
}

TEST(GptOssMoeTrain, QloraIsRefusedByName) {
    const ModelConfig cfg = preset_config("tiny-gpt-oss");
    for (bool keep_packed : {true, false}) {
        Transformer m(cfg, random_weights(cfg, seed_for("gpt-oss-qlora"), DType::F32), ModelOptions{});
        try {
            (void)qlora_quantize_base(m, keep_packed);
            FAIL() << "QLoRA through the experts was not refused";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("tiny-gpt-oss: QLoRA through a mixture-of-experts MLP (gpt-oss) is not implemented"),
                      std::string::npos)
                << e.what();
        }
    }
}

}  // namespace
}  // namespace kv::test
