// Training through LFM2's gated short convolutions (the tiny-lfm2 preset): LoRA and full
// fine-tuning steps through an h2o cache over chunks that carry the convolutions' states, and
// the weights a fine-tuned model is saved with (the convolution's own tensors, loaded back
// exactly; a merged LoRA model whose logits are the adapted model's). Gradients against finite
// differences and against the whole sequence: grad_fd_test ("lfm2", Lfm2Gradient.*).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "engine/backend/backend_registry.h"
#include "engine/grad/lora.h"
#include "engine/model/model_loader.h"
#include "engine/model/presets.h"
#include "engine/train/model_weights.h"
#include "engine/train/qlora.h"
#include "engine/train/trainer.h"
#include "tests/engine/state_dict_util.h"
#include "tests/engine/family_train_util.h"
#include "tests/support/test_support.h"

namespace kv::test {
namespace {

RunConfig lfm2_run(const std::string& mode) { return family_train_run(mode, "tiny-lfm2", 11); }

TEST(Lfm2Train, LoraAndFullStepsThroughH2oLowerTheLoss) {
    SingleThread st;
    const ModelConfig cfg = preset_config("tiny-lfm2");
    int conv_layers = 0;
    for (int64_t l = 0; l < cfg.num_layers; ++l) conv_layers += cfg.short_conv_layer(l);
    ASSERT_EQ(conv_layers, 4);
    for (const std::string mode : {"finetune_long_lora", "finetune_long_full"}) {
        RunConfig c = lfm2_run(mode);
        c.train.lr = mode == "finetune_long_lora" ? 1e-2 : 1e-3;
        LoadedModel lm = load_model("tiny-lfm2", ModelOptions{}, seed_for("lfm2-train-" + mode));
        Trainer t(c, lm);
        const TrainStepRecord s1 = t.step();
        ASSERT_TRUE(std::isfinite(s1.loss)) << mode;
        EXPECT_GT(s1.grad_norm, 0.0) << mode;
        // Every convolution weight (LoRA: every convolution adapter's B; A's gradient is
        // B^T(...) = 0 at B = 0) received a gradient through the chunks' carried states.
        int conv = 0;
        for (const auto& p : t.params()) {
            if (p.name.find(".conv.") == std::string::npos) continue;
            if (mode == "finetune_long_lora" && p.name.find("lora_B") == std::string::npos) continue;
            EXPECT_TRUE(any_nonzero(*p.grad)) << mode << " " << p.name;
            ++conv;
        }
        // full: in_proj, taps and out_proj; LoRA: in_proj's and out_proj's adapters
        EXPECT_EQ(conv, conv_layers * (mode == "finetune_long_lora" ? 2 : 3)) << mode;
        const TrainStepRecord s2 = t.step();
        std::printf("%s on tiny-lfm2 through h2o: loss %.5f -> %.5f\n", mode.c_str(), s1.loss, s2.loss);
        EXPECT_LT(s2.loss, s1.loss) << mode;
    }
}

// QLoRA would pack the attention and MLP matrices to NF4 and leave the convolution's float: refused
// by name instead, for either way of keeping the base.
TEST(Lfm2Train, QloraIsRefusedByName) {
    const ModelConfig cfg = preset_config("tiny-lfm2");
    for (bool keep_packed : {true, false}) {
        Transformer m(cfg, random_weights(cfg, seed_for("lfm2-qlora"), DType::F32), ModelOptions{});
        try {
            (void)qlora_quantize_base(m, keep_packed);
            FAIL() << "QLoRA through LFM2's short convolutions was not refused";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("tiny-lfm2: layer 0 is a short convolution (LFM2); QLoRA through it is not implemented"),
                      std::string::npos)
                << e.what();
        }
    }
}

TEST(Lfm2Weights, StateDictIsTheCheckpointAndLoadsBackExactly) {
    expect_state_dict_round_trip("tiny-lfm2", "lfm2-state-dict");
}

TEST(Lfm2Weights, MergedLoraModelHasTheAdaptedLogits) {
    const ModelConfig cfg = preset_config("tiny-lfm2");
    Transformer m(cfg, random_weights(cfg, seed_for("lfm2-merge"), DType::F32), ModelOptions{});
    LoraConfig lc;
    lc.r = 4;
    lc.alpha = 8;
    lc.targets = {"q", "k", "v", "proj"};
    Lora lora(m, lc);
    int conv_adapters = 0;
    for (const auto& a : lora.adapters()) conv_adapters += a.module.find(".conv.") != std::string::npos;
    EXPECT_EQ(conv_adapters, 4 * 2);  // in_proj and out_proj of the four convolution layers
    expect_merged_lora_logits(m, cfg, lora, "lfm2-merge-b");
}

}  // namespace
}  // namespace kv::test
