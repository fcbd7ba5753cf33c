// lukv-<scorer> (LUKV's layer x head budget curves, kvpress PR #236 `LUKVPress`): head g of layer
// l keeps C_g = max(1, round(R_{l,g} L)) slots, R from --kv_cache.head_ratios
// (engine/kv/head_ratios.h), L the layer's length. Within its budget a head keeps what the
// wrapped scorer (knorm, snapkv, h2o, expected-attention) ranks highest among its own slots:
// when a chunk of n tokens arrives, a head holding h slots evicts its max(0, h + n - C_g)
// lowest-scoring old slots outside the grace window. Storage is the layer's pool of sum_g C_g
// slots per batch row (PooledSlots, policy_capabilities.h): exactly the slots the heads keep.
// docs/POLICIES.md#lukv-per-head-ratio-tables.
#include <algorithm>
#include <limits>
#include <numeric>

#include "engine/core/error.h"
#include "engine/kv/head_ratios.h"
#include "engine/kv/kv_config.h"
#include "engine/kv/policies/output_projection.h"
#include "engine/kv/policies/policy_score_based.h"

namespace kv {

class LukvPolicy final : public KVPolicy, public PooledSlots, public OutputProjectionUser {
   public:
    LukvPolicy(const KVCacheConfig& cfg, int64_t L, int64_t G, int64_t layer, const std::string& inner_name, std::string name)
        : KVPolicy(L, G), name_(std::move(name)), grace_(cfg.grace_period), keep_initial_fraction_(cfg.keep_initial_fraction) {
        if (cfg.head_ratios.empty())
            throw Error(str("--kv_cache.head_ratios is required for policy '", name_, "'; expected one ratio in (0, 1] per (layer, KV head)"));
        cap_ = head_budgets(cfg.head_ratios, L, G, layer);
        S_ = std::accumulate(cap_.begin(), cap_.end(), int64_t(0));
        // The policy's length is the smallest head budget: a prefill fills every head alike and
        // must fit each of them, and the planner's chunks must leave every head n old slots.
        L_ = *std::min_element(cap_.begin(), cap_.end());
        if (grace_ >= L_)
            throw Error(str("--kv_cache.grace_period: ", grace_, " must be smaller than layer ", layer, "'s smallest head budget ", L_,
                            " (--kv_cache.head_ratios)"));
        // The scorer sees a pool of S slots per (b, g) row; its own grace ring and top-k are off
        // (this policy decides).
        KVCacheConfig c = cfg;
        c.grace_period = 0;
        c.max_chunk_size = 0;
        c.name = CacheName{inner_name, cfg.buffer()}.text();
        std::unique_ptr<KVPolicy> p = build_policy(*find_policy(inner_name), PolicyArgs{c, S_, G, layer, nullptr});
        inner_.reset(dynamic_cast<ScorePolicy*>(p.get()));
        if (!inner_) throw Error(str(name_, ": '", inner_name, "' is not a score policy"));
        (void)p.release();
    }
    const char* name() const override { return name_.c_str(); }
    bool needs_attention_weights() const override { return inner_->needs_attention_weights(); }
    int64_t weights_query_window() const override { return inner_->weights_query_window(); }
    FeatureSet needs_features() const override { return inner_->needs_features(); }
    void set_output_projection(const Tensor& wo) override {
        if (auto* u = dynamic_cast<OutputProjectionUser*>(inner_.get())) u->set_output_projection(wo);
    }
    bool reads_output_projection() const override {
        const auto* u = dynamic_cast<const OutputProjectionUser*>(inner_.get());
        return u && u->reads_output_projection();
    }
    int64_t pool_slots() const override { return S_; }
    bool per_row_positions() const override { return true; }
    const std::vector<int32_t>& token_positions() const override { return inner_->pos_; }

    void reset(int64_t batch) override {
        B_ = batch;
        T_ = P_ = 0;
        prefill_n_ = 0;
        initial_rule_ = false;
        inner_->reset(batch);
        sync();
    }
    int64_t max_forward_length() const override { return L_ - grace_; }
    void prefill(int64_t n, const InsertFeatures& f) override {
        if (n < 1 || n > L_) throw_chunk_error(name(), n, L_, 0, L_, "a prefill must fit the smallest head budget");
        // LayerCache writes a prefill's token t of head g to pool slot t G + g.
        SlotPlan p;
        p.n = n;
        p.rows = B_ * G_;
        p.length_after = S_;
        for (int64_t r = 0; r < B_ * G_; ++r)
            for (int64_t t = 0; t < n; ++t) p.targets.push_back(int32_t(t * G_ + r % G_));
        apply(p, f);
        prefill_n_ = n;
        initial_rule_ = true;
    }
    SlotPlan prepare(int64_t n) const override {
        if (P_ == 0) throw Error(str(name(), " cache: the first call of a sequence must be a prefill"));
        if (n < 1 || n > max_forward_length())
            throw_chunk_error(name(), n, max_forward_length(), T_, L_, "every head must keep its grace window and evict n old slots");
        SlotPlan p;
        p.input_pos = P_;
        p.n = n;
        p.rows = B_ * G_;
        p.length_after = S_;
        p.targets.resize(size_t(p.rows * n));
        std::vector<float> sc((size_t)(B_ * G_ * S_));
        inner_->eviction_scores(sc);
        for (int64_t b = 0; b < B_; ++b) {
            const std::vector<int32_t> freed = choose_slots(sc.data() + b * G_ * S_, inner_->pos_.data() + b * G_ * S_, n, P_);
            for (int64_t i = 0; i < G_ * n; ++i) p.targets[size_t(b * G_ * n + i)] = freed[size_t(i)];
        }
        return p;
    }
    void apply(const SlotPlan& p, const InsertFeatures& f) override {
        if (p.rows != B_ * G_ || p.moves != 0 || p.length_after != S_)
            throw Error(str(name(), " cache: a plan of ", p.rows, " rows and ", p.moves, " moves over ", p.length_after,
                            " slots; this layer's plans have ", B_ * G_, " rows, no moves and a pool of ", S_, " slots"));
        std::vector<int32_t>& pos = inner_->pos_;
        for (int64_t r = 0; r < B_ * G_; ++r) {
            const int64_t b = r / G_;
            for (int64_t t = 0; t < p.n; ++t) {
                const int32_t slot = p.targets[size_t(r * p.n + t)];
                if (slot < 0 || slot >= S_) throw Error(str(name(), " cache: plan slot ", slot, " outside the pool of ", S_));
                for (int64_t g = 0; g < G_; ++g) pos[size_t((b * G_ + g) * S_ + slot)] = -1;  // whoever kept it, evicted
                pos[size_t(r * S_ + slot)] = int32_t(p.input_pos + t);
                inner_->init_slot(r, slot, f, r * p.n + t);
            }
        }
        if (p.input_pos > 0) initial_rule_ = false;
        P_ = p.input_pos + p.n;
        T_ = std::min(P_, L_);
        sync();
        inner_->observe_chunk(f, p.input_pos, p.n);  // the scorer's per-chunk state (expected-attention)
    }
    void update(const std::vector<float>& w, int64_t n) override { inner_->accumulate(w, n); }
    // The scorer's score of every pool slot (B, G, S), +inf where the head keeps nothing.
    std::vector<float> slot_scores() const override {
        if (P_ == 0) return {};
        std::vector<float> sc((size_t)(B_ * G_ * S_));
        inner_->eviction_scores(sc);
        for (size_t i = 0; i < sc.size(); ++i)
            if (inner_->pos_[i] < 0) sc[i] = std::numeric_limits<float>::infinity();
        return sc;
    }
    int64_t head_budget(int64_t g) const { return cap_[size_t(g)]; }

   private:
    // The G n pool slots of one batch row the next n tokens go to, ascending (head g takes
    // entries [g n, (g + 1) n)): every head's own evictions, then slots no head keeps.
    // sc, pos: (G, S) of the row.
    std::vector<int32_t> choose_slots(const float* sc, const int32_t* pos, int64_t n, int64_t P) const {
        std::vector<int32_t> out;
        std::vector<uint8_t> kept((size_t)S_, 0);
        for (int64_t g = 0; g < G_; ++g) {
            const int32_t* pg = pos + g * S_;
            const float* sg = sc + g * S_;
            std::vector<int32_t> cand;  // old slots outside the grace window
            int64_t held = 0;
            for (int64_t s = 0; s < S_; ++s) {
                if (pg[s] < 0) continue;
                ++held;
                kept[size_t(s)] = 1;
                if (pg[s] < P - grace_) cand.push_back(int32_t(s));
            }
            const int64_t e = std::max<int64_t>(0, held + n - cap_[size_t(g)]);
            if (e == 0) continue;
            const int64_t C = cap_[size_t(g)];
            if (initial_rule_ && prefill_n_ == C) {
                // The first eviction of a head its prefill filled: the base scorers' keep-initial
                // rule (a prefill records no attention weights, so snapkv's scores are all 0
                // here): drop the tokens at positions [keep, keep + n).
                const int64_t keep = std::max<int64_t>(0, std::min<int64_t>(int64_t(keep_initial_fraction_ * double(C)), C - grace_ - n));
                for (int32_t s : cand)
                    if (pg[s] >= keep && pg[s] < keep + e) out.push_back(s);
                continue;
            }
            if (int64_t(cand.size()) < e)
                throw Error(str(name(), " cache: head ", g, " must evict ", e, " of ", cand.size(), " old slots outside its grace window"));
            // the e lowest scores; ties: the lower slot (ScorePolicy's order). A total order, so
            // one set however found; `out` is sorted below, so the set is all that counts.
            if (e < int64_t(cand.size()))
                std::nth_element(cand.begin(), cand.begin() + e, cand.end(),
                                 [sg](int32_t a, int32_t b) { return sg[a] < sg[b] || (sg[a] == sg[b] && a < b); });
            out.insert(out.end(), cand.begin(), cand.begin() + e);
        }
        for (int64_t s = 0; s < S_ && int64_t(out.size()) < G_ * n; ++s)
            if (!kept[size_t(s)]) out.push_back(int32_t(s));
        if (int64_t(out.size()) != G_ * n)  // cannot happen while every head holds <= its budget
            throw Error(str(name(), " cache: ", out.size(), " free slots for a chunk needing ", G_ * n));
        std::sort(out.begin(), out.end());
        return out;
    }
    // The scorer's view of the sequence: every pool slot is a candidate row entry.
    void sync() {
        inner_->T_ = B_ > 0 && P_ > 0 ? S_ : 0;
        inner_->P_ = P_;
    }

    std::string name_;
    std::vector<int64_t> cap_;  // per head: its budget C_g
    int64_t S_ = 0, grace_ = 0, prefill_n_ = 0;
    double keep_initial_fraction_;
    bool initial_rule_ = false;  // the next chunk is the first after the prefill
    std::unique_ptr<ScorePolicy> inner_;
};

// For the tests: the budget of head g of a lukv-* layer.
int64_t lukv_head_budget_for_test(const KVPolicy& p, int64_t g) {
    auto* l = dynamic_cast<const LukvPolicy*>(&p);
    if (!l) throw Error("lukv_head_budget_for_test: not a lukv-* policy");
    return l->head_budget(g);
}

namespace {
void validate_lukv(const KVCacheConfig& cfg, int64_t num_layers, int64_t num_kv_heads) {
    if (cfg.head_ratios.empty())
        throw Error(str("--kv_cache.head_ratios is required for policy '", cfg.policy(),
                        "'; expected one ratio in (0, 1] per (layer, KV head): \"1,0.5;0.25,1\", \"pattern:1,0.5\" or a file"));
    // Without a model's shape (num_layers 0) the table is still parsed.
    if (num_layers > 0 && num_kv_heads > 0) check_head_ratios(cfg.head_ratios, num_layers, num_kv_heads);
    else (void)parse_head_ratios(cfg.head_ratios);
}

// The planner's lengths: every layer's smallest head budget (its cache_length()).
void lukv_plan_lengths(const KVCacheConfig& cfg, int64_t num_kv_heads, std::vector<int64_t>& lengths) {
    validate_lukv(cfg, 0, 0);  // the plan may come first: a missing table is named as such, not read as a file ''
    for (size_t l = 0; l < lengths.size(); ++l) {
        if (lengths[l] <= 0) continue;
        const std::vector<int64_t> c = head_budgets(cfg.head_ratios, lengths[l], num_kv_heads, int64_t(l));
        lengths[l] = *std::min_element(c.begin(), c.end());
    }
}

template <const char* Inner, const char* Name>
std::unique_ptr<KVPolicy> make_lukv(const PolicyArgs& a) {
    return std::make_unique<LukvPolicy>(a.cfg, a.L, a.G, a.layer, Inner, Name);
}

constexpr char kKnorm[] = "knorm", kLukvKnorm[] = "lukv-knorm";
constexpr char kSnapkv[] = "snapkv", kLukvSnapkv[] = "lukv-snapkv";
constexpr char kH2o[] = "h2o", kLukvH2o[] = "lukv-h2o";
constexpr char kEa[] = "expected-attention", kLukvEa[] = "lukv-expected-attention";
}  // namespace

std::vector<PolicyInfo> lukv_policies() {
    const std::vector<std::string> buffers = {"default", "f32", "bf16", "f16"};
    const std::string anchor = "docs/POLICIES.md#lukv-per-head-ratio-tables";
    const std::vector<std::pair<std::string, std::string>> required = {{"kv_cache.head_ratios", "pattern:1"}};
    std::vector<PolicyInfo> out;
    out.push_back({.name = kLukvKnorm,
                   .summary = "LUKV per-head budgets (--kv_cache.head_ratios) over Knorm: each head keeps its share by its keys' norms",
                   .make = make_lukv<kKnorm, kLukvKnorm>,
                   .buffers = buffers,
                   .uses = {"grace_period", "keep_initial_fraction", "head_ratios"},
                   .required = required,
                   .doc_anchor = anchor,
                   .validate = validate_lukv,
                   .plan_lengths = lukv_plan_lengths});
    out.push_back({.name = kLukvSnapkv,
                   .summary = "LUKV per-head budgets (--kv_cache.head_ratios) over SnapKV's votes",
                   .make = make_lukv<kSnapkv, kLukvSnapkv>,
                   .needs_attention_weights = true,
                   .buffers = buffers,
                   .uses = {"snapkv_window", "snapkv_kernel", "grace_period", "keep_initial_fraction", "head_ratios"},
                   .required = required,
                   .doc_anchor = anchor,
                   .validate = validate_lukv,
                   .plan_lengths = lukv_plan_lengths});
    out.push_back({.name = kLukvH2o,
                   .summary = "LUKV per-head budgets (--kv_cache.head_ratios) over H2O's accumulated attention",
                   .make = make_lukv<kH2o, kLukvH2o>,
                   .needs_attention_weights = true,
                   .buffers = buffers,
                   .uses = {"grace_period", "keep_initial_fraction", "normalize_scores", "head_ratios"},
                   .required = required,
                   .doc_anchor = anchor,
                   .validate = validate_lukv,
                   .plan_lengths = lukv_plan_lengths});
    out.push_back({.name = kLukvEa,
                   .summary = "LUKV per-head budgets (--kv_cache.head_ratios) over Expected Attention",
                   .make = make_lukv<kEa, kLukvEa>,
                   .buffers = buffers,
                   .uses = {"grace_period", "keep_initial_fraction", "head_ratios"},
                   .required = required,
                   .doc_anchor = anchor,
                   .validate = validate_lukv,
                   .plan_lengths = lukv_plan_lengths});
    return out;
}

}  // namespace kv
