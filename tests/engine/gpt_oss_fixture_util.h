// The gpt-oss sinks fixture (tests/fixtures/models/gpt_oss_sinks) through eval_long's driver, as
// the sink tests of the full-layer and pooled caches run it: the model with YaRN RoPE, a cache
// of 8 slots, the fixture's 37 tokens in fixture_chunk_plan's chunks; the test's own
// CacheAttention observes every call.
#pragma once

#include <algorithm>
#include <memory>
#include <string>

#include "engine/kv/kv_cache.h"
#include "engine/kv/kv_config.h"
#include "engine/model/transformer.h"
#include "formats/io/hf_folder.h"
#include "formats/io/safetensors_file.h"
#include "tests/engine/fixture_driver_util.h"

namespace kv::test {

inline std::string gpt_oss_fixture_dir() { return std::string(KVLAB_SOURCE_DIR) + "/tests/fixtures/models/gpt_oss_sinks"; }
// The same attention with gpt-oss's mixture of experts in every layer (4 experts, 2 per token).
inline std::string gpt_oss_moe_fixture_dir() { return std::string(KVLAB_SOURCE_DIR) + "/tests/fixtures/models/gpt_oss_moe"; }

struct GptOssDriverRun {
    HfModelFolder mf = load_hf_model_folder(gpt_oss_fixture_dir());
    SafetensorsContents expected = load_safetensors(gpt_oss_fixture_dir() + "/expected.safetensors");
    Tensor ids = expected.tensors.at("input_ids.1");  // (1, 37)
    std::unique_ptr<Transformer> model;
    std::unique_ptr<KVCache> cache;
    ChunkPlan plan;

    explicit GptOssDriverRun(const std::string& cache_name) {
        ModelOptions opt;
        opt.rope = RopeMode::YARN;
        model = std::make_unique<Transformer>(mf.config, mf.weights, opt);
        model->set_context_width(64);
        const int64_t T = ids.size(1);
        KVCacheConfig kc;
        kc.name = cache_name;
        kc.cache_length = 8;
        cache = std::make_unique<KVCache>(kc, mf.config, Device{}, DType::F32, T);
        plan = fixture_chunk_plan(T);
    }

    // The driver with `attention` in front of the cache; every next token scored.
    HeadResult run(CacheAttention& attention) { return drive_next_token(*model, *cache, ids, plan, attention); }
};

}  // namespace kv::test
