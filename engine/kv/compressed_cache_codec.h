// The file format of a saved compressed cache (compress-then-ask; compressed_cache.h): plain
// values only, so the one encoder and the one decoder stand alone (the fuzz target builds them
// with nothing else). Layout, little-endian:
//   "KVCC" u32 version (1)
//   u64 context_length, context_fingerprint, rope_width, B, G, D; u32 dtype (kernels/common/dtype.h's
//   DType value of the saved K/V); u32 name length, the cache name bytes; u32 layers
//   per layer: u64 kept; u8 has_scores; i32 positions[B G kept] (kUnusedSlotPosition: an unused
//   slot, at the end of its row); f32 scores[B G kept] if
//   has_scores; f32 K[B G kept D], f32 V[B G kept D] (exact for f32, bf16 and f16 values)
//   u64 FNV-1a 64 of every byte before it
// The decoder checks magic, version, checksum and every size against the bytes left before
// allocating, and throws kv::Error naming what is wrong.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kv {

inline constexpr uint32_t kCompressedCacheVersion = 1;

// The position of an unused slot of a row that keeps fewer slots than its layer's longest row
// (a score threshold keeps a different count per head): beyond every query, so attention masks it.
inline constexpr int32_t kUnusedSlotPosition = 0x7fffffff;

struct CompressedCacheImage {
    std::string cache_name;            // the {policy}-{buffer} that chose the kept slots
    int64_t context_length = 0;        // tokens of the compressed context
    uint64_t context_fingerprint = 0;  // FNV-1a 64 of the context's token ids (which context it was)
    int64_t rope_width = 0;            // the RoPE context width the keys were rotated with
    int64_t B = 0, G = 0, D = 0;
    uint32_t dtype = 0;                // DType of K and V in the cache
    struct Layer {
        int64_t kept = 0;
        std::vector<int32_t> positions;  // (B G, kept)
        std::vector<float> scores;       // (B G, kept) or empty
        std::vector<float> K, V;         // (B, G, kept, D)
    };
    std::vector<Layer> layers;
};

std::vector<uint8_t> encode_compressed_cache(const CompressedCacheImage& img);
CompressedCacheImage decode_compressed_cache(const uint8_t* data, size_t size);

// FNV-1a 64 over bytes, and over a token sequence (each id as 4 little-endian bytes).
uint64_t fnv1a64(const uint8_t* data, size_t size, uint64_t h = 0xcbf29ce484222325ULL);
uint64_t token_fingerprint(const std::vector<int32_t>& ids);

}  // namespace kv
