// Reading BOS/EOS/PAD from Hugging Face side files. Tolerant of missing files and keys (a bare
// tokenizer.json must load), strict about malformed JSON. Must not change tokenization.
#include "special_ids.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/core/error.h"

namespace kv {

namespace {

using nlohmann::json;

std::optional<json> read_json_if_present(const std::filesystem::path& p) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(p, ec)) return std::nullopt;
    std::ifstream f(p, std::ios::binary);
    if (!f) throw Error(str(p.string(), ": cannot be opened for reading"));
    std::stringstream ss;
    ss << f.rdbuf();
    try {
        return json::parse(ss.str());
    } catch (const json::parse_error& e) {
        throw Error(str(p.string(), ": not valid JSON (", e.what(), ")"));
    }
}

// "bos_token": "<s>" or {"content": "<s>", ...} or null.
void read_token_field(const json& j, const char* key, std::optional<std::string>& text, bool& is_null) {
    auto it = j.find(key);
    if (it == j.end()) return;
    if (it->is_null()) {
        is_null = true;
        text = std::string();
    } else if (it->is_string()) {
        text = it->get<std::string>();
    } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
        text = (*it)["content"].get<std::string>();
    }
}

void read_id_field(const json& j, const char* key, std::vector<int32_t>& out) {
    auto it = j.find(key);
    if (it == j.end()) return;
    if (it->is_number_integer()) {
        out.push_back(it->get<int32_t>());
    } else if (it->is_array()) {
        for (const json& v : *it)
            if (v.is_number_integer()) out.push_back(v.get<int32_t>());
    }
}

void read_bool_field(const json& j, const char* key, std::optional<bool>& out) {
    auto it = j.find(key);
    if (it != j.end() && it->is_boolean()) out = it->get<bool>();
}

}  // namespace

SideConfig read_side_config(const std::string& dir) {
    namespace fs = std::filesystem;
    SideConfig c;
    const fs::path d(dir);
    if (auto j = read_json_if_present(d / "tokenizer_config.json"); j && j->is_object()) {
        c.any_file = true;
        read_token_field(*j, "bos_token", c.bos_token, c.bos_null);
        read_token_field(*j, "eos_token", c.eos_token, c.eos_null);
        read_token_field(*j, "pad_token", c.pad_token, c.pad_null);
        read_bool_field(*j, "add_bos_token", c.add_bos_token);
        read_bool_field(*j, "add_eos_token", c.add_eos_token);
    }
    for (const char* name : {"generation_config.json", "config.json"}) {
        if (auto j = read_json_if_present(d / name); j && j->is_object()) {
            c.any_file = true;
            read_id_field(*j, "bos_token_id", c.bos_ids);
            read_id_field(*j, "eos_token_id", c.eos_ids);
            read_id_field(*j, "pad_token_id", c.pad_ids);
        }
    }
    return c;
}

SpecialIds resolve_special_ids(const SideConfig& cfg, const std::function<int32_t(const std::string&)>& lookup,
                               int32_t vocab_size, int32_t fallback_bos) {
    SpecialIds r;
    auto valid = [&](int32_t id) { return id >= 0 && id < vocab_size; };
    auto by_text = [&](const std::optional<std::string>& t, bool is_null) -> int32_t {
        if (!t || is_null) return -1;
        const int32_t id = lookup(*t);
        return valid(id) ? id : -1;
    };
    auto first_valid = [&](const std::vector<int32_t>& ids) {
        for (int32_t id : ids)
            if (valid(id)) return id;
        return int32_t(-1);
    };

    if (cfg.bos_token) {
        r.bos = by_text(cfg.bos_token, cfg.bos_null);  // an explicit null means "no BOS"
    } else {
        r.bos = first_valid(cfg.bos_ids);
        if (r.bos < 0 && valid(fallback_bos)) r.bos = fallback_bos;
    }

    auto add_eos = [&](int32_t id) {
        if (valid(id) && std::find(r.eos.begin(), r.eos.end(), id) == r.eos.end()) r.eos.push_back(id);
    };
    add_eos(by_text(cfg.eos_token, cfg.eos_null));
    for (int32_t id : cfg.eos_ids) add_eos(id);
    if (r.eos.empty()) {
        for (std::string_view n : kEndOfGenerationNames) add_eos(lookup(std::string(n)));
    }

    r.pad = cfg.pad_token ? by_text(cfg.pad_token, cfg.pad_null) : first_valid(cfg.pad_ids);
    return r;
}

}  // namespace kv
