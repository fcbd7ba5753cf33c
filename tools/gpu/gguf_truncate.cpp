// kvlab_gguf_truncate IN.gguf OUT.gguf LAYERS [--q4_0-embedding]: the same model with only its
// first LAYERS transformer blocks (blk.0 .. blk.LAYERS-1), every other tensor, the tokenizer and
// all other metadata kept byte for byte; {arch}.block_count is set to LAYERS.
// --q4_0-embedding re-quantizes a Q8_0 token_embd.weight to Q4_0 (18 instead of 34 bytes per 32
// values; SmolLM2's is 30 MB of its 94 MiB and also its output head). The engine dequantizes
// every weight at load, so the format changes the numbers, not the code paths a device runs.
// The GPU kit carries SmolLM2-135M this way: all 30 blocks do not fit the device machine's
// 64 MiB; its vocabulary, tokenizer, head shapes (9 query / 3 KV heads, GQA) and Q4_1 blocks do.
// The result is a smaller model with SmolLM2's parts, not SmolLM2's quality: compare devices
// with it (both load the same file), nothing else.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/core/error.h"
#include "formats/gguf/gguf_blocks.h"
#include "formats/gguf/gguf_parse.h"
#include "formats/gguf/gguf_writer.h"

namespace {
// Q8_0 blocks (34 bytes) -> Q4_0 blocks (18 bytes), as ggml quantizes Q4_0: per 32 values the
// one of largest magnitude m (sign kept) gives d = m / -8, q = x / d + 8 rounded, clamped to
// 0..15; x = (q - 8) d (gguf_blocks.h).
std::vector<uint8_t> q8_0_to_q4_0(const uint8_t* src, size_t nblocks) {
    std::vector<uint8_t> out(nblocks * 18);
    float x[32];
    for (size_t b = 0; b < nblocks; ++b) {
        kv::gguf_blocks::dequant_q8_0(src + b * 34, x);
        float m = 0;
        for (float v : x)
            if (std::fabs(v) > std::fabs(m)) m = v;
        const float d = m / -8.0f, id = d != 0 ? 1.0f / d : 0.0f;
        uint8_t* o = out.data() + b * 18;
        const uint16_t dh = kv::f32_to_f16(d);
        std::memcpy(o, &dh, 2);  // little-endian hosts only (x86-64)
        for (int j = 0; j < 16; ++j) {
            const int q0 = std::clamp(int(x[j] * id + 8.5f), 0, 15), q1 = std::clamp(int(x[j + 16] * id + 8.5f), 0, 15);
            o[2 + j] = uint8_t(q0 | q1 << 4);
        }
    }
    return out;
}
}  // namespace

int main(int argc, char** argv) {
    const bool requant = argc == 5 && std::strcmp(argv[4], "--q4_0-embedding") == 0;
    if (argc != 4 && !requant) {
        std::fprintf(stderr, "usage: kvlab_gguf_truncate IN.gguf OUT.gguf LAYERS [--q4_0-embedding]\n");
        return 2;
    }
    const std::string in = argv[1], out = argv[2];
    char* end = nullptr;
    const long layers = std::strtol(argv[3], &end, 10);
    if (!end || *end || layers < 1) {
        std::fprintf(stderr, "kvlab_gguf_truncate: LAYERS '%s' is not a number >= 1\n", argv[3]);
        return 2;
    }
    try {
        std::ifstream f(in, std::ios::binary);
        if (!f) throw kv::Error(kv::str(in, ": cannot read"));
        std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
        kv::GgufFile g = kv::gguf_parse(bytes.data(), bytes.size(), in);
        const std::string arch = g.get("general.architecture").as_string(g.what("general.architecture"));
        const std::string count_key = arch + ".block_count";
        const long have = long(g.get(count_key).as_int(g.what(count_key)));
        if (layers > have) throw kv::Error(kv::str(in, ": has ", have, " blocks; cannot keep ", layers));
        kv::GgufWriter w;
        w.set_alignment(uint32_t(g.alignment));
        for (const auto& [key, value] : g.metadata)
            w.set(key, key == count_key ? kv::GgufValue::of_u32(uint32_t(layers)) : value);
        size_t kept = 0;
        for (const kv::GgufTensorInfo& t : g.tensors) {
            if (t.name.rfind("blk.", 0) == 0 && std::atol(t.name.c_str() + 4) >= layers) continue;
            std::vector<int64_t> ne(t.ne, t.ne + t.n_dims);
            if (requant && t.name == "token_embd.weight" && t.type == kv::GgmlType::Q8_0) {
                w.add_tensor(t.name, kv::GgmlType::Q4_0, ne, q8_0_to_q4_0(bytes.data() + t.file_offset, t.nbytes / 34));
                std::printf("%s: Q8_0 -> Q4_0\n", t.name.c_str());
            } else {
                w.add_tensor(t.name, t.type, ne,
                             std::vector<uint8_t>(bytes.begin() + long(t.file_offset), bytes.begin() + long(t.file_offset + t.nbytes)));
            }
            ++kept;
        }
        w.write(out);
        std::printf("%s: %ld of %ld blocks, %zu of %zu tensors\n", out.c_str(), layers, have, kept, g.tensors.size());
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "kvlab_gguf_truncate: %s\n", e.what());
        return 1;
    }
}
