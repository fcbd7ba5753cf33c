// The CPU matmul's column blocks (kernels/cpu/matmul.cpp): with more than one thread a large
// oneDNN product runs as one single-threaded call per block of output columns. Blocks of 16
// that do not divide N, transposed weights, broadcast and batched operands, and alpha/beta
// accumulation must give the naive f64 product at every thread count.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/backend/backend_registry.h"
#include "engine/core/error.h"
#include "engine/ops/ops.h"
#include "tests/support/test_support.h"

namespace kv::test {
namespace {

// d = alpha a @ b + beta d0 in f64; a [batch, M, K], b [batch or 1, K, N] (row-major values).
std::vector<double> naive(const std::vector<double>& a, const std::vector<double>& b, const std::vector<double>& d0, int64_t batch,
                          bool b_broadcast, int64_t M, int64_t K, int64_t N, double alpha, double beta) {
    std::vector<double> d(size_t(batch * M * N));
    for (int64_t z = 0; z < batch; ++z)
        for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < N; ++j) {
                double s = 0;
                for (int64_t k = 0; k < K; ++k) s += a[size_t((z * M + i) * K + k)] * b[size_t(((b_broadcast ? 0 : z) * K + k) * N + j)];
                const size_t o = size_t((z * M + i) * N + j);
                d[o] = alpha * s + beta * d0[o];
            }
    return d;
}

struct Case {
    int64_t batch, M, K, N;
    bool b_transposed, b_broadcast;
    float alpha, beta;
};

TEST(MatmulBlocks, ColumnBlocksEqualTheF64ProductAtEveryThreadCount) {
    const int keep = num_threads();
    // 1M+ multiply-adds and N >= 32 threads: the block path for 2..4 threads; N = 203 and 130
    // leave a last block narrower than the others.
    const std::vector<Case> cases = {
        {1, 150, 96, 203, true, false, 1.f, 0.f},  {1, 150, 96, 203, false, false, 0.5f, 0.25f},
        {2, 70, 64, 130, false, false, 1.f, 0.f},  {3, 60, 80, 144, true, true, 1.f, 0.f},
        {1, 40, 700, 256, true, false, 1.f, -1.f},
    };
    for (const Case& c : cases) {
        std::mt19937_64 rng(seed_for("matmul_blocks/" + std::to_string(c.N) + "/" + std::to_string(c.M)));
        const Tensor a = random_tensor({c.batch, c.M, c.K}, DType::F32, rng);
        const int64_t bb = c.b_broadcast ? 1 : c.batch;
        // A transposed operand is a [.., N, K] array viewed as [.., K, N] (a Linear weight).
        const Tensor bstore = c.b_transposed ? random_tensor({bb, c.N, c.K}, DType::F32, rng) : random_tensor({bb, c.K, c.N}, DType::F32, rng);
        const Tensor b = c.b_transposed ? bstore.transpose(1, 2) : bstore;
        const Tensor d0 = random_tensor({c.batch, c.M, c.N}, DType::F32, rng);
        const std::vector<double> want = naive(a.to_f64_vector(), b.contiguous().to_f64_vector(), d0.to_f64_vector(), c.batch, c.b_broadcast,
                                               c.M, c.K, c.N, c.alpha, c.beta);
        double ref = 0;
        for (double x : want) ref = std::max(ref, std::fabs(x));
        for (int threads : {1, 2, 3, 4}) {
            SCOPED_TRACE(str("N ", c.N, " M ", c.M, " K ", c.K, " batch ", c.batch, " threads ", threads));
            set_num_threads(threads);
            Tensor d = d0.clone();
            const Tensor bx = c.b_broadcast ? b.expand({c.batch, c.K, c.N}) : b;
            ops::matmul_(d, a, bx, c.alpha, c.beta);
            const std::vector<double> got = d.to_f64_vector();
            double err = 0;
            for (size_t i = 0; i < got.size(); ++i) err = std::max(err, std::fabs(got[i] - want[i]));
            // f32 products over K <= 700 terms of |x| <= 1
            EXPECT_LE(err, 2e-6 * ref * std::sqrt(double(c.K))) << "max |err| " << err << " of max |ref| " << ref;
        }
    }
    set_num_threads(keep);
}

}  // namespace
}  // namespace kv::test
