// Experiment identity of runs (see run_experiment.h).
#include "run_experiment.h"

#include <algorithm>
#include <cmath>
#include <set>

#include <nlohmann/json.hpp>

#include "config_fields.h"

namespace kv::storage {

namespace {

void flatten(const nlohmann::json& j, const std::string& prefix, FlatConfig& out) {
    if (j.is_object()) {
        for (auto it = j.begin(); it != j.end(); ++it) flatten(it.value(), prefix.empty() ? it.key() : prefix + "." + it.key(), out);
        return;
    }
    out[prefix] = j.is_string() ? j.get<std::string>() : j.is_null() ? "" : j.dump();
}

bool under(const std::string& field, const std::string& axis) {
    return field == axis || (field.size() > axis.size() && field.compare(0, axis.size(), axis) == 0 && field[axis.size()] == '.');
}

}  // namespace

FlatConfig flat_run_config(const std::string& config_json) {
    FlatConfig out;
    const nlohmann::json j = nlohmann::json::parse(config_json, nullptr, /*allow_exceptions=*/false);
    if (j.is_object()) flatten(j, "", out);
    if (auto it = out.find("kv_cache.name"); it != out.end()) it->second = canonical_cache_name(it->second);
    return out;
}

bool is_experiment_field(const std::string& dotted) {
    for (const char* f : {"name", "out_dir", "resume", "telemetry"})
        if (under(dotted, f)) return false;
    return true;
}

std::vector<std::string> differing_fields(const std::vector<FlatConfig>& configs, const std::vector<std::string>& axes) {
    std::set<std::string> fields;
    for (const FlatConfig& c : configs)
        for (const auto& [k, v] : c) fields.insert(k);
    std::vector<std::string> out;
    for (const std::string& f : fields) {
        if (!is_experiment_field(f)) continue;
        if (std::any_of(axes.begin(), axes.end(), [&](const std::string& a) { return under(f, a); })) continue;
        // The first chunk's length goes with the cache length (0 means it): a dense reference
        // stepping in the compared runs' chunks belongs to their experiment.
        if (f == "kv_cache.prefill_length" && std::find(axes.begin(), axes.end(), "kv_cache.cache_length") != axes.end()) continue;
        const std::string* first = nullptr;
        std::string none;
        bool differs = false;
        for (const FlatConfig& c : configs) {
            auto it = c.find(f);
            const std::string& v = it == c.end() ? none : it->second;
            if (!first) first = &v;
            else if (v != *first) differs = true;
            if (differs) break;
        }
        if (differs) out.push_back(f);
    }
    return out;
}

std::string experiment_label(const FlatConfig& config, const std::vector<std::string>& fields) {
    std::string out;
    for (const std::string& f : fields) {
        auto it = config.find(f);
        out += (out.empty() ? "" : ", ") + f + "=" + (it == config.end() ? std::string("(unset)") : it->second);
    }
    return out;
}

MeanSe mean_and_se(const std::vector<double>& values) {
    MeanSe m;
    m.n = int(values.size());
    if (values.empty()) return m;
    double sum = 0;
    for (double v : values) sum += v;
    m.mean = sum / double(m.n);
    if (m.n > 1) {
        double ss = 0;
        for (double v : values) ss += (v - m.mean) * (v - m.mean);
        m.se = std::sqrt(ss / double(m.n - 1)) / std::sqrt(double(m.n));
    }
    return m;
}

}  // namespace kv::storage
