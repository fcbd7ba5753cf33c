// Run configuration lookups (see run_config.h). Parses without exceptions: a malformed config
// reads as empty, it never stops a listing or an export.
#include "config_fields.h"

#include <nlohmann/json.hpp>

#include "engine/core/kv_names.h"

namespace kv::storage {

namespace {
std::string as_text(const nlohmann::json& v) {
    if (v.is_string()) return v.get<std::string>();
    if (v.is_null()) return "";
    return v.dump();
}
}  // namespace

std::string run_config_value(const std::string& config_json, const std::string& dotted) {
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

CacheName split_cache_name(const std::string& name) {
    auto dash = name.rfind('-');
    if (dash != std::string::npos) {
        std::string tail = name.substr(dash + 1);
        for (const std::string& b : kv_buffer_names())
            if (tail == b) return {name.substr(0, dash), tail};
    }
    return {name, "default"};
}

}  // namespace kv::storage
