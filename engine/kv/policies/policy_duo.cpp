// duo (DuoAttention, Xiao et al., ICLR 2025, "DuoAttention: Efficient Long-Context LLM
// Inference with Retrieval and Streaming Heads"): every KV head has a gate from a calibration
// (`kvlab calibrate duo`, engine/kv/duo_calibration.h). Retrieval heads (gate >= threshold,
// or the top 1 - sparsity fraction of gates over the model) keep the full cache — the whole
// budget L when a cache length is given, as sinks + a ring — and streaming heads keep
// duo_sinks attention sinks plus the duo_recent most recent tokens. The rule per head is
// StreamingLLM's with capacity cap_g = L (retrieval) or min(L, sinks + recent) (streaming).
//
// Storage is what the heads keep: a layer whose heads all have one capacity is a plain
// position policy of that length (no pool; all retrieval = dense until L is reached, all
// streaming = `streaming` with L = sinks + recent, bit for bit); a mixed layer keeps one pool
// of sum_g cap_g slots per batch row (PooledSlots, policy_capabilities.h), each slot owned by one head.
// docs/POLICIES.md#duo.
#include <algorithm>
#include <numeric>

#include "engine/kv/policies/duo_gates.h"
#include "engine/core/error.h"
#include "engine/kv/kv_config.h"
#include "engine/kv/kv_policy.h"
#include "engine/kv/policies/policy_registry.h"

namespace kv {

namespace {

struct DuoLayerPlan {
    std::vector<int64_t> cap;    // per head: slots it may keep
    std::vector<uint8_t> retrieval;
    int64_t sinks = 0, recent = 0;
};

DuoLayerPlan duo_layer_plan(const KVCacheConfig& cfg, int64_t L, int64_t G, int64_t layer) {
    const DuoGates g = cfg.duo_gates.rfind("pattern:", 0) == 0 ? duo_gates_for_model(cfg.duo_gates, layer + 1, G)
                                                               : read_duo_gates(cfg.duo_gates);
    if (g.kv_heads != G || layer >= g.layers)
        throw Error(str("--kv_cache.duo_gates: '", cfg.duo_gates, "' has gates for ", g.layers, " layers x ", g.kv_heads,
                        " KV heads; this model's layer ", layer, " has ", G, " KV heads"),
                    "calibrate the gates for this model: kvlab calibrate duo MODEL -o FILE");
    // A pattern has 0/1 gates already: the sparsity option ranks a calibrated file only.
    const bool pattern = cfg.duo_gates.rfind("pattern:", 0) == 0;
    const std::vector<uint8_t> r =
        duo_retrieval_heads(g, cfg.policy_option("duo_threshold"), pattern ? -1.0 : cfg.policy_option("duo_sparsity"));
    DuoLayerPlan p;
    const int64_t sinks = int64_t(cfg.policy_option("duo_sinks")), recent = int64_t(cfg.policy_option("duo_recent"));
    const int64_t ws = std::min(L, sinks + recent);
    p.sinks = sinks;
    p.recent = recent;
    for (int64_t h = 0; h < G; ++h) {
        p.retrieval.push_back(r[size_t(layer * G + h)]);
        p.cap.push_back(p.retrieval.back() ? L : ws);
    }
    return p;
}

class DuoPolicy final : public KVPolicy, public PooledSlots {
   public:
    DuoPolicy(const KVCacheConfig& cfg, int64_t L, int64_t G, int64_t layer) : KVPolicy(L, G) {
        const DuoLayerPlan lp = duo_layer_plan(cfg, L, G, layer);
        cap_ = lp.cap;
        retrieval_ = lp.retrieval;
        // A head whose budget is below sinks + recent keeps sinks in the same proportion (64 of
        // 320 by default), so a short cache still has a ring.
        for (int64_t c : cap_) sink_.push_back(std::min({lp.sinks, c - 1, c * lp.sinks / (lp.sinks + lp.recent)}));
        const int64_t cmin = *std::min_element(cap_.begin(), cap_.end());
        if (cmin == *std::max_element(cap_.begin(), cap_.end())) {
            // One capacity for every head: StreamingLLM's ring of that length, shared by the heads.
            KVCacheConfig c = cfg;
            c.sinks = sink_[0];
            c.name = CacheName{"streaming", cfg.buffer()}.text();
            inner_ = build_policy(*find_policy("streaming"), PolicyArgs{c, cmin, G, layer, nullptr});
            L_ = cmin;
            return;
        }
        S_ = std::accumulate(cap_.begin(), cap_.end(), int64_t(0));
        // A prefill fills every head alike (slot t * G + g): at most the smallest capacity, so
        // no streaming head ever sees more than its window.
        L_ = cmin;
    }

    const char* name() const override { return "duo"; }
    int64_t pool_slots() const override { return S_; }  // 0: one capacity, the inner ring's rows
    bool per_row_positions() const override { return inner_ ? inner_->per_row_positions() : true; }
    const std::vector<int32_t>& token_positions() const override { return inner_ ? inner_->token_positions() : pos_; }

    void reset(int64_t batch) override {
        B_ = batch;
        T_ = P_ = 0;
        if (inner_) inner_->reset(batch);
        else pos_.assign(size_t(B_ * G_ * S_), -1);
    }
    int64_t max_forward_length() const override {
        if (inner_) return inner_->max_forward_length();
        // n new tokens per head next to its sinks: n <= cap_g - sinks_g for every head.
        int64_t m = INT64_MAX;
        for (size_t g = 0; g < cap_.size(); ++g) m = std::min(m, cap_[g] - sink_[g]);
        return m;
    }
    void prefill(int64_t n, const InsertFeatures& f) override {
        if (inner_) {
            inner_->prefill(n, f);
            sync();
            return;
        }
        if (n < 1 || n > L_) throw_chunk_error(name(), n, L_, 0, L_, "a prefill must fit the smallest head's capacity");
        SlotPlan p;
        p.n = n;
        p.rows = B_ * G_;
        p.length_after = S_;
        for (int64_t r = 0; r < B_ * G_; ++r)
            for (int64_t t = 0; t < n; ++t) p.targets.push_back(int32_t(t * G_ + r % G_));
        apply(p, f);
    }
    SlotPlan prepare(int64_t n) const override {
        if (inner_) return inner_->prepare(n);
        if (P_ == 0) throw Error("duo cache: the first call of a sequence must be a prefill");
        if (n < 1 || n > max_forward_length())
            throw_chunk_error(name(), n, max_forward_length(), T_, L_, "a chunk may not overwrite a head's own sinks or itself");
        SlotPlan p;
        p.input_pos = P_;
        p.n = n;
        p.rows = B_ * G_;
        p.length_after = S_;
        p.targets.resize(size_t(p.rows * n));
        for (int64_t b = 0; b < B_; ++b) {
            const std::vector<int32_t> slots = overwrite_slots(b, n);
            for (int64_t i = 0; i < G_ * n; ++i) p.targets[size_t(b * G_ * n + i)] = slots[size_t(i)];
        }
        return p;
    }
    void apply(const SlotPlan& p, const InsertFeatures& f) override {
        if (inner_) {
            inner_->apply(p, f);
            sync();
            return;
        }
        if (p.rows != B_ * G_ || p.moves != 0 || p.length_after != S_)
            throw Error(str("duo cache: a plan of ", p.rows, " rows and ", p.moves, " moves over ", p.length_after,
                            " slots; this layer's plans have ", B_ * G_, " rows, no moves and a pool of ", S_, " slots"));
        for (int64_t r = 0; r < B_ * G_; ++r) {
            const int64_t b = r / G_;
            for (int64_t t = 0; t < p.n; ++t) {
                const int32_t slot = p.targets[size_t(r * p.n + t)];
                if (slot < 0 || slot >= S_) throw Error(str("duo cache: plan slot ", slot, " outside the pool of ", S_));
                for (int64_t g = 0; g < G_; ++g) pos_[size_t((b * G_ + g) * S_ + slot)] = -1;  // whoever kept it, evicted
                pos_[size_t(r * S_ + slot)] = int32_t(p.input_pos + t);
            }
        }
        P_ = p.input_pos + p.n;
        T_ = std::min(P_, L_);
    }

    bool is_retrieval(int64_t g) const { return retrieval_[size_t(g)] != 0; }
    int64_t head_capacity(int64_t g) const { return cap_[size_t(g)]; }

   private:
    void sync() {
        B_ = inner_->batch();
        T_ = inner_->current_length();
        P_ = inner_->input_pos();
    }
    // The G n pool slots of batch row b the next n tokens overwrite, ascending: every head's
    // oldest non-sink tokens beyond cap_g - n (those must go: eviction is by overwriting, so the
    // gradient replay rebuilds the same state from the plans), then empty slots.
    std::vector<int32_t> overwrite_slots(int64_t b, int64_t n) const {
        std::vector<int32_t> out;
        int64_t forced = 0;
        for (int64_t g = 0; g < G_; ++g) {
            const int32_t* pos = pos_.data() + (b * G_ + g) * S_;
            std::vector<std::pair<int32_t, int32_t>> old;  // (position, slot) of non-sinks
            int64_t held = 0;
            for (int64_t s = 0; s < S_; ++s) {
                if (pos[s] < 0) continue;
                ++held;
                if (pos[s] >= sink_[size_t(g)]) old.push_back({pos[s], int32_t(s)});
            }
            const int64_t excess = std::max<int64_t>(0, held + n - cap_[size_t(g)]);
            std::sort(old.begin(), old.end());
            for (int64_t i = 0; i < excess; ++i) out.push_back(old[size_t(i)].second);
            forced += excess;
        }
        for (int64_t s = 0; s < S_ && int64_t(out.size()) < G_ * n; ++s) {
            bool empty = true;
            for (int64_t g = 0; g < G_ && empty; ++g) empty = pos_[size_t((b * G_ + g) * S_ + s)] < 0;
            if (empty) out.push_back(int32_t(s));
        }
        if (int64_t(out.size()) != G_ * n)  // cannot happen while every head holds <= cap_g
            throw Error(str("duo cache: ", out.size(), " slots to overwrite (", forced, " evictions) for a chunk needing ", G_ * n));
        std::sort(out.begin(), out.end());
        return out;
    }

    std::vector<int64_t> cap_, sink_;
    std::vector<uint8_t> retrieval_;
    int64_t S_ = 0;
    std::vector<int32_t> pos_;        // (B, G, S) when pooled
    std::unique_ptr<KVPolicy> inner_;  // a uniform layer
};

void validate_duo(const KVCacheConfig& cfg, int64_t num_layers, int64_t num_kv_heads) {
    // Without a model's shape (num_layers 0) the file is still read and checked.
    if (num_layers > 0 && num_kv_heads > 0) (void)duo_gates_for_model(cfg.duo_gates, num_layers, num_kv_heads);
    else if (cfg.duo_gates.empty() || cfg.duo_gates.rfind("pattern:", 0) == 0) (void)duo_gates_for_model(cfg.duo_gates, 1, 1);
    else (void)read_duo_gates(cfg.duo_gates);
}

// The planner's lengths: every layer's smallest head capacity (its cache_length()).
void duo_plan_lengths(const KVCacheConfig& cfg, int64_t num_kv_heads, std::vector<int64_t>& lengths) {
    for (size_t l = 0; l < lengths.size(); ++l) {
        if (lengths[l] <= 0) continue;
        const DuoLayerPlan p = duo_layer_plan(cfg, lengths[l], num_kv_heads, int64_t(l));
        lengths[l] = *std::min_element(p.cap.begin(), p.cap.end());
    }
}

}  // namespace

// For the tests: the role and capacity of head g of a duo layer.
bool duo_head_is_retrieval_for_test(const KVPolicy& p, int64_t g) {
    auto* d = dynamic_cast<const DuoPolicy*>(&p);
    if (!d) throw Error("duo_head_is_retrieval_for_test: not a duo policy");
    return d->is_retrieval(g);
}
int64_t duo_head_capacity_for_test(const KVPolicy& p, int64_t g) {
    auto* d = dynamic_cast<const DuoPolicy*>(&p);
    if (!d) throw Error("duo_head_capacity_for_test: not a duo policy");
    return d->head_capacity(g);
}

std::vector<PolicyInfo> duo_policies() {
    return {{.name = "duo",
             .summary = "DuoAttention: calibrated retrieval heads keep the full cache, streaming heads sinks + recent (--kv_cache.duo_gates)",
             .make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> { return std::make_unique<DuoPolicy>(a.cfg, a.L, a.G, a.layer); },
             .needs_cache_length = false,
             .buffers = {"default", "f32", "bf16", "f16"},
             .uses = {"duo_gates"},
             .options = {{.name = "duo_sinks", .help = "duo: attention sinks of a streaming head", .def = 64, .lo = 0, .hi = 1 << 20, .integer = true},
                         {.name = "duo_recent", .help = "duo: recent window of a streaming head", .def = 256, .lo = 1, .hi = 1 << 20, .integer = true},
                         {.name = "duo_threshold", .help = "duo: a head with gate >= threshold is a retrieval head", .def = 0.5, .lo = 0, .hi = 1},
                         {.name = "duo_sparsity",
                          .help = "duo: fraction of streaming heads, the lowest gates over the model (-1: use duo_threshold)",
                          .def = -1,
                          .lo = -1,
                          .hi = 1}},
             .required = {{"kv_cache.duo_gates", "pattern:10"}},
             .doc_anchor = "docs/POLICIES.md#duo",
             .validate = validate_duo,
             .plan_lengths = duo_plan_lengths}};
}

}  // namespace kv
