// Asymmetric K/V widths (--kv_cache.key_bits / value_bits): a width picks the format of that
// width in the buffer's family, so "q8" with value_bits 4 is the k8v4 buffer; exact bytes per
// slot against row sizes written here from each format's layout (docs/POLICIES.md, buffers
// table); bad widths and buffers without widths are refused naming the option.
#include <gtest/gtest.h>

#include <functional>

#include "engine/core/error.h"
#include "engine/kv/buffers/kv_buffer.h"
#include "engine/kv/kv_cache.h"
#include "engine/model/presets.h"
#include "engine/ops/ops.h"
#include "engine/model/transformer.h"
#include "tests/support/test_support.h"

namespace kv::test {
namespace {

// Bytes of one quantized row of n values, from the layouts: min-max rows carry an f32 scale and
// zero point; llama.cpp blocks of 32 an f16 scale; FP8 rows one f32 scale; NVFP4 an E4M3 byte
// per 16 values and an f32 row scale; MXFP4 an E8M0 byte per 32.
int64_t row_bytes(const std::string& f, int64_t n) {
    if (f == "q8") return n + 4 + 4;
    if (f == "q4") return n / 2 + 4 + 4;
    if (f == "q8_0") return n / 32 * (2 + 32);
    if (f == "q4_0") return n / 32 * (2 + 16);
    if (f == "fp8_e4m3" || f == "fp8_e5m2") return n + 4;
    if (f == "nvfp4") return n / 2 + n / 16 + 4;
    if (f == "mxfp4") return n / 32 * (1 + 16);
    ADD_FAILURE() << "no layout for " << f;
    return 0;
}

KVCacheConfig with_bits(const std::string& name, int64_t kb, int64_t vb) {
    KVCacheConfig c;
    c.name = name;
    c.cache_length = 32;
    c.key_bits = kb;
    c.value_bits = vb;
    return c;
}

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

TEST(KVBits, EachWidthStoresTheExactBytesOfItsFormat) {
    const int64_t G = 3, D = 64, L = 32;
    struct Case {
        const char* buffer;
        int64_t kb, vb;
        const char *keys, *values;
    };
    const Case cases[] = {
        {"q8", 0, 4, "q8", "q4"},          {"q4", 8, 0, "q8", "q4"},           {"k8v4", 0, 8, "q8", "q8"},
        {"q8_0", 8, 4, "q8_0", "q4_0"},    {"q4_0", 8, 8, "q8_0", "q8_0"},     {"fp8_e4m3", 0, 4, "fp8_e4m3", "nvfp4"},
        {"fp8_e5m2", 8, 4, "fp8_e5m2", "nvfp4"}, {"mxfp4", 8, 0, "fp8_e4m3", "mxfp4"}, {"kfp8vfp4", 4, 8, "nvfp4", "fp8_e4m3"},
        {"nf4", 4, 4, nullptr, nullptr},
    };
    for (const Case& cs : cases) {
        KVCacheConfig c = with_bits(str("h2o-", cs.buffer), cs.kb, cs.vb);
        validate_kv_config(c, 2, D, G);
        const auto [kf, vf] = kv_quant_formats(c);
        if (!cs.keys) {  // nf4 at its own width
            EXPECT_EQ(ops::quant_format_name(kf), std::string("nf4"));
            continue;
        }
        EXPECT_EQ(ops::quant_format_name(kf), std::string(cs.keys)) << cs.buffer;
        EXPECT_EQ(ops::quant_format_name(vf), std::string(cs.values)) << cs.buffer;
        const int64_t slot = G * (row_bytes(cs.keys, D) + row_bytes(cs.values, D));
        EXPECT_EQ(kv_slot_bytes(c, G, D, DType::F32), slot) << cs.buffer;
        BufferParams p{0, L, G, D, Device{}, DType::F32};
        auto buf = make_buffer(c, p, make_buffer_shared(c, L, G, D, Device{}, DType::F32));
        buf->allocate(1);
        EXPECT_EQ(int64_t(buf->bytes()), L * slot) << cs.buffer;
        EXPECT_DOUBLE_EQ(buf->bits_per_element(), 8.0 * double(slot) / double(2 * G * D)) << cs.buffer;
    }
}

TEST(KVBits, WidthsGiveTheSameCacheAsTheNamedAsymmetricBuffer) {
    ModelConfig cfg = preset_config("tiny");
    Transformer m{cfg, random_weights(cfg, 5, DType::F32), ModelOptions{}};
    m.set_context_width(cfg.max_position_embeddings);
    std::mt19937_64 rng(2);
    std::vector<int32_t> v(96);
    for (auto& x : v) x = int32_t(rng() % 256);
    const Tensor ids = Tensor::from_i32({1, 96}, v);
    auto run = [&](const KVCacheConfig& c) {
        KVCache cache(c, cfg, Device{}, DType::F32, 96);
        std::vector<std::vector<float>> outs;
        int64_t P = 0;
        for (int64_t n : {32, 16, 16, 32}) {
            Tensor x = m.embed(ids.slice(1, P, P + n));
            for (int l = 0; l < int(cfg.num_layers); ++l) outs.push_back((x = m.block(l, x, P, cache)).to_f32_vector());
            P += n;
        }
        return outs;
    };
    EXPECT_EQ(run(with_bits("h2o-q8", 0, 4)), run(with_bits("h2o-k8v4", 0, 0)));
    EXPECT_EQ(run(with_bits("h2o-q4_0", 8, 0)), run(with_bits("h2o-k8v4_0", 0, 0)));
    // and the widths are used: q8 keys and values differ from q8 with 4-bit values
    EXPECT_NE(run(with_bits("h2o-q8", 0, 4)), run(with_bits("h2o-q8", 0, 0)));
}

TEST(KVBits, BadWidthsAreRefusedNamingTheOption) {
    const int64_t G = 3, D = 64;
    std::string e = error_of([&] { validate_kv_config(with_bits("h2o-q8", 3, 0), 2, D, G); });
    EXPECT_NE(e.find("--kv_cache.key_bits: 3 bits"), std::string::npos) << e;
    EXPECT_NE(e.find("expected 8 or 4"), std::string::npos) << e;
    e = error_of([&] { validate_kv_config(with_bits("h2o-nf4", 0, 8), 2, D, G); });
    EXPECT_NE(e.find("--kv_cache.value_bits: 8 bits"), std::string::npos) << e;
    EXPECT_NE(e.find("expected 4"), std::string::npos) << e;
    e = error_of([&] { validate_kv_config(with_bits("h2o-default", 8, 0), 2, D, G); });
    EXPECT_NE(e.find("--kv_cache.key_bits: the 'default' buffer stores full precision"), std::string::npos) << e;
    e = error_of([&] { validate_kv_config(with_bits("h2o-kivi2", 0, 4), 2, D, G); });
    EXPECT_NE(e.find("--kv_cache.value_bits: the 'kivi2' buffer packs keys and values with one width"), std::string::npos) << e;
    e = error_of([&] { validate_kv_config(with_bits("h2o-q8", -1, 0), 2, D, G); });
    EXPECT_NE(e.find("--kv_cache.key_bits: -1 is invalid"), std::string::npos) << e;
}

}  // namespace
}  // namespace kv::test
