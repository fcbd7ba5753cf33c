// libFuzzer target for the memory state stored in memory_blocks.state (a blob read from session
// files): any bytes must decode or throw kv::Error; what decodes must survive encode + decode.
// fuzz-sources: storage/memory_state.cpp engine/core/error.cpp
#include <cstdint>
#include <cstdlib>

#include "engine/core/error.h"
#include "storage/memory_state.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    try {
        const kv::storage::MemoryState s = kv::storage::decode_memory_state(data, size);
        const std::vector<uint8_t> once = kv::storage::encode_memory_state(s);
        const kv::storage::MemoryState back = kv::storage::decode_memory_state(once.data(), once.size());
        if (kv::storage::encode_memory_state(back) != once) std::abort();
    } catch (const kv::Error&) {
    }
    return 0;
}
