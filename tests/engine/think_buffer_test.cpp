// The think buffer (ThinK, Xu et al. 2024; kvpress ThinKPress) against its definition in f64:
// the key channels kept per (batch row, KV head) are the round((1 - ratio) D) largest
// |Q_win[:, c]| |K[:, c]| over the prefill chunk's last snapkv_window queries of the group's
// query heads and the prefill's keys; every later chunk attends over the stored keys with the
// other channels zero (values whole). Byte counts are computed here from the shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <random>

#include "engine/core/error.h"
#include "engine/kv/buffers/kv_buffer.h"
#include "engine/kv/kv_cache.h"
#include "engine/memory/memory_tracker.h"
#include "engine/run/run_config.h"
#include "kv_test_util.h"
#include "tests/support/test_support.h"

namespace kv::test {
namespace {

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "<no error>";
}

// round((1 - ratio) D), at least one channel.
int64_t kept_of(int64_t D, double ratio) { return std::max<int64_t>(1, int64_t(std::floor((1.0 - ratio) * double(D) + 0.5))); }

// ThinK's choice from the definition: per (b, g) the scores s_c = sqrt(sum q_c^2) sqrt(sum k_c^2),
// then Dk times the best channel not yet taken (the lower one on a tie). q (B, NH, n, D), k
// (B, G, n, D); returns per row b * G + g a mask of D flags.
std::vector<std::vector<bool>> reference_channels(const std::vector<float>& q, const std::vector<float>& k, int64_t B, int64_t NH,
                                                  int64_t G, int64_t n, int64_t D, int64_t w, int64_t Dk) {
    std::vector<std::vector<bool>> out;
    const int64_t R = NH / G;
    for (int64_t b = 0; b < B; ++b)
        for (int64_t g = 0; g < G; ++g) {
            std::vector<double> s(static_cast<size_t>(D));
            for (int64_t c = 0; c < D; ++c) {
                double qq = 0, kk = 0;
                for (int64_t h = g * R; h < g * R + R; ++h)
                    for (int64_t t = n - w; t < n; ++t) qq += std::pow(double(q[size_t(((b * NH + h) * n + t) * D + c)]), 2);
                for (int64_t t = 0; t < n; ++t) kk += std::pow(double(k[size_t(((b * G + g) * n + t) * D + c)]), 2);
                s[size_t(c)] = std::sqrt(qq) * std::sqrt(kk);
            }
            std::vector<bool> keep(static_cast<size_t>(D), false);
            for (int64_t j = 0; j < Dk; ++j) {
                int64_t best = -1;
                for (int64_t c = 0; c < D; ++c)
                    if (!keep[size_t(c)] && (best < 0 || s[size_t(c)] > s[size_t(best)])) best = c;
                keep[size_t(best)] = true;
            }
            out.push_back(keep);
        }
    return out;
}

// A harness whose cache is rebuilt with ThinK's options.
void rebuild(LayerHarness& h, double ratio, int64_t window) {
    h.cfg.key_channel_ratio = ratio;
    h.cfg.snapkv_window = window;
    h.cache = std::make_unique<KVCache>(h.cfg, h.model, Device{}, DType::F32, 0, &byte_codec());
    h.cache->set_replay_logging(true);
}

// Position held by slot s of row r (-1: empty).
int32_t slot_position(const KVPolicy& p, int64_t r, int64_t s) {
    const std::vector<int32_t>& pos = p.token_positions();
    return p.per_row_positions() ? pos[size_t(r * p.cache_length() + s)] : pos[size_t(s)];
}

class ThinKReference : public ::testing::TestWithParam<std::tuple<std::string, double>> {};

// A prefill of 8 tokens then chunks of 3 through 12 slots (h2o evicts by the attention over
// the pruned keys): the channels, the stored keys and values of every kept position, and each
// chunk's attention output equal the f64 computation from the definition.
TEST_P(ThinKReference, ChannelsStoredRowsAndAttentionMatchF64) {
    const auto [policy, ratio] = GetParam();
    const int64_t L = 12, w = 4, n0 = 8;
    LayerHarness h(policy + "-think", L, seed_for("think " + policy));
    rebuild(h, ratio, w);
    const int64_t B = h.B, G = h.G, NH = h.NH, D = h.D, R = NH / G, Dk = kept_of(D, ratio);
    const double scale = 1.0 / std::sqrt(double(D));
    // Prefill: attention over the chunk's own keys as the model computed them (kvpress prunes
    // after the prefill's attention).
    const Tensor y0 = h.step(n0);
    const std::vector<float> q0 = h.last_q[0].to_f32_vector(), k0 = h.last_k[0].to_f32_vector();
    const std::vector<std::vector<bool>> keep = reference_channels(q0, k0, B, NH, G, n0, D, w, Dk);
    {
        const std::vector<float> y = y0.to_f32_vector();
        for (int64_t b = 0; b < B; ++b)
            for (int64_t hh = 0; hh < NH; ++hh)
                for (int64_t t = 0; t < n0; ++t) {
                    const int64_t r = b * G + hh / R;
                    std::vector<double> lg;
                    double mx = -std::numeric_limits<double>::infinity();
                    for (int64_t p = 0; p <= t; ++p) {
                        double dot = 0;
                        for (int64_t c = 0; c < D; ++c)
                            dot += double(q0[size_t(((b * NH + hh) * n0 + t) * D + c)]) * double(h.history[size_t(r)][p].first[size_t(c)]);
                        lg.push_back(dot * scale), mx = std::max(mx, dot * scale);
                    }
                    double z = 0;
                    for (double& x : lg) z += (x = std::exp(x - mx));
                    for (int64_t c = 0; c < D; ++c) {
                        double acc = 0;
                        for (int64_t p = 0; p <= t; ++p) acc += lg[size_t(p)] / z * double(h.history[size_t(r)][p].second[size_t(c)]);
                        EXPECT_NEAR(y[size_t(((b * NH + hh) * n0 + t) * D + c)], acc, 5e-5) << "prefill b " << b << " head " << hh;
                    }
                }
    }
    for (int64_t step = 0; step < 6; ++step) {
        const int64_t n = 3, P = h.P;
        const std::vector<float> y = h.step(n).to_f32_vector(), q = h.last_q[0].to_f32_vector();
        const KVPolicy& pol = h.layer().policy();
        const int64_t T = pol.current_length();
        auto [K, V] = h.layer().buffer().read(T);
        const std::vector<float> kr = K.to_f32_vector(), vr = V.to_f32_vector();
        for (int64_t r = 0; r < B * G; ++r)
            for (int64_t s = 0; s < T; ++s) {
                const int32_t p = slot_position(pol, r, s);
                if (p < 0) continue;
                const auto& [kh, vh] = h.history[size_t(r)].at(p);
                for (int64_t c = 0; c < D; ++c) {
                    ASSERT_EQ(kr[size_t((r * T + s) * D + c)], keep[size_t(r)][size_t(c)] ? kh[size_t(c)] : 0.0f)
                        << "row " << r << " slot " << s << " channel " << c;
                    ASSERT_EQ(vr[size_t((r * T + s) * D + c)], vh[size_t(c)]);
                }
            }
        for (int64_t b = 0; b < B; ++b)
            for (int64_t hh = 0; hh < NH; ++hh)
                for (int64_t t = 0; t < n; ++t) {
                    const int64_t r = b * G + hh / R;
                    std::vector<double> lg;
                    std::vector<int32_t> ps;
                    double mx = -std::numeric_limits<double>::infinity();
                    for (int64_t s = 0; s < T; ++s) {
                        const int32_t p = slot_position(pol, r, s);
                        if (p < 0 || p > P + t) continue;
                        double dot = 0;  // q . k over the kept channels only
                        for (int64_t c = 0; c < D; ++c)
                            if (keep[size_t(r)][size_t(c)])
                                dot += double(q[size_t(((b * NH + hh) * n + t) * D + c)]) * double(h.history[size_t(r)][p].first[size_t(c)]);
                        lg.push_back(dot * scale), ps.push_back(p), mx = std::max(mx, dot * scale);
                    }
                    double z = 0;
                    for (double& x : lg) z += (x = std::exp(x - mx));
                    for (int64_t c = 0; c < D; ++c) {
                        double acc = 0;
                        for (size_t i = 0; i < ps.size(); ++i) acc += lg[i] / z * double(h.history[size_t(r)][ps[i]].second[size_t(c)]);
                        EXPECT_NEAR(y[size_t(((b * NH + hh) * n + t) * D + c)], acc, 5e-5)
                            << policy << " ratio " << ratio << " chunk at " << P << " b " << b << " head " << hh << " query " << t;
                    }
                }
    }
    EXPECT_GT(h.P, L);  // the cache evicted
}

INSTANTIATE_TEST_SUITE_P(Ratios, ThinKReference,
                         ::testing::Values(std::make_tuple(std::string("h2o"), 0.5), std::make_tuple(std::string("h2o"), 0.25),
                                           std::make_tuple(std::string("lastrec"), 0.8), std::make_tuple(std::string("snapkv"), 0.0)),
                         [](const auto& i) {
                             return std::get<0>(i.param) + "_" + std::to_string(int(std::get<1>(i.param) * 100));
                         });

// What the buffer reports and what the allocator holds: Dk key channels and D value channels
// per slot and head in f32, plus one int32 channel number per kept channel and head; the slot
// size the byte budget uses; the logical bytes of the kept slots.
TEST(ThinKBuffer, BytesAreKeptChannelsTimesElementBytes) {
    for (double ratio : {0.0, 0.25, 0.5, 0.9, 0.99}) {
        MemoryTracker tracker;
        MemoryTrackerScope scope(tracker);
        const int64_t L = 12;
        LayerHarness h("lastrec-think", L, seed_for("think bytes"));
        rebuild(h, ratio, 4);
        const int64_t before = tracker.current(Device{}, MemCategory::KV_CACHE);
        h.step(8);
        h.step(3);
        const int64_t B = h.B, G = h.G, D = h.D, Dk = kept_of(D, ratio);
        const int64_t want = B * G * L * (Dk + D) * 4 + B * G * Dk * 4;
        EXPECT_EQ(int64_t(h.layer().buffer().bytes()), want) << ratio;
        EXPECT_EQ(tracker.current(Device{}, MemCategory::KV_CACHE) - before, want) << ratio;
        EXPECT_EQ(int64_t(h.layer().logical_bytes()), B * G * 11 * (Dk + D) * 4) << ratio;
        EXPECT_EQ(kv_slot_bytes(h.cfg, G, D, DType::F32), G * (Dk + D) * 4) << ratio;
        EXPECT_DOUBLE_EQ(h.layer().buffer().bits_per_element(), 32.0 * double(Dk + D) / double(2 * D)) << ratio;
    }
    EXPECT_EQ(kept_of(16, 0.99), 1);  // never fewer than one channel
}

// The option's range, and what the buffer cannot do, each refused with one message.
TEST(ThinKBuffer, RefusesBadOptionsAndLayouts) {
    for (double bad : {1.0, -0.25, 1.5, std::nan("")}) {
        KVCacheConfig c;
        c.name = "h2o-think";
        c.cache_length = 16;
        c.key_channel_ratio = bad;
        const std::string msg = error_of([&] { validate_kv_config(c, 2, 16, 2); });
        EXPECT_NE(msg.find("--kv_cache.key_channel_ratio"), std::string::npos) << msg;
        EXPECT_NE(msg.find("expected the fraction of key channels pruned per head, in [0, 1)"), std::string::npos) << msg;
    }
    {
        RunConfig rc;
        const std::string msg = error_of([&] { set_run_option(rc, "kv_cache.key_channel_ratio", "2"); });
        EXPECT_NE(msg.find("--kv_cache.key_channel_ratio: 2 is out of range"), std::string::npos) << msg;
        set_run_option(rc, "kv_cache.key_channel_ratio", "0.75");
        EXPECT_EQ(rc.kv_cache.key_channel_ratio, 0.75);
    }
    for (const char* opt : {"paged", "offload"}) {
        KVCacheConfig c;
        c.name = "h2o-think";
        c.cache_length = 16;
        c.paged_block_size = std::string(opt) == "paged" ? 4 : 0;
        c.cpu_offload = std::string(opt) == "offload";
        const std::string msg = error_of([&] { validate_kv_config(c, 2, 16, 2); });
        EXPECT_NE(msg.find("without paged or offloaded storage"), std::string::npos) << opt << ": " << msg;
    }
    {  // per-head pools mix the heads in one row; the channels are per head
        const std::string msg = error_of([] { LayerHarness h("ada-snapkv-think", 12, 1); });
        EXPECT_NE(msg.find("keeps its key channels per KV head, but policy 'ada-snapkv' pools"), std::string::npos) << msg;
    }
    {
        KVCacheConfig c;
        c.name = "h2o-think";
        BufferParams p;
        p.L = 8, p.G = 2, p.D = 16;
        p.device = Device{DeviceType::CUDA, 0};
        const std::string msg = error_of([&] { make_buffer(c, p, nullptr); });
        EXPECT_NE(msg.find("the 'think' buffer (pruned key channels) runs on the CPU backend only"), std::string::npos) << msg;
        p.device = Device{};
        auto buf = make_buffer(c, p, nullptr);
        std::mt19937_64 rng(3);
        const Tensor k = random_tensor({1, 2, 4, 16}, DType::F32, rng, -1.0, 1.0);
        const std::string m2 = error_of([&] { buf->prefill(k, k); });
        EXPECT_NE(m2.find("chooses its key channels from the prefill chunk's queries"), std::string::npos) << m2;
    }
}

}  // namespace
}  // namespace kv::test
