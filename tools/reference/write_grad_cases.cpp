// Writes the gradient fixture cases of kvlab's own policies (tests/fixtures/grad/policies):
// phase 1 on a real cache with each policy, then the decisions as a kvlab-grad-case JSON for
// tools/reference/grad_reference.py. A maintenance tool, run by hand:
//   build/bin/kvlab_write_grad_cases && for f in tests/fixtures/grad/policies/*.case.json; do
//     /usr/bin/python3 tools/reference/grad_reference.py --case $f --out ${f%.case.json}.out.safetensors; done
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "engine/grad/gradient_pipeline.h"
#include "engine/model/model_loader.h"

using namespace kv;

int main() {
    const std::string model_dir = "tests/fixtures/models/llama_gqa";
    ModelOptions mo;
    LoadedModel lm = load_model(std::string(KVLAB_SOURCE_DIR) + "/" + model_dir, mo);
    const int64_t B = 2, T = 80, L = 32, chunk = 16;
    struct Spec {
        const char *name, *cache;
        int64_t grace;
    };
    for (Spec sp :
         {Spec{"h2o_grace_q8", "h2o-q8", 6}, Spec{"lastrec", "lastrec-default", 0}, Spec{"snapkv", "snapkv-default", 0},
          Spec{"tova_grace", "tova-default", 4}, Spec{"streaming", "streaming-default", 0}, Spec{"qh2o_q8", "qh2o-q8", 0}}) {
        std::mt19937_64 rng(std::hash<std::string>{}(sp.name));
        std::vector<int32_t> ids((size_t)(B * T)), tg((size_t)(B * T), -100);
        for (auto& x : ids) x = int32_t(rng() % uint64_t(lm.config.vocab_size));
        for (int64_t b = 0; b < B; ++b)
            for (int64_t t = 0; t + 1 < T; ++t)
                if (rng() % 4 != 0) tg[size_t(b * T + t)] = ids[size_t(b * T + t + 1)];
        KVCacheConfig kc;
        kc.name = sp.cache;
        kc.cache_length = L;
        kc.grace_period = sp.grace;
        KVCache cache(kc, lm.config, Device{}, DType::F32, T);
        ChunkPlanOptions po;
        po.chunk_size = chunk;
        const ChunkPlan plan = plan_chunks(T, std::vector<int64_t>(size_t(lm.config.num_layers), L), po);
        HeadSpec head;
        head.B = B, head.T = T, head.token_targets = tg;
        ModelGrads g = ModelGrads::zeros_like(*lm.model);
        GradientTargets gt;
        gt.model = &g;
        GradientStats st =
            gradient_step(*lm.model, cache, Tensor::from_i32({B, T}, ids), plan, head, 1.0, GradientOptions{}, gt);
        nlohmann::json j;
        j["format"] = "kvlab-grad-case", j["version"] = 1, j["model"] = model_dir, j["dtype"] = "f32";
        j["rope_context_width"] = T, j["B"] = B, j["T"] = T, j["head"] = "next_token_prediction";
        j["ids"] = nlohmann::json::array(), j["targets"] = nlohmann::json::array();
        for (int64_t b = 0; b < B; ++b) {
            j["ids"].push_back(std::vector<int32_t>(ids.begin() + b * T, ids.begin() + (b + 1) * T));
            j["targets"].push_back(std::vector<int32_t>(tg.begin() + b * T, tg.begin() + (b + 1) * T));
        }
        j["chunks"] = plan.chunks;
        j["cache_length"] = std::vector<int64_t>(size_t(lm.config.num_layers), L);
        j["lora"] = nullptr;
        j["kvlab_cache"] = sp.cache, j["kvlab_grace_period"] = sp.grace;
        j["plans"] = nlohmann::json::array();
        for (const auto& layer : st.plans) {
            nlohmann::json lj = nlohmann::json::array();
            for (const auto& p : layer)
                lj.push_back({{"input_pos", p.input_pos},
                              {"n", p.n},
                              {"rows", p.rows},
                              {"targets", p.targets},
                              {"moves", p.moves},
                              {"move_from", p.move_from},
                              {"move_to", p.move_to},
                              {"length_after", p.length_after}});
            j["plans"].push_back(lj);
        }
        const std::string out = std::string(KVLAB_SOURCE_DIR) + "/tests/fixtures/grad/policies/" + sp.name + ".case.json";
        std::ofstream(out) << j.dump() << "\n";
    }
    return 0;
}
