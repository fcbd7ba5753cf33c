// Saving and loading a compressed cache (--kv_cache.save / load): a loaded cache answers bit for
// bit as the one saved, the file holds the kept K/V, positions and scores exactly, and damaged,
// truncated, wrong-version or other-context files are refused with a message naming the problem.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "engine/core/error.h"
#include "engine/kv/compressed_cache.h"
#include "engine/kv/compressed_cache_codec.h"
#include "engine/model/presets.h"
#include "engine/model/transformer.h"
#include "engine/run/compress_then_ask.h"
#include "tests/support/test_support.h"

namespace kv::test {
namespace {

std::vector<int32_t> tokens(int64_t T, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<int32_t> v((size_t)T);
    for (auto& x : v) x = int32_t(rng() % 256);
    return v;
}

struct Fixture {
    ModelConfig cfg = preset_config("tiny");
    Transformer model{cfg, random_weights(cfg, 5, DType::F32), ModelOptions{}};
    std::vector<int32_t> ctx = tokens(48, 1), q = tokens(10, 2);
    std::vector<int32_t> targets() const {
        std::vector<int32_t> t(q.begin() + 1, q.end());
        t.push_back(-100);
        return t;
    }
    CompressedCache compress(const std::string& name, int64_t keep) {
        KVCacheConfig kc;
        kc.name = name;
        kc = context_cache_config(kc, int64_t(ctx.size()));
        RunConfig rc;
        rc.driver.chunk_size = 8;
        return compress_context(model, kc, context_chunk_plan(rc, kc, cfg, int64_t(ctx.size())), ctx, keep, int64_t(ctx.size() + q.size()));
    }
};

std::string temp_path(const std::string& name) { return (std::filesystem::temp_directory_path() / name).string(); }

std::vector<uint8_t> read_all(const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}
void write_all(const std::string& p, const std::vector<uint8_t>& b) {
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

TEST(CompressedCacheFile, LoadedCacheAnswersBitIdentically) {
    Fixture fx;
    for (const char* name : {"h2o-default", "lastrec-default", "snapkv-default"}) {
        CompressedCache saved = fx.compress(name, 20);
        const std::string path = temp_path(std::string("kvlab_cc_") + name + ".kvc");
        save_compressed_cache(saved, fx.ctx, path);
        const AskResult a = ask_compressed(fx.model, saved, fx.q, fx.targets(), true);
        CompressedCache loaded = load_compressed_cache(path, Device{}, &fx.ctx);
        EXPECT_EQ(loaded.cache_name(), name);
        EXPECT_EQ(loaded.context_length(), int64_t(fx.ctx.size()));
        ASSERT_EQ(loaded.num_layers(), saved.num_layers());
        for (int l = 0; l < saved.num_layers(); ++l) {
            EXPECT_EQ(loaded.layer(l).positions, saved.layer(l).positions);
            EXPECT_EQ(loaded.layer(l).scores, saved.layer(l).scores);
            EXPECT_EQ(loaded.layer(l).K.to_f32_vector(), saved.layer(l).K.to_f32_vector());
            EXPECT_EQ(loaded.layer(l).V.to_f32_vector(), saved.layer(l).V.to_f32_vector());
        }
        const AskResult b = ask_compressed(fx.model, loaded, fx.q, fx.targets(), true);
        EXPECT_EQ(a.logits, b.logits) << name << ": the loaded cache answers bit for bit";
        EXPECT_EQ(a.argmax, b.argmax);
        std::remove(path.c_str());
    }
}

// The file's bytes as the format says (compressed_cache_codec.h), read back by hand here.
TEST(CompressedCacheFile, LayoutIsTheDocumentedOne) {
    CompressedCacheImage img;
    img.cache_name = "h2o-default";
    img.context_length = 9;
    img.context_fingerprint = token_fingerprint({1, 2, 3});
    img.rope_width = 300;
    img.B = 1, img.G = 1, img.D = 2, img.dtype = 0;
    img.layers.push_back({2, {3, 7}, {0.5f, 1.5f}, {1, 2, 3, 4}, {5, 6, 7, 8}});
    const std::vector<uint8_t> b = encode_compressed_cache(img);
    // 4 magic + 4 version + 6 * 8 + 4 dtype + 4 + 11 name + 4 layers + 8 kept + 1 flag + 4 * (2 + 2 + 4 + 4) + 8 checksum
    ASSERT_EQ(b.size(), size_t(4 + 4 + 48 + 4 + 4 + 11 + 4 + 8 + 1 + 48 + 8));
    EXPECT_EQ(std::string(b.begin(), b.begin() + 4), "KVCC");
    EXPECT_EQ(b[4], 1);
    EXPECT_EQ(b[8], 9);  // context length, little-endian
    EXPECT_EQ(b[24] | (b[25] << 8), 300);  // the RoPE width after the fingerprint
    // FNV-1a 64 of the ids 1, 2, 3 as 4 little-endian bytes each, computed here from its definition.
    uint64_t h = 0xcbf29ce484222325ULL;
    for (int id : {1, 2, 3})
        for (int k = 0; k < 4; ++k) h = (h ^ uint8_t(id >> (8 * k))) * 0x100000001b3ULL;
    EXPECT_EQ(img.context_fingerprint, h);
    const CompressedCacheImage back = decode_compressed_cache(b.data(), b.size());
    EXPECT_EQ(back.layers[0].positions, (std::vector<int32_t>{3, 7}));
    EXPECT_EQ(back.layers[0].V, (std::vector<float>{5, 6, 7, 8}));
}

TEST(CompressedCacheFile, RefusesDamagedWrongVersionAndOtherContextFiles) {
    Fixture fx;
    CompressedCache c = fx.compress("h2o-default", 12);
    const std::string path = temp_path("kvlab_cc_refuse.kvc");
    save_compressed_cache(c, fx.ctx, path);
    const std::vector<uint8_t> good = read_all(path);
    auto message = [&](const std::vector<uint8_t>& bytes, const std::vector<int32_t>* ctx = nullptr) {
        write_all(path, bytes);
        try {
            load_compressed_cache(path, Device{}, ctx);
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string("loaded");
    };
    std::vector<uint8_t> flipped = good;
    flipped[good.size() / 2] ^= 0x10;
    EXPECT_NE(message(flipped).find("checksum"), std::string::npos);
    EXPECT_NE(message(std::vector<uint8_t>(good.begin(), good.end() - 100)).find("checksum"), std::string::npos);
    std::vector<uint8_t> v2 = good;
    v2[4] = 2;
    EXPECT_NE(message(v2).find("version 2"), std::string::npos);
    std::vector<uint8_t> magic = good;
    magic[0] = 'X';
    EXPECT_NE(message(magic).find("magic"), std::string::npos);
    const std::vector<int32_t> other = tokens(48, 99);
    EXPECT_NE(message(good, &other).find("not this sample's context"), std::string::npos);
    EXPECT_EQ(message(good, &fx.ctx), "loaded");
    std::remove(path.c_str());
    EXPECT_NE(message({}).find("magic"), std::string::npos);
    std::remove(path.c_str());
    try {
        load_compressed_cache(temp_path("kvlab_cc_missing.kvc"), Device{});
        ADD_FAILURE() << "a missing file loaded";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("cannot open"), std::string::npos);
    }
}

// A file written from the layout by another encoder (tools/reference/compressed_cache_fixture.py,
// Python's struct) loads with the values that script wrote.
TEST(CompressedCacheFile, ReadsAFileWrittenFromTheLayout) {
    const std::string path = std::string(KVLAB_SOURCE_DIR) + "/tests/fixtures/compressed_cache/two_layers.kvc";
    const std::vector<int32_t> ctx = {10, 11, 12, 13, 14, 15, 16};
    CompressedCache c = load_compressed_cache(path, Device{}, &ctx);
    EXPECT_EQ(c.cache_name(), "h2o-default");
    EXPECT_EQ(c.context_length(), 7);
    EXPECT_EQ(c.rope_width(), 64);
    ASSERT_EQ(c.num_layers(), 2);
    EXPECT_EQ(c.kept(0), 3);
    EXPECT_EQ(c.kept(1), 2);
    EXPECT_EQ(c.layer(0).positions, (std::vector<int32_t>{0, 2, 6, 1, 2, 5}));
    EXPECT_EQ(c.layer(0).scores, (std::vector<float>{0.5f, 0.25f, 2.0f, 1.0f, 1.5f, 0.125f}));
    EXPECT_TRUE(c.layer(1).scores.empty());
    const std::vector<float> K0 = c.layer(0).K.to_f32_vector(), V1 = c.layer(1).V.to_f32_vector();
    ASSERT_EQ(K0.size(), 12u);
    for (size_t i = 0; i < 12; ++i) EXPECT_EQ(K0[i], float(i));
    ASSERT_EQ(V1.size(), 8u);
    for (size_t i = 0; i < 8; ++i) EXPECT_EQ(V1[i], 0.25f * float(i));
    const std::vector<int32_t> other = {10, 11, 12, 13, 14, 15, 17};
    EXPECT_THROW(load_compressed_cache(path, Device{}, &other), Error);
}

}  // namespace
}  // namespace kv::test
