// KIVI buffers (engine/kv/buffers/buffer_kivi.cpp, layout kernels/common/kivi_math.h): the packing
// against f64 bounds decoded from the bytes here, the buffer's contents against the tokens
// written (exact inside the residual window, within one group's bound outside it), the exact
// packed bytes per memory category, and the fused SDPA against the dense f64 SDPA over the
// dequantized cache. Registry loops, invariants and FD gradients take kivi2/kivi4 in their
// own suites (kv_registry_test, kv_invariants_test, grad_fd_test).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>

#include "engine/kv/buffers/kv_buffer.h"
#include "engine/kv/kv_config.h"
#include "engine/memory/memory_tracker.h"
#include "engine/ops/ops.h"
#include "kernels/common/kivi_math.h"
#include "tests/support/test_support.h"

namespace kv::test {
namespace {

// Decoded from the bytes by hand (layout of kivi_math.h), in f64.
int code_at(const uint8_t* run, int64_t i, int bits) { return (run[(i * bits) / 8] >> ((i * bits) % 8)) & ((1 << bits) - 1); }

// Largest error of one quantization of values in [lo, hi] by `bits`: half a step of the f16
// scale, whose rounding up (and the minimum's rounding down) widens the step by at most two
// f16 ulps of the larger magnitude.
double group_bound(double lo, double hi, int bits) {
    const double qmax = double((1 << bits) - 1), mag = std::max(std::fabs(lo), std::fabs(hi));
    return 0.5 * ((hi - lo) / qmax + 2.0 * mag / 1024.0) + 1e-6;
}

TEST(KiviFormat, PackingRoundTripsWithinTheGroupBoundOfAnF64Reference) {
    std::mt19937_64 rng(seed_for("kivi format"));
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    for (int bits : {2, 4})
        for (auto [S, D] : {std::pair<int64_t, int64_t>{32, 64}, {16, 16}, {8, 24}})
            for (int64_t n : {S, S - 3}) {
                const int64_t VG = std::min(S, D), qmax = (1 << bits) - 1;
                // Channels of different offsets and spreads; one constant, one large.
                std::vector<float> x(size_t(S * D), 0.0f);
                for (int64_t d = 0; d < D; ++d) {
                    const double off = d == 1 ? 300.0 : 3.0 * u(rng), spread = d == 0 ? 0.0 : std::fabs(u(rng)) * (d % 5 + 1);
                    for (int64_t t = 0; t < n; ++t) x[size_t(t * D + d)] = float(off + spread * u(rng));
                }
                std::vector<uint8_t> codes(size_t(D * S * bits / 8));
                std::vector<uint16_t> sc(size_t(2 * D));
                kivi_pack_key_group(x.data(), D, n, S, D, bits, codes.data(), sc.data());
                for (int64_t d = 0; d < D; ++d) {
                    double lo = 1e30, hi = -1e30;
                    for (int64_t t = 0; t < n; ++t) lo = std::min(lo, double(x[size_t(t * D + d)])), hi = std::max(hi, double(x[size_t(t * D + d)]));
                    const double s = f16_to_f32(sc[size_t(2 * d)]), mn = f16_to_f32(sc[size_t(2 * d + 1)]);
                    // The range is covered up to the packer's f32 arithmetic: mn + qmax * s may fall
                    // an f32 rounding short of hi (seen: both -0.0413055), within group_bound's slack.
                    EXPECT_LE(mn, lo) << "channel " << d;
                    EXPECT_GE(mn + double(qmax) * s, hi - 1e-6) << "channel " << d;
                    for (int64_t t = 0; t < n; ++t) {
                        const double deq = mn + s * code_at(codes.data() + d * S * bits / 8, t, bits);
                        ASSERT_LE(std::fabs(deq - double(x[size_t(t * D + d)])), group_bound(lo, hi, bits))
                            << bits << "-bit key, S " << S << " D " << D << " token " << t << " channel " << d;
                    }
                }
                // Values: per token, groups of VG channels.
                std::vector<uint8_t> vcodes(size_t(D * bits / 8));
                std::vector<uint16_t> vsc(size_t(2 * (D / VG)));
                for (int64_t t = 0; t < n; ++t) {
                    const float* row = &x[size_t(t * D)];
                    kivi_pack_value_row(row, D, VG, bits, vcodes.data(), vsc.data());
                    for (int64_t g = 0; g < D / VG; ++g) {
                        double lo = 1e30, hi = -1e30;
                        for (int64_t d = g * VG; d < (g + 1) * VG; ++d) lo = std::min(lo, double(row[d])), hi = std::max(hi, double(row[d]));
                        const double s = f16_to_f32(vsc[size_t(2 * g)]), mn = f16_to_f32(vsc[size_t(2 * g + 1)]);
                        for (int64_t d = g * VG; d < (g + 1) * VG; ++d) {
                            const double deq = mn + s * code_at(vcodes.data(), d, bits);
                            ASSERT_LE(std::fabs(deq - double(row[d])), group_bound(lo, hi, bits))
                                << bits << "-bit value, token " << t << " channel " << d;
                        }
                    }
                }
            }
}

struct KiviSetup {
    int bits = 2;
    int64_t B = 2, G = 2, L = 128, D = 32, S = 16, R = 20;
    KVCacheConfig cfg() const {
        KVCacheConfig c;
        c.name = str("dense-kivi", bits);
        c.kivi_group_size = S;
        c.kivi_residual = R;
        return c;
    }
    std::unique_ptr<KVBuffer> make() const {
        BufferParams p;
        p.L = L, p.G = G, p.D = D;
        return make_buffer(cfg(), p, nullptr);
    }
};

Tensor random_kv(int64_t B, int64_t G, int64_t n, int64_t D, std::mt19937_64& rng, std::vector<float>* out) {
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    std::vector<float> v(size_t(B * G * n * D));
    for (int64_t i = 0; i < int64_t(v.size()); ++i) v[size_t(i)] = u(rng) + 0.5f * float((i % D) % 3);  // per-channel offsets
    *out = v;
    return Tensor::from_f32({B, G, n, D}, v);
}

// Appends only (the dense / lastrec case): KIVI's scheme exactly. The last R tokens read back
// bit for bit; every token read back within the bound of its key group (per channel) and value
// group (per token) over the tokens written; and tokens outside the window really are packed.
TEST(KiviBuffer, AppendsKeepTheResidualExactAndPackedGroupsWithinTheirBound) {
    for (int bits : {2, 4}) {
        KiviSetup st;
        st.bits = bits;
        auto buf = st.make();
        std::mt19937_64 rng(seed_for(str("kivi append ", bits)));
        const int64_t B = st.B, G = st.G, D = st.D, S = st.S;
        std::vector<std::vector<float>> K(size_t(B * G)), V(size_t(B * G));  // per row, token-major
        auto append = [&](const std::vector<float>& k, const std::vector<float>& v, int64_t n) {
            for (int64_t r = 0; r < B * G; ++r) {
                K[size_t(r)].insert(K[size_t(r)].end(), k.begin() + r * n * D, k.begin() + (r + 1) * n * D);
                V[size_t(r)].insert(V[size_t(r)].end(), v.begin() + r * n * D, v.begin() + (r + 1) * n * D);
            }
        };
        std::vector<float> kv, vv;
        Tensor k = random_kv(B, G, 40, D, rng, &kv), v = random_kv(B, G, 40, D, rng, &vv);
        buf->prefill(k, v);
        append(kv, vv, 40);
        int64_t T = 40;
        for (int64_t n : {1, 7, 16, 3, 1, 25, 9, 1, 25}) {  // up to L = 128
            SlotPlan plan;
            plan.n = n;
            plan.rows = 1;
            for (int64_t t = 0; t < n; ++t) plan.targets.push_back(int32_t(T + t));
            k = random_kv(B, G, n, D, rng, &kv);
            v = random_kv(B, G, n, D, rng, &vv);
            buf->write(plan, k, v);
            append(kv, vv, n);
            T += n;
            auto [Kr, Vr] = buf->read(T);
            const std::vector<float> kr = Kr.to_f32_vector(), vr = Vr.to_f32_vector();
            int64_t packed_differ = 0;
            for (int64_t r = 0; r < B * G; ++r)
                for (int64_t s = 0; s < T; ++s) {
                    const int64_t j0 = s / S * S, j1 = std::min(T, j0 + S);
                    for (int64_t d = 0; d < D; ++d) {
                        const double want_k = K[size_t(r)][size_t(s * D + d)], want_v = V[size_t(r)][size_t(s * D + d)];
                        const double got_k = kr[size_t((r * T + s) * D + d)], got_v = vr[size_t((r * T + s) * D + d)];
                        if (s >= T - st.R) {
                            ASSERT_EQ(got_k, want_k) << "residual key, row " << r << " slot " << s;
                            ASSERT_EQ(got_v, want_v) << "residual value, row " << r << " slot " << s;
                            continue;
                        }
                        double klo = 1e30, khi = -1e30, vlo = 1e30, vhi = -1e30;
                        for (int64_t t = j0; t < j1; ++t)
                            klo = std::min(klo, double(K[size_t(r)][size_t(t * D + d)])), khi = std::max(khi, double(K[size_t(r)][size_t(t * D + d)]));
                        const int64_t VG = std::min(S, D), g0 = d / VG * VG;
                        for (int64_t e = g0; e < g0 + VG; ++e)
                            vlo = std::min(vlo, double(V[size_t(r)][size_t(s * D + e)])), vhi = std::max(vhi, double(V[size_t(r)][size_t(s * D + e)]));
                        ASSERT_LE(std::fabs(got_k - want_k), group_bound(klo, khi, bits)) << "key, row " << r << " slot " << s << " channel " << d << " T " << T << " range [" << klo << ", " << khi << "] got " << got_k << " want " << want_k;
                        ASSERT_LE(std::fabs(got_v - want_v), group_bound(vlo, vhi, bits)) << "value, row " << r << " slot " << s << " channel " << d << " T " << T << " got " << got_v << " want " << want_v;
                        packed_differ += got_k != want_k;
                    }
                }
            // Groups entirely older than the window plus one group are packed.
            if (T - st.R > 2 * S) {
                EXPECT_GT(packed_differ, 0) << "nothing was quantized at T " << T;
            }
        }
    }
}

// Memory by category, exactly: codes (kv_cache) = 2 D bits/8 bytes per slot and head; f16
// scale and minimum (kv_quant_scales) = 4 D / S (keys, per channel per group) + 4 D / VG
// (values, per token per channel group); the residual pool (kv_residual) = B G (ceil(R/S) +
// 2) blocks of S slots of f32 K and V, plus the int32 group map.
TEST(KiviBuffer, MemoryCategoriesHoldTheExactPackedBytes) {
    for (int bits : {2, 4})
        for (int64_t S : {16, 32}) {
            KiviSetup st;
            st.bits = bits;
            st.S = S;
            MemoryTracker tracker;
            MemoryTrackerScope scope(tracker);
            auto buf = st.make();
            std::mt19937_64 rng(seed_for("kivi bytes"));
            std::vector<float> kv, vv;
            Tensor k = random_kv(st.B, st.G, 50, st.D, rng, &kv), v = random_kv(st.B, st.G, 50, st.D, rng, &vv);
            buf->prefill(k, v);
            k = Tensor(), v = Tensor();
            const Device cpu{};
            const int64_t slots = st.B * st.G * st.L, VG = std::min(S, st.D), NG = st.L / S;
            EXPECT_EQ(tracker.current(cpu, MemCategory::KV_CACHE), slots * 2 * st.D * bits / 8) << bits << " bits, S " << S;
            EXPECT_EQ(tracker.current(cpu, MemCategory::KV_QUANT_SCALES), slots * (4 * st.D / S + 4 * st.D / VG));
            const int64_t blocks = st.B * st.G * ((st.R + S - 1) / S + 2);
            EXPECT_EQ(tracker.current(cpu, MemCategory::KV_RESIDUAL), blocks * 2 * S * st.D * 4 + st.B * st.G * NG * 4);
            EXPECT_EQ(int64_t(buf->bytes()), tracker.current(cpu, MemCategory::KV_CACHE) + tracker.current(cpu, MemCategory::KV_QUANT_SCALES) +
                                                 tracker.current(cpu, MemCategory::KV_RESIDUAL));
            EXPECT_DOUBLE_EQ(buf->bits_per_element(), double(bits) + 8.0 * (4.0 / double(S) + 4.0 / double(VG)) / 2.0);
        }
}

// The fused read: attention over the packed cache (scattered writes included: groups unpacked
// and packed again) equals the dense f64 SDPA over the cache dequantized to f64, outputs and
// weight sums, with positions that hide part of the cache from some queries.
TEST(KiviBuffer, FusedSdpaEqualsF64SdpaOverTheDequantizedCache) {
    for (int bits : {2, 4}) {
        KiviSetup st;
        st.bits = bits;
        st.R = 8;
        auto buf = st.make();
        std::mt19937_64 rng(seed_for(str("kivi sdpa ", bits)));
        const int64_t B = st.B, G = st.G, D = st.D, L = st.L, NH = 6, n = 3;
        std::vector<float> kv, vv;
        buf->prefill(random_kv(B, G, 100, D, rng, &kv), random_kv(B, G, 100, D, rng, &vv));
        SlotPlan app;  // fill the cache
        app.n = L - 100;
        app.rows = 1;
        for (int64_t t = 0; t < app.n; ++t) app.targets.push_back(int32_t(100 + t));
        buf->write(app, random_kv(B, G, app.n, D, rng, &kv), random_kv(B, G, app.n, D, rng, &vv));
        SlotPlan ev;  // eviction-style: different scattered slots per (b, g), into packed groups
        ev.n = 5;
        ev.rows = B * G;
        for (int64_t r = 0; r < B * G; ++r) {
            std::vector<int32_t> all(static_cast<size_t>(L));
            std::iota(all.begin(), all.end(), 0);
            std::shuffle(all.begin(), all.end(), rng);
            ev.targets.insert(ev.targets.end(), all.begin(), all.begin() + ev.n);
        }
        buf->write(ev, random_kv(B, G, ev.n, D, rng, &kv), random_kv(B, G, ev.n, D, rng, &vv));

        std::vector<int32_t> kp(size_t(B * G * L));
        for (int64_t r = 0; r < B * G; ++r) {
            std::vector<int32_t> p(static_cast<size_t>(L));
            std::iota(p.begin(), p.end(), 0);
            std::shuffle(p.begin(), p.end(), rng);
            std::copy(p.begin(), p.end(), kp.begin() + r * L);
        }
        Tensor kpos = Tensor::from_i32({B, G, L}, kp), qpos = Tensor::from_i32({1, n}, {60, 100, int32_t(L + 5)});
        std::vector<float> qv;
        Tensor q = random_kv(B, NH, n, D, rng, &qv);
        const float scale = 1.0f / std::sqrt(float(D));
        Tensor y = Tensor::empty({B, NH, n, D}, DType::F32), ws = Tensor::empty({B, G, L}, DType::F32);
        buf->attend(y, q, L, kpos, qpos, scale, &ws);

        auto [K, V] = buf->read(L);
        Tensor y64 = Tensor::empty({B, NH, n, D}, DType::F64), ws64 = Tensor::empty({B, G, L}, DType::F64);
        ops::sdpa_(y64, q.to(DType::F64), K.to(DType::F64), V.to(DType::F64), kpos, qpos, scale, 0, &ws64);
        const std::vector<double> a = y.to_f64_vector(), b = y64.to_f64_vector(), wa = ws.to_f64_vector(), wb = ws64.to_f64_vector();
        for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 2e-5 * (1.0 + std::fabs(b[i]))) << bits << "-bit output " << i;
        for (size_t i = 0; i < wa.size(); ++i) ASSERT_NEAR(wa[i], wb[i], 2e-6) << bits << "-bit weight sum " << i;
    }
}

// Rows (b) of a (B, G, n, D) tensor taken from rows src[b].
Tensor take_rows(const std::vector<float>& x, int64_t B, int64_t G, int64_t n, int64_t D, const std::vector<int32_t>& src) {
    std::vector<float> out(size_t(B * G * n * D));
    const int64_t row = G * n * D;
    for (int64_t b = 0; b < B; ++b) std::copy(x.begin() + src[size_t(b)] * row, x.begin() + (src[size_t(b)] + 1) * row, out.begin() + b * row);
    return Tensor::from_f32({B, G, n, D}, out);
}

// Beam search: after reorder_batch(src) a buffer holds, and goes on to pack and attend, exactly
// what a buffer fed the same tokens with its rows already in src's order holds: reads and
// fused attention bit for bit, before and after more tokens are appended (so the copied
// residual groups are packed later, on their own).
TEST(KiviBuffer, BeamReorderEqualsABufferFedTheReorderedRows) {
    for (int bits : {2, 4}) {
        KiviSetup st;
        st.bits = bits;
        st.B = 3;
        auto a = st.make(), ref = st.make();
        std::mt19937_64 rng(seed_for(str("kivi beam ", bits)));
        const int64_t B = st.B, G = st.G, D = st.D;
        const std::vector<int32_t> ident = {0, 1, 2}, src = {2, 2, 0};
        std::vector<float> kv, vv;
        random_kv(B, G, 45, D, rng, &kv);
        random_kv(B, G, 45, D, rng, &vv);
        a->prefill(take_rows(kv, B, G, 45, D, ident), take_rows(vv, B, G, 45, D, ident));
        ref->prefill(take_rows(kv, B, G, 45, D, src), take_rows(vv, B, G, 45, D, src));
        int64_t T = 45;
        auto append = [&](int64_t n, const std::vector<int32_t>& ra, const std::vector<int32_t>& rr) {
            SlotPlan plan;
            plan.n = n;
            plan.rows = 1;
            for (int64_t t = 0; t < n; ++t) plan.targets.push_back(int32_t(T + t));
            random_kv(B, G, n, D, rng, &kv);
            random_kv(B, G, n, D, rng, &vv);
            a->write(plan, take_rows(kv, B, G, n, D, ra), take_rows(vv, B, G, n, D, ra));
            ref->write(plan, take_rows(kv, B, G, n, D, rr), take_rows(vv, B, G, n, D, rr));
            T += n;
        };
        append(7, ident, src);
        a->reorder_batch(src);
        auto compare = [&](const char* when) {
            auto [Ka, Va] = a->read(T);
            auto [Kr, Vr] = ref->read(T);
            EXPECT_EQ(Ka.to_f32_vector(), Kr.to_f32_vector()) << bits << "-bit keys " << when;
            EXPECT_EQ(Va.to_f32_vector(), Vr.to_f32_vector()) << bits << "-bit values " << when;
            std::vector<int32_t> kp(static_cast<size_t>(T));
            std::iota(kp.begin(), kp.end(), 0);
            std::vector<float> qv;
            Tensor q = random_kv(B, 2 * G, 1, D, rng, &qv), kpos = Tensor::from_i32({1, 1, T}, kp), qpos = Tensor::from_i32({1, 1}, {int32_t(T)});
            Tensor ya = Tensor::empty({B, 2 * G, 1, D}, DType::F32), yr = Tensor::empty({B, 2 * G, 1, D}, DType::F32);
            a->attend(ya, q, T, kpos, qpos, 0.25f, nullptr);
            ref->attend(yr, q, T, kpos, qpos, 0.25f, nullptr);
            EXPECT_EQ(ya.to_f32_vector(), yr.to_f32_vector()) << bits << "-bit attention " << when;
        };
        compare("right after the reorder");
        for (int64_t n : {16, 1, 30, 9}) append(n, ident, ident);
        compare("after appends that pack the copied groups");
    }
}

// Offloaded (--kv_cache.cpu_offload): two layers' KIVI buffers share one resident slot, so every
// switch parks one and restores the other; writes and fused attention give exactly what
// resident buffers give.
TEST(KiviBuffer, OffloadedEqualsResident) {
    KiviSetup st;
    KVCacheConfig oc = st.cfg();
    oc.cpu_offload = true;
    auto sh = make_buffer_shared(oc, st.L, st.G, st.D, Device{}, DType::F32);
    BufferParams p;
    p.L = st.L, p.G = st.G, p.D = st.D;
    std::vector<std::unique_ptr<KVBuffer>> off, res;
    for (int64_t l = 0; l < 2; ++l) {
        p.layer = l;
        off.push_back(make_buffer(oc, p, sh));
        res.push_back(make_buffer(st.cfg(), p, nullptr));
    }
    EXPECT_EQ(off[0]->name(), "kivi2+offload");
    std::mt19937_64 rng(seed_for("kivi offload"));
    const int64_t B = st.B, G = st.G, D = st.D;
    std::vector<float> kv, vv, qv;
    int64_t T = 0;
    for (int64_t n : {40, 1, 25, 16, 1}) {
        for (int64_t l = 0; l < 2; ++l) {
            Tensor k = random_kv(B, G, n, D, rng, &kv), v = random_kv(B, G, n, D, rng, &vv);
            if (T == 0) {
                off[size_t(l)]->prefill(k, v);
                res[size_t(l)]->prefill(k, v);
            } else {
                SlotPlan plan;
                plan.n = n;
                plan.rows = 1;
                for (int64_t t = 0; t < n; ++t) plan.targets.push_back(int32_t(T + t));
                off[size_t(l)]->write(plan, k, v);
                res[size_t(l)]->write(plan, k, v);
            }
        }
        T += n;
        std::vector<int32_t> kp(static_cast<size_t>(T));
        std::iota(kp.begin(), kp.end(), 0);
        Tensor kpos = Tensor::from_i32({1, 1, T}, kp), qpos = Tensor::from_i32({1, 1}, {int32_t(T)});
        for (int64_t l = 0; l < 2; ++l) {
            Tensor q = random_kv(B, 2 * G, 1, D, rng, &qv);
            Tensor yo = Tensor::empty({B, 2 * G, 1, D}, DType::F32), yr = Tensor::empty({B, 2 * G, 1, D}, DType::F32);
            Tensor wo = Tensor::empty({B, G, T}, DType::F32), wr = Tensor::empty({B, G, T}, DType::F32);
            off[size_t(l)]->attend(yo, q, T, kpos, qpos, 0.25f, &wo);
            res[size_t(l)]->attend(yr, q, T, kpos, qpos, 0.25f, &wr);
            EXPECT_EQ(yo.to_f32_vector(), yr.to_f32_vector()) << "layer " << l << " T " << T;
            EXPECT_EQ(wo.to_f32_vector(), wr.to_f32_vector()) << "layer " << l << " T " << T;
        }
    }
}

TEST(KiviBuffer, BadOptionsGiveOneClearMessage) {
    auto msg = [](const std::function<void(KVCacheConfig&)>& f, int64_t D) {
        KVCacheConfig c;
        c.name = "h2o-kivi2";
        c.cache_length = 64;
        f(c);
        try {
            validate_kv_config(c, 2, D, 2);
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string();
    };
    EXPECT_NE(msg([](KVCacheConfig& c) { c.kivi_group_size = 12; }, 32).find("--kv_cache.kivi_group_size: 12"), std::string::npos);
    EXPECT_NE(msg([](KVCacheConfig& c) { c.kivi_group_size = 16; }, 24).find("do not divide head size 24"), std::string::npos);
    EXPECT_NE(msg([](KVCacheConfig& c) { c.kivi_residual = -1; }, 32).find("--kv_cache.kivi_residual: -1"), std::string::npos);
    EXPECT_NE(msg([](KVCacheConfig& c) { c.paged_block_size = 16; }, 32).find("paged storage is for full-precision"), std::string::npos);
    EXPECT_EQ(msg([](KVCacheConfig&) {}, 32), "");
}

}  // namespace
}  // namespace kv::test
