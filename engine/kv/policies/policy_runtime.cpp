// Policies registered at run time (policy_runtime.h): the table that extends the registry, and
// the score policy that asks an ExternalScorer. Scores live in SlotScorePolicy's one float per
// slot, so the grace ring, keep-initial rule and tie-breaking are the built-in policies' own:
// an external scorer computing the same scores makes the same decisions, bit for bit.
#include "engine/kv/policies/policy_runtime.h"

#include <algorithm>
#include <atomic>
#include <mutex>

#include "engine/core/error.h"
#include "engine/telemetry/trace.h"
#include "engine/kv/kv_config.h"
#include "engine/kv/policies/policy_score_based.h"

namespace kv {

namespace {

// Capacity reserved up front: the extended table never reallocates, so a PolicyInfo pointer
// (find_policy) taken during a run stays valid while another policy is registered.
constexpr size_t kMaxExternalPolicies = 256;

struct RuntimeTable {
    std::mutex mu;
    std::vector<ExternalPolicySpec> specs;
    std::vector<PolicyInfo> table;    // built-in + external, once one is registered
    std::vector<std::string> names;
    std::atomic<bool> active{false};
};

RuntimeTable& runtime() {
    static RuntimeTable t;
    return t;
}

class ExternalScorePolicy final : public SlotScorePolicy, public ReadsTokens {
   public:
    ExternalScorePolicy(const PolicyArgs& a, std::string name, ExternalNeeds needs, std::unique_ptr<ExternalScorer> scorer)
        : SlotScorePolicy(a.cfg, a.L, a.G), name_(std::move(name)), needs_(needs), scorer_(std::move(scorer)), layer_(a.layer) {}

    const char* name() const override { return name_.c_str(); }
    bool needs_attention_weights() const override { return needs_.attention; }
    int64_t weights_query_window() const override { return needs_.attention_window; }
    FeatureSet needs_features() const override { return needs_.features; }
    void observe_tokens(const std::vector<int32_t>& ids, int64_t n) override {
        ids_ = ids;
        ids_n_ = n;
    }

    void prefill(int64_t n, const InsertFeatures& f) override {
        score_new(f, n, 0);
        ScorePolicy::prefill(n, f);
    }
    void apply(const SlotPlan& plan, const InsertFeatures& f) override {
        score_new(f, plan.n, plan.input_pos);
        ScorePolicy::apply(plan, f);
    }

   protected:
    float initial_score(const InsertFeatures&, int64_t i) const override { return new_scores_[size_t(i)]; }
    void accumulate(const std::vector<float>& w, int64_t n) override {
        const bool weights = needs_.attention && !w.empty();
        if (!weights && !needs_.rescore) return;
        ExternalFeatures x = common(n, input_pos());
        x.length = T_;
        x.weights = weights ? w.data() : nullptr;
        x.scores = &score(0, 0);
        logged([&] { scorer_->update(x); });
    }

   private:
    ExternalFeatures common(int64_t n, int64_t input_pos) const {
        ExternalFeatures x;
        x.layer = layer_;
        x.rows = rows();
        x.groups = G_;
        x.n = n;
        x.input_pos = input_pos;
        x.slots = L_;
        x.length = T_;
        x.positions = pos_.data();
        if (needs_.token_ids && ids_n_ == n && !ids_.empty()) x.token_ids = ids_.data();
        return x;
    }
    void score_new(const InsertFeatures& f, int64_t n, int64_t input_pos) {
        ExternalFeatures x = common(n, input_pos);
        const size_t want = size_t(rows() * n);
        auto view = [want](const std::vector<float>& v) { return v.size() >= want ? v.data() : nullptr; };
        if (needs_.features.has(Feature::KeyNorm)) x.key_norm = view(f.key_norm);
        if (needs_.features.has(Feature::ValueNorm)) x.value_norm = view(f.value_norm);
        if (needs_.features.has(Feature::KeyVectors) && f.head_dim > 0 && f.keys.size() == want * size_t(f.head_dim)) x.keys = f.keys.data(), x.head_dim = f.head_dim;
        if (needs_.features.has(Feature::ValueVectors) && f.head_dim > 0 && f.values.size() == want * size_t(f.head_dim)) x.values = f.values.data(), x.head_dim = f.head_dim;
        if (needs_.features.has(Feature::QueryVectors) && !f.queries.empty()) x.queries = f.queries.data(), x.query_heads = f.query_heads, x.head_dim = f.head_dim;
        new_scores_.assign(want, 0.0f);
        logged([&] { scorer_->score_new(x, new_scores_.data()); });
    }

    // A scorer's failure (a Python traceback) goes into the run's log as well as its error.
    template <class F>
    static void logged(F&& call) {
        try {
            call();
        } catch (const std::exception& e) {
            trace::log(trace::LogLevel::ERROR, e.what());
            throw;
        }
    }

    std::string name_;
    ExternalNeeds needs_;
    std::unique_ptr<ExternalScorer> scorer_;
    int64_t layer_;
    std::vector<float> new_scores_;  // (rows, n) of the chunk being placed
    std::vector<int32_t> ids_;
    int64_t ids_n_ = 0;
};

std::unique_ptr<KVPolicy> make_external_policy(const PolicyArgs& a) {
    const std::string name = a.cfg.policy();
    ExternalPolicySpec spec;
    {
        std::lock_guard<std::mutex> lock(runtime().mu);
        for (const ExternalPolicySpec& s : runtime().specs)
            if (s.name == name) spec = s;
    }
    if (!spec.make) throw Error(str("policy '", name, "' is not registered in this process"));
    std::unique_ptr<ExternalScorer> scorer = spec.make(a);
    if (!scorer) throw Error(str("policy '", name, "': its factory made no scorer for layer ", a.layer));
    return std::make_unique<ExternalScorePolicy>(a, name, spec.needs, std::move(scorer));
}

PolicyInfo info_of(const ExternalPolicySpec& s) {
    return {.name = s.name,
            .summary = s.summary.empty() ? "registered at run time (external scorer)" : s.summary,
            .make = &make_external_policy,
            .needs_attention_weights = s.needs.attention,
            .uses = {"grace_period", "keep_initial_fraction", "max_chunk_size"},
            .doc_anchor = "docs/POLICIES.md#policies-registered-at-run-time"};
}

}  // namespace

void register_external_policy(ExternalPolicySpec spec) {
    if (spec.name.empty() || !std::all_of(spec.name.begin(), spec.name.end(), [](char c) {
            return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
        }))
        throw Error(str("policy name '", spec.name, "' is not a word; expected letters, digits and '_' (cache names are {policy}-{buffer})"));
    if (!spec.make) throw Error(str("policy '", spec.name, "': no scorer factory"));
    // Built-in names (and buffer suffixes) are read before taking the lock: the lookups read
    // the runtime table without it.
    const std::vector<PolicyInfo>& current = policy_registry();
    const std::vector<std::string>& current_names = kv_policy_names();
    RuntimeTable& rt = runtime();
    std::lock_guard<std::mutex> lock(rt.mu);
    for (size_t i = 0; i < rt.specs.size(); ++i)
        if (rt.specs[i].name == spec.name) {
            // Replacing a registered policy (an edited class): same slot, new scorer.
            for (PolicyInfo& p : rt.table)
                if (p.name == spec.name) p = info_of(spec);
            rt.specs[i] = std::move(spec);
            return;
        }
    if (find_policy(spec.name))
        throw Error(str("policy '", spec.name, "' is a built-in policy; choose another name for a registered one"));
    if (rt.specs.size() >= kMaxExternalPolicies)
        throw Error(str("policy '", spec.name, "': at most ", kMaxExternalPolicies, " policies can be registered in one process"));
    if (!rt.active.load()) {
        rt.table.reserve(current.size() + kMaxExternalPolicies);
        rt.table = current;
        rt.names.reserve(current_names.size() + kMaxExternalPolicies);
        rt.names = current_names;
    }
    rt.table.push_back(info_of(spec));
    rt.names.push_back(spec.name);
    rt.specs.push_back(std::move(spec));
    rt.active.store(true);
}

std::vector<std::string> external_policy_names() {
    std::lock_guard<std::mutex> lock(runtime().mu);
    std::vector<std::string> v;
    for (const auto& s : runtime().specs) v.push_back(s.name);
    return v;
}

const std::vector<PolicyInfo>& with_runtime_policies(const std::vector<PolicyInfo>& builtin) {
    return runtime().active.load() ? runtime().table : builtin;
}

const std::vector<std::string>& with_runtime_policy_names(const std::vector<std::string>& builtin) {
    return runtime().active.load() ? runtime().names : builtin;
}

}  // namespace kv
