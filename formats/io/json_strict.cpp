// Strict JSON parsing (duplicate keys and depth rejected) and typed field access.
// A SAX handler builds the tree itself: nlohmann's callback parser cannot see duplicates
// cheaply and rescans parent objects on every close, which is quadratic for big headers.
#include "formats/io/json_strict.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "engine/core/error.h"

namespace kv {

namespace {

using json = nlohmann::json;

// Builds a json tree like nlohmann's DOM parser, but stops at the first duplicate key or at
// excessive depth and keeps the reason, so the caller can throw one kv::Error.
class StrictBuilder {
   public:
    explicit StrictBuilder(json& root) : root_(root) {}

    bool null() { return put(json(nullptr)); }
    bool boolean(bool v) { return put(json(v)); }
    bool number_integer(json::number_integer_t v) { return put(json(v)); }
    bool number_unsigned(json::number_unsigned_t v) { return put(json(v)); }
    bool number_float(json::number_float_t v, const json::string_t&) { return put(json(v)); }
    bool string(json::string_t& v) { return put(json(std::move(v))); }
    bool binary(json::binary_t&) {
        error_ = "binary values are not JSON";
        return false;
    }
    bool start_object(std::size_t) { return open(json::object()); }
    bool start_array(std::size_t) { return open(json::array()); }
    bool end_object() { return close(); }
    bool end_array() { return close(); }
    bool key(json::string_t& k) {
        json& obj = *stack_.back();
        if (obj.contains(k)) {
            error_ = str("duplicate key '", k, "'");
            return false;
        }
        slot_ = &obj[k];
        return true;
    }
    template <class Exception>
    bool parse_error(std::size_t, const std::string&, const Exception& ex) {
        error_ = ex.what();
        return false;
    }

    const std::string& error() const { return error_; }

   private:
    json& root_;
    std::vector<json*> stack_;  // open objects/arrays, innermost last
    json* slot_ = nullptr;      // where the next object member goes (set by key())
    std::string error_;

    json* place(json&& v) {
        if (stack_.empty()) {
            root_ = std::move(v);
            return &root_;
        }
        json& top = *stack_.back();
        if (top.is_array()) {
            top.push_back(std::move(v));
            return &top.back();
        }
        *slot_ = std::move(v);
        return slot_;
    }
    bool put(json&& v) {
        place(std::move(v));
        return true;
    }
    bool open(json&& v) {
        if (int(stack_.size()) >= kJsonMaxDepth) {
            error_ = str("nested deeper than ", kJsonMaxDepth, " levels");
            return false;
        }
        stack_.push_back(place(std::move(v)));
        return true;
    }
    bool close() {
        stack_.pop_back();
        return true;
    }
};

}  // namespace

json parse_json_strict(const char* begin, const char* end, const std::string& source, const std::string& what) {
    // nlohmann's lexer takes a NUL byte for the end of input, so "{}\0garbage" would pass.
    // JSON never contains a raw NUL (inside strings it must be escaped).
    if (const void* nul = std::memchr(begin, 0, size_t(end - begin)))
        throw Error(str(source, ": ", what, " is not valid JSON: NUL byte at offset ", static_cast<const char*>(nul) - begin));
    json root;
    StrictBuilder b(root);
    bool ok = false;
    try {
        ok = json::sax_parse(begin, end, &b, json::input_format_t::json, /*strict=*/true, /*ignore_comments=*/false);
    } catch (const std::exception& e) {  // nlohmann may throw (e.g. out_of_range) besides reporting
        throw Error(str(source, ": ", what, " is not valid JSON: ", e.what()));
    }
    if (!ok || !b.error().empty())
        throw Error(str(source, ": ", what, " is not valid JSON: ", b.error().empty() ? "parse failed" : b.error()));
    return root;
}

json parse_json_strict(const std::string& text, const std::string& source, const std::string& what) {
    return parse_json_strict(text.data(), text.data() + text.size(), source, what);
}

std::string json_describe(const json& v) {
    switch (v.type()) {
        case json::value_t::null: return "null";
        case json::value_t::boolean: return v.get<bool>() ? "true" : "false";
        case json::value_t::number_integer:
        case json::value_t::number_unsigned:
        case json::value_t::number_float: return "number " + v.dump();
        case json::value_t::string: {
            const std::string& s = v.get_ref<const std::string&>();
            std::string shown = s.size() > 40 ? s.substr(0, 40) + "..." : s;
            try {
                return "string " + json(shown).dump();
            } catch (const std::exception&) {  // truncation split a UTF-8 sequence
                return "a string";
            }
        }
        case json::value_t::array: return str("array of ", v.size());
        case json::value_t::object: return "object";
        default: return v.type_name();
    }
}

// ---- JsonFields --------------------------------------------------------------------------
JsonFields::JsonFields(const json& obj, std::string source, std::string where)
    : obj_(obj), source_(std::move(source)), where_(std::move(where)) {}

void JsonFields::fail(const char* key, const std::string& problem) const {
    throw Error(str(source_, ": field '", where_, key, "' ", problem));
}

const json* JsonFields::find(const char* key) const {
    if (!obj_.is_object()) return nullptr;
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
}

bool JsonFields::has(const char* key) const { return find(key) != nullptr; }

const json& JsonFields::require(const char* key) const {
    const json* v = find(key);
    if (!v) fail(key, "is missing; it is required");
    return *v;
}

int64_t JsonFields::as_int(const char* key, const json& v) const {
    if (v.is_number_unsigned()) {
        auto u = v.get<json::number_unsigned_t>();
        if (u > uint64_t(std::numeric_limits<int64_t>::max())) fail(key, str("is ", u, ", which is out of range"));
        return int64_t(u);
    }
    if (v.is_number_integer()) return v.get<json::number_integer_t>();
    fail(key, str("must be an integer, got ", json_describe(v)));
}

int64_t JsonFields::get_int(const char* key) const { return as_int(key, require(key)); }

int64_t JsonFields::get_int(const char* key, int64_t fallback) const {
    const json* v = find(key);
    return v ? as_int(key, *v) : fallback;
}

double JsonFields::get_number(const char* key) const {
    const json& v = require(key);
    if (!v.is_number()) fail(key, str("must be a number, got ", json_describe(v)));
    double d = v.get<double>();
    if (!std::isfinite(d)) fail(key, "must be a finite number");
    return d;
}

double JsonFields::get_number(const char* key, double fallback) const { return has(key) ? get_number(key) : fallback; }

bool JsonFields::get_bool(const char* key, bool fallback) const {
    const json* v = find(key);
    if (!v) return fallback;
    if (!v->is_boolean()) fail(key, str("must be true or false, got ", json_describe(*v)));
    return v->get<bool>();
}

std::string JsonFields::get_string(const char* key) const {
    const json& v = require(key);
    if (!v.is_string()) fail(key, str("must be a string, got ", json_describe(v)));
    return v.get<std::string>();
}

std::string JsonFields::get_string(const char* key, const std::string& fallback) const {
    return has(key) ? get_string(key) : fallback;
}

std::vector<int64_t> JsonFields::get_int_list(const char* key) const {
    const json* v = find(key);
    std::vector<int64_t> out;
    if (!v) return out;
    if (v->is_array()) {
        for (const json& e : *v) {
            if (!e.is_number_integer()) fail(key, str("must be an integer or a list of integers, got a list containing ", json_describe(e)));
            out.push_back(as_int(key, e));
        }
        return out;
    }
    if (!v->is_number_integer()) fail(key, str("must be an integer or a list of integers, got ", json_describe(*v)));
    out.push_back(as_int(key, *v));
    return out;
}

}  // namespace kv
