// Run memory sized up front (see run_memory.h).
#include "engine/run/run_memory.h"

#include <algorithm>

#include "engine/core/error.h"
#include "engine/kv/kv_config.h"

namespace kv {

namespace {
// Bytes per cached element of a buffer, x2 (so q4 = 1): a lower bound for each buffer kind.
uint64_t half_bytes_per_element(const std::string& cache_name, DType dtype) {
    const std::string buf = cache_name.substr(cache_name.rfind('-') + 1);
    if (buf == "f32") return 8;
    if (buf == "bf16" || buf == "f16") return 4;
    if (buf == "q8" || buf == "q8_0") return 2;
    if (buf == "q4" || buf == "nf4" || buf == "q4_0") return 1;
    return dtype == DType::F32 ? 8 : 4;  // default: the model's precision
}
}  // namespace

std::vector<SizedItem> run_memory_items(const RunConfig& cfg, const ModelConfig& m) {
    std::vector<SizedItem> items;
    const DType dt = cfg.dtype == "bf16" ? DType::BF16 : DType::F32;
    const bool train = cfg.mode.rfind("finetune_", 0) == 0;
    const uint64_t B = uint64_t(std::max<int64_t>(1, train ? cfg.train.micro_batch_size : cfg.driver.micro_batch_size));
    const uint64_t G = uint64_t(m.num_kv_heads), D = uint64_t(m.head_dim), nl = uint64_t(m.num_layers);
    const bool gen = cfg.mode == "generate";
    // Tokens a sample can reach: the sequence, or for generation the new tokens (the prompt is
    // not tokenized yet; it only adds).
    const uint64_t T = uint64_t(std::max<int64_t>(1, gen ? cfg.generate.max_new_tokens : cfg.data.seq_length));
    const std::string t_cause = gen ? str("max_new_tokens ", T) : str("seq_length ", T);
    const uint64_t chunk = uint64_t(std::max<int64_t>(1, std::min<int64_t>(cfg.driver.chunk_size, int64_t(T))));

    // KV cache: K and V of every layer, (B, G, L, D) each, plus one int32 position per slot.
    uint64_t slots = 0;  // sum over layers of L
    for (uint64_t l = 0; l < nl; ++l) {
        int64_t L = int64_t(T);
        if (cfg.kv_cache.layer_cache_lengths.empty() || l < cfg.kv_cache.layer_cache_lengths.size())
            L = cfg.kv_cache.length_for_layer(int64_t(l), int64_t(T), int64_t(nl));
        slots = checked_add(slots, uint64_t(std::max<int64_t>(L, 0)), "the KV cache size");
    }
    const std::string kv_cause = cfg.kv_cache.cache_length > 0 ? str("cache_length ", cfg.kv_cache.cache_length) : t_cause;
    const uint64_t cells = checked_mul({slots, B, G}, "the KV cache size");
    items.push_back({kv_cause, "KV", checked_mul({cells, D, half_bytes_per_element(cfg.kv_cache.name, dt)}, "the KV cache size") / 2});
    const std::string policy = cfg.kv_cache.name.substr(0, cfg.kv_cache.name.rfind('-'));
    if (policy != "dense") items.push_back({kv_cause, "scores and slot positions", checked_mul({cells, 4}, "the KV cache size")});

    // The samples' token ids and targets, and the RoPE tables as wide as the sequence.
    items.push_back({t_cause, "token ids", checked_mul({T, B, 8}, "the token buffers")});
    items.push_back({t_cause, "position tables",
                     checked_mul({T, uint64_t(std::max<int64_t>(m.rope_dims(), 2)), 4}, "the position tables")});

    // One chunk's logits (f32) and MLP activations.
    const std::string c_cause = str("chunk_size ", chunk);
    items.push_back({c_cause, "logits", checked_mul({chunk, B, uint64_t(m.vocab_size), 4}, "the logits")});
    items.push_back({c_cause, "activations", checked_mul({chunk, B, uint64_t(m.intermediate_size), 4}, "the activations")});
    return items;
}

void check_run_memory(const RunConfig& cfg, const ModelConfig& model) {
    const int64_t budget = cfg.memory_budget.empty() ? 0 : parse_bytes(cfg.memory_budget, "--memory.budget");
    require_within_budget(run_memory_items(cfg, model), budget);
}

}  // namespace kv
