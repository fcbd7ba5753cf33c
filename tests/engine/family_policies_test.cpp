// eval_long's driver with h2o, snapkv and quest on every architecture family's fixture (issue
// 40): windowed layers keep their window by rule, KV-shared layers read their source's cache,
// layers without a token cache hold none, and the policy acts on the layers that keep
// everything. An 8-slot cache (quest: pages of 2, 2 of them read) over the fixture's tokens
// through a prefill of 6, chunks of 2 and single tokens; every next token is scored.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>

#include "engine/core/layer_kind.h"
#include "engine/driver/long_context.h"
#include "engine/kv/kv_cache.h"
#include "engine/kv/kv_config.h"
#include "engine/kv/layer_cache.h"
#include "engine/model/transformer.h"
#include "formats/io/hf_folder.h"
#include "formats/io/safetensors_file.h"
#include "tests/engine/fixture_driver_util.h"

namespace kv {
namespace {

constexpr int64_t kSlots = 8;

class FamilyPolicies : public testing::TestWithParam<std::tuple<const char*, const char*>> {};

TEST_P(FamilyPolicies, EvalLongDriverRunsAndThePolicyActsOnTheFullLayersOnly) {
    const auto [name, policy] = GetParam();
    const std::string dir = std::string(KVLAB_SOURCE_DIR) + "/tests/fixtures/models/" + name;
    const HfModelFolder folder = load_hf_model_folder(dir);
    const SafetensorsContents expected = load_safetensors(dir + "/expected.safetensors");
    const ModelConfig& mc = folder.config;
    ModelOptions opt;
    opt.rope = RopeMode::YARN;  // as the fixtures were written
    Transformer model(mc, folder.weights, opt);
    model.set_context_width(std::stoll(expected.metadata.at("context_width")));
    // the first row of the fixture's longest input
    int longest = 0;
    const int inputs = std::stoi(expected.metadata.at("inputs"));
    for (int j = 1; j < inputs; ++j)
        if (expected.tensors.at("input_ids." + std::to_string(j)).size(1) > expected.tensors.at("input_ids." + std::to_string(longest)).size(1))
            longest = j;
    const Tensor ids = expected.tensors.at("input_ids." + std::to_string(longest)).slice(0, 0, 1).contiguous();
    const int64_t T = ids.size(1);
    ASSERT_GT(T, kSlots + 6) << "too few tokens for the cache to evict";

    KVCacheConfig kc;
    kc.name = std::string(policy) + "-default";
    if (std::string(policy) == "quest") {
        kc.cache_length = 0;  // quest keeps every page and reads a few
        kc.policy_options = {{"quest_page_size", 2}, {"quest_pages", 2}};
    } else {
        kc.cache_length = kSlots;
    }
    KVCache cache(kc, mc, Device{}, DType::F32, T);
    ChunkPlan plan = test::fixture_chunk_plan(T);
    if (mc.any_kv_shared()) {  // a KV-shared reader needs its source as of the same chunk: one chunk per cell, as eval_long plans it
        plan.cells.clear();
        for (size_t c = 0; c < plan.chunks.size(); ++c) plan.cells.push_back({c, c + 1});
    }
    const HeadResult res = test::drive_next_token(model, cache, ids, plan, cache);
    ASSERT_EQ(res.count[0], double(T - 1));
    EXPECT_TRUE(std::isfinite(res.loss_sum[0])) << res.loss_sum[0];

    int acting = 0, full = 0;
    for (int l = 0; l < mc.num_layers; ++l) {
        if (cache.shared_layer(l)) continue;  // reads layer kv_source(l)'s cache, holds nothing itself
        const KVPolicy& p = cache.layer(l).policy();
        const std::string got = p.name();
        if (mc.layer_spec(l).mixer == LayerMixer::SHORT_CONV) {  // a convolution state, no token cache
            EXPECT_EQ(p.current_length(), 0) << "layer " << l << " is a convolution";
            continue;
        }
        if (mc.layer_window(l) > 0) {
            EXPECT_EQ(got, "window") << "layer " << l << " is windowed (" << mc.layer_window(l) << ")";
            continue;
        }
        ++full;
        EXPECT_EQ(got, policy) << "layer " << l << " keeps everything: the policy acts there";
        if (got != policy) continue;
        ++acting;
        if (std::string(policy) != "quest") {
            EXPECT_EQ(p.current_length(), kSlots) << "layer " << l << " must hold its " << kSlots << " slots after evicting";
        }
    }
    // Mistral's and Phi-3's fixtures window every layer: nothing is left to the policy there.
    EXPECT_EQ(acting, full);
    EXPECT_TRUE(full > 0 || std::string(name) == "mistral_window" || std::string(name) == "phi3_partial") << name << ": no full layer";
}

INSTANTIATE_TEST_SUITE_P(
    Families, FamilyPolicies,
    testing::Combine(testing::Values("mistral_window", "qwen2_window", "gemma2_alternating", "gemma3_interleaved", "gemma3_kv_shared",
                                     "gemma3n_text", "phi3_partial", "smollm3_nope", "olmo2_postnorm", "gpt_oss_sinks", "gpt_oss_moe",
                                     "deepseek_v2_mla", "lfm2_hybrid"),
                     testing::Values("h2o", "snapkv", "quest")),
    [](const testing::TestParamInfo<FamilyPolicies::ParamType>& i) {
        return std::string(std::get<0>(i.param)) + "_" + std::get<1>(i.param);
    });

// The run summary's layer_kinds (and the views' layer labels) from each fixture's config.json:
// Gemma 3 (sliding_window_pattern 3: layers 0, 1, 3 windowed by 5), Gemma 3n (layer_types, its
// last 3 layers reading the last earlier layer of their type), LFM2 (conv / full_attention),
// SmolLM3 (every 4th layer NoPE by default).
TEST(LayerKind, NamesWhatEachFamilysLayersCache) {
    auto kinds = [](const char* name) {
        const ModelConfig mc = load_hf_model_folder(std::string(KVLAB_SOURCE_DIR) + "/tests/fixtures/models/" + name).config;
        std::vector<std::string> out;
        for (int64_t l = 0; l < mc.num_layers; ++l) out.push_back(layer_kind(mc, l));
        return out;
    };
    using V = std::vector<std::string>;
    EXPECT_EQ(kinds("gemma3_interleaved"), (V{"window 5", "window 5", "full", "window 5"}));
    EXPECT_EQ(kinds("gemma3n_text"),
              (V{"window 5", "window 5", "full", "shared with layer 1", "shared with layer 1", "shared with layer 2"}));
    EXPECT_EQ(kinds("lfm2_hybrid"), (V{"convolution", "full", "convolution", "full"}));
    EXPECT_EQ(kinds("smollm3_nope"), (V{"full", "full", "full", "full, NoPE", "full"}));
    EXPECT_EQ(kinds("mistral_window"), (V(kinds("mistral_window").size(), "window 5")));
}

}  // namespace
}  // namespace kv
