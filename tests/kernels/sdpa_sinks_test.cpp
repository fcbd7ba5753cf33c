// Attention sinks (gpt-oss): a learned logit per query head joins every softmax denominator
// with no value. The CPU kernels (through engine/ops, with an ops::AttentionSinks scope) are
// checked against a float64 reference written here from the definition,
//   A[h,i,:] = softmax([s_i1 .. s_iT visible, sink_h])[:T],  y = A v,
//   w[b,g,j] = (1/R) sum_{h in g} sum_i A[h,i,j]   (so sum_j w < n),
// on the tiled, decode and windowed paths, and their gradients (q, k, v and the sink logits)
// against central finite differences of that reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <random>

#include "engine/ops/ops.h"
#include "kernels/cpu/ref/ref_ops.h"
#include "tests/kernels/sink_attention_ref.h"
#include "tests/support/test_support.h"

namespace kv::test {
namespace {

struct SinkCase {
    const char* name;
    int64_t B, NH, G, n, T, HS;
    int window;
    bool scattered;  // slots hold a shuffled subset of older positions plus the n new ones
};

void PrintTo(const SinkCase& s, std::ostream* os) { *os << s.name; }

struct Inputs {
    Tensor q, k, v, kpos, qpos, sinks;
    float scale;
};

// Random q, k, v (scores up to ~|6|), positions as a cache after evictions or 0..T-1, and sink
// logits spanning "takes almost nothing" (-30) to "takes almost everything" (+20).
Inputs make_inputs(const SinkCase& sc, std::mt19937_64& rng) {
    Inputs in;
    in.q = random_tensor({sc.B, sc.NH, sc.n, sc.HS}, DType::F64, rng, -1.5, 1.5);
    in.k = random_tensor({sc.B, sc.G, sc.T, sc.HS}, DType::F64, rng, -1.5, 1.5);
    in.v = random_tensor({sc.B, sc.G, sc.T, sc.HS}, DType::F64, rng);
    const int64_t P = sc.scattered ? 2 * sc.T : sc.T - sc.n;
    std::vector<int32_t> kp;
    for (int64_t r = 0; r < sc.B * sc.G; ++r) {
        std::vector<int32_t> pool;
        if (sc.scattered) {
            std::vector<int32_t> old((size_t)P);
            std::iota(old.begin(), old.end(), 0);
            std::shuffle(old.begin(), old.end(), rng);
            pool.assign(old.begin(), old.begin() + (sc.T - sc.n));
            for (int64_t i = 0; i < sc.n; ++i) pool.push_back(int32_t(P + i));
            std::shuffle(pool.begin(), pool.end(), rng);
        } else {
            for (int64_t j = 0; j < sc.T; ++j) pool.push_back(int32_t(j));
        }
        kp.insert(kp.end(), pool.begin(), pool.end());
    }
    in.kpos = Tensor::from_i32({sc.B, sc.G, sc.T}, kp);
    std::vector<int32_t> qp((size_t)sc.n);
    for (int64_t i = 0; i < sc.n; ++i) qp[size_t(i)] = int32_t(P + i);
    in.qpos = Tensor::from_i32({1, sc.n}, qp);
    std::vector<double> s((size_t)sc.NH);
    std::uniform_real_distribution<double> u(-2.0, 3.0);
    for (auto& x : s) x = u(rng);
    s[0] = 20.0;
    if (sc.NH > 1) s[size_t(sc.NH - 1)] = -30.0;
    in.sinks = Tensor::from_f64({sc.NH}, s);
    in.scale = 1.0f / std::sqrt(float(sc.HS));
    return in;
}

// The definition, in f64 (sink_attention_ref.h): y (B, NH, n, HS) and the weight sums (B, G, T).
SinkAttentionRef reference(const SinkCase& sc, const Inputs& in) {
    const std::vector<double> sink = in.sinks.to_f64_vector();
    return sink_attention_f64({sc.B, sc.NH, sc.G, sc.n, sc.T, sc.HS, sc.window}, in.q.to_f64_vector(), in.k.to_f64_vector(),
                              in.v.to_f64_vector(), in.kpos.to_i64_vector(), in.qpos.to_i64_vector(), double(in.scale), &sink);
}

class SdpaSinks : public testing::TestWithParam<SinkCase> {};

TEST_P(SdpaSinks, ForwardMatchesSoftmaxOverScoresAndSink) {
    const SinkCase sc = GetParam();
    std::mt19937_64 rng(seed_for(sc.name));
    const Inputs in = make_inputs(sc, rng);
    const SinkAttentionRef ref = reference(sc, in);
    for (DType dt : {DType::F64, DType::F32, DType::BF16}) {
        if (dt == DType::BF16 && sc.n > 4) continue;  // bf16 K/V: the decode path's stored form
        SCOPED_TRACE(dt == DType::F64 ? "f64" : dt == DType::F32 ? "f32" : "bf16");
        const bool f64 = dt == DType::F64;
        // Inputs rounded to dt; the reference sees the rounded values.
        Inputs r = in;
        r.q = in.q.to(f64 ? DType::F64 : DType::F32);
        r.k = in.k.to(dt), r.v = in.v.to(dt);
        const SinkAttentionRef want = f64 ? ref : reference(sc, Inputs{r.q.to(DType::F64), r.k.to(DType::F64), r.v.to(DType::F64), in.kpos, in.qpos,
                                                          in.sinks, in.scale});
        Tensor sinks = in.sinks.to(f64 ? DType::F64 : DType::F32);
        Tensor y = Tensor::zeros(r.q.shape(), r.q.dtype());
        Tensor w = Tensor::zeros({sc.B, sc.G, sc.T}, f64 ? DType::F64 : DType::F32);
        {
            const ops::AttentionSinks scope(&sinks);
            EXPECT_FALSE(ops::sdpa_lse_supported(y.device())) << "the log-sum-exp cannot merge attentions with a sink";
            ops::sdpa_(y, r.q, r.k, r.v, in.kpos, in.qpos, in.scale, sc.window, &w);
        }
        const double tol = f64 ? 1e-12 : 2e-5;
        EXPECT_LT(max_rel(y.to_f64_vector(), want.y), tol) << "attention output";
        EXPECT_LT(max_rel(w.to_f64_vector(), want.w), tol) << "attention-weight sums";
        // The sink takes mass: every (b, g) row of weight sums adds up to less than n.
        const std::vector<double> wv = w.to_f64_vector();
        for (int64_t p = 0; p < sc.B * sc.G; ++p) {
            const double total = std::accumulate(wv.begin() + p * sc.T, wv.begin() + (p + 1) * sc.T, 0.0);
            EXPECT_LT(total, double(sc.n) * (1 - 1e-6)) << "pair " << p;
        }
        // Without the scope the same call is plain SDPA again (the scope closed).
        Tensor y0 = Tensor::zeros(r.q.shape(), r.q.dtype());
        ops::sdpa_(y0, r.q, r.k, r.v, in.kpos, in.qpos, in.scale, sc.window);
        EXPECT_GT(max_rel(y0.to_f64_vector(), want.y), 1e-3) << "sinks must change the output";
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, SdpaSinks,
                         testing::Values(SinkCase{"prefill_gqa_window_9", 1, 4, 2, 40, 40, 16, 9, false},
                                         SinkCase{"chunk_n7_over_300_scattered", 2, 6, 2, 7, 300, 32, 0, true},
                                         SinkCase{"chunk_n5_window_30_scattered", 1, 4, 1, 5, 64, 16, 30, true},
                                         SinkCase{"decode_n1_T600", 2, 8, 2, 1, 600, 64, 0, true},
                                         SinkCase{"decode_n3_window_50", 1, 4, 2, 3, 200, 32, 50, true}),
                         [](const testing::TestParamInfo<SinkCase>& i) { return std::string(i.param.name); });

// A query older than every slot sees nothing: its output is zero with or without a sink.
TEST(SdpaSinksRows, QueryThatSeesNothingGetsZeros) {
    const SinkCase sc{"unseen", 1, 2, 1, 2, 8, 16, 0, false};
    std::mt19937_64 rng(seed_for("SdpaSinksRows"));
    Inputs in = make_inputs(sc, rng);
    in.kpos = Tensor::from_i32({1, 1, 8}, {10, 11, 12, 13, 14, 15, 16, 17});
    in.qpos = Tensor::from_i32({1, 2}, {3, 12});  // query 0 sees nothing, query 1 sees 3 slots
    const SinkAttentionRef want = reference(sc, in);
    Tensor y = Tensor::zeros(in.q.shape(), DType::F64), w = Tensor::zeros({1, 1, 8}, DType::F64);
    {
        const ops::AttentionSinks scope(&in.sinks);
        ops::sdpa_(y, in.q, in.k, in.v, in.kpos, in.qpos, in.scale, 0, &w);
    }
    EXPECT_LT(max_rel(y.to_f64_vector(), want.y), 1e-12);
    EXPECT_LT(max_rel(w.to_f64_vector(), want.w), 1e-12);
    const std::vector<double> yv = y.to_f64_vector();
    for (int64_t h = 0; h < 2; ++h)
        for (int64_t d = 0; d < 16; ++d) EXPECT_EQ(yv[size_t((h * 2 + 0) * 16 + d)], 0.0);
}

// Quest's page kernel with sinks: each query's softmax over the slots of the pages it selected
// (the kernel's dst3) plus the sink, from the definition; pages of 8 over 64 scattered-free slots.
TEST(SdpaSinksRows, QuestSelectionKeepsTheSinkInTheDenominator) {
    const SinkCase sc{"quest", 1, 4, 2, 3, 64, 16, 0, false};
    std::mt19937_64 rng(seed_for("SdpaSinksQuest"));
    const Inputs in = make_inputs(sc, rng);
    const int64_t P = 8, NP = 8, pages = 2;
    // Page bounds: element-wise min / max of each page's keys.
    const std::vector<double> kv = in.k.to_f64_vector();
    std::vector<float> mn(size_t(sc.B * sc.G * NP * sc.HS)), mx(mn.size());
    for (int64_t g = 0; g < sc.G; ++g)
        for (int64_t j = 0; j < NP; ++j)
            for (int64_t d = 0; d < sc.HS; ++d) {
                double lo = 1e300, hi = -1e300;
                for (int64_t t = j * P; t < (j + 1) * P; ++t) lo = std::min(lo, kv[size_t((g * sc.T + t) * sc.HS + d)]), hi = std::max(hi, kv[size_t((g * sc.T + t) * sc.HS + d)]);
                mn[size_t((g * NP + j) * sc.HS + d)] = float(lo), mx[size_t((g * NP + j) * sc.HS + d)] = float(hi);
            }
    Tensor kmin = Tensor::from_f32({sc.B, sc.G, NP, sc.HS}, mn), kmax = Tensor::from_f32({sc.B, sc.G, NP, sc.HS}, mx);
    Tensor y = Tensor::zeros(in.q.shape(), DType::F64), sel = Tensor::zeros({sc.B, sc.NH, sc.n, pages + 1}, DType::I32);
    {
        const ops::AttentionSinks scope(&in.sinks);
        ops::sdpa_quest_(y, in.q, in.k, in.v, in.kpos, in.qpos, kmin, kmax, in.scale, P, pages, nullptr, &sel);
    }
    // The definition over the selected pages' slots: positions outside them hidden.
    const std::vector<int64_t> sv = sel.to_i64_vector();
    const std::vector<double> q = in.q.to_f64_vector(), v = in.v.to_f64_vector(), sink = in.sinks.to_f64_vector(), yv = y.to_f64_vector();
    const std::vector<int64_t> qp = in.qpos.to_i64_vector();
    double err = 0, scale = 0;
    int64_t partial = 0;
    for (int64_t h = 0; h < sc.NH; ++h) {
        const int64_t g = h / (sc.NH / sc.G);
        for (int64_t i = 0; i < sc.n; ++i) {
            std::vector<double> logit;
            std::vector<int64_t> slot;
            int64_t chosen = 0;
            for (int64_t e = 0; e <= pages; ++e) {
                const int64_t pg = sv[size_t((h * sc.n + i) * (pages + 1) + e)];
                if (pg < 0) continue;
                ++chosen;
                for (int64_t t = pg * P; t < (pg + 1) * P; ++t) {
                    if (t > qp[size_t(i)]) continue;  // positions are 0..T-1 here
                    double dot = 0;
                    for (int64_t d = 0; d < sc.HS; ++d) dot += q[size_t((h * sc.n + i) * sc.HS + d)] * kv[size_t((g * sc.T + t) * sc.HS + d)];
                    logit.push_back(double(in.scale) * dot), slot.push_back(t);
                }
            }
            partial += chosen < NP;
            logit.push_back(sink[size_t(h)]);
            const double m = *std::max_element(logit.begin(), logit.end());
            double z = 0;
            for (double x : logit) z += std::exp(x - m);
            for (int64_t d = 0; d < sc.HS; ++d) {
                double want = 0;
                for (size_t e = 0; e < slot.size(); ++e) want += std::exp(logit[e] - m) / z * v[size_t((g * sc.T + slot[e]) * sc.HS + d)];
                err = std::max(err, std::abs(yv[size_t((h * sc.n + i) * sc.HS + d)] - want));
                scale = std::max(scale, std::abs(want));
            }
        }
    }
    EXPECT_GT(partial, 0) << "every query read every page: the selection would not bite";
    EXPECT_LT(err, 1e-12 * std::max(scale, 1.0));
}

// Bad input: sinks that do not match q's heads are refused by name.
TEST(SdpaSinksRows, RefusesSinksOfTheWrongLength) {
    const SinkCase sc{"bad", 1, 4, 2, 3, 8, 16, 0, false};
    std::mt19937_64 rng(seed_for("SdpaSinksBad"));
    Inputs in = make_inputs(sc, rng);
    Tensor three = Tensor::from_f64({3}, {0.0, 1.0, 2.0});
    Tensor y = Tensor::zeros(in.q.shape(), DType::F64);
    const ops::AttentionSinks scope(&three);
    try {
        ops::sdpa_(y, in.q, in.k, in.v, in.kpos, in.qpos, in.scale);
        FAIL() << "expected a refusal";
    } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find("attention sinks must be float (4)"), std::string::npos) << e.what();
    }
}

// ---- gradients -----------------------------------------------------------------------------
// L = sum(y * U) for a random U, differentiated by central differences through reference().
class SdpaSinksGrad : public testing::TestWithParam<SinkCase> {};

TEST_P(SdpaSinksGrad, MatchesFiniteDifferencesOfTheDefinition) {
    const SinkCase sc = GetParam();
    std::mt19937_64 rng(seed_for(std::string("grad_") + sc.name));
    Inputs in = make_inputs(sc, rng);
    // Moderate sinks here (the +20 / -30 rows have gradients ~1e-9, which FD cannot resolve).
    {
        std::vector<double> s = in.sinks.to_f64_vector();
        s[0] = 2.5;
        if (sc.NH > 1) s[size_t(sc.NH - 1)] = -1.0;
        in.sinks = Tensor::from_f64({sc.NH}, s);
    }
    const Tensor U = random_tensor(in.q.shape(), DType::F64, rng);
    const std::vector<double> u = U.to_f64_vector();
    auto loss = [&] {
        const SinkAttentionRef r = reference(sc, in);
        double l = 0;
        for (size_t i = 0; i < u.size(); ++i) l += r.y[i] * u[i];
        return l;
    };
    auto fd = [&](Tensor& x) {
        std::vector<double> g((size_t)x.numel());
        double* px = x.data<double>();
        for (int64_t e = 0; e < x.numel(); ++e) {
            // Five-point stencil at h = 1e-3: truncation O(h^4) ~ 1e-12 and rounding eps|L|/h ~ 1e-13.
            // A two-point stencil at h = 1e-5 rounds to ~1e-11|L|, which for the sink of a 300-key
            // row (gradient ~1e-3 of L) read 7e-8 relative under a build with other summation.
            const double keep = px[e], h = 1e-3;
            auto at = [&](double x) { px[e] = x; return loss(); };
            const double l2p = at(keep + 2 * h), l1p = at(keep + h), l1m = at(keep - h), l2m = at(keep - 2 * h);
            px[e] = keep;
            g[size_t(e)] = (-l2p + 8 * l1p - 8 * l1m + l2m) / (12 * h);
        }
        return g;
    };
    const std::vector<double> gq = fd(in.q), gk = fd(in.k), gv = fd(in.v), gs = fd(in.sinks);

    for (DType dt : {DType::F64, DType::F32}) {
        SCOPED_TRACE(dt == DType::F64 ? "f64" : "f32");
        const double tol = dt == DType::F64 ? 1e-9 : 5e-6;
        Tensor q = in.q.to(dt), k = in.k.to(dt), v = in.v.to(dt), du = U.to(dt), sinks = in.sinks.to(dt);
        Tensor dq = Tensor::zeros(q.shape(), dt), dk = Tensor::zeros(k.shape(), dt), dv = Tensor::zeros(v.shape(), dt);
        Tensor ds = Tensor::full({sc.NH}, dt, 0.25);  // the scope's gradient accumulates: starts at 0.25
        {
            const ops::AttentionSinks scope(&sinks, &ds);
            ops::SdpaBackwardOptions opt;
            opt.window = sc.window;
            ops::sdpa_backward_(dq, dk, dv, q, k, v, in.kpos, in.qpos, du, in.scale, opt);
        }
        std::vector<double> dsv = ds.to_f64_vector();
        for (double& x : dsv) x -= 0.25;
        EXPECT_LT(max_rel(dq.to_f64_vector(), gq), tol) << "dq";
        EXPECT_LT(max_rel(dk.to_f64_vector(), gk), tol) << "dk";
        EXPECT_LT(max_rel(dv.to_f64_vector(), gv), tol) << "dv";
        // d sink = -sum_i A_sink D_i, with D_i = sum_j A_ij dP_ij a weighted mean of terms of
        // both signs, so d sink can be far smaller than its terms while the errors (f32 rounding
        // here, the differences' eps |L| / h) stay the size of the terms. Over 160 random seeds x
        // 4 shapes: f32 <= 2.4e-4, f64 <= 1.9e-9 relative (dq, dk, dv: f32 <= 1e-6, f64 <= 5e-11).
        EXPECT_LT(max_rel(dsv, gs), dt == DType::F64 ? 2e-8 : 2e-3) << "dsinks";
    }

    // The f64 operator reference (kernels/cpu/ref: src6 sinks, dst4 dsinks) agrees as well.
    Tensor rq = Tensor::zeros(in.q.shape(), DType::F64), rk = Tensor::zeros(in.k.shape(), DType::F64),
           rv = Tensor::zeros(in.v.shape(), DType::F64), rs = Tensor::zeros({sc.NH}, DType::F64);
    OpCall c;
    c.op = OpKind::SDPA_BACKWARD;
    c.p.alpha = in.scale;
    c.p.window = sc.window;
    c.dst = rq.view(), c.dst2 = rk.view(), c.dst3 = rv.view(), c.dst4 = rs.view();
    for (const Tensor* t : std::initializer_list<const Tensor*>{&in.q, &in.k, &in.v, &in.kpos, &in.qpos, &U, &in.sinks})
        c.src[c.nsrc++] = t->view();
    kv::ref::compute(c);
    EXPECT_LT(max_rel(rq.to_f64_vector(), gq), 1e-9) << "reference dq";
    EXPECT_LT(max_rel(rk.to_f64_vector(), gk), 1e-9) << "reference dk";
    EXPECT_LT(max_rel(rv.to_f64_vector(), gv), 1e-9) << "reference dv";
    EXPECT_LT(max_rel(rs.to_f64_vector(), gs), 2e-8) << "reference dsinks";
}

INSTANTIATE_TEST_SUITE_P(Shapes, SdpaSinksGrad,
                         testing::Values(SinkCase{"gqa_chunk_over_cache_scattered", 2, 4, 2, 5, 24, 4, 0, true},
                                         SinkCase{"prefill_window_6", 1, 2, 1, 12, 12, 8, 6, false},
                                         SinkCase{"three_key_blocks", 1, 2, 1, 3, 300, 2, 0, true},
                                         SinkCase{"decode_n1", 1, 4, 1, 1, 20, 8, 0, true}),
                         [](const testing::TestParamInfo<SinkCase>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace kv::test
