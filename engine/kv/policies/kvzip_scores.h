// KVzip's reconstruction prompt and its scoring of one piece (Kim et al. 2025; kvpress'
// KVzipPress), shared by the policies that rank by it: kvzip (uniform heads), global-kvzip
// (layer budgets from a ranking over all layers). docs/POLICIES.md#kvzip.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "engine/kv/kv_policy.h"

namespace kv {

// kvpress' prompts ("Repeat the previous context exactly." for a sequence's first piece, the
// quoting one for later pieces, "\n" as the suffix of a model without a chat template), with
// kvzip_chunk_size and kvzip_quoted_tokens from cfg; none when the cache was built without a
// tokenizer (text null or without encode). Made once, when the policy is.
std::optional<ReconstructionPrompt> kvzip_prompt(const KVCacheConfig& cfg, const TextCodec* text);
// The prompt made above, or kv::Error naming `policy` when there is none.
const ReconstructionPrompt& kvzip_prompt_or_throw(const std::optional<ReconstructionPrompt>& prompt, const char* policy);

// Scores the slots one reconstruction piece re-reads: for every (b, g) row of B G rows with
// positions pos (row stride `stride`, slots [0, T) filled and in in.cache_keys), each slot
// holding a position in [in.chunk_begin, in.chunk_end) at or past n_sink gets the largest
// softmax weight the group's query heads and the piece's queries pay it, the softmax running
// over the sinks, the chunk's own slots and the piece's own keys (causal). Writes those slots
// of `score` (rows x stride); leaves the others. Throws kv::Error when the piece's shapes do
// not match the cache.
void kvzip_score_piece(const ReconstructionInput& in, int64_t B, int64_t G, int64_t T, const std::vector<int32_t>& pos, int64_t stride,
                       int64_t n_sink, const char* policy, std::vector<float>& score);

}  // namespace kv
