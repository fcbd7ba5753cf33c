// The policy registry (see policy_registry.h): one line per policy file, and the lookups every
// other place uses. A policy file describes its policies in `<file>_policies()`.
#include "engine/kv/policies/policy_registry.h"

#include <algorithm>

#include "engine/core/error.h"
#include "engine/kv/kv_config.h"
#include "engine/kv/kv_policy.h"
#include "engine/kv/policies/policy_runtime.h"
#include "engine/kv/read_selection.h"

namespace kv {

// One line per policy file (a file may describe several policies, e.g. h2o's three).
#define KV_POLICY_FILES(X) \
    X(positional)          \
    X(smart_lastrec)       \
    X(h2o)                 \
    X(qh2o)                \
    X(tova)                \
    X(snapkv)              \
    X(knorm)               \
    X(random)              \
    X(rkv)                 \
    X(expected_attention)  \
    X(cake)                \
    X(quest)               \
    X(ada)                 \
    X(lukv)                \
    X(kvzip)               \
    X(global_kvzip)        \
    X(kvzap)               \
    X(keydiff)             \
    X(chunkkv)             \
    X(observed_attention)  \
    X(cur)                 \
    X(non_causal_attn)     \
    X(leverage)            \
    X(compactor)           \
    X(lagkv)               \
    X(critical)            \
    X(qfilter)             \
    X(cap)                 \
    X(simlayerkv)          \
    X(finch)               \
    X(merging)             \
    X(cam)                 \
    X(key_rerotation)      \
    X(duo)

#define KV_DECLARE_POLICY_FILE(f) std::vector<PolicyInfo> f##_policies();
KV_POLICY_FILES(KV_DECLARE_POLICY_FILE)
#undef KV_DECLARE_POLICY_FILE

namespace {

std::vector<PolicyInfo> build_registry() {
    std::vector<PolicyInfo> all;
#define KV_APPEND_POLICY_FILE(f)                 \
    for (PolicyInfo & p : f##_policies()) all.push_back(std::move(p));
    KV_POLICY_FILES(KV_APPEND_POLICY_FILE)
#undef KV_APPEND_POLICY_FILE
    // A broken table is a programmer error: fail at the first lookup, loudly.
    std::vector<std::string> seen, opts;
    for (const PolicyInfo& p : all) {
        if (p.name.empty() || !p.make || p.doc_anchor.empty())
            throw Error(str("policy registry: policy '", p.name, "' lacks a name, a factory or a doc anchor"));
        if (p.name.find_first_of(" ,") != std::string::npos || std::find(seen.begin(), seen.end(), p.name) != seen.end())
            throw Error(str("policy registry: policy name '", p.name, "' is repeated or contains a space or comma"));
        seen.push_back(p.name);
        for (const PolicyOption& o : p.options) {
            if (std::find(opts.begin(), opts.end(), o.name) != opts.end() || !(o.lo <= o.def && o.def <= o.hi))
                throw Error(str("policy registry: option '", o.name, "' of '", p.name, "' is repeated or its default is out of range"));
            opts.push_back(o.name);
        }
    }
    return all;
}

}  // namespace

const std::vector<PolicyInfo>& policy_registry() {
    static const std::vector<PolicyInfo> r = build_registry();
    return with_runtime_policies(r);  // plus policies registered at run time (policy_runtime.h)
}

const PolicyInfo* find_policy(const std::string& name) {
    for (const PolicyInfo& p : policy_registry())
        if (p.name == name) return &p;
    return nullptr;
}

const std::vector<std::string>& kv_policy_names() {
    static const std::vector<std::string> names = [] {
        std::vector<std::string> v;
        for (const PolicyInfo& p : policy_registry()) v.push_back(p.name);
        return v;
    }();
    return with_runtime_policy_names(names);
}

const PolicyOption* find_policy_option(const std::string& name, const PolicyInfo** owner) {
    for (const PolicyInfo& p : policy_registry())
        for (const PolicyOption& o : p.options)
            if (o.name == name) {
                if (owner) *owner = &p;
                return &o;
            }
    return nullptr;
}

std::unique_ptr<ReadSelection> make_read_selection(const KVCacheConfig& cfg) {
    const PolicyInfo* p = find_policy(cfg.policy());
    return p && p->read_selection ? p->read_selection(cfg) : nullptr;
}

void policy_plan_lengths(const KVCacheConfig& cfg, int64_t num_kv_heads, std::vector<int64_t>& lengths) {
    const PolicyInfo* p = find_policy(cfg.policy());
    if (p && p->plan_lengths) p->plan_lengths(cfg, num_kv_heads, lengths);
}

std::string policy_help_text() {
    std::string s;
    size_t width = 0;  // names line up in one column, the longest one included
    for (const PolicyInfo& p : policy_registry()) width = std::max(width, p.name.size());
    for (const PolicyInfo& p : policy_registry()) {
        std::string line = "    " + p.name;
        line.resize(4 + width + 2, ' ');
        s += line + p.summary + "\n";
    }
    return s;
}

std::unique_ptr<KVPolicy> build_policy(const PolicyInfo& info, const PolicyArgs& args) {
    std::unique_ptr<KVPolicy> p = info.make(args);
    // The one place a policy's class is asked what it implements: from here on callers read
    // the attached pointers.
    PolicyCapabilities& c = p->caps_;
    c.selects_reads = dynamic_cast<SelectsReads*>(p.get());
    c.reconstructs_context = dynamic_cast<ReconstructsContext*>(p.get());
    c.pooled_slots = dynamic_cast<PooledSlots*>(p.get());
    c.cross_layer_lengths = dynamic_cast<CrossLayerLengths*>(p.get());
    c.reorders_batch = dynamic_cast<ReordersBatch*>(p.get());
    c.reads_tokens = dynamic_cast<ReadsTokens*>(p.get());
    c.rerotates_keys = dynamic_cast<RerotatesKeys*>(p.get());
    return p;
}

std::unique_ptr<KVPolicy> make_policy(const KVCacheConfig& cfg, int64_t L, int64_t G, const TextCodec* text, int64_t layer) {
    const std::string p = cfg.policy();
    const PolicyInfo* info = find_policy(p);
    if (!info) throw Error(str("unknown KV cache policy '", p, "'"));
    return build_policy(*info, PolicyArgs{cfg, L, G, layer, text});
}

}  // namespace kv
