// Helpers for the tokenizer tests: scratch folders under the build tree, file writing, and the
// 256-entry byte-level base vocabulary most hand-made test tokenizers start from.
// Test-only; must not contain expected values (each test derives its own).
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "formats/tokenizer/byte_level.h"
#include "formats/tokenizer/tokenizer.h"

namespace kv::test {

// A fresh, empty folder for one test: <build>/test_tmp/tokenizer/<name>.<pid>.
inline std::string scratch_dir(const std::string& name) {
    namespace fs = std::filesystem;
    const fs::path d = fs::path(KVLAB_BINARY_DIR) / "test_tmp" / "tokenizer" / (name + "." + std::to_string(::getpid()));
    fs::remove_all(d);
    fs::create_directories(d);
    return d.string();
}

inline void write_text(const std::string& path, const std::string& content) {
    std::ofstream f(path, std::ios::binary);
    f << content;
}

// Byte b -> id b, token = its GPT-2 byte-level character (so every byte string is encodable).
inline nlohmann::json byte_vocab() {
    nlohmann::json v = nlohmann::json::object();
    for (int b = 0; b < 256; ++b) v[byte_level_encode(std::string(1, char(b)))] = b;
    return v;
}

// A minimal GPT-2-style tokenizer.json: ByteLevel pre-tokenizer (GPT-2 regex) and decoder.
inline nlohmann::json gpt2_style_json(const nlohmann::json& vocab, const nlohmann::json& merges) {
    using nlohmann::json;
    return json{{"version", "1.0"},
                {"added_tokens", json::array()},
                {"normalizer", nullptr},
                {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                                   {"use_regex", true}}},
                {"post_processor", {{"type", "ByteLevel"}, {"trim_offsets", true}}},
                {"decoder", {{"type", "ByteLevel"}}},
                {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"unk_token", nullptr},
                           {"byte_fallback", false}}}};
}

// Writes `j` as <dir>/tokenizer.json and loads it through the folder factory.
inline std::unique_ptr<Tokenizer> load_json_tokenizer(const std::string& name, const nlohmann::json& j) {
    const std::string dir = scratch_dir(name);
    write_text(dir + "/tokenizer.json", j.dump());
    return load_tokenizer(dir);
}

// The piece of every id, for readable failures.
inline std::vector<std::string> pieces_of(const Tokenizer& t, const std::vector<int32_t>& ids) {
    std::vector<std::string> out;
    for (int32_t id : ids) out.push_back(t.token_to_piece(id));
    return out;
}

}  // namespace kv::test
