// global-kvzip: KVzip's scores (kvzip_scores.h) ranked across all layers, as kvpress'
// KVzipPress ranks them by default (layerwise=False) and the paper's non-uniform allocation
// does, within what fixed-size buffers allow (docs/POLICIES.md#kvzip). Every layer starts at
// one short length F (its prefill, as cake's layers do); each layer's reconstruction of the
// prefill scores its tokens; once every layer has, the layers' budgets are fixed for the rest
// of the sequence from one ranking over all layers, heads and rows:
//   counts  c_l = how many of the ceil(kvzip_global_keep M) highest of the M prefill scores
//                 (sinks left out; ties at the threshold to the lower layer) are layer l's
//   budgets B_l = c_l / sum c * (N cache_length)   (cake_layer_budgets: floors F and what the
//                 layer holds, water-filled, rounded so that sum B_l = N cache_length)
// Each layer's buffer grows to B_l at its next call; chunks fill it, then evict the lowest
// scores per (b, g) row, sinks last (heads keep B_l slots each). A token is scored by its own
// chunk's piece, as in kvzip.
#include "engine/kv/policies/policy_global_kvzip.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>

#include "engine/core/error.h"
#include "engine/kv/policies/kvzip_scores.h"
#include "engine/kv/policies/layer_budget_policy.h"
#include "engine/kv/policies/policy_cake.h"
#include "engine/kv/policies/policy_registry.h"

namespace kv {

std::vector<int64_t> kvzip_global_counts(const std::vector<std::vector<double>>& scores, double keep) {
    std::vector<std::pair<double, int32_t>> all;  // (score, layer)
    for (size_t l = 0; l < scores.size(); ++l)
        for (double s : scores[l]) all.push_back({s, int32_t(l)});
    std::vector<int64_t> counts(scores.size(), 0);
    const size_t K = std::min(all.size(), size_t(std::ceil(keep * double(all.size()))));
    if (K == 0) return counts;
    auto first = [](const std::pair<double, int32_t>& a, const std::pair<double, int32_t>& b) {
        return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    std::nth_element(all.begin(), all.begin() + std::ptrdiff_t(K - 1), all.end(), first);
    for (size_t i = 0; i < K; ++i) ++counts[size_t(all[i].second)];
    return counts;
}

namespace {

int64_t global_kvzip_initial_length(const KVCacheConfig& c, int64_t num_layers) {
    return grow_only_initial_length(c, num_layers, c.policy_option("kvzip_floor_fraction"), int64_t(c.policy_option("kvzip_n_sink")) + 1);
}

class GlobalKVzipPolicy final : public LayerBudgetPolicy, public ReconstructsContext {
   public:
    GlobalKVzipPolicy(const KVCacheConfig& cfg, int64_t L, int64_t G, const TextCodec* text)
        : LayerBudgetPolicy(L, G, cfg.cache_length > 0 ? cfg.cache_length : L),
          prompt_(kvzip_prompt(cfg, text)),
          n_sink_(int64_t(cfg.policy_option("kvzip_n_sink"))),
          keep_(cfg.policy_option("kvzip_global_keep")) {
        if (!cfg.layer_cache_lengths.empty() || !cfg.layer_cache_rule.empty())
            throw Error("--kv_cache.layer_cache_lengths: policy 'global-kvzip' decides every layer's length itself; leave it empty and "
                        "give --kv_cache.cache_length (the mean)");
        if (L <= n_sink_)
            throw Error(str("--kv_cache.cache_length: ", L, " is too short for global-kvzip with kvzip_n_sink ", n_sink_,
                            "; expected more slots than sinks"));
    }
    const char* name() const override { return "global-kvzip"; }
    bool per_row_positions() const override { return true; }
    const std::vector<int32_t>& token_positions() const override { return pos_; }

    void reset(int64_t batch) override {
        B_ = batch;
        T_ = P_ = prefill_n_ = 0;
        relayout(initial_length());
        std::fill(pos_.begin(), pos_.end(), -1);
        std::fill(score_.begin(), score_.end(), 0.0f);
    }

    int64_t max_forward_length() const override {
        if (P_ > 0 && decided()) return budget();
        return P_ > 0 ? std::numeric_limits<int32_t>::max() : L_;  // undecided: a layer grows to take any chunk
    }

    void prefill(int64_t n, const InsertFeatures&) override {
        if (n < 1 || n > L_) throw_chunk_error(name(), n, L_, 0, L_, "a prefill must fit the cache");
        for (int64_t r = 0; r < rows(); ++r)
            for (int64_t t = 0; t < n; ++t) place(r, t, t);
        T_ = P_ = prefill_n_ = n;
    }

    SlotPlan prepare(int64_t n) const override {
        if (P_ == 0) throw Error(str(name(), " cache: the first call of a sequence must be a prefill"));
        SlotPlan p;
        p.input_pos = P_;
        p.n = n;
        p.length_after = std::min(L_, T_ + n);
        const int64_t fresh = std::min(n, L_ - T_), evict = n - fresh;
        if (n < 1 || evict > T_) throw_chunk_error(name(), n, L_, T_, L_, "the chunk is longer than the layer's budget");
        if (evict == 0) {  // filling: free slots [T, T+n), the same for every row
            p.rows = 1;
            for (int64_t t = 0; t < n; ++t) p.targets.push_back(int32_t(T_ + t));
            return p;
        }
        // Free slots first, then the lowest scores of the row (ties: the lower slot); a sink only
        // when a chunk needs more slots than the others hold (a budget at its floor F, a chunk
        // of F: kvzip's sinks score 1, the most a weight can be, and go last the same way).
        p.rows = rows();
        p.targets.resize(size_t(rows() * n));
        std::vector<int32_t> cand((size_t)T_);
        for (int64_t r = 0; r < rows(); ++r) {
            const int32_t* pos = pos_.data() + r * L_;
            const float* s = score_.data() + r * L_;
            std::iota(cand.begin(), cand.end(), 0);
            const int64_t ns = n_sink_;
            auto less = [s, pos, ns](int32_t a, int32_t b) {
                const bool sa = pos[a] < ns, sb = pos[b] < ns;
                return sa != sb ? sb : (s[a] < s[b] || (s[a] == s[b] && a < b));
            };
            std::partial_sort(cand.begin(), cand.begin() + evict, cand.end(), less);
            for (int64_t t = 0; t < fresh; ++t) p.targets[size_t(r * n + t)] = int32_t(T_ + t);
            for (int64_t t = 0; t < evict; ++t) p.targets[size_t(r * n + fresh + t)] = cand[size_t(t)];
        }
        return p;
    }

    void apply(const SlotPlan& p, const InsertFeatures&) override {
        if (p.moves != 0) throw Error(str(name(), " cache: a plan with moves (", p.moves, ") is not one of global-kvzip's"));
        for (int64_t r = 0; r < rows(); ++r) {
            const int64_t pr = p.rows == 1 ? 0 : r;
            for (int64_t t = 0; t < p.n; ++t) place(r, p.targets[size_t(pr * p.n + t)], p.input_pos + t);
        }
        T_ = p.length_after;
        P_ = p.input_pos + p.n;
    }

    std::vector<float> slot_scores() const override { return T_ > 0 ? score_ : std::vector<float>{}; }

    ReconstructionPrompt reconstruction_prompt() const override { return kvzip_prompt_or_throw(prompt_, name()); }

    void observe_reconstruction(const ReconstructionInput& in) override {
        kvzip_score_piece(in, B_, G_, T_, pos_, L_, n_sink_, name(), score_);
        // The last piece of the prefill's reconstruction: the layer's say in the ranking.
        if (!has_said() && P_ == prefill_n_ && in.chunk_end == P_) {
            std::vector<double> mine;
            for (int64_t i = 0; i < rows() * L_; ++i)
                if (pos_[size_t(i)] >= n_sink_) mine.push_back(double(score_[size_t(i)]));
            say(std::move(mine));
        }
    }

    int64_t budget_of_layer() const { return decided() ? budget() : 0; }

   private:
    int64_t rows() const { return B_ * G_; }

    void place(int64_t r, int64_t slot, int64_t position) {
        pos_[size_t(r * L_ + slot)] = int32_t(position);
        score_[size_t(r * L_ + slot)] = position < n_sink_ ? 1.0f : 0.0f;  // sinks kept (a weight is at most 1)
    }

    void relayout(int64_t L) override {
        restride_rows(pos_, rows(), L_, L, int32_t(-1));
        restride_rows(score_, rows(), L_, L, 0.0f);
        L_ = L;
    }

    std::vector<int64_t> decide(const std::vector<std::vector<double>>& says, const std::vector<int64_t>& floors,
                                int64_t total) const override {
        std::vector<double> pref;
        for (int64_t c : kvzip_global_counts(says, keep_)) pref.push_back(double(c));
        return cake_layer_budgets(pref, floors, total, 0);
    }

    std::optional<ReconstructionPrompt> prompt_;  // none without a tokenizer (the pass says so)
    int64_t n_sink_;
    double keep_;
    int64_t prefill_n_ = 0;
    std::vector<int32_t> pos_;  // (B*G, L) token position per slot, -1 empty
    std::vector<float> score_;  // (B*G, L) KVzip score (lower = evicted first; sinks 1)
};

}  // namespace

int64_t global_kvzip_budget(const KVPolicy& p) {
    const auto* g = dynamic_cast<const GlobalKVzipPolicy*>(&p);
    if (!g) throw Error(str("global_kvzip_budget: '", p.name(), "' is not a global-kvzip policy"));
    return g->budget_of_layer();
}

std::vector<PolicyInfo> global_kvzip_policies() {
    return {{.name = "global-kvzip",
             .summary = "KVzip ranked across all layers: layer budgets from one ranking of every layer's KVzip scores of the prefill",
             .make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> {
                 return std::make_unique<GlobalKVzipPolicy>(a.cfg, a.L, a.G, a.text);
             },
             .needs_text = true,
             // buffers that can change a layer's length (resize_slots)
             .buffers = {"default", "f32", "bf16", "f16"},
             .uses = {"max_chunk_size"},
             .options = {{.name = "kvzip_global_keep",
                          .help = "global-kvzip: the fraction of the prefill's KVzip scores, over all layers and heads, ranked as "
                                  "kept when the layer budgets are shared out (kvpress' 1 - compression_ratio)",
                          .def = 0.25,
                          .lo = 0.001,
                          .hi = 1.0},
                         {.name = "kvzip_floor_fraction",
                          .help = "global-kvzip: every layer keeps at least this fraction of cache_length of earlier tokens besides "
                                  "a chunk; it is also each layer's length (its prefill) until the budgets are decided",
                          .def = 0.25,
                          .lo = 0.01,
                          .hi = 1.0}},
             .initial_layer_length = global_kvzip_initial_length,
             .doc_anchor = "docs/POLICIES.md#kvzip"}};
}

}  // namespace kv
