// The turboquant buffer (engine/kv/buffers/buffer_quantized.cpp over quant_formats.h's TQK/TQV
// rows): what a layer reads back is the stored codes decoded here in f64 (levels or uniform
// steps, then the inverse rotation S H / sqrt(n) written here); SDPA over the buffer equals an
// f64 SDPA over that decoded cache; the memory tracker holds exactly the stored rows plus the
// working buffer, at every width of --kv_cache.key_bits / value_bits; and it runs eval_long
// under h2o and snapkv. The codes themselves: tests/kernels/turboquant_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "engine/kv/buffers/buffer_common.h"
#include "engine/kv/buffers/kv_buffer.h"
#include "engine/kv/kv_config.h"
#include "engine/memory/memory_tracker.h"
#include "engine/model/model_loader.h"
#include "engine/ops/ops.h"
#include "engine/run/evaluate.h"
#include "tests/engine/kv_test_util.h"
#include "tests/support/test_support.h"

namespace kv::test {
namespace {

// x = S H y / sqrt(n): Sylvester's H[i][j] = (-1)^popcount(i & j), S's signs the low bits of
// successive splitmix64 outputs from the format's seed.
std::vector<double> unrotate(const std::vector<double>& y) {
    const size_t n = y.size();
    std::vector<double> x(n, 0.0);
    uint64_t state = kTurboQuantSeed;
    for (size_t i = 0; i < n; ++i) {
        for (size_t j = 0; j < n; ++j) x[i] += (__builtin_popcountll(i & j) % 2 ? -1.0 : 1.0) * y[j];
        state += 0x9e3779b97f4a7c15ull;
        uint64_t z = state;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        x[i] *= (z & 1 ? -1.0 : 1.0) / std::sqrt(double(n));
    }
    return x;
}

double f32_at(const uint8_t* p) {
    float f;
    std::memcpy(&f, p, 4);
    return double(f);
}

// One stored row of n values in f64: b-bit codes (code i at bits [b i, b i + b)), then the
// norm (keys: codes are levels of the unit row) or lo and step (values).
std::vector<double> decode_row(QuantFormat f, const uint8_t* r, int64_t n) {
    const int b = tq_bits(f);
    const int64_t payload = (n * b + 7) / 8;
    const QuantLevels lv = ops::quant_levels(f, n);
    std::vector<double> y(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
        uint32_t q = 0;
        for (int k = 0; k < b; ++k) q |= uint32_t((r[(i * b + k) / 8] >> ((i * b + k) % 8)) & 1) << k;
        y[size_t(i)] = tq_codebook(f) ? double(lv.v[q]) * f32_at(r + payload) : f32_at(r + payload) + double(q) * f32_at(r + payload + 4);
    }
    return unrotate(y);
}

Tensor random_kv(int64_t B, int64_t G, int64_t n, int64_t D, std::mt19937_64& rng) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> v(size_t(B * G * n * D));
    for (size_t i = 0; i < v.size(); ++i) v[i] = nd(rng) * (i % 11 == 0 ? 8.0f : 1.0f) + 0.3f * float(i % 5);
    return Tensor::from_f32({B, G, n, D}, v);
}

struct TqSetup {
    int64_t key_bits = 0, value_bits = 0;  // 0: the buffer's 4
    int64_t B = 2, G = 2, L = 40, D = 32;
    KVCacheConfig cfg() const {
        KVCacheConfig c;
        c.name = "dense-turboquant";
        c.key_bits = key_bits;
        c.value_bits = value_bits;
        return c;
    }
};

TEST(TurboQuantBuffer, ReadsAreTheStoredCodesAndSdpaEqualsF64SdpaOverThem) {
    for (const TqSetup& st : {TqSetup{}, TqSetup{2, 8}, TqSetup{3, 2}}) {
        const std::string what = "key_bits " + std::to_string(st.key_bits) + " value_bits " + std::to_string(st.value_bits);
        const KVCacheConfig cfg = st.cfg();
        const auto [kf, vf] = kv_quant_formats(cfg);
        BufferParams p;
        p.L = st.L, p.G = st.G, p.D = st.D;
        auto shared = make_buffer_shared(cfg, st.L, st.G, st.D, Device{}, DType::F32);
        auto buf = make_buffer(cfg, p, shared);
        ASSERT_EQ(buf->name(), "turboquant");
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
        auto decoded = [&](const Tensor& q, QuantFormat f) {
            const Tensor c = q.contiguous();
            const uint8_t* bytes = c.data<uint8_t>();
            const int64_t rb = q.size(3);
            std::vector<double> out;
            for (int64_t r = 0; r < st.B * st.G * st.L; ++r) {
                const std::vector<double> y = decode_row(f, bytes + r * rb, st.D);
                out.insert(out.end(), y.begin(), y.end());
            }
            return out;
        };
        const std::vector<double> kd = decoded(*stored[0], kf), vd = decoded(*stored[1], vf);
        const std::vector<float> kr = K.contiguous().to_f32_vector(), vr = V.contiguous().to_f32_vector();
        for (size_t i = 0; i < kd.size(); ++i) {
            // the kernels rotate in f32: a few roundings of the row's scale
            ASSERT_NEAR(double(kr[i]), kd[i], 1e-5 * (1.0 + std::fabs(kd[i]))) << what << " key element " << i;
            ASSERT_NEAR(double(vr[i]), vd[i], 1e-5 * (1.0 + std::fabs(vd[i]))) << what << " value element " << i;
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
            ASSERT_NEAR(double(yv[e]), ref[e], 1e-4 * (1.0 + std::fabs(ref[e]))) << what << " output element " << e << " of (B, NH, n, D)";
    }
}

// Exact bytes: keys D b / 8 code bytes + an f32 norm, values D b / 8 + f32 lo and step, per
// token and head; the tracker holds them (kv_cache) and nothing else: on the CPU with f32
// activations the rows are written and attended as codes, with no f32 working buffer.
TEST(TurboQuantBuffer, MemoryTrackerHoldsTheExactBytes) {
    for (const TqSetup& st : {TqSetup{}, TqSetup{2, 8}, TqSetup{3, 3}, TqSetup{4, 2}}) {
        const std::string what = "key_bits " + std::to_string(st.key_bits) + " value_bits " + std::to_string(st.value_bits);
        MemoryTracker tracker;
        MemoryTrackerScope scope(tracker);
        const KVCacheConfig cfg = st.cfg();
        BufferParams p;
        p.L = st.L, p.G = st.G, p.D = st.D;
        auto shared = make_buffer_shared(cfg, st.L, st.G, st.D, Device{}, DType::F32);
        auto buf = make_buffer(cfg, p, shared);
        std::mt19937_64 rng(seed_for(what + " bytes"));
        buf->prefill(random_kv(st.B, st.G, 30, st.D, rng), random_kv(st.B, st.G, 30, st.D, rng));
        const int64_t kb = st.key_bits ? st.key_bits : 4, vb = st.value_bits ? st.value_bits : 4;
        const int64_t rbk = st.D * kb / 8 + 4, rbv = st.D * vb / 8 + 8;
        const int64_t stored = st.B * st.G * st.L * (rbk + rbv);
        EXPECT_EQ(int64_t(buf->bytes()), stored) << what;
        EXPECT_EQ(tracker.current(Device{}, MemCategory::KV_CACHE), stored) << what;
        EXPECT_DOUBLE_EQ(buf->bits_per_element(), 8.0 * double(rbk + rbv) / double(2 * st.D)) << what;
        EXPECT_EQ(kv_slot_bytes(cfg, st.G, st.D, DType::F32), st.G * (rbk + rbv)) << what << ": the budget's slot bytes";
    }
}

TEST(TurboQuantBuffer, WidthsAndHeadSizesItCannotTakeAreRefused) {
    KVCacheConfig c;
    c.name = "h2o-turboquant";
    c.cache_length = 32;
    c.key_bits = 8;  // the key codebook has at most 16 levels
    try {
        validate_kv_config(c, 2, 64, 2);
        FAIL() << "8-bit TurboQuant keys accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("--kv_cache.key_bits: 8 bits"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("expected 2 or 3 or 4"), std::string::npos) << e.what();
    }
    c.key_bits = 0;
    try {
        validate_kv_config(c, 2, 96, 3);  // 96 per head, 288 over heads: no power of two
        FAIL() << "head size 96 accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("Hadamard"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("head size 96"), std::string::npos) << e.what();
    }
    EXPECT_NO_THROW(validate_kv_config(c, 2, 64, 3));
}

// h2o and snapkv (scores from attention over the decoded keys) run a repeat-task sample on the
// buffer; the loss is finite, differs from the same policy on f32 (the codes are used) and the
// summary's bits per element are the rows'.
TEST(TurboQuantBuffer, ComposesWithH2oAndSnapkvInEvalLong) {
    LoadedModel lm = load_model("tiny", ModelOptions{}, 0);
    for (const char* policy : {"h2o", "snapkv"}) {
        RunConfig cfg;
        cfg.mode = "eval_long";
        cfg.model = "tiny";
        cfg.data.name = "repeat";
        cfg.data.seq_length = 192;
        cfg.data.num_samples = 1;
        cfg.data.repeat_length = 16;
        cfg.data.repeat_distance = 80;
        cfg.kv_cache.cache_length = 64;
        cfg.kv_cache.snapkv_window = 4;
        cfg.driver.chunk_size = 16;
        cfg.kv_cache.name = std::string(policy) + "-turboquant";
        const EvalSummary tq = run_eval(cfg, lm);
        cfg.kv_cache.name = std::string(policy) + "-default";
        const EvalSummary f32 = run_eval(cfg, lm);
        EXPECT_EQ(tq.cache_name, std::string(policy) + "-turboquant");
        EXPECT_TRUE(std::isfinite(tq.mean_loss)) << policy;
        EXPECT_NE(tq.mean_loss, f32.mean_loss) << policy << ": the codes are what attention reads";
        const int64_t D = lm.config.head_dim;
        EXPECT_DOUBLE_EQ(tq.kv_bits_per_element, 8.0 * double((D / 2 + 4) + (D / 2 + 8)) / double(2 * D)) << policy;
    }
}

}  // namespace
}  // namespace kv::test
