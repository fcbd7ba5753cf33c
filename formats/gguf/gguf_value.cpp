// GgufValue construction, checked conversions and descriptions. The host must be
// little-endian (GGUF files are little-endian by default), which is asserted at compile time.
#include "formats/gguf/gguf_value.h"

#include <bit>
#include <cstring>
#include <limits>

#include "engine/core/error.h"

namespace kv {

static_assert(std::endian::native == std::endian::little, "GGUF values are decoded with memcpy: little-endian hosts only");

namespace {

template <class V>
GgufValue scalar(GgufValueType t, V v) {
    GgufValue out;
    out.type = t;
    out.raw.resize(sizeof(V));
    std::memcpy(out.raw.data(), &v, sizeof(V));
    return out;
}

template <class V>
V load(const uint8_t* p, uint64_t k) {
    V v;
    std::memcpy(&v, p + k * sizeof(V), sizeof(V));
    return v;
}

// File strings go into messages: control bytes (NUL, newlines) are shown as \xNN, long ones cut.
std::string printable(const std::string& s, size_t max_bytes) {
    std::string out;
    for (size_t i = 0; i < s.size() && i < max_bytes; ++i) {
        unsigned char ch = static_cast<unsigned char>(s[i]);
        if (ch < 32 || ch == 127)
            out += str("\\x", "0123456789abcdef"[ch >> 4], "0123456789abcdef"[ch & 15]);
        else
            out += char(ch);
    }
    return s.size() > max_bytes ? out + "..." : out;
}

std::string type_mismatch(const std::string& what, const GgufValue& v, const char* expected) {
    return str(what, ": is ", v.describe(), ", expected ", expected);
}

}  // namespace

// ---- construction ------------------------------------------------------------------------
GgufValue GgufValue::of_u8(uint8_t v) { return scalar(GgufValueType::UINT8, v); }
GgufValue GgufValue::of_i8(int8_t v) { return scalar(GgufValueType::INT8, v); }
GgufValue GgufValue::of_u16(uint16_t v) { return scalar(GgufValueType::UINT16, v); }
GgufValue GgufValue::of_i16(int16_t v) { return scalar(GgufValueType::INT16, v); }
GgufValue GgufValue::of_u32(uint32_t v) { return scalar(GgufValueType::UINT32, v); }
GgufValue GgufValue::of_i32(int32_t v) { return scalar(GgufValueType::INT32, v); }
GgufValue GgufValue::of_f32(float v) { return scalar(GgufValueType::FLOAT32, v); }
GgufValue GgufValue::of_bool(bool v) { return scalar(GgufValueType::BOOL, uint8_t(v ? 1 : 0)); }
GgufValue GgufValue::of_u64(uint64_t v) { return scalar(GgufValueType::UINT64, v); }
GgufValue GgufValue::of_i64(int64_t v) { return scalar(GgufValueType::INT64, v); }
GgufValue GgufValue::of_f64(double v) { return scalar(GgufValueType::FLOAT64, v); }

GgufValue GgufValue::of_string(std::string v) {
    GgufValue out;
    out.type = GgufValueType::STRING;
    out.str = std::move(v);
    return out;
}

GgufValue GgufValue::of_array(GgufValueType elem, const std::vector<GgufValue>& items) {
    GgufValue out;
    out.type = GgufValueType::ARRAY;
    out.elem = elem;
    out.count = items.size();
    for (size_t k = 0; k < items.size(); ++k) {
        const GgufValue& it = items[k];
        if (it.type != elem)
            throw Error(kv::str("GgufValue::of_array: item ", k, " is ", it.describe(), ", expected ",
                            gguf_value_type_name(elem)));
        if (elem == GgufValueType::STRING)
            out.strings.push_back(it.str);
        else if (elem == GgufValueType::ARRAY)
            out.arrays.push_back(it);
        else
            out.raw.insert(out.raw.end(), it.raw.begin(), it.raw.end());
    }
    return out;
}

GgufValue GgufValue::of_string_array(std::vector<std::string> items) {
    GgufValue out;
    out.type = GgufValueType::ARRAY;
    out.elem = GgufValueType::STRING;
    out.count = items.size();
    out.strings = std::move(items);
    return out;
}

GgufValue GgufValue::of_i32_array(const std::vector<int32_t>& items) {
    GgufValue out;
    out.type = GgufValueType::ARRAY;
    out.elem = GgufValueType::INT32;
    out.count = items.size();
    out.raw.resize(items.size() * 4);
    if (!items.empty()) std::memcpy(out.raw.data(), items.data(), out.raw.size());
    return out;
}

GgufValue GgufValue::of_f32_array(const std::vector<float>& items) {
    GgufValue out;
    out.type = GgufValueType::ARRAY;
    out.elem = GgufValueType::FLOAT32;
    out.count = items.size();
    out.raw.resize(items.size() * 4);
    if (!items.empty()) std::memcpy(out.raw.data(), items.data(), out.raw.size());
    return out;
}

// ---- decoding ----------------------------------------------------------------------------
int64_t gguf_decode_int(GgufValueType t, const uint8_t* b, uint64_t k) {
    switch (t) {
        case GgufValueType::UINT8: return load<uint8_t>(b, k);
        case GgufValueType::INT8: return load<int8_t>(b, k);
        case GgufValueType::UINT16: return load<uint16_t>(b, k);
        case GgufValueType::INT16: return load<int16_t>(b, k);
        case GgufValueType::UINT32: return load<uint32_t>(b, k);
        case GgufValueType::INT32: return load<int32_t>(b, k);
        case GgufValueType::UINT64: return int64_t(load<uint64_t>(b, k));  // caller checks range
        case GgufValueType::INT64: return load<int64_t>(b, k);
        case GgufValueType::BOOL: return load<uint8_t>(b, k);
        default: return 0;
    }
}

double gguf_decode_float(GgufValueType t, const uint8_t* b, uint64_t k) {
    switch (t) {
        case GgufValueType::FLOAT32: return load<float>(b, k);
        case GgufValueType::FLOAT64: return load<double>(b, k);
        case GgufValueType::UINT64: return double(load<uint64_t>(b, k));
        default: return double(gguf_decode_int(t, b, k));
    }
}

// ---- checked conversions -----------------------------------------------------------------
int64_t GgufValue::as_int(const std::string& what) const {
    if (!gguf_value_type_is_integer(type) || raw.size() != gguf_value_type_size(type))
        throw Error(type_mismatch(what, *this, "an integer"));
    if (type == GgufValueType::UINT64 && load<uint64_t>(raw.data(), 0) > uint64_t(std::numeric_limits<int64_t>::max()))
        throw Error(kv::str(what, ": value ", load<uint64_t>(raw.data(), 0), " is too large, expected at most ",
                        std::numeric_limits<int64_t>::max()));
    return gguf_decode_int(type, raw.data(), 0);
}

double GgufValue::as_float(const std::string& what) const {
    if ((!gguf_value_type_is_integer(type) && !gguf_value_type_is_float(type)) || raw.size() != gguf_value_type_size(type))
        throw Error(type_mismatch(what, *this, "a number"));
    return gguf_decode_float(type, raw.data(), 0);
}

bool GgufValue::as_bool(const std::string& what) const {
    if (type != GgufValueType::BOOL || raw.size() != 1) throw Error(type_mismatch(what, *this, "a bool"));
    return raw[0] != 0;
}

const std::string& GgufValue::as_string(const std::string& what) const {
    if (type != GgufValueType::STRING) throw Error(type_mismatch(what, *this, "a string"));
    return str;
}

std::vector<int64_t> GgufValue::as_int_array(const std::string& what) const {
    if (!is_array() || !gguf_value_type_is_integer(elem) || raw.size() != count * gguf_value_type_size(elem))
        throw Error(type_mismatch(what, *this, "an array of integers"));
    std::vector<int64_t> out(count);
    for (uint64_t k = 0; k < count; ++k) {
        if (elem == GgufValueType::UINT64 && load<uint64_t>(raw.data(), k) > uint64_t(std::numeric_limits<int64_t>::max()))
            throw Error(kv::str(what, ": element ", k, " = ", load<uint64_t>(raw.data(), k), " is too large"));
        out[k] = gguf_decode_int(elem, raw.data(), k);
    }
    return out;
}

std::vector<double> GgufValue::as_float_array(const std::string& what) const {
    if (!is_array() || (!gguf_value_type_is_integer(elem) && !gguf_value_type_is_float(elem)) ||
        raw.size() != count * gguf_value_type_size(elem))
        throw Error(type_mismatch(what, *this, "an array of numbers"));
    std::vector<double> out(count);
    for (uint64_t k = 0; k < count; ++k) out[k] = gguf_decode_float(elem, raw.data(), k);
    return out;
}

const std::vector<std::string>& GgufValue::as_string_array(const std::string& what) const {
    if (!is_array() || elem != GgufValueType::STRING) throw Error(type_mismatch(what, *this, "an array of strings"));
    return strings;
}

std::string GgufValue::describe() const {
    if (type == GgufValueType::STRING) {
        return kv::str("string '", printable(str, 40), "'");
    }
    if (type == GgufValueType::ARRAY) return kv::str("array[", gguf_value_type_name(elem), "; ", count, "]");
    if (raw.size() != gguf_value_type_size(type)) return gguf_value_type_name(type);
    if (type == GgufValueType::BOOL) return raw[0] ? "bool true" : "bool false";
    if (gguf_value_type_is_float(type)) return kv::str(gguf_value_type_name(type), " ", gguf_decode_float(type, raw.data(), 0));
    if (type == GgufValueType::UINT64) return kv::str("uint64 ", load<uint64_t>(raw.data(), 0));
    return kv::str(gguf_value_type_name(type), " ", gguf_decode_int(type, raw.data(), 0));
}

bool GgufValue::operator==(const GgufValue& o) const {
    if (type != o.type) return false;
    if (type == GgufValueType::STRING) return str == o.str;
    if (type != GgufValueType::ARRAY) return raw == o.raw;
    return elem == o.elem && count == o.count && raw == o.raw && strings == o.strings && arrays == o.arrays;
}

}  // namespace kv
