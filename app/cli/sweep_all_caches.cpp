// Every registered cache policy for a sweep (see sweep_all_caches.h).
#include "sweep_all_caches.h"

#include <cstdio>
#include <cstdlib>
#include <optional>

#include "engine/core/cache_name.h"
#include "engine/core/error.h"
#include "engine/core/join.h"
#include "engine/kv/policies/policy_registry.h"
#include "engine/model/model_loader.h"
#include "engine/run/compress_then_ask.h"
#include "engine/run/protocol.h"

namespace kv::cli {

namespace {

std::string first_value(const std::string& name, const std::string& value) {
    const OptionDef* d = find_run_option(name);
    if (d && d->type == OptionType::LIST) return value;  // its commas separate one value's items
    return value.substr(0, value.find(','));
}

}  // namespace

AllCaches all_caches(const RunConfig& base, const std::vector<std::pair<std::string, std::string>>& options) {
    RunConfig probe = base;
    std::string buffer = "default";
    std::optional<double> ratio;
    for (const auto& [name, value] : options) {
        if (name == "kv_cache.name") continue;
        if (name == "kv_cache.buffer") buffer = first_value(name, value);
        else if (name == "kv_cache.ratio") ratio = std::atof(first_value(name, value).c_str());
        else set_run_option(probe, name, first_value(name, value));
    }
    if (ratio) probe.kv_cache.cache_length = int64_t(*ratio * double(probe.data.seq_length));
    const bool ask = parse_protocol(probe.protocol.name) == Protocol::COMPRESS_THEN_ASK;
    std::optional<LoadedModel> lm;
    AllCaches out;
    for (const std::string& policy : kv_policy_names()) {
        RunConfig c = probe;
        std::string why;
        try {
            set_run_option(c, "kv_cache.name", CacheName{policy, buffer}.text());
            if (ask) {
                if (!lm) lm.emplace(load_model(c.model, ModelOptions{}, c.model_seed));
                why = compression_refusal(c, *lm);
            } else {
                const std::vector<std::string> p = run_config_problems(c);
                if (!p.empty()) why = p.front();
            }
        } catch (const Error& e) {
            why = e.what();
        }
        if (why.empty()) out.policies.push_back(policy);
        else out.skipped.push_back({policy, why});
    }
    return out;
}

void expand_all_caches(const RunConfig& base, std::vector<std::pair<std::string, std::string>>& options) {
    for (auto& [name, value] : options) {
        if (name != "kv_cache.name" || value != "all") continue;
        const AllCaches a = all_caches(base, options);
        for (const auto& [policy, why] : a.skipped) std::fprintf(stderr, "kvlab sweep: --kv_cache.name all: skipping %s: %s\n", policy.c_str(), why.c_str());
        if (a.policies.empty())
            throw Error("--kv_cache.name all: no registered policy can run this sweep's configuration (each skipped above); expected a "
                        "protocol, buffer and budget some policy accepts");
        std::fprintf(stderr, "kvlab sweep: --kv_cache.name all: %zu policies: %s\n", a.policies.size(), join(a.policies, ",").c_str());
        value = join(a.policies, ",");
        if (a.policies.size() == 1) value = a.policies.front();
    }
}

}  // namespace kv::cli
