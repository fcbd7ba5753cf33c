// Attention sinks (gpt-oss) over a KIVI cache: SDPA_KIVI's optional source 9, one logit per
// query head in every row's softmax denominator with no value. Checked on every CPU kernel
// variant this machine runs (chunk and decode paths, f32 and f64, GQA, windows, residual and
// packed groups, a partial last group, evicted slot positions, a row that sees nothing)
// against a float64 reference written here: the KIVI bytes decoded from op.h's layout, then
//   A[h,i,:] = softmax([s_i1 .. s_iT visible, sink_h])[:T],  y = A v,
//   w[b,g,j] = (1/R) sum_{h in g} sum_i A[h,i,j]   (so sum_j w < n).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "engine/backend/backend_registry.h"
#include "engine/ops/ops.h"
#include "tests/kernels/sink_attention_ref.h"
#include "tests/support/test_support.h"

namespace kv::test {
namespace {

struct KiviSinkCase {
    const char* name;
    int64_t B, NH, G, n, T, HS, S;
    int bits, window;
    bool scattered;  // slots hold a shuffled subset of older positions plus the n new ones
    bool unseen;     // query 0 is older than every slot (sees nothing)
    bool f64;
};

void PrintTo(const KiviSinkCase& c, std::ostream* os) { *os << c.name; }

// A KIVI cache of random bytes (every byte is a valid run of codes), f16 scales in [0.01, 0.3]
// and minima in [-2, 0], every third group full precision (a residual block), the rest packed.
struct KiviInputs {
    int64_t NG = 0, L = 0, VG = 0, P = 3;
    Tensor q, kc, ks, vc, vs, res, map, kpos, qpos, sinks;
    float scale = 0;
};

KiviInputs make_inputs(const KiviSinkCase& c, std::mt19937_64& rng) {
    KiviInputs in;
    in.L = c.T + c.S;  // spare rows after T: the op reads slots [0, T) only
    in.NG = (in.L + c.S - 1) / c.S;
    in.VG = std::min(c.S, c.HS);
    std::uniform_int_distribution<int> byte(0, 255);
    auto bytes = [&](const Shape& s) {
        Tensor t = Tensor::empty(s, DType::U8);
        for (int64_t i = 0; i < t.numel(); ++i) t.data<uint8_t>()[i] = uint8_t(byte(rng));
        return t;
    };
    auto scales = [&](const Shape& s) {
        std::vector<float> v(size_t(s.numel()));
        std::uniform_real_distribution<float> sc(0.01f, 0.3f), mn(-2.0f, 0.0f);
        for (size_t i = 0; i < v.size(); ++i) v[i] = i % 2 == 0 ? sc(rng) : mn(rng);
        return Tensor::from_f32(s, v).to(DType::F16);
    };
    const DType fl = c.f64 ? DType::F64 : DType::F32;
    in.q = random_tensor({c.B, c.NH, c.n, c.HS}, fl, rng, -2.0, 2.0);
    in.kc = bytes({c.B, c.G, in.NG, c.HS, c.S * c.bits / 8});
    in.ks = scales({c.B, c.G, in.NG, c.HS, 2});
    in.vc = bytes({c.B, c.G, in.L, c.HS * c.bits / 8});
    in.vs = scales({c.B, c.G, in.L, c.HS / in.VG, 2});
    in.res = random_tensor({in.P, 2, c.S, c.HS}, fl, rng, -2.0, 2.0);
    std::vector<int32_t> map(size_t(c.B * c.G * in.NG));
    for (size_t i = 0; i < map.size(); ++i) map[i] = i % 3 == 1 ? int32_t(i % size_t(in.P)) : -1;
    in.map = Tensor::from_i32({c.B, c.G, in.NG}, map);
    const int64_t old = c.scattered ? 2 * c.T : c.T - c.n;  // positions below the queries'
    std::vector<int32_t> kp;
    for (int64_t r = 0; r < c.B * c.G; ++r) {
        std::vector<int32_t> pool;
        if (c.scattered) {
            std::vector<int32_t> o((size_t)old);
            std::iota(o.begin(), o.end(), 0);
            std::shuffle(o.begin(), o.end(), rng);
            pool.assign(o.begin(), o.begin() + (c.T - c.n));
            for (int64_t i = 0; i < c.n; ++i) pool.push_back(int32_t(old + i));
            std::shuffle(pool.begin(), pool.end(), rng);
        } else {
            for (int64_t j = 0; j < c.T; ++j) pool.push_back(int32_t(j + (c.unseen ? 10 : 0)));
        }
        kp.insert(kp.end(), pool.begin(), pool.end());
    }
    in.kpos = Tensor::from_i32({c.B, c.G, c.T}, kp);
    std::vector<int32_t> qp((size_t)c.n);
    for (int64_t i = 0; i < c.n; ++i) qp[size_t(i)] = int32_t(old + i + (c.unseen ? 10 : 0));
    if (c.unseen) qp[0] = 3;
    in.qpos = Tensor::from_i32({1, c.n}, qp);
    // Sinks from "takes almost everything" (+20) to "takes almost nothing" (-30).
    std::vector<double> s((size_t)c.NH);
    std::uniform_real_distribution<double> u(-2.0, 3.0);
    for (auto& x : s) x = u(rng);
    s[0] = 20.0;
    if (c.NH > 1) s[size_t(c.NH - 1)] = -30.0;
    in.sinks = Tensor::from_f64({c.NH}, s).to(fl);
    in.scale = 1.0f / std::sqrt(float(c.HS));
    return in;
}

// The cache decoded to f64 from op.h's layout: K, V (B, G, T, HS).
struct Decoded {
    std::vector<double> k, v;
};
Decoded decode(const KiviSinkCase& c, const KiviInputs& in) {
    const std::vector<double> ks = in.ks.to_f64_vector(), vs = in.vs.to_f64_vector(), res = in.res.to_f64_vector();
    const std::vector<int64_t> map = in.map.to_i64_vector();
    const uint8_t* kc = in.kc.data<uint8_t>();
    const uint8_t* vc = in.vc.data<uint8_t>();
    const int64_t KB = c.S * c.bits / 8, VB = c.HS * c.bits / 8, mask = (1 << c.bits) - 1;
    auto code = [&](const uint8_t* row, int64_t e) { return double((row[e * c.bits / 8] >> ((e * c.bits) % 8)) & mask); };
    Decoded d;
    d.k.assign(size_t(c.B * c.G * c.T * c.HS), 0.0), d.v.assign(d.k.size(), 0.0);
    for (int64_t b = 0; b < c.B; ++b)
        for (int64_t g = 0; g < c.G; ++g)
            for (int64_t t = 0; t < c.T; ++t) {
                const int64_t j = t / c.S, e = t % c.S, blk = map[size_t((b * c.G + g) * in.NG + j)];
                for (int64_t ch = 0; ch < c.HS; ++ch) {
                    const size_t at = size_t(((b * c.G + g) * c.T + t) * c.HS + ch);
                    if (blk >= 0) {
                        d.k[at] = res[size_t(((blk * 2 + 0) * c.S + e) * c.HS + ch)];
                        d.v[at] = res[size_t(((blk * 2 + 1) * c.S + e) * c.HS + ch)];
                        continue;
                    }
                    const int64_t kg = ((b * c.G + g) * in.NG + j) * c.HS + ch;
                    d.k[at] = ks[size_t(kg * 2 + 1)] + ks[size_t(kg * 2)] * code(kc + kg * KB, e);
                    const int64_t vr = (b * c.G + g) * in.L + t, vg = vr * (c.HS / in.VG) + ch / in.VG;
                    d.v[at] = vs[size_t(vg * 2 + 1)] + vs[size_t(vg * 2)] * code(vc + vr * VB, ch);
                }
            }
    return d;
}

// The sink softmax over the decoded cache, in f64 (sink_attention_ref.h).
SinkAttentionRef reference(const KiviSinkCase& c, const KiviInputs& in, bool with_sinks) {
    const Decoded kv = decode(c, in);
    const std::vector<double> sink = in.sinks.to_f64_vector();
    return sink_attention_f64({c.B, c.NH, c.G, c.n, c.T, c.HS, c.window}, in.q.to_f64_vector(), kv.k, kv.v, in.kpos.to_i64_vector(),
                              in.qpos.to_i64_vector(), double(in.scale), with_sinks ? &sink : nullptr);
}

OpCall kivi_call(const KiviSinkCase& c, const KiviInputs& in, Tensor& y, Tensor& w, bool with_sinks) {
    OpCall call;
    call.op = OpKind::SDPA_KIVI;
    call.p.alpha = in.scale;
    call.p.window = c.window;
    call.p.kivi_bits = c.bits;
    call.p.kivi_group = int(c.S);
    call.dst = y.view();
    call.dst2 = w.view();
    for (const Tensor* t : {&in.q, &in.kc, &in.ks, &in.vc, &in.vs, &in.res, &in.map, &in.kpos, &in.qpos}) call.src[call.nsrc++] = t->view();
    if (with_sinks) call.src[call.nsrc++] = in.sinks.view();
    return call;
}

class SdpaKiviSinks : public testing::TestWithParam<KiviSinkCase> {};

TEST_P(SdpaKiviSinks, EveryCpuVariantMatchesTheSinkSoftmaxOverTheDecodedCache) {
    const KiviSinkCase c = GetParam();
    std::mt19937_64 rng(seed_for(std::string("kivi_sinks_") + c.name));
    const KiviInputs in = make_inputs(c, rng);
    const SinkAttentionRef want = reference(c, in, true), plain = reference(c, in, false);
    ASSERT_GT(max_rel(plain.y, want.y), 1e-3) << "the sinks must change the output, or the case tests nothing";
    const DType fl = c.f64 ? DType::F64 : DType::F32;
    const double tol = c.f64 ? 1e-12 : 2e-5;
    int ran = 0;
    for (const CpuVariant& v : cpu_variants()) {
        KernelBackend* be = cpu_variant_backend(v.name);
        if (!be) continue;  // not built, or this CPU cannot run it
        SCOPED_TRACE(v.name);
        Tensor y = Tensor::full(in.q.shape(), fl, -12345.0), w = Tensor::full({c.B, c.G, c.T}, fl, -12345.0);
        OpCall call = kivi_call(c, in, y, w, true);
        ASSERT_TRUE(be->supports_op(call)) << "the " << v.name << " variant refuses SDPA_KIVI with sinks";
        OpContext ctx = ops::current_context();
        ctx.workspace = nullptr;
        be->compute(ctx, call);
        EXPECT_LT(max_rel(y.to_f64_vector(), want.y), tol) << "attention output";
        EXPECT_LT(max_rel(w.to_f64_vector(), want.w), tol) << "attention-weight sums";
        // The sink takes mass: the weight sums add up to less than n per (b, g) pair (head 0's
        // sink of +20 takes nearly all of its rows; head NH - 1's -30 almost nothing, so the
        // bound is on the total).
        const std::vector<double> wv = w.to_f64_vector();
        EXPECT_LT(std::accumulate(wv.begin(), wv.end(), 0.0), double(c.B * c.G * c.n) * (1 - 1e-3));
        if (c.unseen) {  // query 0 sees nothing: zeros in every head
            const std::vector<double> yv = y.to_f64_vector();
            for (int64_t b = 0; b < c.B; ++b)
                for (int64_t h = 0; h < c.NH; ++h)
                    for (int64_t d = 0; d < c.HS; ++d) EXPECT_EQ(yv[size_t(((b * c.NH + h) * c.n) * c.HS + d)], 0.0);
        }
        // Without source 9 the same call is plain KIVI attention.
        Tensor y0 = Tensor::zeros(in.q.shape(), fl), w0 = Tensor::zeros({c.B, c.G, c.T}, fl);
        OpCall call0 = kivi_call(c, in, y0, w0, false);
        be->compute(ctx, call0);
        EXPECT_LT(max_rel(y0.to_f64_vector(), plain.y), tol) << "attention output without sinks";
        EXPECT_LT(max_rel(w0.to_f64_vector(), plain.w), tol) << "weight sums without sinks";
        ++ran;
    }
    EXPECT_GT(ran, 0) << "no CPU variant ran";
}

// Shapes: chunk calls take the tiled path; decode calls (n <= 4, f32, head size, group and
// value group multiples of the vector width) take the code-direct path, split into units of
// 512 keys for T = 1000.
INSTANTIATE_TEST_SUITE_P(Shapes, SdpaKiviSinks,
                         testing::Values(KiviSinkCase{"chunk_n9_T64_S16_gqa", 1, 4, 2, 9, 64, 16, 16, 2, 0, false, false, false},
                                         KiviSinkCase{"chunk_n5_T77_partial_group_scattered", 2, 2, 1, 5, 77, 16, 8, 4, 0, true, false, false},
                                         KiviSinkCase{"chunk_window_7_n6_T40", 1, 2, 2, 6, 40, 32, 16, 2, 7, false, false, false},
                                         KiviSinkCase{"chunk_n4_T50_f64_scattered", 1, 4, 2, 4, 50, 16, 16, 2, 0, true, false, true},
                                         KiviSinkCase{"chunk_n6_unseen_row", 1, 4, 2, 6, 48, 16, 16, 4, 0, false, true, false},
                                         KiviSinkCase{"decode_n1_T200_S32_scattered", 2, 6, 3, 1, 200, 32, 32, 2, 0, true, false, false},
                                         KiviSinkCase{"decode_n3_T1000_split", 1, 8, 2, 3, 1000, 64, 32, 4, 0, true, false, false},
                                         KiviSinkCase{"decode_n2_window_50_T300", 1, 4, 2, 2, 300, 32, 32, 2, 50, true, false, false},
                                         KiviSinkCase{"decode_n2_unseen_row", 1, 4, 1, 2, 96, 32, 32, 4, 0, false, true, false}),
                         [](const testing::TestParamInfo<KiviSinkCase>& i) { return std::string(i.param.name); });

// Through the engine entry point: an ops::AttentionSinks scope around ops::sdpa_kivi_ reaches
// the kernel as source 9 (the variant chosen at start-up).
TEST(SdpaKiviSinksOps, TheSinksScopeReachesTheKivi) {
    const KiviSinkCase c{"ops", 1, 4, 2, 3, 64, 16, 16, 2, 0, true, false, false};
    std::mt19937_64 rng(seed_for("SdpaKiviSinksOps"));
    const KiviInputs in = make_inputs(c, rng);
    const SinkAttentionRef want = reference(c, in, true);
    ops::KiviCacheViews views{&in.kc, &in.ks, &in.vc, &in.vs, &in.res, &in.map, c.bits, int(c.S)};
    Tensor y = Tensor::zeros(in.q.shape(), DType::F32), w = Tensor::zeros({c.B, c.G, c.T}, DType::F32);
    {
        const ops::AttentionSinks scope(&in.sinks);
        ops::sdpa_kivi_(y, in.q, views, in.kpos, in.qpos, in.scale, 0, &w);
    }
    EXPECT_LT(max_rel(y.to_f64_vector(), want.y), 2e-5);
    EXPECT_LT(max_rel(w.to_f64_vector(), want.w), 2e-5);
    // Sinks that do not match q's heads are refused by name.
    const Tensor three = Tensor::from_f64({3}, {0.0, 1.0, 2.0}).to(DType::F32);
    const ops::AttentionSinks bad(&three);
    try {
        ops::sdpa_kivi_(y, in.q, views, in.kpos, in.qpos, in.scale, 0, &w);
        FAIL() << "expected a refusal";
    } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find("attention sinks must be float (4)"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace kv::test
