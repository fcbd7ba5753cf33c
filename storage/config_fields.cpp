// Run configuration lookups (see config_fields.h). Parses without exceptions: a malformed config
// reads as empty, it never stops a listing or an export.
#include "config_fields.h"

#include <nlohmann/json.hpp>

#include "engine/core/run_mode.h"

namespace kv::storage {

namespace {
std::string as_text(const nlohmann::json& v) {
    if (v.is_string()) return v.get<std::string>();
    if (v.is_null()) return "";
    return v.dump();
}
}  // namespace

namespace {
std::string raw_config_value(const std::string& config_json, const std::string& dotted) {
    nlohmann::json j = nlohmann::json::parse(config_json, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return "";
    if (j.contains(dotted)) return as_text(j[dotted]);
    const nlohmann::json* cur = &j;
    size_t start = 0;
    while (true) {
        size_t dot = dotted.find('.', start);
        std::string key = dotted.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
        if (!cur->is_object() || !cur->contains(key)) return "";
        cur = &(*cur)[key];
        if (dot == std::string::npos) return as_text(*cur);
        start = dot + 1;
    }
}
}  // namespace

std::string run_config_value(const std::string& config_json, const std::string& dotted) {
    const std::string v = raw_config_value(config_json, dotted);
    return dotted == "kv_cache.name" ? canonical_cache_name(v) : v;
}

std::string canonical_cache_name(const std::string& stored) {
    const std::optional<CacheName> n = read_cache_name(stored);
    return n ? n->text() : stored;
}

std::optional<CacheName> run_cache_name(const std::string& config_json) {
    const std::string name = raw_config_value(config_json, "kv_cache.name");
    if (name.empty()) return std::nullopt;
    return read_cache_name(name).value_or(CacheName{name, "default"});
}

std::string run_policy(const std::string& config_json) {
    const std::optional<CacheName> n = run_cache_name(config_json);
    return n ? n->policy : "";
}

bool run_evaluates_quality(const std::string& config_json) {
    const RunModeInfo* m = find_run_mode(run_config_value(config_json, "mode"));
    return m && m->kind == RunKind::EVALUATE && m->reports_loss;
}

}  // namespace kv::storage
