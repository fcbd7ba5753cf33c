// Safetensors header validation (see safetensors_parse.h). Every check the reference reader
// makes is here, in the same order of strictness, with messages naming tensor and byte range.
// Must stay free of Tensor, mmap and file access: the fuzz target feeds it random bytes.
#include "formats/io/safetensors_parse.h"

#include <algorithm>
#include <limits>

#include "engine/core/error.h"
#include "formats/io/json_strict.h"

namespace kv {

using json = nlohmann::json;

int64_t SafetensorsEntry::numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;  // cannot overflow: parse_safetensors_header checked it
    return n;
}

const SafetensorsEntry* SafetensorsHeader::find(const std::string& name) const {
    for (const auto& e : entries)
        if (e.name == name) return &e;
    return nullptr;
}

std::string shape_json(const std::vector<int64_t>& shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

namespace {

std::string all_dtype_names() {
    std::string s;
    for (size_t i = 0; i < size_t(StDType::COUNT); ++i) s += (i ? ", " : "") + std::string(st_dtype_name(StDType(i)));
    return s;
}

// Compact JSON text of a (possibly large) value, cut to a message-sized prefix.
std::string short_dump(const json& v) {
    std::string s = v.dump();
    return s.size() > 80 ? s.substr(0, 80) + "..." : s;
}

// A non-negative JSON integer as u64; false for anything else (negative, float, non-number).
bool json_u64(const json& v, uint64_t& out) {
    if (v.is_number_unsigned()) {
        out = v.get<uint64_t>();
        return true;
    }
    if (v.is_number_integer() && v.get<int64_t>() >= 0) {
        out = uint64_t(v.get<int64_t>());
        return true;
    }
    return false;
}

SafetensorsEntry parse_entry(const std::string& name, const json& v, const std::string& file) {
    auto fail = [&](const std::string& msg) -> void { throw Error(str(file, ": tensor '", name, "': ", msg)); };
    SafetensorsEntry e;
    e.name = name;
    if (!v.is_object()) fail(str("entry must be an object {\"dtype\", \"shape\", \"data_offsets\"}, got ", json_describe(v)));

    auto dt = v.find("dtype");
    if (dt == v.end()) fail("missing \"dtype\"");
    if (!dt->is_string()) fail(str("\"dtype\" must be a string, got ", json_describe(*dt)));
    auto parsed = st_dtype_from_name(dt->get<std::string>());
    if (!parsed) fail(str("unknown dtype ", json_describe(*dt), "; expected one of ", all_dtype_names()));
    e.dtype = *parsed;

    auto sh = v.find("shape");
    if (sh == v.end()) fail("missing \"shape\"");
    if (!sh->is_array()) fail(str("\"shape\" must be a list of non-negative integers, got ", json_describe(*sh)));
    for (const json& d : *sh) {
        uint64_t u = 0;
        if (!json_u64(d, u)) fail(str("\"shape\" must be a list of non-negative integers, found ", json_describe(d)));
        if (u > uint64_t(std::numeric_limits<int64_t>::max())) fail(str("shape dimension ", u, " is too large"));
        e.shape.push_back(int64_t(u));
    }

    auto off = v.find("data_offsets");
    if (off == v.end()) fail("missing \"data_offsets\"");
    if (!off->is_array() || off->size() != 2 || !json_u64((*off)[0], e.begin) || !json_u64((*off)[1], e.end))
        fail(str("\"data_offsets\" must be [BEGIN, END] with non-negative integers, got ", short_dump(*off)));
    if (e.begin > e.end) fail(str("data_offsets [", e.begin, ", ", e.end, "] end before they begin"));
    return e;
}

// Bytes the entry must occupy: numel × bits / 8, with every product overflow-checked.
void check_entry_size(const SafetensorsEntry& e, uint64_t data_size, const std::string& file) {
    auto fail = [&](const std::string& msg) -> void { throw Error(str(file, ": tensor '", e.name, "': ", msg)); };
    if (e.end > data_size)
        fail(str("data_offsets [", e.begin, ", ", e.end, "] run past the end of the data section (", data_size,
                 " bytes); the file is truncated or the offsets are wrong"));
    uint64_t numel = 1;
    for (int64_t d : e.shape)
        if (__builtin_mul_overflow(numel, uint64_t(d), &numel))
            fail(str("shape ", shape_json(e.shape), " has more elements than fit in 64 bits"));
    if (numel > uint64_t(std::numeric_limits<int64_t>::max()))
        fail(str("shape ", shape_json(e.shape), " has more elements than fit in 64 bits"));
    uint64_t bits = 0;
    if (__builtin_mul_overflow(numel, uint64_t(st_dtype_bits(e.dtype)), &bits))
        fail(str("shape ", shape_json(e.shape), " of dtype ", st_dtype_name(e.dtype), " has more bytes than fit in 64 bits"));
    if (bits % 8 != 0)
        fail(str("shape ", shape_json(e.shape), " of dtype ", st_dtype_name(e.dtype),
                 " does not end on a byte boundary; sub-byte tensors must fill whole bytes"));
    if (bits / 8 != e.nbytes())
        fail(str("data_offsets [", e.begin, ", ", e.end, "] hold ", e.nbytes(), " bytes but dtype ", st_dtype_name(e.dtype),
                 " with shape ", shape_json(e.shape), " needs ", bits / 8, " bytes"));
}

}  // namespace

SafetensorsHeader parse_safetensors_header(const uint8_t* data, size_t size, const std::string& file) {
    if (size < 8)
        throw Error(str(file, ": truncated: the file has ", size,
                        " bytes; a safetensors file starts with an 8-byte little-endian header length"));
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
    if (n > kSafetensorsMaxHeader)
        throw Error(str(file, ": header length ", n, " exceeds the maximum of ", kSafetensorsMaxHeader,
                        " bytes; this is not a safetensors file or it is corrupt"));
    if (n > uint64_t(size) - 8)
        throw Error(str(file, ": header length ", n, " runs past the end of the file (", size,
                        " bytes, so at most ", size - 8, " header bytes); the file is truncated"));
    if (n == 0 || data[8] != '{')
        throw Error(str(file, ": the header must be a JSON object starting with '{' right after the 8-byte length"));

    const char* begin = reinterpret_cast<const char*>(data + 8);
    json root = parse_json_strict(begin, begin + n, file, "the safetensors header");
    if (!root.is_object()) throw Error(str(file, ": the safetensors header must be a JSON object, got ", json_describe(root)));

    SafetensorsHeader h;
    h.header_size = n;
    h.data_offset = 8 + n;
    h.data_size = uint64_t(size) - h.data_offset;
    for (auto it = root.begin(); it != root.end(); ++it) {
        if (it.key() == "__metadata__") {
            const json& m = it.value();
            if (m.is_null()) continue;  // the reference reader treats null as "no metadata"
            if (!m.is_object())
                throw Error(str(file, ": \"__metadata__\" must be an object of string values, got ", json_describe(m)));
            for (auto mi = m.begin(); mi != m.end(); ++mi) {
                if (!mi.value().is_string())
                    throw Error(str(file, ": \"__metadata__\" value for key '", mi.key(), "' must be a string, got ",
                                    json_describe(mi.value())));
                h.metadata[mi.key()] = mi.value().get<std::string>();
            }
            h.has_metadata = true;
            continue;
        }
        h.entries.push_back(parse_entry(it.key(), it.value(), file));
    }
    for (const auto& e : h.entries) check_entry_size(e, h.data_size, file);

    std::sort(h.entries.begin(), h.entries.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
        if (a.begin != b.begin) return a.begin < b.begin;
        if (a.end != b.end) return a.end < b.end;
        return a.name < b.name;
    });
    uint64_t pos = 0;
    const SafetensorsEntry* prev = nullptr;
    for (const auto& e : h.entries) {
        if (e.begin < pos)
            throw Error(str(file, ": tensors '", prev->name, "' [", prev->begin, ", ", prev->end, ") and '", e.name, "' [",
                            e.begin, ", ", e.end, ") overlap; every byte of the data section belongs to one tensor"));
        if (e.begin > pos)
            throw Error(str(file, ": bytes [", pos, ", ", e.begin, ") of the data section are not covered by any tensor",
                            " (a hole before '", e.name, "'); tensors must be packed without gaps"));
        pos = e.end;
        prev = &e;
    }
    if (pos != h.data_size)
        throw Error(str(file, ": bytes [", pos, ", ", h.data_size, ") at the end of the data section are not covered by any",
                        " tensor; the data section must end where the last tensor ends"));
    return h;
}

}  // namespace kv
