// Strict JSON input for every file format in formats/io: parses text into nlohmann::json while
// rejecting duplicate keys (nlohmann would silently keep the last) and nesting deeper than a
// fixed limit, and reads typed fields with one error message naming source, field and the
// expected type. Must not touch files, tensors or the allocator (fuzz targets link it alone).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kv {

// Deeper documents are rejected: no format we read nests more than a handful of levels, and a
// bound keeps hostile input from building pathological trees.
constexpr int kJsonMaxDepth = 64;

// Parses [begin, end) as exactly one JSON value (surrounding whitespace allowed). Throws
// kv::Error "<source>: <what> is not valid JSON: ..." / "... duplicate key 'k' ..." / "... nested
// deeper than 64 levels".
nlohmann::json parse_json_strict(const char* begin, const char* end, const std::string& source,
                                 const std::string& what);
nlohmann::json parse_json_strict(const std::string& text, const std::string& source, const std::string& what);

// "string \"abc\"", "number 1.5", "object", "array of 3", "null" — for error messages.
std::string json_describe(const nlohmann::json& v);

// Typed access to the fields of one JSON object. `where` prefixes field names in messages
// ("rope_scaling." gives "field 'rope_scaling.factor'"). Absent and null count as missing.
class JsonFields {
   public:
    JsonFields(const nlohmann::json& obj, std::string source, std::string where = {});

    bool has(const char* key) const;  // present and not null
    const nlohmann::json* find(const char* key) const;  // nullptr when absent or null

    int64_t get_int(const char* key) const;  // required
    int64_t get_int(const char* key, int64_t fallback) const;
    double get_number(const char* key) const;
    double get_number(const char* key, double fallback) const;
    bool get_bool(const char* key, bool fallback) const;
    std::string get_string(const char* key) const;
    std::string get_string(const char* key, const std::string& fallback) const;
    // An integer or a list of integers (e.g. eos_token_id); empty when absent or null.
    std::vector<int64_t> get_int_list(const char* key) const;

    // Throws "<source>: field '<where><key>' <problem>".
    [[noreturn]] void fail(const char* key, const std::string& problem) const;

   private:
    const nlohmann::json& obj_;
    std::string source_;
    std::string where_;

    const nlohmann::json& require(const char* key) const;
    int64_t as_int(const char* key, const nlohmann::json& v) const;
};

}  // namespace kv
