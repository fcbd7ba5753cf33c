// libFuzzer target for the safetensors header parser: any bytes must give a header that
// satisfies the format's invariants or a kv::Error — never a crash, leak or other exception.
// No Tensor, no mmap: the parser is pure by design (formats/io/safetensors_parse.h).
// fuzz-sources: formats/io/safetensors_parse.cpp formats/io/safetensors_dtype.cpp formats/io/json_strict.cpp engine/core/error.cpp
#include <cstdint>
#include <cstdlib>

#include "engine/core/error.h"
#include "formats/io/safetensors_parse.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    try {
        kv::SafetensorsHeader h = kv::parse_safetensors_header(data, size, "fuzz.safetensors");
        // Accepted headers: entries tile the data section exactly, which ends at the file end.
        if (h.data_offset + h.data_size != size) std::abort();
        uint64_t pos = 0;
        for (const auto& e : h.entries) {
            if (e.begin != pos || e.end < e.begin) std::abort();
            pos = e.end;
        }
        if (pos != h.data_size) std::abort();
    } catch (const kv::Error&) {
    }
    return 0;
}
