// The safetensors header, parsed and validated against the bytes of a whole file — the pure
// layer under the memory-mapped loader. It builds no tensors, maps nothing and opens no files,
// so the fuzz target can call it on arbitrary bytes (links only error.cpp, json_strict.cpp,
// safetensors_dtype.cpp and nlohmann-json).

// Format (huggingface/safetensors): u64 little-endian N; N bytes of UTF-8 JSON object starting
// with '{' (trailing spaces allowed); then the data section. Entries
//   "name": {"dtype": "BF16", "shape": [..], "data_offsets": [BEGIN, END]}
// with offsets relative to the data section, END exclusive; optional "__metadata__" maps
// string → string. No duplicate names, no overlaps, no holes, no trailing bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "formats/io/safetensors_dtype.h"

namespace kv {

constexpr uint64_t kSafetensorsMaxHeader = 100'000'000;  // bytes, as the reference reader

struct SafetensorsEntry {
    std::string name;
    StDType dtype = StDType::F32;
    std::vector<int64_t> shape;  // row-major; empty = scalar
    uint64_t begin = 0;          // byte range in the data section, [begin, end)
    uint64_t end = 0;

    uint64_t nbytes() const { return end - begin; }
    int64_t numel() const;  // product of shape (validated not to overflow)
};

struct SafetensorsHeader {
    uint64_t header_size = 0;  // N
    uint64_t data_offset = 0;  // 8 + N: start of the data section in the file
    uint64_t data_size = 0;    // file size - data_offset (fully covered by the entries)
    std::vector<SafetensorsEntry> entries;  // sorted by begin (then end, then name)
    bool has_metadata = false;              // "__metadata__" present (and not null)
    std::map<std::string, std::string> metadata;

    const SafetensorsEntry* find(const std::string& name) const;  // linear; nullptr if absent
};

// `data`/`size` are the whole file. Throws kv::Error "<file>: <what was wrong>; <expected>".
SafetensorsHeader parse_safetensors_header(const uint8_t* data, size_t size, const std::string& file);

// "[2, 3]" — the JSON spelling used in messages.
std::string shape_json(const std::vector<int64_t>& shape);

}  // namespace kv
