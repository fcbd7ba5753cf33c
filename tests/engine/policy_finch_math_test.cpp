// finch's window softmaxes (engine/kv/policies/policy_finch_math.h): every ISA level this CPU runs
// gives the same bits, and they are finch's scores of the definition in plain f64 (within the f32
// exponentials' tolerance).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "engine/kv/policies/policy_finch_math.h"
#include "engine/kv/policies/policy_math.h"

namespace kv::test {
namespace {

TEST(FinchMath, EveryLevelGivesTheSameBitsAsTheF64Definition) {
    const int64_t nq = 3, M = 2 * nq, T = 41, first = 40;  // two heads of three window queries; T: vector blocks and a tail
    const double scale = 0.4;
    std::mt19937 rng(11);
    std::uniform_real_distribution<double> u(-5.0, 5.0);
    std::vector<double> logit(static_cast<size_t>(M * T)), pre(static_cast<size_t>(T));
    for (double& x : logit) x = u(rng);
    std::vector<int32_t> pos(static_cast<size_t>(T));
    for (int64_t j = 0; j < T; ++j) pos[size_t(j)] = int32_t((j * 13) % (T + 2));  // positions 0 .. T + 1, shuffled
    pos[7] = -1;                                                                   // an empty slot
    std::vector<int64_t> late;
    for (int64_t j = 0; j < T; ++j) {
        if (pos[size_t(j)] < 0 || pos[size_t(j)] >= first) late.push_back(j);
        pre[size_t(j)] = pos[size_t(j)] >= 0 && pos[size_t(j)] < first ? 1.0 : 0.0;
    }
    // reference: each window query's softmax over the slots it sees, times its position, averaged
    std::vector<double> ref(static_cast<size_t>(T), 0.0);
    for (int64_t m = 0; m < M; ++m) {
        const int64_t p = first + m % nq;
        double mx = -INFINITY, z = 0;
        for (int64_t j = 0; j < T; ++j)
            if (pos[size_t(j)] >= 0 && pos[size_t(j)] <= p) mx = std::max(mx, scale * logit[size_t(m * T + j)]);
        for (int64_t j = 0; j < T; ++j)
            if (pos[size_t(j)] >= 0 && pos[size_t(j)] <= p) z += std::exp(scale * logit[size_t(m * T + j)] - mx);
        for (int64_t j = 0; j < T; ++j)
            if (pre[size_t(j)] > 0) ref[size_t(j)] += double(p) * std::exp(scale * logit[size_t(m * T + j)] - mx) / z / double(M);
    }
    // The same weights as the unfused passes give (policy_exp_sum_f32 on the shifted, masked
    // row): the fused kernel keeps finch's scores bit for bit.
    std::vector<double> unfused(static_cast<size_t>(T), 0.0);
    {
        std::vector<double> x(static_cast<size_t>(T)), e(static_cast<size_t>(T));
        for (int64_t m = 0; m < M; ++m) {
            const int64_t p = first + m % nq;
            double mx = -INFINITY;
            for (int64_t j = 0; j < T; ++j) {
                const bool sees = pos[size_t(j)] >= 0 && pos[size_t(j)] <= p;
                x[size_t(j)] = sees ? logit[size_t(m * T + j)] * scale : -INFINITY;
                mx = std::max(mx, x[size_t(j)]);
            }
            for (int64_t j = 0; j < T; ++j) x[size_t(j)] = std::isinf(x[size_t(j)]) ? -1000.0 : x[size_t(j)] - mx;
            const double z = policy_exp_sum_f32(x.data(), e.data(), T);
            const double f = double(p) / (z * double(M));
            for (int64_t j = 0; j < T; ++j) unfused[size_t(j)] += e[size_t(j)] * f * pre[size_t(j)];
        }
    }
    std::vector<double> first_level;
    for (int level = 2; level <= 4; ++level) {
        const size_t nT = size_t(T);
        std::vector<double> e(nT), acc(nT, 0.0), scaled(logit.size());
        for (size_t i = 0; i < logit.size(); ++i) scaled[i] = logit[i] * scale;  // as finch_logits hands them on
        finch_window_scores(level, scaled.data(), M, nq, T, pos.data(), first, late.data(), int64_t(late.size()), true, pre.data(),
                            e.data(), acc.data());
        for (int64_t j = 0; j < T; ++j) ASSERT_NEAR(acc[size_t(j)], ref[size_t(j)], 1e-6 * ref[size_t(j)] + 1e-300) << "level " << level << " slot " << j;
        EXPECT_EQ(std::memcmp(acc.data(), unfused.data(), nT * sizeof(double)), 0) << "level " << level << ": not the unfused passes' bits";
        if (first_level.empty()) first_level = acc;
        else EXPECT_EQ(std::memcmp(acc.data(), first_level.data(), nT * sizeof(double)), 0) << "level " << level;
    }
}

// The logits scale Q Kt at every level against the f64 dot products (fused multiply-adds or not: the
// last bits may differ, nothing more). M, T: full tiles and both kinds of leftover.
TEST(FinchMath, LogitsEqualTheF64DotProductsAtEveryLevel) {
    const int64_t D = 64, ldk = 61;
    std::mt19937 rng(5);
    std::normal_distribution<double> nd(0.0, 1.0);
    for (int64_t M : {16, 13}) {
        const int64_t T = 57;
        std::vector<double> Q(size_t(M * D));
        std::vector<float> Kt(size_t(D * ldk));
        for (double& x : Q) x = nd(rng);
        for (float& x : Kt) x = float(nd(rng));
        for (int level = 2; level <= 4; ++level) {
            std::vector<double> C(size_t(M * T), NAN);
            finch_logits_at(level, M, T, D, Q.data(), Kt.data(), ldk, 0.125, C.data());
            for (int64_t i = 0; i < M; ++i)
                for (int64_t j = 0; j < T; ++j) {
                    double ref = 0, mag = 0;
                    for (int64_t d = 0; d < D; ++d) ref += Q[size_t(i * D + d)] * double(Kt[size_t(d * ldk + j)]), mag += std::fabs(Q[size_t(i * D + d)] * double(Kt[size_t(d * ldk + j)]));
                    ASSERT_NEAR(C[size_t(i * T + j)], 0.125 * ref, 1e-14 * mag) << "level " << level << " row " << i << " column " << j;
                }
        }
    }
}

}  // namespace
}  // namespace kv::test
