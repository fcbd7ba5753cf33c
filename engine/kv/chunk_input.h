// What one chunk brings to the cache besides its q, k and v: its token ids, the plans to replay
// and where the fidelity log-sum-exp goes. They travel with every call of the chunk and are
// never stored in the cache, so a caller cannot forget to set them or leave them behind for the
// next chunk. The model calls a LayerAttention; ChunkCall binds one chunk's inputs to the cache
// (or to a wrapper of it) for the blocks of that chunk.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/model/attention.h"
#include "engine/telemetry/replay_plan.h"

namespace kv {

struct ChunkInput {
    // The chunk's token ids (B, n) row-major, for policies that read the text (ReadsTokens);
    // null = the caller has no text.
    const std::vector<int32_t>* ids = nullptr;
    // Replay (the gradient pipeline's forced plans, replay tests): per layer, the plans of the
    // sequence as a replay log holds them; each layer commits its own next plan instead of
    // planning, and its policy is not updated. null = the policies plan.
    const std::vector<std::vector<SlotPlan>>* replay = nullptr;
    // Fidelity: where the chunk's attention log-sum-exp goes (LayerCache::attend), or null.
    Tensor* lse = nullptr;
    // Multi-head latent attention (KVCache::attend_latent): how to run the chunk in the expanded
    // form over the latents the cache holds (LayerCache::attend), or null = the absorbed form.
    LatentExpansion* expansion = nullptr;
};

// A LayerAttention whose calls take a chunk's inputs: the model-level cache, and wrappers of it
// that observe it (FidelityAttention). A call without inputs is one with an empty ChunkInput.
class CacheAttention : public LayerAttention {
   public:
    virtual void attend(int layer, const Tensor& q, const Tensor& k, const Tensor& v, int64_t input_pos, float scale, int window,
                        Tensor& y, const ChunkInput& in) = 0;
    void attend(int layer, const Tensor& q, const Tensor& k, const Tensor& v, int64_t input_pos, float scale, int window,
                Tensor& y) final {
        attend(layer, q, k, v, input_pos, scale, window, y, ChunkInput{});
    }
    // The latent call with the chunk's inputs. A wrapper that reads the call's y must not pass
    // the expansion on: this default runs the absorbed form through attend(..., in).
    virtual void attend_latent(int layer, const Tensor& q, const Tensor& kv, int64_t input_pos, float scale, int window, Tensor& y,
                               LatentExpansion& ex, const ChunkInput& in) {
        ex.ensure_queries();
        attend(layer, q, kv, kv, input_pos, scale, window, y, in);
    }
    void attend_latent(int layer, const Tensor& q, const Tensor& kv, int64_t input_pos, float scale, int window, Tensor& y,
                       LatentExpansion& ex) final {
        attend_latent(layer, q, kv, input_pos, scale, window, y, ex, ChunkInput{});
    }
};

// The attention the blocks of one chunk run: every call goes to `target` with `in`.
class ChunkCall final : public LayerAttention {
   public:
    ChunkCall(CacheAttention& target, const ChunkInput& in) : target_(target), in_(in) {}
    void attend(int layer, const Tensor& q, const Tensor& k, const Tensor& v, int64_t input_pos, float scale, int window,
                Tensor& y) override {
        target_.attend(layer, q, k, v, input_pos, scale, window, y, in_);
    }
    void attend_latent(int layer, const Tensor& q, const Tensor& kv, int64_t input_pos, float scale, int window, Tensor& y,
                       LatentExpansion& ex) override {
        target_.attend_latent(layer, q, kv, input_pos, scale, window, y, ex, in_);
    }
    void attend_shared(int layer, int source, const Tensor& q, int64_t input_pos, float scale, int window, Tensor& y) override {
        target_.attend_shared(layer, source, q, input_pos, scale, window, y);
    }
    void set_rope_frequencies(const std::vector<double>* inv_freq) override { target_.set_rope_frequencies(inv_freq); }
    void set_output_projection(int layer, const Tensor& wo) override { target_.set_output_projection(layer, wo); }
    void set_layer_input(int layer, const Tensor& h) override { target_.set_layer_input(layer, h); }
    LayerState* layer_state(int layer) override { return target_.layer_state(layer); }

   private:
    CacheAttention& target_;
    ChunkInput in_;
};

// The token ids (B, n) of a chunk as ChunkInput::ids holds them.
std::vector<int32_t> chunk_ids(const Tensor& ids);

}  // namespace kv
