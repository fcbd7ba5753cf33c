// Calibrated FP8 K/V scales (engine/kv/kv_scales.h, `kvlab calibrate kv-scales`,
// --kv_cache.kv_scales): the calibrated scales equal max|K| / 448 and max|V| / 448 per layer and
// KV head, computed here in f64 from the keys and values the model hands its attention on the
// same text; an fp8_e4m3 buffer with them stores the text's K/V with no more squared error than
// one dynamic scale per tensor (max over the layer's K or V / 448); files that are missing, of
// another model or for a buffer without fp8 rows get one message naming what was wrong.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>

#include <unistd.h>

#include "engine/core/error.h"
#include "engine/kv/buffers/kv_buffer.h"
#include "engine/kv/kv_config.h"
#include "engine/kv/kv_scales.h"
#include "engine/model/attention.h"
#include "kernels/common/quant_formats.h"
#include "tests/engine/tiny_model_util.h"
#include "tests/support/test_support.h"

namespace kv::test {
namespace {

// f throws kv::Error whose message holds every part.
template <class F>
void expect_error_contains(const F& f, const std::vector<std::string>& parts) {
    try {
        f();
        ADD_FAILURE() << "no error; expected one naming " << parts.front();
    } catch (const Error& e) {
        for (const std::string& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << "'" << p << "' in: " << e.what();
    }
}

// The keys and values each layer's attention receives (B = 1), kept as f32 vectors (G, n, D).
class Capture final : public LayerAttention {
   public:
    void attend(int layer, const Tensor& q, const Tensor& k, const Tensor& v, int64_t input_pos, float scale, int window,
                Tensor& y) override {
        if (int(K.size()) <= layer) K.resize(size_t(layer + 1)), V.resize(size_t(layer + 1));
        K[size_t(layer)] = k.contiguous().to_f32_vector();
        V[size_t(layer)] = v.contiguous().to_f32_vector();
        plain.attend(layer, q, k, v, input_pos, scale, window, y);
    }
    PlainAttention plain;
    std::vector<std::vector<float>> K, V;
};

struct Calibrated {
    std::vector<int32_t> ids;
    Capture cap;
    KvScales scales;
    std::string path;
};

const Calibrated& calibrated() {
    static Calibrated c = [] {
        Calibrated r;
        TinyModel& m = tiny_model<91>();
        r.ids = random_tokens(200, 17);
        Tensor idt = Tensor::from_i32({1, int64_t(r.ids.size())}, r.ids);
        Tensor x = m.model.embed(idt);
        for (int l = 0; l < int(m.cfg.num_layers); ++l) x = m.model.block(l, x, 0, r.cap);
        r.scales = calibrate_kv_scales(m.model, r.ids);
        // Each test case is its own process, and ctest runs two at once: a file of this
        // process's own, or one case reads the file while the other rewrites it.
        r.path = testing::TempDir() + "kv_scales_test_scales." + std::to_string(::getpid()) + ".txt";
        write_kv_scales(r.path, r.scales);
        return r;
    }();
    return c;
}

TEST(KvScales, CalibratedScalesAreMaxOver448PerHead) {
    const Calibrated& c = calibrated();
    const ModelConfig& cfg = tiny_model<91>().cfg;
    const int64_t G = cfg.num_kv_heads, D = cfg.head_dim, n = int64_t(c.ids.size());
    ASSERT_EQ(c.scales.layers, cfg.num_layers);
    ASSERT_EQ(c.scales.kv_heads, G);
    for (int64_t l = 0; l < cfg.num_layers; ++l)
        for (int64_t g = 0; g < G; ++g) {
            double km = 0, vm = 0;
            for (int64_t i = 0; i < n * D; ++i) {
                km = std::max(km, std::fabs(double(c.cap.K[size_t(l)][size_t(g * n * D + i)])));
                vm = std::max(vm, std::fabs(double(c.cap.V[size_t(l)][size_t(g * n * D + i)])));
            }
            EXPECT_FLOAT_EQ(c.scales.k_scale(l, g), float(km / 448.0)) << "layer " << l << " head " << g;
            EXPECT_FLOAT_EQ(c.scales.v_scale(l, g), float(vm / 448.0)) << "layer " << l << " head " << g;
        }
    // The file reads back to the same scales.
    const KvScales back = read_kv_scales(c.path);
    EXPECT_EQ(back.k, c.scales.k);
    EXPECT_EQ(back.v, c.scales.v);
}

// Squared error of x stored as E4M3 with one scale s for all of it.
double per_tensor_error(const std::vector<float>& x) {
    float amax = 0;
    for (float a : x) amax = std::max(amax, std::fabs(a));
    const float s = amax / 448.0f;
    double e = 0;
    for (float a : x) {
        const double d = double(a) - double(e4m3_to_f32(f32_to_e4m3(a / s))) * double(s);
        e += d * d;
    }
    return e;
}

TEST(KvScales, CalibratedFp8ErrorIsAtMostThePerTensorDynamicError) {
    const Calibrated& c = calibrated();
    const ModelConfig& cfg = tiny_model<91>().cfg;
    const int64_t G = cfg.num_kv_heads, D = cfg.head_dim, n = int64_t(c.ids.size());
    KVCacheConfig kc;
    kc.name = "dense-fp8_e4m3";
    kc.kv_scales = c.path;
    validate_kv_config(kc, cfg.num_layers, D, G);
    for (int64_t l = 0; l < cfg.num_layers; ++l) {
        BufferParams p;
        p.layer = l, p.L = n, p.G = G, p.D = D;
        auto buf = make_buffer(kc, p, make_buffer_shared(kc, n, G, D, Device{}, DType::F32));
        ASSERT_TRUE(buf->fused_attention()) << "calibrated fp8 rows are attended as codes";
        buf->prefill(Tensor::from_f32({1, G, n, D}, c.cap.K[size_t(l)]), Tensor::from_f32({1, G, n, D}, c.cap.V[size_t(l)]));
        // Each stored row carries its head's calibrated scale (not one computed from the row).
        for (int side = 0; side < 2; ++side) {
            const Tensor st = buf->storage_tensors()[size_t(side)]->contiguous();  // (1, G, n, D + 4)
            for (int64_t g = 0; g < G; ++g)
                for (int64_t t = 0; t < n; t += 37)
                    ASSERT_EQ(get_f32(st.data<uint8_t>() + ((g * n + t) * (D + 4)) + D), side ? c.scales.v_scale(l, g) : c.scales.k_scale(l, g))
                        << "layer " << l << " head " << g << " slot " << t;
        }
        auto [K, V] = buf->read(n);
        for (int kv_side = 0; kv_side < 2; ++kv_side) {
            const std::vector<float>& x = kv_side == 0 ? c.cap.K[size_t(l)] : c.cap.V[size_t(l)];
            const std::vector<float> got = (kv_side == 0 ? K : V).contiguous().to_f32_vector();
            double e = 0;
            for (size_t i = 0; i < x.size(); ++i) e += (double(x[i]) - double(got[i])) * (double(x[i]) - double(got[i]));
            const double et = per_tensor_error(x);
            EXPECT_LE(e, et) << "layer " << l << (kv_side ? " values" : " keys");
            EXPECT_GT(e, 0.0) << "layer " << l << ": the rows were quantized";
        }
    }
}

TEST(KvScales, MissingMismatchedOrMisusedFilesAreRefusedByName) {
    const Calibrated& c = calibrated();
    const ModelConfig& cfg = tiny_model<91>().cfg;
    KVCacheConfig kc;
    kc.name = "dense-fp8_e4m3";
    kc.kv_scales = testing::TempDir() + "kv_scales_test_no_such_file.txt";
    expect_error_contains([&] { validate_kv_config(kc, cfg.num_layers, cfg.head_dim, cfg.num_kv_heads); },
                          {"--kv_cache.kv_scales", "no_such_file", "cannot be read", "kvlab calibrate kv-scales"});
    kc.kv_scales = c.path;
    expect_error_contains([&] { validate_kv_config(kc, cfg.num_layers, cfg.head_dim, cfg.num_kv_heads + 1); },
                          {"--kv_cache.kv_scales", "holds scales for", "expected a file calibrated on this model"});
    kc.name = "dense-q8";
    expect_error_contains([&] { validate_kv_config(kc, cfg.num_layers, cfg.head_dim, cfg.num_kv_heads); },
                          {"--kv_cache.kv_scales", "'q8'", "no fp8 rows"});
    const std::string bad = testing::TempDir() + "kv_scales_test_bad.txt";
    {
        std::ofstream f(bad);
        f << "kvlab kv-scales 1\nmodel tiny\nlayers 2 kv_heads 2 head_dim 16\n0 0 0.1 0.1\n0 1 nan 0.1\n";
    }
    kc.name = "dense-fp8_e4m3";
    kc.kv_scales = bad;
    expect_error_contains([&] { validate_kv_config(kc, cfg.num_layers, cfg.head_dim, cfg.num_kv_heads); },
                          {"kv_scales_test_bad.txt", "line 5", "finite scales > 0"});
}

}  // namespace
}  // namespace kv::test
