// The pure GGUF container parser: bytes in, header + metadata + tensor infos out, every length,
// count and offset bounds-checked. It never maps files, allocates tensors or dequantizes, so
// the fuzz target can call it on any buffer; it depends only on kv::Error.
//
// Layout (v2/v3, little-endian; ggml docs/gguf.md):
//   "GGUF" | u32 version | u64 tensor_count | u64 kv_count
//   kv_count × { string key | u32 value_type | value }       string = u64 length + bytes
//   tensor_count × { string name | u32 n_dims | n_dims × u64 ne | u32 ggml_type | u64 offset }
//   zero padding to `general.alignment` (default 32) | tensor data (offsets relative to here)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "formats/gguf/gguf_types.h"
#include "formats/gguf/gguf_value.h"

namespace kv {

constexpr uint64_t kGgufDefaultAlignment = 32;
constexpr int kGgufMaxDims = 4;  // ggml's GGML_MAX_DIMS

struct GgufTensorInfo {
    std::string name;
    GgmlType type = GgmlType::F32;
    int n_dims = 0;
    int64_t ne[kGgufMaxDims] = {1, 1, 1, 1};  // ggml order: ne[0] is the innermost (contiguous) dim
    uint64_t offset = 0;       // as stored: relative to the data section
    uint64_t file_offset = 0;  // absolute byte position of the data in the file
    uint64_t nbytes = 0;       // numel / block_size * type_size

    int64_t numel() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
    int64_t n_rows() const { return ne[0] ? numel() / ne[0] : 0; }  // rows of ne[0] elements
    // PyTorch (row-major) shape: ne reversed, e.g. ggml [in, out] -> [out, in].
    std::vector<int64_t> torch_shape() const;
    std::string shape_str() const;  // "ne=[576, 1536]"
};

struct GgufParseLimits {
    uint64_t max_tensors = uint64_t(1) << 20;
    uint64_t max_kv = uint64_t(1) << 20;
    uint64_t max_string_bytes = uint64_t(1) << 30;    // ggml's GGUF_MAX_STRING_LENGTH
    uint64_t max_array_elements = uint64_t(1) << 30;  // ggml's GGUF_MAX_ARRAY_ELEMENTS
    int max_array_depth = 8;                          // arrays of arrays of ...
    uint64_t max_key_bytes = 65535;                   // docs/gguf.md: keys are at most 2^16-1 bytes
    uint64_t max_tensor_name_bytes = 63;              // ggml's GGML_MAX_NAME (64) minus the NUL
    uint64_t max_alignment = uint64_t(1) << 20;
};

struct GgufFile {
    std::string source;  // path or label: every message starts with it
    uint32_t version = 0;
    uint64_t alignment = kGgufDefaultAlignment;
    uint64_t data_offset = 0;  // absolute start of the (aligned) data section
    uint64_t file_size = 0;
    std::vector<std::pair<std::string, GgufValue>> metadata;  // in file order
    std::vector<GgufTensorInfo> tensors;                      // in file order

    const GgufValue* find(const std::string& key) const;               // nullptr if absent
    const GgufValue& get(const std::string& key) const;                // throws naming the key
    const GgufTensorInfo* find_tensor(const std::string& name) const;  // nullptr if absent
    // "<source>: metadata key '<key>'" — the `what` argument of GgufValue conversions.
    std::string what(const std::string& key) const;

    void build_index();  // after filling metadata/tensors by hand (the parser calls it)

   private:
    std::unordered_map<std::string, size_t> kv_index_, tensor_index_;
};

// Parse a whole GGUF file held in memory. `source` names it in messages. Throws kv::Error for
// any malformed input: bad magic, unsupported version, unknown value or tensor type, truncation,
// lengths or counts beyond the limits, dims not divisible by the block size, size overflow,
// misaligned offsets, tensor data outside the file or overlapping.
GgufFile gguf_parse(const uint8_t* data, size_t size, const std::string& source, const GgufParseLimits& limits = {});

}  // namespace kv
