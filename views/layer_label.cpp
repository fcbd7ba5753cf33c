// Layer labels with each layer's type (see layer_label.h).
#include "views/layer_label.h"

#include <nlohmann/json.hpp>

namespace kv::views {

std::vector<std::string> layer_kinds_of_summary(const std::string& summary_json) {
    const nlohmann::json j = nlohmann::json::parse(summary_json.empty() ? "{}" : summary_json, nullptr, false);
    std::vector<std::string> out;
    if (!j.is_object() || !j.contains("layer_kinds") || !j["layer_kinds"].is_array()) return out;
    for (const auto& k : j["layer_kinds"]) out.push_back(k.is_string() ? k.get<std::string>() : std::string());
    return out;
}

std::string layer_kind_suffix(int layer, const std::vector<std::string>& kinds) {
    if (layer < 0 || size_t(layer) >= kinds.size() || kinds[size_t(layer)].empty() || kinds[size_t(layer)] == "full") return "";
    return " (" + kinds[size_t(layer)] + ")";
}

std::string layer_label(int layer, const std::vector<std::string>& kinds) {
    return "layer " + std::to_string(layer) + layer_kind_suffix(layer, kinds);
}

}  // namespace kv::views
