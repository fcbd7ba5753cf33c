// Run memory sized up front (see run_memory.h).
#include "engine/run/run_memory.h"

#include <algorithm>

#include "engine/core/error.h"
#include "engine/kv/kv_config.h"
#include "engine/kv/window_layer.h"
#include "engine/run/run_plan.h"
#include "engine/core/run_mode.h"

namespace kv {

namespace {
// Bytes of one cached K element plus its V element (so q4 = 1): a lower bound for each buffer kind.
uint64_t kv_pair_bytes(const KVCacheConfig& kc, DType dtype) {
    const BufferInfo& b = *find_buffer(kc.buffer());  // buffer() reads known buffers only
    if (b.kind == BufferKind::FULL) return 2 * uint64_t(dtype_size(b.dtype.value_or(dtype)));  // default: the model's precision
    if (b.kind == BufferKind::THINK) return uint64_t(dtype_size(dtype));  // full values and at least one key channel
    // codes of K and V; kivi2's 0.75 byte with group 32 (codes + f16 scales) rounds up to 1, not a lower bound
    return std::max<uint64_t>(1, 2 * uint64_t(b.bits) / 8);
}
}  // namespace

std::vector<SizedItem> run_memory_items(const RunConfig& cfg, const ModelConfig& m) {
    std::vector<SizedItem> items;
    const DType dt = cfg.dtype == "bf16" ? DType::BF16 : DType::F32;
    const RunModeInfo& mode = run_mode(cfg.mode);
    const bool train = mode.kind == RunKind::TRAIN;
    const uint64_t B = uint64_t(std::max<int64_t>(1, train ? cfg.train.micro_batch_size : cfg.driver.micro_batch_size));
    // The cache's heads and head size: one head of [k_pe ; c_kv] for a latent cache (ModelConfig::latent_cache).
    const uint64_t G = uint64_t(m.cache_kv_heads()), D = uint64_t(m.cache_head_dim()), nl = uint64_t(m.num_layers);
    const bool gen = mode.kind == RunKind::GENERATE;
    // Tokens a sample can reach: the sequence, or for generation the new tokens (the prompt is
    // not tokenized yet; it only adds).
    const uint64_t T = uint64_t(std::max<int64_t>(1, gen ? cfg.generate.max_new_tokens : cfg.data.seq_length));
    const std::string t_cause = gen ? str("max_new_tokens ", T) : str("seq_length ", T);
    // A byte budget sets the cache length here as in the cache itself (engine/kv/kv_cache.cpp).
    const KVCacheConfig kc = apply_kv_budget(cfg.kv_cache, int64_t(nl), int64_t(G), int64_t(D), dt, int64_t(T), m.cache_tensors(),
                                             run_budget_layers(cfg, m, int64_t(T)));
    const uint64_t chunk = uint64_t(std::max<int64_t>(1, std::min<int64_t>(cfg.driver.chunk_size, int64_t(T))));

    // KV cache: K and V of every layer, (B, G, L, D) each (both counted: `pair` bytes per
    // element), plus one int32 position per slot.
    // Windowed layers keep a ring of window - 1 + the largest chunk (engine/kv/window_layer.h).
    KVCacheConfig ring = kc;
    if (ring.max_chunk_size == 0) ring.max_chunk_size = std::min<int64_t>(run_ring_chunk(cfg, m), int64_t(T));
    auto layer_slots = [&](uint64_t l) {  // L of layer l
        // reads its source's cache, or keeps a convolution state: no token slots
        if (m.kv_shared(int64_t(l)) || !m.has_kv_cache(int64_t(l))) return uint64_t(0);
        if (const int w = m.layer_window(int64_t(l)); w > 0) return uint64_t(window_layer_length(ring, w, int64_t(T)));
        int64_t L = int64_t(T);
        if (kc.layer_cache_lengths.empty() || l < kc.layer_cache_lengths.size())
            L = kc.length_for_layer(int64_t(l), int64_t(T), int64_t(nl));
        return uint64_t(std::max<int64_t>(L, 0));
    };
    uint64_t slots = 0, window_slots = 0, windowed = 0;  // sum over layers of L; of windowed layers
    int64_t widest_window = 0;
    for (uint64_t l = 0; l < nl; ++l) {
        slots = checked_add(slots, layer_slots(l), "the KV cache size");
        if (const int w = m.layer_window(int64_t(l)); w > 0 && !m.kv_shared(int64_t(l))) {
            window_slots += layer_slots(l), ++windowed;
            widest_window = std::max<int64_t>(widest_window, w);
        }
    }
    const std::string kv_cause = kc.cache_length > 0 ? str("cache_length ", kc.cache_length) : t_cause;
    const uint64_t cells = checked_mul({slots, B, G}, "the KV cache size");
    // A latent cache stores one vector per slot (its values are its keys; full precision only): half the pair.
    const uint64_t pair = m.cache_tensors() == 1 ? kv_pair_bytes(kc, dt) / 2 : kv_pair_bytes(kc, dt);
    const uint64_t bs = uint64_t(std::max<int64_t>(kc.paged_block_size, 0));
    if (bs == 0) {
        // Each layer type its own line: the policy's layers, and the windows kept by rule.
        if (slots > window_slots)
            items.push_back({kv_cause, windowed ? "KV, full-attention layers" : "KV",
                             checked_mul({slots - window_slots, B, G, D, pair}, "the KV cache size")});
        if (windowed)
            items.push_back({str("sliding_window ", widest_window, " in ", windowed, " of ", nl, " layers"), "KV, windowed layers",
                             checked_mul({window_slots, B, G, D, pair}, "the KV cache size")});
    } else {
        // Paged storage (engine/kv/buffers/buffer_paged.cpp) allocates whole blocks of `bs` slots per
        // batch row as tokens arrive, up to min(L, T) slots a layer, plus a block table (int32
        // per block) and, per read, a contiguous gather of the layer's K and V.
        uint64_t used = 0, blocks = 0, widest = 0;  // slots written, blocks, max slots of one layer
        for (uint64_t l = 0; l < nl; ++l) {
            const uint64_t n = std::min(layer_slots(l), T);
            used = checked_add(used, n, "the KV cache size");
            blocks = checked_add(blocks, n / bs + (n % bs != 0), "the KV block count");
            widest = std::max(widest, n);
        }
        const uint64_t kv = checked_mul({used, B, G, D, pair}, "the KV cache size");
        const uint64_t in_blocks = checked_mul({blocks, bs, B, G, D, pair}, "the KV block size");
        const std::string bs_cause = str("paged_block_size ", bs);
        items.push_back({kv_cause, "KV", kv});
        if (in_blocks > kv) items.push_back({bs_cause, "KV block padding", in_blocks - kv});
        items.push_back({bs_cause, "block tables", checked_mul({blocks, B, 4}, "the block tables")});
        items.push_back({kv_cause, "paged gather", checked_mul({widest, B, G, D, pair}, "the paged gather")});
    }
    if (kc.policy() != "dense") items.push_back({kv_cause, "scores and slot positions", checked_mul({cells, 4}, "the KV cache size")});

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
