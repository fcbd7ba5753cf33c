// libFuzzer target for saved compressed caches (--kv_cache.load reads them): any bytes must
// decode or throw kv::Error; what decodes must survive encode + decode unchanged.
// fuzz-sources: engine/kv/compressed_cache_codec.cpp engine/core/error.cpp
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "engine/core/error.h"
#include "engine/kv/compressed_cache_codec.h"

namespace {

void check(const std::vector<uint8_t>& buf) {
    try {
        const kv::CompressedCacheImage img = kv::decode_compressed_cache(buf.data(), buf.size());
        const std::vector<uint8_t> once = kv::encode_compressed_cache(img);
        const kv::CompressedCacheImage back = kv::decode_compressed_cache(once.data(), once.size());
        if (kv::encode_compressed_cache(back) != once) std::abort();
    } catch (const kv::Error&) {
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::vector<uint8_t> buf(data, data + size);
    check(buf);
    // Again with a valid checksum appended, so the fuzzer reaches the field checks behind it.
    const uint64_t h = kv::fnv1a64(buf.data(), buf.size());
    for (int i = 0; i < 8; ++i) buf.push_back(uint8_t(h >> (8 * i)));
    check(buf);
    return 0;
}
