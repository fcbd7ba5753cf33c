// A small GGUF writer for tests and tools: any metadata values plus tensors given as raw ggml
// bytes (quantized blocks) or floats (stored as F32/F16/BF16). The product never writes GGUF;
// nothing outside tests/ and tools/ should link against this.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "formats/gguf/gguf_types.h"
#include "formats/gguf/gguf_value.h"

namespace kv {

class GgufWriter {
   public:
    uint32_t version = 3;  // written as is (tests write other versions on purpose)

    // Metadata in insertion order; setting an existing key replaces its value in place.
    void set(const std::string& key, GgufValue value);
    void remove(const std::string& key);  // no-op when absent (tests of missing keys)
    // Data alignment (power of two); also records it as general.alignment (uint32).
    void set_alignment(uint32_t alignment);

    // `ne` in ggml order (ne[0] innermost); `bytes` must be exactly the tensor's size for
    // `type` (numel / block_size * type_size) — throws kv::Error otherwise.
    void add_tensor(const std::string& name, GgmlType type, const std::vector<int64_t>& ne, std::vector<uint8_t> bytes);
    // Row-major values with a PyTorch shape (outermost first), stored as F32, F16 or BF16.
    void add_float_tensor(const std::string& name, const std::vector<int64_t>& torch_shape,
                          const std::vector<float>& values, GgmlType type = GgmlType::F32);

    std::vector<uint8_t> bytes() const;
    void write(const std::string& path) const;  // throws kv::Error naming the path on I/O failure

   private:
    struct TensorEntry {
        std::string name;
        GgmlType type;
        std::vector<int64_t> ne;
        std::vector<uint8_t> data;
    };
    std::vector<std::pair<std::string, GgufValue>> metadata_;
    std::vector<TensorEntry> tensors_;
    uint64_t alignment_ = 32;
};

}  // namespace kv
