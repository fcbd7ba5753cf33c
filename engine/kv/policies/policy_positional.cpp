// Position-only policies: dense (never evicts), lastrec (init grace tokens + a ring over the
// rest, reference §4.2) and streaming (attention sinks + recent window = lastrec with sinks).
// Decisions never depend on (b, g), so slots are shared by every row.
#include <algorithm>

#include "engine/core/error.h"
#include "engine/kv/kv_policy.h"
#include "engine/kv/policies/policy_registry.h"

namespace kv {

void throw_chunk_error(const char* policy, int64_t n, int64_t allowed, int64_t T, int64_t L, const char* why) {
    throw Error(str(policy, " cache: a chunk of ", n, " tokens is not allowed here (", why, "; cache holds ", T, " of ", L,
                    " slots, at most ", allowed, " tokens fit)"),
                "use a chunk size that divides the cache length, or let the driver plan chunks");
}

namespace {

class SharedPositionsPolicy : public KVPolicy {
   public:
    SharedPositionsPolicy(int64_t L, int64_t G) : KVPolicy(L, G) {}
    bool per_row_positions() const override { return false; }
    const std::vector<int32_t>& token_positions() const override { return pos_; }
    void reset(int64_t batch) override {
        B_ = batch;
        T_ = P_ = 0;
        pos_.assign(size_t(L_), -1);
    }

   protected:
    void write(const SlotPlan& p) {
        for (int64_t t = 0; t < p.n; ++t) pos_[size_t(p.targets[size_t(t)])] = int32_t(p.input_pos + t);
        T_ = p.length_after;
        P_ = p.input_pos + p.n;
    }
    SlotPlan range_plan(int64_t start, int64_t n) const {
        SlotPlan p;
        p.input_pos = P_;
        p.n = n;
        p.rows = 1;
        for (int64_t t = 0; t < n; ++t) p.targets.push_back(int32_t(start + t));
        p.length_after = std::min(L_, T_ + n);
        return p;
    }
    std::vector<int32_t> pos_;
};

class DensePolicy final : public SharedPositionsPolicy {
   public:
    DensePolicy(int64_t L, int64_t G) : SharedPositionsPolicy(L, G) {}
    const char* name() const override { return "dense"; }
    int64_t max_forward_length() const override { return L_ - T_; }
    void prefill(int64_t n, const InsertFeatures&) override { write(range_plan(0, n)); }
    SlotPlan prepare(int64_t n) const override {
        if (n < 1 || T_ + n > L_) throw_chunk_error("dense", n, L_ - T_, T_, L_, "a dense cache never evicts and is full");
        return range_plan(T_, n);
    }
    void apply(const SlotPlan& p, const InsertFeatures&) override { write(p); }
};

// lastrec / streaming: slots [0, s) keep the first s tokens; the rest is a ring.
class LastRecPolicy final : public SharedPositionsPolicy {
   public:
    LastRecPolicy(int64_t L, int64_t G, int64_t sinks, const char* name) : SharedPositionsPolicy(L, G), s_(sinks), name_(name) {}
    const char* name() const override { return name_; }
    int64_t max_forward_length() const override { return T_ < L_ ? std::min(L_ - T_, L_ - s_) : L_ - s_; }
    void reset(int64_t batch) override {
        SharedPositionsPolicy::reset(batch);
        next_ = 0;
    }
    void prefill(int64_t n, const InsertFeatures&) override {
        write(range_plan(0, n));
        next_ = n < L_ ? n : s_;
    }
    SlotPlan prepare(int64_t n) const override {
        if (n < 1 || n > L_ - s_) throw_chunk_error(name_, n, L_ - s_, T_, L_, "a chunk may not overwrite itself in the ring");
        if (T_ < L_ && T_ + n > L_) throw_chunk_error(name_, n, L_ - T_, T_, L_, "the chunk straddles the point where the cache becomes full");
        SlotPlan p = range_plan(0, n);
        // positions_wrap_around(n, next, s, L)
        for (int64_t t = 0; t < n; ++t) {
            int64_t slot = next_ + t;
            if (slot >= L_) slot = s_ + (slot - L_);
            p.targets[size_t(t)] = int32_t(slot);
        }
        return p;
    }
    void apply(const SlotPlan& p, const InsertFeatures&) override {
        write(p);
        int64_t last = p.targets.back() + 1;
        next_ = last >= L_ ? s_ : last;
    }

   private:
    int64_t s_;
    const char* name_;
    int64_t next_ = 0;
};

}  // namespace

std::vector<PolicyInfo> positional_policies() {
    const char* anchor = "docs/POLICIES.md#position-policies-decisions-identical-for-every-b-g";
    return {{.name = "dense",
             .summary = "never evicts (cache_length 0: the whole sequence)",
             .make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> { return std::make_unique<DensePolicy>(a.L, a.G); },
             .needs_cache_length = false,
             .evicts = false,
             .doc_anchor = anchor},
            {.name = "lastrec",
             .summary = "the first init_grace_tokens tokens plus the most recent ones (a ring)",
             .make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> {
                 const int64_t s = a.cfg.init_grace_tokens >= 0 ? a.cfg.init_grace_tokens
                                                                : std::min<int64_t>(16, std::max<int64_t>(a.L / 8, 1));
                 return std::make_unique<LastRecPolicy>(a.L, a.G, std::min(s, a.L - 1), "lastrec");
             },
             .uses = {"init_grace_tokens"},
             .doc_anchor = anchor},
            {.name = "streaming",
             .summary = "StreamingLLM: `sinks` attention sinks plus the most recent tokens",
             .make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> {
                 return std::make_unique<LastRecPolicy>(a.L, a.G, std::min(a.cfg.sinks, a.L - 1), "streaming");
             },
             .uses = {"sinks"},
             .doc_anchor = anchor}};
}

}  // namespace kv
