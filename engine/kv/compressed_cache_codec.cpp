// The compressed-cache file codec (see compressed_cache_codec.h).
#include "engine/kv/compressed_cache_codec.h"

#include <cstring>

#include "engine/core/error.h"

namespace kv {

uint64_t fnv1a64(const uint8_t* data, size_t size, uint64_t h) {
    for (size_t i = 0; i < size; ++i) h = (h ^ data[i]) * 0x100000001b3ULL;
    return h;
}

uint64_t token_fingerprint(const std::vector<int32_t>& ids) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (int32_t id : ids) {
        const uint32_t u = uint32_t(id);
        const uint8_t b[4] = {uint8_t(u), uint8_t(u >> 8), uint8_t(u >> 16), uint8_t(u >> 24)};
        h = fnv1a64(b, 4, h);
    }
    return h;
}

namespace {

void put(std::vector<uint8_t>& out, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out.push_back(uint8_t(v >> (8 * i)));
}

template <class T>
void put_array(std::vector<uint8_t>& out, const std::vector<T>& v) {
    static_assert(sizeof(T) == 4);
    for (const T& x : v) {
        uint32_t u;
        std::memcpy(&u, &x, 4);
        put(out, u, 4);
    }
}

struct Reader {
    const uint8_t* p;
    size_t left;
    uint64_t get(int bytes, const char* what) {
        if (left < size_t(bytes)) throw Error(str("compressed cache file: truncated in ", what));
        uint64_t v = 0;
        for (int i = 0; i < bytes; ++i) v |= uint64_t(p[i]) << (8 * i);
        p += bytes, left -= size_t(bytes);
        return v;
    }
    template <class T>
    std::vector<T> array(uint64_t count, const char* what) {
        if (count > left / 4) throw Error(str("compressed cache file: ", what, " of ", count, " values exceeds the ", left, " bytes left"));
        std::vector<T> v((size_t)count);
        for (auto& x : v) {
            const uint32_t u = uint32_t(get(4, what));
            std::memcpy(&x, &u, 4);
        }
        return v;
    }
};

}  // namespace

std::vector<uint8_t> encode_compressed_cache(const CompressedCacheImage& img) {
    std::vector<uint8_t> out = {'K', 'V', 'C', 'C'};
    put(out, kCompressedCacheVersion, 4);
    put(out, uint64_t(img.context_length), 8);
    put(out, img.context_fingerprint, 8);
    put(out, uint64_t(img.rope_width), 8);
    put(out, uint64_t(img.B), 8);
    put(out, uint64_t(img.G), 8);
    put(out, uint64_t(img.D), 8);
    put(out, img.dtype, 4);
    put(out, img.cache_name.size(), 4);
    out.insert(out.end(), img.cache_name.begin(), img.cache_name.end());
    put(out, img.layers.size(), 4);
    for (const auto& l : img.layers) {
        put(out, uint64_t(l.kept), 8);
        put(out, l.scores.empty() ? 0 : 1, 1);
        put_array(out, l.positions);
        put_array(out, l.scores);
        put_array(out, l.K);
        put_array(out, l.V);
    }
    put(out, fnv1a64(out.data(), out.size()), 8);
    return out;
}

CompressedCacheImage decode_compressed_cache(const uint8_t* data, size_t size) {
    if (size < 16 || std::memcmp(data, "KVCC", 4) != 0)
        throw Error("compressed cache file: not a kvlab compressed cache (no 'KVCC' magic)", "expected a file written by --kv_cache.save");
    Reader r{data + 4, size - 4};
    const uint32_t version = uint32_t(r.get(4, "the version"));
    if (version != kCompressedCacheVersion)
        throw Error(str("compressed cache file: version ", version, "; this kvlab reads version ", kCompressedCacheVersion),
                    "save the cache again with this kvlab");
    uint64_t stored = 0;
    for (int i = 0; i < 8; ++i) stored |= uint64_t(data[size - 8 + size_t(i)]) << (8 * i);
    if (stored != fnv1a64(data, size - 8))
        throw Error("compressed cache file: checksum mismatch (the file is damaged or truncated)", "save the cache again");
    r.left -= 8;  // the checksum
    CompressedCacheImage img;
    const uint64_t ctx = r.get(8, "the context length");
    img.context_fingerprint = r.get(8, "the context fingerprint");
    const uint64_t width = r.get(8, "the RoPE width");
    const uint64_t B = r.get(8, "B"), G = r.get(8, "G"), D = r.get(8, "D");
    const uint64_t lim = uint64_t(1) << 31;
    if (ctx >= lim || width >= lim || B == 0 || B >= 4096 || G == 0 || G >= 4096 || D == 0 || D >= 65536)
        throw Error(str("compressed cache file: implausible shape (context ", ctx, ", B ", B, ", G ", G, ", D ", D, ")"));
    img.rope_width = int64_t(width);
    img.context_length = int64_t(ctx), img.B = int64_t(B), img.G = int64_t(G), img.D = int64_t(D);
    img.dtype = uint32_t(r.get(4, "the dtype"));
    const uint64_t name_len = r.get(4, "the cache name");
    if (name_len > r.left || name_len > 4096) throw Error(str("compressed cache file: a cache name of ", name_len, " bytes"));
    img.cache_name.assign(reinterpret_cast<const char*>(r.p), size_t(name_len));
    r.p += name_len, r.left -= size_t(name_len);
    const uint64_t layers = r.get(4, "the layer count");
    if (layers == 0 || layers > 4096) throw Error(str("compressed cache file: ", layers, " layers"));
    for (uint64_t l = 0; l < layers; ++l) {
        CompressedCacheImage::Layer L;
        const uint64_t kept = r.get(8, "a layer's kept slots");
        if (kept > ctx) throw Error(str("compressed cache file: layer ", l, " keeps ", kept, " slots of a context of ", ctx));
        L.kept = int64_t(kept);
        const uint64_t has_scores = r.get(1, "a layer's score flag");
        if (has_scores > 1) throw Error(str("compressed cache file: layer ", l, " score flag ", has_scores));
        const uint64_t rows = B * G, kd = kept * D;  // below 2^24 and 2^47: no overflow
        if (kept > (r.left / 4) / rows || kd > (r.left / 4) / rows)
            throw Error(str("compressed cache file: layer ", l, " of ", kept, " slots exceeds the ", r.left, " bytes left"));
        L.positions = r.array<int32_t>(rows * kept, "positions");
        for (int32_t p : L.positions)
            if (p != kUnusedSlotPosition && (p < 0 || uint64_t(p) >= ctx)) throw Error(str("compressed cache file: layer ", l, " position ", p, " outside the context of ", ctx));
        if (has_scores) L.scores = r.array<float>(rows * kept, "scores");
        L.K = r.array<float>(rows * kd, "keys");
        L.V = r.array<float>(rows * kd, "values");
        img.layers.push_back(std::move(L));
    }
    if (r.left != 0) throw Error(str("compressed cache file: ", r.left, " unexpected bytes after the last layer"));
    return img;
}

}  // namespace kv
