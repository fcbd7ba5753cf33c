// Text generation: the prompt is prefilled in one call, then tokens are decoded one at a time
// through the KV cache (any policy; beam search needs a position-only policy so beams can
// share slot layouts). Sampling, beam search with a length penalty, stop tokens and stop
// strings (held back while a match is in progress), streaming of complete UTF-8 text.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "engine/kv/kv_config.h"
#include "engine/model/transformer.h"
#include "engine/run/run_config.h"
#include "engine/tokenizer/tokenizer.h"

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
};

struct GenerationCallbacks {
    std::function<void(const std::string& text)> on_text;  // streamed pieces
    const std::atomic<bool>* cancel = nullptr;
};

// `cache_cfg` with cache_length 0 sizes a dense cache to prompt + max_new_tokens.
GenerationResult generate(Transformer& model, const Tokenizer& tok, const std::vector<int32_t>& prompt, const GenerateConfig& g,
                          KVCacheConfig cache_cfg, const GenerationCallbacks& cb = {});

}  // namespace kv
