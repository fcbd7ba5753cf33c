// The deployed floating-point buffers (fp8_e4m3, fp8_e5m2, nvfp4, mxfp4; engine/kv/
// buffer_quantized.cpp over kernels/common/quant_formats.h), with a scale per token and head or
// per token over all heads: what a layer reads back is the stored bytes decoded here in f64
// from the format definitions; SDPA over the buffer equals an f64 SDPA written here over that
// decoded cache; the memory tracker holds exactly the stored rows (plus the working buffer where
// rows span heads).
// Invariants with every policy are kv_invariants_test's (its combos include these buffers).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "engine/kv/buffers/buffer_common.h"
#include "engine/kv/buffers/kv_buffer.h"
#include "engine/kv/kv_config.h"
#include "engine/memory/memory_tracker.h"
#include "engine/ops/ops.h"
#include "tests/engine/kv_test_util.h"
#include "tests/support/test_support.h"

namespace kv::test {
namespace {

// Minifloat magnitude from the definition (field 0: subnormal), sign at bit e + m.
double mini(int c, int e, int m, int bias) {
    const int field = (c >> m) & ((1 << e) - 1), mant = c & ((1 << m) - 1);
    const double v = field == 0 ? std::ldexp(double(mant), 1 - bias - m) : std::ldexp(double((1 << m) + mant), field - bias - m);
    return (c >> (e + m)) & 1 ? -v : v;
}
double f32_at(const uint8_t* p) {
    float f;
    std::memcpy(&f, p, 4);
    return double(f);
}

// One stored row of n values decoded in f64 (layouts of quant_formats.h's header comment), each
// product rounded once to f32 as the working buffer holds it.
std::vector<double> decode_row(const std::string& fmt, const uint8_t* r, int64_t n) {
    std::vector<double> y{};
    y.resize(size_t(n));
    if (fmt == "fp8_e4m3" || fmt == "fp8_e5m2") {
        const bool e5 = fmt == "fp8_e5m2";
        for (int64_t i = 0; i < n; ++i) y[size_t(i)] = double(float((e5 ? mini(r[i], 5, 2, 15) : mini(r[i], 4, 3, 7)) * f32_at(r + n)));
    } else if (fmt == "nvfp4") {
        const double sg = f32_at(r + n / 2 + n / 16);
        for (int64_t i = 0; i < n; ++i)
            y[size_t(i)] = double(float(mini((r[i / 2] >> (4 * (i % 2))) & 15, 2, 1, 1) * double(float(mini(r[n / 2 + i / 16], 4, 3, 7) * sg))));
    } else {  // mxfp4
        for (int64_t i = 0; i < n; ++i) {
            const uint8_t* b = r + (i / 32) * 17;
            const int j = int(i % 32);
            y[size_t(i)] = double(float(mini((b[1 + j % 16] >> (j < 16 ? 0 : 4)) & 15, 2, 1, 1) * std::ldexp(1.0, int(b[0]) - 127)));
        }
    }
    return y;
}

struct FpSetup {
    std::string buffer, granularity;
    int64_t B = 2, G = 2, L = 40, D = 32;
    KVCacheConfig cfg() const {
        KVCacheConfig c;
        c.name = "dense-" + buffer;
        c.scale_granularity = granularity;
        return c;
    }
    bool over_heads() const { return granularity == "token"; }
    int64_t row() const { return over_heads() ? G * D : D; }
};

Tensor random_kv(int64_t B, int64_t G, int64_t n, int64_t D, std::mt19937_64& rng) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> v(size_t(B * G * n * D));
    for (size_t i = 0; i < v.size(); ++i) v[i] = nd(rng) * (i % 11 == 0 ? 8.0f : 1.0f) + 0.3f * float(i % 5);
    return Tensor::from_f32({B, G, n, D}, v);
}

// The (B, G, L, D) cache decoded from the stored bytes (B, gq, L, rb).
std::vector<double> decoded_cache(const FpSetup& st, const Tensor& q) {
    const Tensor c = q.contiguous();
    const std::vector<uint8_t> bytes(c.data<uint8_t>(), c.data<uint8_t>() + c.numel());
    const int64_t rb = q.size(3), gq = q.size(1), n = st.row();
    std::vector<double> out(size_t(st.B * st.G * st.L * st.D));
    for (int64_t b = 0; b < st.B; ++b)
        for (int64_t h = 0; h < gq; ++h)
            for (int64_t t = 0; t < st.L; ++t) {
                const std::vector<double> y = decode_row(st.buffer, bytes.data() + ((b * gq + h) * st.L + t) * rb, n);
                for (int64_t i = 0; i < n; ++i) {
                    const int64_t g = st.over_heads() ? i / st.D : h, d = i % st.D;
                    out[size_t(((b * st.G + g) * st.L + t) * st.D + d)] = y[size_t(i)];
                }
            }
    return out;
}

std::vector<FpSetup> setups() {
    std::vector<FpSetup> s;
    for (const char* b : {"fp8_e4m3", "fp8_e5m2", "nvfp4", "mxfp4"})
        for (const char* g : {"head", "token"}) s.push_back({b, g});
    return s;
}

TEST(FpBuffers, ReadsAreTheStoredBytesAndSdpaEqualsF64SdpaOverThem) {
    for (const FpSetup& st : setups()) {
        const std::string what = st.buffer + "/" + st.granularity;
        const KVCacheConfig cfg = st.cfg();
        BufferParams p;
        p.L = st.L, p.G = st.G, p.D = st.D;
        auto shared = make_buffer_shared(cfg, st.L, st.G, st.D, Device{}, DType::F32);
        auto buf = make_buffer(cfg, p, shared);
        ASSERT_EQ(buf->name(), st.buffer);
        std::mt19937_64 rng(seed_for(what));
        buf->prefill(random_kv(st.B, st.G, 30, st.D, rng), random_kv(st.B, st.G, 30, st.D, rng));
        SlotPlan app;
        app.n = st.L - 30;
        app.rows = 1;
        for (int64_t t = 0; t < app.n; ++t) app.targets.push_back(int32_t(30 + t));
        buf->write(app, random_kv(st.B, st.G, app.n, st.D, rng), random_kv(st.B, st.G, app.n, st.D, rng));
        buf->flush();  // quantize; the next read dequantizes the stored rows
        auto [K, V] = buf->read(st.L);
        std::vector<Tensor*> stored = buf->storage_tensors();
        ASSERT_EQ(stored.size(), 2u);
        const std::vector<double> kd = decoded_cache(st, *stored[0]), vd = decoded_cache(st, *stored[1]);
        const std::vector<float> kr = K.contiguous().to_f32_vector(), vr = V.contiguous().to_f32_vector();
        for (size_t i = 0; i < kd.size(); ++i) {
            ASSERT_EQ(double(kr[i]), kd[i]) << what << " key element " << i;
            ASSERT_EQ(double(vr[i]), vd[i]) << what << " value element " << i;
        }
        // SDPA (4 query heads over 2 KV heads, everything visible) against f64 over the decoded cache.
        const int64_t NH = 4, n = 3, T = st.L, D = st.D, B = st.B, G = st.G;
        Tensor q = random_kv(B, NH, n, D, rng);
        std::vector<int32_t> kp(size_t(B * G * T));
        for (size_t i = 0; i < kp.size(); ++i) kp[i] = int32_t(i % size_t(T));
        Tensor kpos = Tensor::from_i32({B, G, T}, kp), qpos = Tensor::from_i32({1, n}, {int32_t(T), int32_t(T + 1), int32_t(T + 2)});
        const float scale = 1.0f / std::sqrt(float(D));
        Tensor y = Tensor::empty({B, NH, n, D}, DType::F32);
        ops::sdpa_(y, q, K, V, kpos, qpos, scale);
        const std::vector<float> yv = y.to_f32_vector();
        const std::vector<double> ref = sdpa_f64(q.to_f32_vector(), kd, vd, B, NH, G, n, T, D, double(scale));
        for (size_t e = 0; e < ref.size(); ++e)
            ASSERT_NEAR(double(yv[e]), ref[e], 2e-5 * (1.0 + std::fabs(ref[e]))) << what << " output element " << e << " of (B, NH, n, D)";
    }
}

// Exact bytes: the stored K and V rows (codes and scales) are 2 B gq L rb bytes of kv_cache
// with rb from the definitions (FP8: n + 4; NVFP4: n/2 + n/16 + 4; MXFP4: 17 per 32), plus the
// shared f32 working buffer 2 B G L D 4 where rows span heads; bits_per_element is 8 rb / n.
TEST(FpBuffers, MemoryTrackerHoldsTheExactBytes) {
    for (const FpSetup& st : setups()) {
        const std::string what = st.buffer + "/" + st.granularity;
        MemoryTracker tracker;
        MemoryTrackerScope scope(tracker);
        const KVCacheConfig cfg = st.cfg();
        BufferParams p;
        p.L = st.L, p.G = st.G, p.D = st.D;
        auto shared = make_buffer_shared(cfg, st.L, st.G, st.D, Device{}, DType::F32);
        auto buf = make_buffer(cfg, p, shared);
        std::mt19937_64 rng(seed_for(what + " bytes"));
        {
            Tensor k = random_kv(st.B, st.G, 30, st.D, rng), v = random_kv(st.B, st.G, 30, st.D, rng);
            buf->prefill(k, v);
        }
        const int64_t n = st.row(), gq = st.over_heads() ? 1 : st.G;
        const int64_t rb = st.buffer.rfind("fp8", 0) == 0 ? n + 4 : st.buffer == "nvfp4" ? n / 2 + n / 16 + 4 : n / 32 * 17;
        // A row per head is written and attended as codes (no working buffer); rows over all
        // heads keep the shared f32 working buffer.
        const int64_t stored = 2 * st.B * gq * st.L * rb, working = st.over_heads() ? 2 * st.B * st.G * st.L * st.D * 4 : 0;
        EXPECT_EQ(int64_t(buf->bytes()), stored) << what;
        EXPECT_EQ(tracker.current(Device{}, MemCategory::KV_CACHE), stored + working) << what;
        EXPECT_DOUBLE_EQ(buf->bits_per_element(), 8.0 * double(rb) / double(n)) << what;
    }
}

// A bad granularity and a head size a block format cannot hold are refused, naming the option.
TEST(FpBuffers, BadSettingsAreRefusedWithTheirOption) {
    KVCacheConfig c;
    c.name = "dense-fp8_e4m3";
    c.scale_granularity = "layer";
    try {
        validate_kv_config(c, 2, 32, 2);
        FAIL() << "granularity 'layer' accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("--kv_cache.scale_granularity"), std::string::npos) << e.what();
    }
    c.scale_granularity = "head";
    c.name = "dense-mxfp4";
    try {
        validate_kv_config(c, 2, 8, 2);  // 8 per head, 16 over heads: no block of 32
        FAIL() << "mxfp4 with head size 8 accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("blocks of 32"), std::string::npos) << e.what();
    }
    c.name = "dense-fp8-e4m3";  // vLLM's alias reads canonically
    EXPECT_EQ(parse_kv_cache_name(c.name).buffer, "fp8_e4m3");
    EXPECT_EQ(parse_kv_cache_name("h2o-fp8").buffer, "fp8_e4m3");
}

}  // namespace
}  // namespace kv::test
