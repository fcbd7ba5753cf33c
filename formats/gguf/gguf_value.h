// One typed GGUF metadata value (scalar, string or array, arrays nested to any depth) and the
// checked conversions loaders use. Numbers keep their exact file bytes, so a value read and
// written again is bit-identical. No parsing here (gguf_parse.h) and no model knowledge.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/gguf/gguf_types.h"

namespace kv {

struct GgufValue {
    GgufValueType type = GgufValueType::UINT8;
    // Numeric or bool scalar: its little-endian bytes. Array of numbers/bools: count * size bytes.
    std::vector<uint8_t> raw;
    std::string str;                             // STRING
    GgufValueType elem = GgufValueType::UINT8;   // ARRAY: element type
    uint64_t count = 0;                          // ARRAY: number of elements
    std::vector<std::string> strings;            // ARRAY of STRING
    std::vector<GgufValue> arrays;               // ARRAY of ARRAY

    // ---- construction (writer, tests) -----------------------------------------------------
    static GgufValue of_u8(uint8_t v);
    static GgufValue of_i8(int8_t v);
    static GgufValue of_u16(uint16_t v);
    static GgufValue of_i16(int16_t v);
    static GgufValue of_u32(uint32_t v);
    static GgufValue of_i32(int32_t v);
    static GgufValue of_f32(float v);
    static GgufValue of_bool(bool v);
    static GgufValue of_u64(uint64_t v);
    static GgufValue of_i64(int64_t v);
    static GgufValue of_f64(double v);
    static GgufValue of_string(std::string v);
    // Array of `items`, each of type `elem` (throws kv::Error otherwise). Empty arrays allowed.
    static GgufValue of_array(GgufValueType elem, const std::vector<GgufValue>& items);
    static GgufValue of_string_array(std::vector<std::string> items);
    static GgufValue of_i32_array(const std::vector<int32_t>& items);
    static GgufValue of_f32_array(const std::vector<float>& items);

    // ---- queries ---------------------------------------------------------------------------
    bool is_array() const { return type == GgufValueType::ARRAY; }
    uint64_t size() const { return is_array() ? count : 1; }

    // Checked conversions. `what` names the value in messages ("x.gguf: metadata key 'k'");
    // a type that does not fit throws kv::Error saying what was found and what was expected.
    int64_t as_int(const std::string& what) const;        // any integer type (uint64 <= INT64_MAX)
    double as_float(const std::string& what) const;       // float or integer types
    bool as_bool(const std::string& what) const;          // BOOL only
    const std::string& as_string(const std::string& what) const;
    std::vector<int64_t> as_int_array(const std::string& what) const;   // integer elements
    std::vector<double> as_float_array(const std::string& what) const;  // numeric elements
    const std::vector<std::string>& as_string_array(const std::string& what) const;

    // "uint32 30", "string 'gpt2'", "array[string; 49152]" — short, for messages and dumps.
    std::string describe() const;

    bool operator==(const GgufValue& o) const;
    bool operator!=(const GgufValue& o) const { return !(*this == o); }
};

// Decode element `k` of little-endian numeric bytes of type `t` (caller checks bounds and type).
int64_t gguf_decode_int(GgufValueType t, const uint8_t* bytes, uint64_t k);
double gguf_decode_float(GgufValueType t, const uint8_t* bytes, uint64_t k);

}  // namespace kv
