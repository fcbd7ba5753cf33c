// ada-<scorer> (Ada-KV, Feng et al. 2024, "Ada-KV: Optimizing KV Cache Eviction by Adaptive
// Budget Allocation"): a layer's budget of G * L slots is shared by its G heads instead of L
// each. When the pool is full and a chunk of n tokens arrives (n new slots per head), the
// G * n evicted slots are the lowest-scoring ones over all heads together (top-k over the
// concatenated scores), with the paper's safeguard: every head keeps at least
// floor(ada_alpha * L) of its old slots (its own best ones) besides the chunk's new tokens,
// alpha = 0.2 as kvpress' AdaKVPress.
// The scores are those of any per-slot score policy (snapkv, expected-attention): the wrapped
// scorer runs over the pool (its rows are the (b, g) heads, its slots the pool's slots).
// Storage is the pool itself — exactly the kept slots (PooledSlots, policy_capabilities.h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "engine/core/error.h"
#include "engine/kv/kv_config.h"
#include "engine/kv/policies/output_projection.h"
#include "engine/kv/policies/policy_ada.h"
#include "engine/kv/policies/policy_score_based.h"

namespace kv {

namespace {
AdaVariant g_variant = AdaVariant::PAPER;
}  // namespace

void set_ada_variant(AdaVariant v) { g_variant = v; }
AdaVariant ada_variant() { return g_variant; }
AdaVariant parse_ada_variant(const std::string& name) {
    if (name == "paper") return AdaVariant::PAPER;
    if (name == "equal") return AdaVariant::EQUAL;
    if (name == "fixed") return AdaVariant::FIXED;
    if (name == "ema") return AdaVariant::EMA;
    throw Error(str("ada variant '", name, "' is unknown; expected paper, equal, fixed or ema"));
}

class AdaKVPolicy : public KVPolicy, public PooledSlots, public OutputProjectionUser {
   public:
    AdaKVPolicy(const KVCacheConfig& cfg, int64_t L, int64_t G, int64_t layer, const std::string& inner_name, std::string name,
                const TextCodec* text = nullptr)
        : KVPolicy(L, G),
          name_(std::move(name)),
          S_(L * G),
          grace_(cfg.grace_period),
          keep_initial_fraction_(cfg.keep_initial_fraction),
          variant_(ada_variant()) {
        const double alpha = cfg.policy_option("ada_alpha");
        min_ = int64_t(std::floor(alpha * double(L)));
        if (grace_ >= L) throw Error(str("grace_period ", grace_, " must be smaller than the cache length ", L));
        // The scorer sees a pool of G * L slots per row; its own grace ring and top-k are off
        // (this policy decides).
        KVCacheConfig c = cfg;
        c.grace_period = 0;
        c.max_chunk_size = 0;
        c.name = CacheName{inner_name, cfg.buffer()}.text();
        const PolicyInfo* info = find_policy(inner_name);
        std::unique_ptr<KVPolicy> p = build_policy(*info, PolicyArgs{c, S_, G, layer, text});
        inner_.reset(dynamic_cast<ScorePolicy*>(p.get()));
        if (!inner_) throw Error(str(name_, ": '", inner_name, "' is not a score policy"));
        (void)p.release();
        two_stage_ = dynamic_cast<TwoStageScores*>(inner_.get());
        inner_->driven_by_pool_ = true;
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
        initial_rule_ = false;
        inner_->reset(batch);
        target_.clear();
        if (variant_ == AdaVariant::EQUAL) target_.assign(size_t(B_ * G_), L_);
        ema_.assign(size_t(B_ * G_ * S_), 0.0f);
        ema_pos_.assign(size_t(B_ * G_ * S_), -1);
        sync();
    }
    int64_t max_forward_length() const override {
        // Each head keeps >= max(min, grace) old slots, so n <= L - max(min, grace) always
        // leaves G * n evictable slots (see docs/POLICIES.md#ada-kv).
        const int64_t m = std::max<int64_t>(1, L_ - std::max(min_, grace_));
        return P_ < L_ ? std::min(m, L_ - P_) : m;
    }
    void prefill(int64_t n, const InsertFeatures& f) override {
        if (n < 1 || n > L_) throw_chunk_error(name(), n, L_, 0, L_, "a prefill must fit the cache");
        SlotPlan p = fill_plan(0, n);
        apply(p, f);
        initial_rule_ = n == L_;
    }
    SlotPlan prepare(int64_t n) const override {
        if (P_ == 0) throw Error(str(name(), " cache: the first call of a sequence must be a prefill"));
        if (n < 1 || n > max_forward_length())
            throw_chunk_error(name(), n, max_forward_length(), T_, L_,
                              P_ < L_ && P_ + n > L_ ? "the chunk straddles the point where the cache becomes full"
                                                     : "the chunk is longer than max_forward_length");
        if (P_ < L_) return fill_plan(P_, n);
        SlotPlan p;
        p.input_pos = P_;
        p.n = n;
        p.rows = B_ * G_;
        p.length_after = S_;
        p.targets.resize(size_t(p.rows * n));
        if (initial_rule_) {
            // The first chunk after a full prefill: the base scorers' keep-initial rule
            // (ScorePolicy, docs/POLICIES.md), per head: every head drops its tokens at positions
            // [keep, keep + n). A prefill records no attention weights, so snapkv's scores are
            // all 0 here (expected-attention's too until a chunk scores them); a top-k over those
            // ties evicted head 0's first 384 of 512 tokens, sink included, in every layer.
            int64_t keep = std::min<int64_t>(int64_t(keep_initial_fraction_ * double(L_)), L_ - grace_ - n);
            keep = std::max<int64_t>(keep, 0);
            const std::vector<int32_t>& pos = inner_->pos_;
            for (int64_t r = 0; r < B_ * G_; ++r)
                for (int64_t s = 0; s < S_; ++s) {
                    const int32_t ps = pos[size_t(r * S_ + s)];
                    if (ps >= keep && ps < keep + n) p.targets[size_t(r * n + (ps - keep))] = int32_t(s);
                }
            return p;
        }
        if (two_stage_) {
            const std::vector<float> alloc = two_stage_->allocation_scores(), sel = two_stage_->selection_scores();
            for (int64_t b = 0; b < B_; ++b) {
                std::vector<int32_t> freed = choose_two_stage(alloc.data() + b * G_ * S_, sel.data() + b * G_ * S_,
                                                              inner_->pos_.data() + b * G_ * S_, n, P_, two_stage_->first_stage_fraction());
                std::sort(freed.begin(), freed.end());
                for (int64_t g = 0; g < G_; ++g)
                    for (int64_t t = 0; t < n; ++t) p.targets[size_t((b * G_ + g) * n + t)] = freed[size_t(g * n + t)];
            }
            return p;
        }
        std::vector<float> sc((size_t)(B_ * G_ * S_));
        inner_->eviction_scores(sc);
        if (variant_ == AdaVariant::EMA) sc = ema_;
        for (int64_t b = 0; b < B_; ++b) {
            const int64_t* target = target_.empty() ? nullptr : target_.data() + b * G_;
            std::vector<int32_t> freed = choose_evictions(sc.data() + b * G_ * S_, inner_->pos_.data() + b * G_ * S_, n, P_, target);
            std::sort(freed.begin(), freed.end());
            for (int64_t g = 0; g < G_; ++g)
                for (int64_t t = 0; t < n; ++t) p.targets[size_t((b * G_ + g) * n + t)] = freed[size_t(g * n + t)];
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
                for (int64_t g = 0; g < G_; ++g) pos[size_t((b * G_ + g) * S_ + slot)] = -1;  // whoever kept it, evicted
                pos[size_t(r * S_ + slot)] = int32_t(p.input_pos + t);
                inner_->init_slot(r, slot, f, r * p.n + t);
            }
        }
        const bool was_initial_rule = initial_rule_;
        if (p.input_pos >= L_) initial_rule_ = false;
        P_ = p.input_pos + p.n;
        T_ = std::min(P_, L_);
        sync();
        // FIXED: the budgets the first top-k over all heads left (the keep-initial eviction before it is equal per head)
        if (variant_ == AdaVariant::FIXED && target_.empty() && p.input_pos >= L_ && !was_initial_rule) {
            target_.assign(size_t(B_ * G_), 0);
            for (int64_t r = 0; r < B_ * G_; ++r)
                for (int64_t s = 0; s < S_; ++s) target_[size_t(r)] += pos[size_t(r * S_ + s)] >= 0;
        }
        // The scorer's own per-chunk state (expected-attention's query statistics): without it
        // its scores stayed 0 and every eviction was a tie, broken toward head 0's lowest slots.
        inner_->observe_chunk(f, p.input_pos, p.n);
    }
    void update(const std::vector<float>& w, int64_t n) override {
        inner_->accumulate(w, n);
        if (variant_ != AdaVariant::EMA) return;
        std::vector<float> sc((size_t)(B_ * G_ * S_));
        inner_->eviction_scores(sc);
        for (size_t i = 0; i < sc.size(); ++i) {
            const int32_t ps = inner_->pos_[i];
            if (ps < 0) continue;
            ema_[i] = ema_pos_[i] == ps ? 0.5f * (ema_[i] + sc[i]) : sc[i];  // a new token starts at its first score
            ema_pos_[i] = ps;
        }
    }
    // The scorer's score of every pool slot (B, G, S), +inf where the head keeps nothing;
    // empty until the pool is full (as ScorePolicy).
    std::vector<float> slot_scores() const override {
        if (P_ < L_) return {};
        std::vector<float> sc((size_t)(B_ * G_ * S_));
        if (two_stage_) {
            // Two scores decide (critical-ada): shown as kvpress' final scores of a one-token step,
            // FLT_MAX where the slot stays, the rescaled score of the G slots that step evicts.
            const std::vector<float> alloc = two_stage_->allocation_scores(), sel = two_stage_->selection_scores();
            std::fill(sc.begin(), sc.end(), std::numeric_limits<float>::max());
            for (int64_t b = 0; b < B_; ++b) {
                std::vector<int32_t> freed;
                try {
                    freed = choose_two_stage(alloc.data() + b * G_ * S_, sel.data() + b * G_ * S_, inner_->pos_.data() + b * G_ * S_, 1, P_,
                                             two_stage_->first_stage_fraction());
                } catch (const Error&) {
                    continue;  // no one-token step possible (too few old slots): nothing shown as evicted
                }
                for (int32_t slot : freed)
                    for (int64_t g = 0; g < G_; ++g) {
                        const size_t i = size_t((b * G_ + g) * S_ + slot);
                        if (inner_->pos_[i] >= 0) sc[i] = sel[i];
                    }
            }
        } else {
            inner_->eviction_scores(sc);
        }
        for (size_t i = 0; i < sc.size(); ++i)
            if (inner_->pos_[i] < 0) sc[i] = std::numeric_limits<float>::infinity();
        return sc;
    }

    // The testable core: the G * n pool slots of one batch row to evict before tokens P ..
    // P + n - 1 arrive, given the scores sc (G, S) and positions pos (G, S) of its heads.
    // target (G) (exploratory variants EQUAL / FIXED, else null): head g evicts exactly its own
    // count + n - target[g] lowest, no top-k over heads.
    std::vector<int32_t> choose_evictions(const float* sc, const int32_t* pos, int64_t n, int64_t P, const int64_t* target = nullptr) const {
        struct Cand {
            float s;
            int32_t g, slot;
        };
        auto lower = [](const Cand& a, const Cand& b) {
            return a.s < b.s || (a.s == b.s && (a.g < b.g || (a.g == b.g && a.slot < b.slot)));
        };
        std::vector<Cand> pool;
        for (int64_t g = 0; g < G_; ++g) {
            std::vector<Cand> own;
            int64_t kept = 0;  // slots of this head that cannot be evicted (recent)
            for (int64_t s = 0; s < S_; ++s) {
                const int32_t ps = pos[g * S_ + s];
                if (ps < 0) continue;
                if (ps >= P - grace_) ++kept;
                else own.push_back({sc[g * S_ + s], int32_t(g), int32_t(s)});
            }
            // Safeguard over the slots being compressed, as kvpress' AdaKVPress lifts a head's
            // best floor(alpha L) scored tokens: the head's recent slots count toward its minimum,
            // its best other old slots make up the rest and are not candidates. The n new tokens
            // do not count (they are not scored yet): counting them let a head keep nothing older
            // than the chunk whenever n >= alpha L (L = 512, chunks of 128), so its queries saw
            // no past at all, not even the first token.
            const int64_t reserve = std::clamp<int64_t>(min_ - kept, 0, int64_t(own.size()));
            // `lower` is a total order (slots are distinct), so the lowest k are one set and one
            // order however they are found: the quota's in order, the pool's as a set (sorted below).
            if (target) {
                const int64_t quota = kept + int64_t(own.size()) + n - target[g];
                if (quota < 0 || quota > int64_t(own.size()))
                    throw Error(str(name(), " cache: head ", g, " must evict ", quota, " of ", own.size(), " evictable slots"));
                std::partial_sort(own.begin(), own.begin() + quota, own.end(), lower);
                pool.insert(pool.end(), own.begin(), own.begin() + quota);
                continue;
            }
            if (reserve > 0) std::nth_element(own.begin(), own.end() - reserve, own.end(), lower);
            pool.insert(pool.end(), own.begin(), own.end() - reserve);
        }
        const int64_t e = G_ * n;
        if (target) {
            if (int64_t(pool.size()) != e) throw Error(str(name(), " cache: the heads' quotas free ", pool.size(), " slots, not ", e));
            std::vector<int32_t> out;
            for (const Cand& c : pool) out.push_back(c.slot);
            return out;
        }
        if (int64_t(pool.size()) < e)
            throw Error(str(name(), " cache: only ", pool.size(), " evictable slots for a chunk needing ", e));
        std::partial_sort(pool.begin(), pool.begin() + e, pool.end(), lower);
        std::vector<int32_t> out;
        for (int64_t i = 0; i < e; ++i) out.push_back(pool[size_t(i)].slot);
        return out;
    }
    int64_t min_per_head() const { return min_; }

    // CriticalAdaKV (kvpress' CriticalAdaKVPress) for one batch row: the heads' budgets are
    // Ada-KV's top-k over all heads by the allocation scores (the wrapped scorer's), e_g of the
    // G n evictions falling to head g; within head g, of its c_g candidates (old, outside the
    // grace window), the best max(safeguard, floor(fraction (c_g - e_g))) by the allocation
    // scores stay (the safeguard, then stage 1), and the e_g lowest selection scores among the
    // rest go (stage 2; equal scores: the lower slot first).
    std::vector<int32_t> choose_two_stage(const float* alloc, const float* sel, const int32_t* pos, int64_t n, int64_t P, double fraction) const {
        const std::vector<int32_t> budget = choose_evictions(alloc, pos, n, P);
        std::vector<int64_t> e((size_t)G_, 0);
        for (int32_t slot : budget)
            for (int64_t g = 0; g < G_; ++g)
                if (pos[g * S_ + slot] >= 0) ++e[size_t(g)];
        std::vector<int32_t> out;
        for (int64_t g = 0; g < G_; ++g) {
            std::vector<int32_t> own;
            int64_t kept = 0;
            for (int64_t s = 0; s < S_; ++s) {
                const int32_t ps = pos[g * S_ + s];
                if (ps < 0) continue;
                if (ps >= P - grace_) ++kept;
                else own.push_back(int32_t(s));
            }
            const float* a = alloc + g * S_;
            const float* z = sel + g * S_;
            const int64_t c = int64_t(own.size()), eg = e[size_t(g)];
            const int64_t reserve = std::clamp<int64_t>(min_ - kept, 0, c);
            const int64_t first = std::min(c, std::max(reserve, int64_t(fraction * double(c - eg))));
            // The first `first` by the allocation score (equal: the higher slot first, eviction's
            // mirror) stay, then the eg lowest selection scores (equal: the lower slot first) go.
            // Both orders are strict and total, so each cut is one set however the sides are
            // ordered: selections, not sorts.
            if (first > 0 && first < c)
                std::nth_element(own.begin(), own.begin() + (first - 1), own.end(),
                                 [a](int32_t x, int32_t y) { return a[x] > a[y] || (a[x] == a[y] && x > y); });
            const auto rest = own.begin() + first;
            if (c - first < eg) throw Error(str(name(), " cache: head ", g, " must evict ", eg, " of ", c - first, " slots past its first stage"));
            if (eg > 0 && eg < c - first)
                std::nth_element(rest, rest + (eg - 1), own.end(), [z](int32_t x, int32_t y) { return z[x] < z[y] || (z[x] == z[y] && x < y); });
            out.insert(out.end(), rest, rest + eg);
        }
        return out;
    }

   protected:
    ScorePolicy& inner() const { return *inner_; }

   private:
    // Filling: token P + t of head g goes to pool slot (P + t) * G + g (interleaved, so the
    // prefill's (B, n, G, D) keys are one contiguous write).
    SlotPlan fill_plan(int64_t P, int64_t n) const {
        SlotPlan p;
        p.input_pos = P;
        p.n = n;
        p.rows = B_ * G_;
        p.length_after = S_;
        for (int64_t r = 0; r < B_ * G_; ++r)
            for (int64_t t = 0; t < n; ++t) p.targets.push_back(int32_t((P + t) * G_ + r % G_));
        return p;
    }
    // The scorer's view of the sequence: every pool slot is a candidate row entry.
    void sync() {
        inner_->T_ = B_ > 0 && P_ > 0 ? S_ : 0;
        inner_->P_ = P_;
    }

    std::string name_;
    int64_t S_, grace_, min_ = 0;
    double keep_initial_fraction_;
    bool initial_rule_ = false;  // the next eviction is the first after a full prefill
    std::unique_ptr<ScorePolicy> inner_;
    TwoStageScores* two_stage_ = nullptr;  // inner_ when it allocates and chooses by different scores (critical-ada)
    AdaVariant variant_;
    std::vector<int64_t> target_;  // (B, G) fixed budgets (EQUAL, FIXED), empty = the paper's top-k
    std::vector<float> ema_;        // (B, G, S) EMA's averaged scores
    std::vector<int32_t> ema_pos_;  // the position each ema_ entry belongs to
};

// ada-kvzip: the pool's scores come from KVzip's reconstruction pass (a capability only this
// variant has, so the driver runs the pass for it alone); each head scores the slots it keeps.
class AdaReconstructingPolicy final : public AdaKVPolicy, public ReconstructsContext {
   public:
    using AdaKVPolicy::AdaKVPolicy;
    ReconstructionPrompt reconstruction_prompt() const override { return scorer().reconstruction_prompt(); }
    void observe_reconstruction(const ReconstructionInput& in) override { scorer().observe_reconstruction(in); }

   private:
    ReconstructsContext& scorer() const {
        auto* r = dynamic_cast<ReconstructsContext*>(&inner());
        if (!r) throw Error(str(name(), ": the wrapped scorer has no reconstruction pass"));
        return *r;
    }
};

// For the formula test (tests/engine/kv_registry_test.cpp): the evictions of one batch row.
std::vector<int32_t> ada_choose_evictions_for_test(const KVPolicy& p, const std::vector<float>& sc, const std::vector<int32_t>& pos,
                                                   int64_t n, int64_t P) {
    auto* a = dynamic_cast<const AdaKVPolicy*>(&p);
    if (!a) throw Error("ada_choose_evictions_for_test: not an ada-* policy");
    return a->choose_evictions(sc.data(), pos.data(), n, P);
}

// For the CriticalAdaKV test (tests/engine/policy_critical_ada_test.cpp): the evictions of one batch row.
std::vector<int32_t> ada_choose_two_stage_for_test(const KVPolicy& p, const std::vector<float>& alloc, const std::vector<float>& sel,
                                                   const std::vector<int32_t>& pos, int64_t n, int64_t P, double fraction) {
    auto* a = dynamic_cast<const AdaKVPolicy*>(&p);
    if (!a) throw Error("ada_choose_two_stage_for_test: not an ada-* policy");
    return a->choose_two_stage(alloc.data(), sel.data(), pos.data(), n, P, fraction);
}

std::vector<PolicyInfo> ada_policies() {
    const std::vector<PolicyOption> opts = {{.name = "ada_alpha",
                                             .help = "Ada-KV safeguard: every head keeps at least floor(alpha * cache_length) slots",
                                             .def = 0.2,
                                             .lo = 0.0,
                                             .hi = 1.0}};
    std::vector<PolicyInfo> out;
    out.push_back({.name = "ada-snapkv",
                   .summary = "Ada-KV over SnapKV: the layer's G*L slots shared by its heads, evictions by top-k over all heads",
                   .make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> {
                       return std::make_unique<AdaKVPolicy>(a.cfg, a.L, a.G, a.layer, "snapkv", "ada-snapkv");
                   },
                   .needs_attention_weights = true,
                   .buffers = {"default", "f32", "bf16", "f16"},
                   .uses = {"snapkv_window", "snapkv_kernel", "grace_period", "keep_initial_fraction"},
                   .options = opts,
                   .doc_anchor = "docs/POLICIES.md#ada-kv"});
    out.push_back({.name = "ada-expected-attention",
                   .summary = "Ada-KV over Expected Attention: per-head budgets from top-k over all heads' expected attention",
                   .make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> {
                       return std::make_unique<AdaKVPolicy>(a.cfg, a.L, a.G, a.layer, "expected-attention", "ada-expected-attention");
                   },
                   .buffers = {"default", "f32", "bf16", "f16"},
                   .uses = {"grace_period", "keep_initial_fraction"},
                   .doc_anchor = "docs/POLICIES.md#ada-kv"});
    out.push_back({.name = "ada-kvzip",
                   .summary = "Ada-KV over KVzip: the layer's G*L slots shared by its heads, evictions by top-k over all heads' KVzip scores",
                   .make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> {
                       return std::make_unique<AdaReconstructingPolicy>(a.cfg, a.L, a.G, a.layer, "kvzip", "ada-kvzip", a.text);
                   },
                   .needs_text = true,
                   .buffers = {"default", "f32", "bf16", "f16"},
                   .uses = {"grace_period", "keep_initial_fraction"},
                   .doc_anchor = "docs/POLICIES.md#kvzip"});
    out.push_back({.name = "critical-ada",
                   .summary = "CriticalAdaKV: Ada-KV's head budgets from SnapKV's scores, each head's slots chosen by CriticalKV's two stages",
                   .make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> {
                       return std::make_unique<AdaKVPolicy>(a.cfg, a.L, a.G, a.layer, "critical-snapkv", "critical-ada");
                   },
                   .needs_attention_weights = true,
                   .buffers = {"default", "f32", "bf16", "f16"},
                   .uses = {"snapkv_window", "snapkv_kernel", "grace_period", "keep_initial_fraction"},
                   .doc_anchor = "docs/POLICIES.md#critical-ada"});
    return out;
}

}  // namespace kv
