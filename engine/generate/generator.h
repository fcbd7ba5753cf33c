// Text generation: the prompt is prefilled in one call, then tokens are decoded one at a time
// through the KV cache (any policy; beam search needs a position-only policy so beams can
// share slot layouts). A cache shorter than prompt + new tokens evicts by its policy at every
// decoded token, exactly as an eval fed the same tokens one per chunk after the prompt. Sampling, beam search with a length penalty, stop tokens and stop
// strings (held back while a match is in progress), streaming of complete UTF-8 text.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "engine/kv/kv_config.h"
#include "engine/kv/layer_cache.h"
#include "engine/model/transformer.h"
#include "engine/run/run_config.h"
#include "formats/tokenizer/tokenizer.h"

namespace kv {

struct GenerationResult {
    std::vector<int32_t> tokens;  // generated ids (without the prompt)
    std::string text;             // decoded, stop string removed
    std::string stop_reason;      // "eos", "stop string", "max_new_tokens", "cancelled"
    double prefill_seconds = 0, decode_seconds = 0;
    int64_t prompt_tokens = 0;
    // Forward passes after the prefill: the first token is sampled from the prefill's logits, so
    // decode speed is decode_forwards / decode_seconds (none when one token was generated).
    int64_t decode_forwards = 0;
    // Decode forwards that ran on a full cache of an evicting policy (each evicted a slot).
    int64_t evicting_forwards = 0;
    // Chunk sizes the prompt was fed in (the first fills the shortest layer), then 1 per token.
    std::vector<int64_t> prompt_chunks;
};

struct GenerationCallbacks {
    std::function<void(const std::string& text)> on_text;  // streamed pieces
    const std::atomic<bool>* cancel = nullptr;
    // After every (layer, chunk) step, prompt and decode alike (plan, policy state, weights).
    LayerStepHook on_layer_step;
};

// `cache_cfg` with cache_length 0 sizes a dense cache to prompt + max_new_tokens.
GenerationResult generate(Transformer& model, const Tokenizer& tok, const std::vector<int32_t>& prompt, const GenerateConfig& g,
                          KVCacheConfig cache_cfg, const GenerationCallbacks& cb = {});

}  // namespace kv
