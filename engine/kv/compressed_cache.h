// A compressed context: kvpress's protocol (compress-then-ask). A context runs through a
// KVCache large enough to hold all of it (no eviction, the policy scoring as it goes), then
// compress_cache() keeps `keep` slots per layer, once, by the policy's own scores; the
// questions asked of the context are appended after the kept slots and never evicted, and
// rewind() drops what a question appended, so every question of a context is answered from the
// same compressed cache. The cache also saves to and loads from a file (compressed_cache_file.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/attention.h"
#include "engine/kv/compressed_cache_codec.h"
#include "engine/kv/kv_cache.h"

namespace kv {

// One layer of a compressed cache: what the compression kept, per (b, g) row.
struct CompressedLayer {
    // (B * G, kept) token positions of the kept slots, ascending per row. Identical rows when
    // the policy keeps one set per layer (positions shared by all heads). A score threshold
    // keeps a count per row: shorter rows end in unused slots (kUnusedSlotPosition, masked).
    std::vector<int32_t> positions;
    // (B * G, kept) the policy's score of each kept slot when it was compressed (the policy's
    // state the choice was made from; a threshold over one set per layer stores the mean over
    // rows it was applied to); empty for policies that choose by position alone.
    std::vector<float> scores;
    Tensor K, V;  // (B, G, kept, D) in the cache's activation dtype
};

class CompressedCache final : public LayerAttention {
   public:
    // context_length: tokens of the compressed context (the first appended token's position);
    // rope_width: the model's RoPE context width its keys were rotated with (YaRN), which the
    // questions must be run with too (0: unknown).
    CompressedCache(std::string cache_name, int64_t context_length, int64_t rope_width, std::vector<CompressedLayer> layers);

    // Appends k, v of positions input_pos.. (the next unseen position) and attends over the
    // kept slots plus everything appended since the last rewind().
    void attend(int layer, const Tensor& q, const Tensor& k, const Tensor& v, int64_t input_pos, float scale, int window,
                Tensor& y) override;
    // Back to the compressed context: drops every appended token of every layer and restores
    // the context slots a decoding budget evicted.
    void rewind();
    // The decoding-time budget (kvpress's ratio of everything seen; 0 = none): after each
    // attend() call layer l holds floor((1 - r) * seen) slots per row, seen = context_length()
    // + appended(l). The appended tokens are never evicted; the context slots go in the order
    // of the policy's scores from the compression (lowest first, ties: the earlier slot; summed
    // over rows when every row keeps the same positions), which are not updated while decoding.
    // Throws kv::Error when the cache holds no scores (a position-only policy) or unused slots,
    // and attend() throws when the budget falls below the appended tokens.
    void set_decode_ratio(double r);
    double decode_ratio() const { return decode_ratio_; }
    // Re-scoring while decoding under the budget (0 = never, the default: the compression's
    // scores rank the context slots for the whole decode): every `every` appended tokens each
    // context slot's score grows by the attention the queries appended since the last re-score
    // paid it (summed over those queries, averaged over the heads of its group: the weight sums
    // an attention-scored policy accumulates, H2O's rule), so slots the question and the
    // generated tokens attend to stay. Throws kv::Error for every < 0 or without a budget.
    void set_decode_rescore(int64_t every);
    // DMS's decoding (kvpress' DMSPress with decoding on), for a cache compressed by a score
    // threshold: while the question and answer are fed (one token per forward), after each
    // attend() every context slot whose position has left the last `window` positions seen and
    // whose score (the one the threshold was applied to) is below `threshold` is evicted, per
    // (b, g) row; rows stay padded to the longest with unused slots. The slots kept by score
    // stay (their scores do not change), the tokens fed are never evicted. Throws kv::Error when
    // the cache holds no scores, with a decoding ratio, or for window < 0.
    void set_decode_threshold(double threshold, int64_t window);
    bool decode_threshold() const { return threshold_decode_; }
    // A question is fed one token per forward, as decoding feeds it (a decoding budget of either kind).
    bool decodes_per_token() const { return decode_ratio_ > 0.0 || threshold_decode_; }
    int64_t decode_rescore_every() const { return rescore_every_; }
    // (rows, context_slots(l)) the context slots' scores now (the compression's, plus what
    // re-scoring added), in the order of positions_now(l).
    const std::vector<float>& context_scores(int l) const { return ctx_score_[size_t(l)]; }
    int64_t slots(int l) const { return pos_[size_t(l)].size() / size_t(std::max<int64_t>(rows_, 1)); }  // per row, now
    int64_t context_slots(int l) const { return ctx_left_[size_t(l)]; }                                    // of them, context
    // (B * G, slots(l)) the positions held now: the context slots left, then the appended tokens.
    const std::vector<int32_t>& positions_now(int l) const { return pos_[size_t(l)]; }

    const std::string& cache_name() const { return name_; }  // the policy-buffer that chose the slots
    int64_t context_length() const { return context_length_; }
    int64_t rope_width() const { return rope_width_; }
    int num_layers() const { return int(layers_.size()); }
    const CompressedLayer& layer(int l) const { return layers_[size_t(l)]; }
    int64_t kept(int l) const { return layers_[size_t(l)].K.size(2); }  // kept context slots per row (the longest row)
    // Kept context slots of layer l summed over its (b, g) rows, unused slots not counted.
    int64_t kept_total(int l) const;
    // Kept context slots of layer l per (b, g) row (a score threshold's count per head).
    std::vector<int64_t> kept_rows(int l) const;
    int64_t appended(int l) const { return appended_[size_t(l)]; }
    // Exact bytes of the kept K/V of all layers (physical: every row as long as the longest).
    size_t kept_bytes() const;
    // Bytes of the slots that hold a kept token (logical: a threshold's shorter rows end in
    // unused slots, which kept_bytes() counts and this does not).
    size_t logical_bytes() const;

   private:
    std::string name_;
    int64_t context_length_;
    int64_t rope_width_;
    std::vector<CompressedLayer> layers_;
    // Per layer: the kept slots followed by the appended tokens (reallocated per append; a
    // question is a few chunks at most), their positions, and how many were appended.
    std::vector<Tensor> K_, V_;
    std::vector<std::vector<int32_t>> pos_;
    std::vector<int64_t> appended_;
    // The decoding budget: its ratio, per layer the context slots left per row and their scores
    // (rows, ctx_left_), and whether all rows keep the same positions.
    double decode_ratio_ = 0.0;
    int64_t rows_ = 0;
    std::vector<int64_t> ctx_left_;
    std::vector<std::vector<float>> ctx_score_;
    std::vector<bool> shared_rows_;
    // Re-scoring: every how many appended tokens, and per layer the weight sums gathered since
    // the last re-score (rows, ctx_left_) and the appended count at it.
    int64_t rescore_every_ = 0;
    std::vector<std::vector<float>> pending_;
    std::vector<int64_t> rescored_at_;
    void evict_to_budget(int layer);
    // The decoding threshold: whether it is on, its threshold and protected window.
    bool threshold_decode_ = false;
    double decode_threshold_ = 0.0;
    int64_t decode_window_ = 0;
    void evict_below_threshold(int layer);
};

// Saves the cache's kept state (compressed_cache_codec.h: kept K/V, positions, the policy's
// scores; versioned, checksummed) to `path`, fingerprinting `context` (the context's token ids).
// Throws kv::Error naming the path when it cannot be written.
void save_compressed_cache(const CompressedCache& cache, const std::vector<int32_t>& context, const std::string& path);
// Loads a saved cache onto `device`. Throws kv::Error naming the path and what is wrong (missing,
// damaged, another version, another context than `expect_context` when given).
CompressedCache load_compressed_cache(const std::string& path, Device device, const std::vector<int32_t>* expect_context = nullptr);

// Keeps `keep` slots per row of every layer of `cache`, which has just run a whole context of
// T tokens without evicting (every layer holds T slots). Policies that score slots keep their
// `keep` highest-scoring slots (ties: the later slot), per (b, g) row when their positions are
// per head, else one set per layer from the scores summed over heads; policies that choose by
// position alone keep what their own eviction keeps of T tokens in `keep` slots (a NaN score or
// a per-layer length rule is refused). rope_width: as the constructor's. `cfg` is the
// cache's configuration (the positional policies' eviction is replayed from it). Throws
// kv::Error naming the policy when it cannot compress this way (per-head pools, length-changing
// policies, a policy that never evicts, unless keep = T: then every policy keeps all) or when
// keep is not in [1, T].
CompressedCache compress_cache(KVCache& cache, const KVCacheConfig& cfg, int64_t keep, int64_t rope_width = 0);

// The threshold budget (DMS's kind of budget, a rule of the protocol, not a policy): keeps the
// slots whose score is >= threshold, per (b, g) row for policies whose positions are per head
// (each row its own count; the layer stores the longest row, the others padded with unused
// slots), else one set per layer by the score's mean over the rows. The last `window` context
// positions are kept whatever their score (DMS's protected recent window), so a layer keeps at
// least min(window, T) slots per row; with window 0 a layer may keep none.
// Throws kv::Error naming the policy when it has no scores (position-only policies) or when it
// cannot compress once (as compress_cache), and for window < 0.
CompressedCache compress_cache_threshold(KVCache& cache, const KVCacheConfig& cfg, double threshold, int64_t rope_width = 0,
                                         int64_t window = 0);

}  // namespace kv
