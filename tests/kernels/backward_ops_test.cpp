// Properties of the gradient ops beyond their values: results that must not depend on the
// thread count (embedding gradient, RMSNorm dweight), SDPA_BACKWARD independent of its
// temporary budget and consistent with chained SDPA calls, and the engine wrappers' messages
// for misuse.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "engine/backend/backend_registry.h"
#include "engine/core/error.h"
#include "engine/ops/ops.h"
#include "tests/support/test_support.h"

namespace kv::test {
namespace {

bool bit_equal(const Tensor& a, const Tensor& b) {
    return a.nbytes() == b.nbytes() && std::memcmp(a.contiguous().data_ptr(), b.contiguous().data_ptr(), a.nbytes()) == 0;
}

// Runs fn with 1 and 2 threads and restores the setting.
template <class F>
void with_threads(int n, F&& fn) {
    const int keep = num_threads();
    set_num_threads(n);
    fn();
    set_num_threads(keep);
}

TEST(BackwardOps, EmbeddingAndRmsnormGradientsIgnoreTheThreadCount) {
    std::mt19937_64 rng(seed_for("backward_ops/threads"));
    Tensor dy = random_tensor({3000, 48}, DType::F32, rng);
    std::vector<int64_t> idv(3000);
    for (size_t i = 0; i < idv.size(); ++i) idv[i] = int64_t((i * 7919) % 37);  // heavy duplicates
    Tensor ids = Tensor::from_i64({3000}, idv);
    Tensor x = random_tensor({3000, 48}, DType::F32, rng), w = random_tensor({48}, DType::F32, rng);
    Tensor t1 = Tensor::zeros({37, 48}, DType::F32), t2 = Tensor::zeros({37, 48}, DType::F32);
    Tensor dx1 = Tensor::zeros(x.shape(), DType::F32), dx2 = Tensor::zeros(x.shape(), DType::F32);
    Tensor dw1 = Tensor::zeros({48}, DType::F32), dw2 = Tensor::zeros({48}, DType::F32);
    with_threads(1, [&] {
        ops::embedding_backward_(t1, ids, dy);
        ops::rmsnorm_backward_(dx1, &dw1, x, w, dy, 1e-6f);
    });
    with_threads(2, [&] {
        ops::embedding_backward_(t2, ids, dy);
        ops::rmsnorm_backward_(dx2, &dw2, x, w, dy, 1e-6f);
    });
    EXPECT_TRUE(bit_equal(t1, t2)) << "embedding gradient depends on the thread count";
    EXPECT_TRUE(bit_equal(dw1, dw2)) << "rmsnorm dweight depends on the thread count";
    EXPECT_TRUE(bit_equal(dx1, dx2));
}

TEST(BackwardOps, SdpaBackwardIndependentOfTemporaryBudgetAndAccumulates) {
    std::mt19937_64 rng(seed_for("backward_ops/sdpa_budget"));
    const int64_t B = 1, NH = 6, G = 2, n = 70, T = 300, HS = 32;
    Tensor q = random_tensor({B, NH, n, HS}, DType::F32, rng), k = random_tensor({B, G, T, HS}, DType::F32, rng);
    Tensor v = random_tensor({B, G, T, HS}, DType::F32, rng), dy = random_tensor({B, NH, n, HS}, DType::F32, rng);
    std::vector<int32_t> kp(T), qp(n);
    for (int64_t j = 0; j < T; ++j) kp[size_t(j)] = int32_t(j);
    for (int64_t i = 0; i < n; ++i) qp[size_t(i)] = int32_t(T - n + i);
    Tensor kpos = Tensor::from_i32({1, 1, T}, kp), qpos = Tensor::from_i32({1, n}, qp);
    auto run = [&](int64_t budget, Tensor& dq, Tensor& dk, Tensor& dv, bool acc) {
        ops::SdpaBackwardOptions o;
        o.max_temp_bytes = budget;
        o.accumulate_dq = o.accumulate_dk = o.accumulate_dv = acc;
        ops::sdpa_backward_(dq, dk, dv, q, k, v, kpos, qpos, dy, 0.2f, o);
    };
    Tensor dq1 = Tensor::zeros(q.shape(), DType::F32), dk1 = Tensor::zeros(k.shape(), DType::F32), dv1 = Tensor::zeros(v.shape(), DType::F32);
    Tensor dq2 = dq1.clone(), dk2 = dk1.clone(), dv2 = dv1.clone();
    run(0, dq1, dk1, dv1, false);
    run(1, dq2, dk2, dv2, false);  // one query per block
    EXPECT_LE(compare(dq2, dq1).rel_err, 1e-6);
    EXPECT_LE(compare(dk2, dk1).rel_err, 1e-6);
    EXPECT_LE(compare(dv2, dv1).rel_err, 1e-6);
    // Accumulating twice doubles.
    run(0, dq2, dk2, dv2, false);
    run(0, dq2, dk2, dv2, true);
    EXPECT_LE(compare(dk2, ops::scale(dk1, 2.0f)).rel_err, 1e-6);
    EXPECT_LE(compare(dv2, ops::scale(dv1, 2.0f)).rel_err, 1e-6);
    EXPECT_LE(compare(dq2, ops::scale(dq1, 2.0f)).rel_err, 1e-6);
}

TEST(BackwardOps, SdpaForwardWeightSumsAreRepeatable) {
    std::mt19937_64 rng(seed_for("backward_ops/sdpa_repeat"));
    Tensor q = random_tensor({1, 14, 100, 64}, DType::F32, rng), k = random_tensor({1, 2, 700, 64}, DType::F32, rng);
    Tensor v = random_tensor({1, 2, 700, 64}, DType::F32, rng);
    std::vector<int32_t> kp(700), qp(100);
    for (int j = 0; j < 700; ++j) kp[size_t(j)] = (j * 389) % 700 + (j >= 600 ? 1000 : 0);
    for (int i = 0; i < 100; ++i) qp[size_t(i)] = 1600 + i;
    Tensor kpos = Tensor::from_i32({1, 1, 700}, kp), qpos = Tensor::from_i32({1, 100}, qp);
    Tensor y1 = Tensor::zeros(q.shape(), DType::F32), y2 = y1.clone(), w1 = Tensor::zeros({1, 2, 700}, DType::F32), w2 = w1.clone();
    ops::sdpa_(y1, q, k, v, kpos, qpos, 0.125f, 0, &w1);
    ops::sdpa_(y2, q, k, v, kpos, qpos, 0.125f, 0, &w2);
    EXPECT_TRUE(bit_equal(y1, y2));
    EXPECT_TRUE(bit_equal(w1, w2));
    // The weight sums of a group add up to the number of queries.
    std::vector<double> w = w1.to_f64_vector();
    double s0 = 0;
    for (int j = 0; j < 700; ++j) s0 += w[size_t(j)];
    EXPECT_NEAR(s0, 100.0, 1e-3);
    // The fast path without weights gives the same outputs.
    Tensor y3 = Tensor::zeros(q.shape(), DType::F32);
    ops::sdpa_(y3, q, k, v, kpos, qpos, 0.125f);
    EXPECT_LE(compare(y3, y1).rel_err, 1e-6);
}

void expect_error(const std::function<void()>& fn, const std::string& fragment) {
    try {
        fn();
        ADD_FAILURE() << "no error; expected one mentioning '" << fragment << "'";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
}

TEST(BackwardOps, WrappersNameTheProblem) {
    Tensor x = Tensor::zeros({4, 8}, DType::F32), dx = Tensor::zeros({4, 8}, DType::F32), dw = Tensor::zeros({8}, DType::F32);
    expect_error([&] { ops::rmsnorm_backward_(dx, &dw, x, Tensor(), x, 1e-6f); }, "dweight was requested for a norm without weight");
    expect_error([&] { ops::rmsnorm_backward_(dx, nullptr, x, Tensor(), Tensor::zeros({4, 9}, DType::F32), 1e-6f); }, "must have the same shape");
    Tensor table = Tensor::zeros({5, 8}, DType::F32);
    expect_error([&] { ops::embedding_backward_(table, Tensor::from_i32({4}, {0, 1, 5, 2}), x); }, "token id 5 at element 2 is out of range [0, 5)");
    Tensor logits = Tensor::zeros({3, 6}, DType::F32);
    expect_error([&] { ops::cross_entropy(logits, Tensor::from_i32({3}, {0, 6, -100})); }, "target 6 at element 1 is out of range [0, 6)");
    expect_error([&] { ops::cross_entropy(logits, Tensor::from_i32({3}, {0, 3, 1}), Tensor::from_i32({2}, {4, 5})); },
                 "target 3 at element 1 is out of range [0, 2)");
    expect_error([&] { ops::cross_entropy(logits, Tensor::from_i32({3}, {0, 1, 1}), Tensor::from_i32({2}, {4, 6})); },
                 "class id 6 at element 1 is out of range [0, 6)");
    Tensor q = Tensor::zeros({1, 4, 3, 8}, DType::F32), k = Tensor::zeros({1, 2, 5, 8}, DType::F32);
    Tensor dq = q.clone(), dk = Tensor::zeros({1, 2, 4, 8}, DType::F32), dv = k.clone();
    Tensor kpos = Tensor::zeros({1, 1, 5}, DType::I32), qpos = Tensor::zeros({1, 3}, DType::I32);
    expect_error([&] { ops::sdpa_backward_(dq, dk, dv, q, k, k, kpos, qpos, q, 1.0f); }, "dk (1, 2, 4, 8) must have the same shape");
    expect_error([&] { ops::sdpa_backward_(dq, dv, dv, q, k, k, kpos, qpos, Tensor::zeros({1, 4, 2, 8}, DType::F32), 1.0f); }, "dy");
    Tensor p = Tensor::zeros({4}, DType::F32);
    expect_error([&] { ops::axpy_(p, Tensor::zeros({5}, DType::F32), 1.0f); }, "does not broadcast");
}

}  // namespace
}  // namespace kv::test
