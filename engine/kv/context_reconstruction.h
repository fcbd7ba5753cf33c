// Context reconstruction (KVzip's scoring pass). A policy with the ReconstructsContext capability
// scores the cache by the attention a "repeat the context" prompt pays it: after each chunk has
// gone through layer l, the chunk's reconstruction pieces (the policy's prompt, then the chunk's
// tokens again) go through layer l too, attending to the whole cache and causally to themselves
// without being written to it; the policy sees each piece's queries and keys
// (ReconstructsContext::observe_reconstruction, policy_capabilities.h) before the next chunk is planned. Pieces sit at the
// positions right after their chunk, so each costs about one more forward of its tokens:
// about 2x the prefill. The long-context driver runs the pieces per (layer, chunk), generation
// after each fed chunk through all layers; the cache state each layer sees is the same.
#pragma once

#include <memory>
#include <vector>

#include "engine/kv/kv_cache.h"
#include "engine/model/transformer.h"

namespace kv {

// The reconstruction pieces of one chunk, embedded, advanced layer by layer.
struct ReconstructionChunk {
    struct Piece {
        Tensor x;                       // (B, m, E) hidden states of the piece
        int64_t begin = 0, end = 0;     // the chunk positions it re-reads
    };
    std::vector<Piece> pieces;
    int64_t query_pos = 0;  // position of every piece's first token: right after the chunk
};

class ContextReconstruction {
   public:
    // Arms every layer of `cache` (its telemetry waits for the pass); disarms when destroyed.
    ContextReconstruction(Transformer& model, KVCache& cache);
    ~ContextReconstruction();
    ContextReconstruction(const ContextReconstruction&) = delete;
    ContextReconstruction& operator=(const ContextReconstruction&) = delete;

    // Tokens of the longest piece for chunks of at most max_chunk tokens (the positions the
    // pass needs past the sequence).
    int64_t max_piece_tokens(int64_t max_chunk) const;
    // The pieces of chunk ids (B, n) at positions [start, start + n). Call for every chunk of
    // the sequence, in order (the prompt of a later piece quotes the tokens before it).
    ReconstructionChunk prepare(const Tensor& ids, int64_t start);
    // Layer l of every piece, right after the chunk itself went through layer l.
    void run_layer(int l, ReconstructionChunk& chunk);

   private:
    Transformer& model_;
    KVCache& cache_;
    ReconstructionPrompt prompt_;
    std::vector<std::vector<int32_t>> recent_;  // per batch row: the last `quoted` tokens before the next chunk
};

// The pass for `cache` when its policy scores by reconstruction (kvzip), else null.
std::unique_ptr<ContextReconstruction> make_context_reconstruction(Transformer& model, KVCache& cache);

}  // namespace kv
