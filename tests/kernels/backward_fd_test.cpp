// Gradient checks by central finite differences: for each gradient op, L = sum(y * R) with a
// random upstream R is differentiated numerically through the f64 *forward* reference
// (kernels/cpu/ref), and compared with three analytic gradients: the CPU kernels in f64 and in
// f32 (through engine/ops, as the gradient pipeline calls them) and the f64 gradient reference.
//
// Bounds (max |analytic - fd| / max |fd| over each gradient tensor; observed values ~10x and
// ~100x below them):
//   f64 kernels and f64 reference  1e-8  central differences with h = 1e-5 on O(1) inputs have
//                                        truncation ~h^2 and rounding ~1e-16 / h, both ~1e-10
//   f32 kernels                    5e-6  inputs are f32-exact, so only f32 arithmetic differs
//                                        (observed <= 6e-7, SDPA's five chained products included)
// None of these ops is non-smooth at the sampled points: masks depend on integer positions
// only, and CE/softmax/SiLU/RMSNorm (eps > 0) are smooth everywhere. Ops with kinks (none yet)
// would sample away from them and say so here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>

#include "engine/ops/ops.h"
#include "kernels/cpu/ref/ref_ops.h"
#include "tests/support/test_support.h"

namespace kv::test {
namespace {

constexpr double kH = 1e-5;
constexpr double kTolF64 = 1e-8;
constexpr double kTolF32 = 5e-6;
constexpr double kTolSdpaF32 = 5e-6;

// Runs one op through the f64 reference: dst (and dst2) of the given shapes, f64.
Tensor ref_run(OpKind k, const OpParams& p, const std::vector<Tensor>& srcs, const Shape& out) {
    Tensor y = Tensor::zeros(out, DType::F64);
    OpCall c;
    c.op = k;
    c.p = p;
    c.dst = y.view();
    for (const Tensor& s : srcs) c.src[c.nsrc++] = s.defined() ? s.view() : TensorView{};
    kv::ref::compute(c);
    return y;
}

double dot(const Tensor& a, const Tensor& b) {
    std::vector<double> x = a.to_f64_vector(), y = b.to_f64_vector();
    double s = 0;
    for (size_t i = 0; i < x.size(); ++i) s += x[i] * y[i];
    return s;
}

// Central differences of loss() with respect to every element of x (f64, contiguous, changed
// in place and restored).
Tensor fd_grad(Tensor& x, const std::function<double()>& loss) {
    Tensor g = Tensor::zeros(x.shape(), DType::F64);
    double* px = x.data<double>();
    double* pg = g.data<double>();
    for (int64_t e = 0; e < x.numel(); ++e) {
        const double keep = px[e];
        px[e] = keep + kH;
        const double lp = loss();
        px[e] = keep - kH;
        const double lm = loss();
        px[e] = keep;
        pg[e] = (lp - lm) / (2 * kH);
    }
    return g;
}

void expect_grad(const Tensor& got, const Tensor& fd, double tol, const std::string& what) {
    Comparison c = compare(got, fd);
    EXPECT_FALSE(c.nonfinite_mismatch) << what << ": NaN/inf\n" << c.report;
    EXPECT_LE(c.rel_err, tol) << what << ": relative error " << c.rel_err << " > " << tol << "\n" << c.report;
}

Tensor f32(const Tensor& t) { return t.to(DType::F32); }

std::mt19937_64 rng_for(const char* name) { return std::mt19937_64(seed_for(std::string("fd/") + name)); }

// =========================================================================================
TEST(BackwardFd, RmsNorm) {
    auto rng = rng_for("rmsnorm");
    for (float offset : {0.0f, 1.0f}) {
        Tensor x = random_tensor({4, 24}, DType::F64, rng, -2.0, 2.0);
        Tensor w = random_tensor({24}, DType::F64, rng, 0.5, 1.5);
        Tensor R = random_tensor({4, 24}, DType::F64, rng);
        OpParams p;
        p.eps = 1e-5f;
        p.weight_offset = offset;
        auto loss = [&] { return dot(ref_run(OpKind::RMSNORM, p, {x, w}, x.shape()), R); };
        Tensor fdx = fd_grad(x, loss), fdw = fd_grad(w, loss);
        // f64 kernels
        Tensor dx = Tensor::zeros(x.shape(), DType::F64), dw = Tensor::zeros({24}, DType::F64);
        ops::rmsnorm_backward_(dx, &dw, x, w, R, p.eps, offset, false, false);
        expect_grad(dx, fdx, kTolF64, "rmsnorm dx f64");
        expect_grad(dw, fdw, kTolF64, "rmsnorm dweight f64");
        // f32 kernels, dweight accumulated onto a known start
        Tensor dx32 = Tensor::zeros(x.shape(), DType::F32), dw32 = Tensor::full({24}, DType::F32, 0.5);
        ops::rmsnorm_backward_(dx32, &dw32, f32(x), f32(w), f32(R), p.eps, offset, false, true);
        expect_grad(dx32, fdx, kTolF32, "rmsnorm dx f32");
        expect_grad(ops::add(dw32, Tensor::full({24}, DType::F32, -0.5)), fdw, kTolF32, "rmsnorm dweight f32 accumulated");
        // f64 reference
        Tensor rdx = Tensor::zeros(x.shape(), DType::F64), rdw = Tensor::zeros({24}, DType::F64);
        OpCall c;
        c.op = OpKind::RMSNORM_BACKWARD;
        c.p = p;
        c.dst = rdx.view();
        c.dst2 = rdw.view();
        c.src[c.nsrc++] = x.view();
        c.src[c.nsrc++] = R.view();
        c.src[c.nsrc++] = w.view();
        kv::ref::compute(c);
        expect_grad(rdx, fdx, kTolF64, "rmsnorm dx reference");
        expect_grad(rdw, fdw, kTolF64, "rmsnorm dweight reference");
    }
}

TEST(BackwardFd, RopePartialRotationNonUnitTables) {
    auto rng = rng_for("rope");
    // Random tables (not unit rotations, like YaRN's scaled ones): the gradient is the transpose.
    Tensor x = random_tensor({2, 3, 5, 16}, DType::F64, rng);
    Tensor pos = Tensor::from_i32({2, 5}, {3, 0, 7, 7, 1, 9, 2, 4, 8, 5});
    Tensor cs = random_tensor({10, 6}, DType::F32, rng, -1.5, 1.5), sn = random_tensor({10, 6}, DType::F32, rng, -1.5, 1.5);
    Tensor R = random_tensor(x.shape(), DType::F64, rng);
    OpParams p;
    p.n_rot = 12;
    auto loss = [&] { return dot(ref_run(OpKind::ROPE, p, {x, pos, cs, sn}, x.shape()), R); };
    Tensor fdx = fd_grad(x, loss);
    Tensor dx = Tensor::zeros(x.shape(), DType::F64);
    ops::rope_backward_(dx, R, pos, cs, sn, 12);
    expect_grad(dx, fdx, kTolF64, "rope dx f64");
    Tensor dx32 = Tensor::zeros(x.shape(), DType::F32);
    ops::rope_backward_(dx32, f32(R), pos, cs, sn, 12);
    expect_grad(dx32, fdx, kTolF32, "rope dx f32");
    Tensor rdx = ref_run(OpKind::ROPE_BACKWARD, p, {R, pos, cs, sn}, x.shape());
    expect_grad(rdx, fdx, kTolF64, "rope dx reference");
}

TEST(BackwardFd, SiluAndSwiglu) {
    auto rng = rng_for("swiglu");
    Tensor x = random_tensor({3, 17}, DType::F64, rng, -8.0, 8.0);
    Tensor up = random_tensor({3, 17}, DType::F64, rng, -2.0, 2.0);
    Tensor R = random_tensor({3, 17}, DType::F64, rng);
    OpParams p;
    {
        auto loss = [&] { return dot(ref_run(OpKind::SILU, p, {x}, x.shape()), R); };
        Tensor fdx = fd_grad(x, loss);
        Tensor dx = Tensor::zeros(x.shape(), DType::F64);
        ops::silu_backward_(dx, x, R);
        expect_grad(dx, fdx, kTolF64, "silu dx f64");
        Tensor dx32 = Tensor::zeros(x.shape(), DType::F32);
        ops::silu_backward_(dx32, f32(x), f32(R));
        expect_grad(dx32, fdx, kTolF32, "silu dx f32");
        expect_grad(ref_run(OpKind::SILU_BACKWARD, p, {x, R}, x.shape()), fdx, kTolF64, "silu dx reference");
    }
    auto loss = [&] { return dot(ref_run(OpKind::SWIGLU, p, {x, up}, x.shape()), R); };
    Tensor fdg = fd_grad(x, loss), fdu = fd_grad(up, loss);
    Tensor dg = Tensor::zeros(x.shape(), DType::F64), du = Tensor::zeros(x.shape(), DType::F64);
    ops::swiglu_backward_(dg, du, x, up, R);
    expect_grad(dg, fdg, kTolF64, "swiglu dgate f64");
    expect_grad(du, fdu, kTolF64, "swiglu dup f64");
    Tensor dg32 = Tensor::zeros(x.shape(), DType::F32), du32 = Tensor::zeros(x.shape(), DType::F32);
    ops::swiglu_backward_(dg32, du32, f32(x), f32(up), f32(R));
    expect_grad(dg32, fdg, kTolF32, "swiglu dgate f32");
    expect_grad(du32, fdu, kTolF32, "swiglu dup f32");
}

// The GELU-tanh gate (Gemma): the loss is the f64 reference, whose forward is transformers'
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); the kernels use the sigmoid form.
TEST(BackwardFd, GeluTanhGate) {
    auto rng = rng_for("geglu");
    Tensor x = random_tensor({3, 17}, DType::F64, rng, -8.0, 8.0);
    Tensor up = random_tensor({3, 17}, DType::F64, rng, -2.0, 2.0);
    Tensor R = random_tensor({3, 17}, DType::F64, rng);
    OpParams p;
    p.act = int(GateAct::GELU_TANH);
    auto loss = [&] { return dot(ref_run(OpKind::SWIGLU, p, {x, up}, x.shape()), R); };
    // the reference forward against the formula written here
    const std::vector<double> xv = x.to_f64_vector(), uv = up.to_f64_vector(), y = ref_run(OpKind::SWIGLU, p, {x, up}, x.shape()).to_f64_vector();
    for (size_t i = 0; i < xv.size(); ++i) {
        const double g = xv[i], want = 0.5 * g * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g))) * uv[i];
        ASSERT_NEAR(y[i], want, 1e-12 * (1.0 + std::fabs(want))) << i;
    }
    Tensor fdg = fd_grad(x, loss), fdu = fd_grad(up, loss);
    Tensor dg = Tensor::zeros(x.shape(), DType::F64), du = Tensor::zeros(x.shape(), DType::F64);
    ops::swiglu_backward_(dg, du, x, up, R, false, GateAct::GELU_TANH);
    expect_grad(dg, fdg, kTolF64, "geglu dgate f64");
    expect_grad(du, fdu, kTolF64, "geglu dup f64");
    Tensor dg32 = Tensor::zeros(x.shape(), DType::F32), du32 = Tensor::zeros(x.shape(), DType::F32);
    ops::swiglu_backward_(dg32, du32, f32(x), f32(up), f32(R), false, GateAct::GELU_TANH);
    expect_grad(dg32, fdg, kTolF32, "geglu dgate f32");
    expect_grad(du32, fdu, kTolF32, "geglu dup f32");
    Tensor gout = ops::gated(x, up, GateAct::GELU_TANH);
    const std::vector<double> gv = gout.to_f64_vector();
    for (size_t i = 0; i < gv.size(); ++i) EXPECT_NEAR(gv[i], y[i], 1e-12 * (1.0 + std::fabs(y[i]))) << i;
}

TEST(BackwardFd, EmbeddingWithDuplicateIds) {
    auto rng = rng_for("embedding");
    Tensor table = random_tensor({10, 6}, DType::F64, rng);
    Tensor ids = Tensor::from_i32({3, 5}, {1, 4, 1, 9, 0, 4, 4, 2, 7, 1, 3, 9, 9, 0, 5});
    Tensor R = random_tensor({3, 5, 6}, DType::F64, rng);
    OpParams p;
    auto loss = [&] { return dot(ref_run(OpKind::EMBEDDING, p, {table, ids}, {3, 5, 6}), R); };
    Tensor fdt = fd_grad(table, loss);
    Tensor dt = Tensor::full(table.shape(), DType::F64, 123.0);  // overwritten: accumulate = false
    ops::embedding_backward_(dt, ids, R, false);
    expect_grad(dt, fdt, kTolF64, "embedding dtable f64");
    Tensor dt32 = Tensor::zeros(table.shape(), DType::F32);
    ops::embedding_backward_(dt32, ids, f32(R), true);
    expect_grad(dt32, fdt, kTolF32, "embedding dtable f32");
    expect_grad(ref_run(OpKind::EMBEDDING_BACKWARD, p, {R, ids}, table.shape()), fdt, kTolF64, "embedding dtable reference");
}

TEST(BackwardFd, CrossEntropyWithIgnoredRowsSubsetAndRowWeights) {
    auto rng = rng_for("cross_entropy");
    for (bool subset : {false, true}) {
        Tensor logits = random_tensor({6, 11}, DType::F64, rng, -4.0, 4.0);
        Tensor cls = Tensor::from_i32({4}, {7, 2, 10, 5});
        const int64_t K = subset ? 4 : 11;
        std::vector<int32_t> t = {1, -100, 3, int32_t(K - 1), 0, -100};
        Tensor targets = Tensor::from_i32({6}, t);
        Tensor wrow = random_tensor({6}, DType::F64, rng, 0.5, 2.0);  // per-row loss weights
        const float scale = 0.3f;
        OpParams p;
        Tensor sub = subset ? cls : Tensor();
        auto loss = [&] { return double(scale) * dot(ref_run(OpKind::CROSS_ENTROPY, p, {logits, targets, sub}, {6}), wrow); };
        Tensor fdz = fd_grad(logits, loss);
        Tensor dz = Tensor::zeros(logits.shape(), DType::F64);
        ops::cross_entropy_backward_(dz, logits, targets, scale, wrow, sub);
        expect_grad(dz, fdz, kTolF64, subset ? "ce dlogits f64 (subset)" : "ce dlogits f64");
        Tensor dz32 = Tensor::zeros(logits.shape(), DType::F32);
        ops::cross_entropy_backward_(dz32, f32(logits), targets, scale, f32(wrow), sub);
        expect_grad(dz32, fdz, kTolF32, subset ? "ce dlogits f32 (subset)" : "ce dlogits f32");
        Tensor rdz = Tensor::zeros(logits.shape(), DType::F64);
        OpCall c;
        c.op = OpKind::CROSS_ENTROPY_BACKWARD;
        c.p.alpha = scale;
        c.dst = rdz.view();
        c.src[c.nsrc++] = logits.view();
        c.src[c.nsrc++] = targets.view();
        c.src[c.nsrc++] = subset ? cls.view() : TensorView{};
        c.src[c.nsrc++] = wrow.view();
        kv::ref::compute(c);
        expect_grad(rdz, fdz, kTolF64, "ce dlogits reference");
        // The loss itself: kernels against the reference, ignored rows exactly 0.
        Tensor l64 = ops::cross_entropy(logits, targets, sub);
        Comparison cl = compare(l64, ref_run(OpKind::CROSS_ENTROPY, p, {logits, targets, sub}, {6}));
        EXPECT_LE(cl.rel_err, 1e-13) << cl.report;
        EXPECT_EQ(l64.to_f64_vector()[1], 0.0);
    }
}

// =========================================================================================
struct SdpaFd {
    const char* name;
    int64_t B, NH, G, n, T, HS;
    int window;
    bool scattered;  // slots hold a shuffled subset of older positions plus the n new ones
    int64_t max_temp_bytes;
    float softcap;  // > 0: Gemma 2's c tanh(s / c) on the scores
};

void PrintTo(const SdpaFd& s, std::ostream* os) { *os << s.name; }

class BackwardFdSdpa : public testing::TestWithParam<SdpaFd> {};

TEST_P(BackwardFdSdpa, MatchesFiniteDifferences) {
    const SdpaFd sp = GetParam();
    auto rng = rng_for(sp.name);
    Tensor q = random_tensor({sp.B, sp.NH, sp.n, sp.HS}, DType::F64, rng, -1.5, 1.5);
    Tensor k = random_tensor({sp.B, sp.G, sp.T, sp.HS}, DType::F64, rng, -1.5, 1.5);
    Tensor v = random_tensor({sp.B, sp.G, sp.T, sp.HS}, DType::F64, rng);
    // Positions per (b, g): scattered (a cache after evictions, new tokens at P..P+n) or 0..T-1.
    const int64_t P = sp.scattered ? 2 * sp.T : sp.T - sp.n;
    std::vector<int32_t> kp;
    for (int64_t r = 0; r < sp.B * sp.G; ++r) {
        std::vector<int32_t> pool;
        if (sp.scattered) {
            std::vector<int32_t> old((size_t)P);
            std::iota(old.begin(), old.end(), 0);
            std::shuffle(old.begin(), old.end(), rng);
            pool.assign(old.begin(), old.begin() + (sp.T - sp.n));
            for (int64_t i = 0; i < sp.n; ++i) pool.push_back(int32_t(P + i));
            std::shuffle(pool.begin(), pool.end(), rng);
        } else {
            for (int64_t j = 0; j < sp.T; ++j) pool.push_back(int32_t(j));
        }
        kp.insert(kp.end(), pool.begin(), pool.end());
    }
    Tensor kpos = Tensor::from_i32({sp.B, sp.G, sp.T}, kp);
    std::vector<int32_t> qp((size_t)sp.n);
    for (int64_t i = 0; i < sp.n; ++i) qp[size_t(i)] = int32_t(P + i);
    Tensor qpos = Tensor::from_i32({1, sp.n}, qp);
    Tensor R = random_tensor(q.shape(), DType::F64, rng);
    const float scale = 1.0f / std::sqrt(float(sp.HS));
    OpParams p;
    p.alpha = scale;
    p.window = sp.window;
    p.softcap = sp.softcap;
    auto loss = [&] { return dot(ref_run(OpKind::SDPA, p, {q, k, v, kpos, qpos}, q.shape()), R); };
    Tensor fdq = fd_grad(q, loss), fdk = fd_grad(k, loss), fdv = fd_grad(v, loss);

    ops::SdpaBackwardOptions opt;
    opt.window = sp.window;
    opt.max_temp_bytes = sp.max_temp_bytes;
    opt.softcap = sp.softcap;
    Tensor dq = Tensor::zeros(q.shape(), DType::F64), dk = Tensor::zeros(k.shape(), DType::F64), dv = Tensor::zeros(v.shape(), DType::F64);
    ops::sdpa_backward_(dq, dk, dv, q, k, v, kpos, qpos, R, scale, opt);
    expect_grad(dq, fdq, kTolF64, "sdpa dq f64");
    expect_grad(dk, fdk, kTolF64, "sdpa dk f64");
    expect_grad(dv, fdv, kTolF64, "sdpa dv f64");

    Tensor dq32 = Tensor::zeros(q.shape(), DType::F32), dk32 = Tensor::zeros(k.shape(), DType::F32),
           dv32 = Tensor::zeros(v.shape(), DType::F32);
    ops::sdpa_backward_(dq32, dk32, dv32, f32(q), f32(k), f32(v), kpos, qpos, f32(R), scale, opt);
    expect_grad(dq32, fdq, kTolSdpaF32, "sdpa dq f32");
    expect_grad(dk32, fdk, kTolSdpaF32, "sdpa dk f32");
    expect_grad(dv32, fdv, kTolSdpaF32, "sdpa dv f32");

    Tensor rq = Tensor::zeros(q.shape(), DType::F64), rk = Tensor::zeros(k.shape(), DType::F64), rv = Tensor::zeros(v.shape(), DType::F64);
    OpCall c;
    c.op = OpKind::SDPA_BACKWARD;
    c.p = p;
    c.dst = rq.view();
    c.dst2 = rk.view();
    c.dst3 = rv.view();
    for (const Tensor* t : {&q, &k, &v, &kpos, &qpos, &R}) c.src[c.nsrc++] = t->view();
    kv::ref::compute(c);
    expect_grad(rq, fdq, kTolF64, "sdpa dq reference");
    expect_grad(rk, fdk, kTolF64, "sdpa dk reference");
    expect_grad(rv, fdv, kTolF64, "sdpa dv reference");
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, BackwardFdSdpa,
    testing::Values(SdpaFd{"gqa_chunk_over_cache_scattered", 2, 4, 2, 5, 24, 4, 0, true, 0, 0.0f},
                    SdpaFd{"prefill_window_6", 1, 2, 1, 12, 12, 8, 6, false, 0, 0.0f},
                    SdpaFd{"chunk_scattered_window_30", 1, 6, 3, 4, 36, 4, 30, true, 0, 0.0f},
                    SdpaFd{"three_key_blocks_one_query_per_block", 1, 2, 1, 3, 300, 2, 0, true, 1, 0.0f},
                    SdpaFd{"decode_n1", 1, 4, 1, 1, 20, 8, 0, true, 0, 0.0f},
                    SdpaFd{"softcap_0_5_gqa_scattered", 2, 4, 2, 5, 24, 4, 0, true, 0, 0.5f},
                    SdpaFd{"softcap_0_8_window_6", 1, 2, 1, 12, 12, 8, 6, false, 0, 0.8f}),
    [](const testing::TestParamInfo<SdpaFd>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace kv::test
