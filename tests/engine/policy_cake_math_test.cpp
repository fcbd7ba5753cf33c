// cake's window math (engine/kv/policies/policy_cake_math.h): every ISA level this CPU runs gives
// the same bits, and they are the softmax and moments of cake's definition in plain f64.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "engine/kv/policies/policy_cake_math.h"

namespace kv::test {
namespace {

TEST(CakeMath, EveryLevelGivesTheSameBitsAsTheF64Definition) {
    const int64_t R = 2, q = 3, T = 37, q0 = 30;  // T: vector blocks and a tail
    const float scale = 0.35f;
    const double gamma = 200.0;
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-4.0f, 4.0f);
    std::vector<float> logits(static_cast<size_t>(R * q * T));
    for (float& x : logits) x = u(rng);
    std::vector<int32_t> pos(static_cast<size_t>(T));
    for (int64_t j = 0; j < T; ++j) pos[size_t(j)] = int32_t((j * 17) % T);  // slot order is not position order
    pos[5] = -1;                                                             // an empty slot
    // reference: softmax over the slots each query sees, then mean + gamma var, entropy, variance
    std::vector<double> ra(static_cast<size_t>(R * q * T), 0.0), ru(static_cast<size_t>(T), 0.0);
    double rH = 0, rV = 0;
    for (int64_t m = 0; m < R * q; ++m) {
        const int64_t qp = q0 + m % q;
        double mx = -INFINITY, z = 0;
        for (int64_t j = 0; j < T; ++j)
            if (pos[size_t(j)] >= 0 && pos[size_t(j)] <= qp) mx = std::max(mx, double(scale) * logits[size_t(m * T + j)]);
        for (int64_t j = 0; j < T; ++j)
            if (pos[size_t(j)] >= 0 && pos[size_t(j)] <= qp) z += std::exp(double(scale) * logits[size_t(m * T + j)] - mx);
        for (int64_t j = 0; j < T; ++j)
            if (pos[size_t(j)] >= 0 && pos[size_t(j)] <= qp) ra[size_t(m * T + j)] = std::exp(double(scale) * logits[size_t(m * T + j)] - mx) / z;
    }
    for (int64_t h = 0; h < R; ++h)
        for (int64_t j = 0; j < T; ++j) {
            double mean = 0, var = 0;
            for (int64_t i = 0; i < q; ++i) mean += ra[size_t((h * q + i) * T + j)] / double(q);
            for (int64_t i = 0; i < q; ++i) var += std::pow(ra[size_t((h * q + i) * T + j)] - mean, 2) / double(q - 1);
            ru[size_t(j)] += (mean + gamma * var) / double(R);
            if (pos[size_t(j)] < q0) {
                rV += var;
                for (int64_t i = 0; i < q; ++i) rH -= ra[size_t((h * q + i) * T + j)] * std::log(ra[size_t((h * q + i) * T + j)] + 1e-10);
            }
        }
    std::vector<double> a0, u0;
    double H0 = 0, V0 = 0;
    for (int level = 2; level <= 4; ++level) {
        const size_t nT = size_t(T), nA = size_t(R * q * T);
        std::vector<double> xs(nT), a(nA), s1(nT), s2(nT), mean(nT), uu(nT);
        double H = 0, V = 0;
        cake_window_softmax(level, logits.data(), R * q, q, T, pos.data(), q0, scale, xs.data(), a.data());
        cake_window_moments(level, a.data(), R, q, T, pos.data(), q0, gamma, true, s1.data(), s2.data(), mean.data(), uu.data(), H, V);
        for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], ra[i], 1e-14) << "level " << level << " weight " << i;
        for (size_t j = 0; j < uu.size(); ++j) ASSERT_NEAR(uu[j], ru[j], 1e-12 * (1 + std::fabs(ru[j]))) << "level " << level << " slot " << j;
        EXPECT_NEAR(H, rH, 1e-12 * std::fabs(rH));
        EXPECT_NEAR(V, rV, 1e-12 * std::fabs(rV));
        if (level == 2) {
            a0 = a, u0 = uu, H0 = H, V0 = V;
            continue;
        }
        EXPECT_EQ(std::memcmp(a.data(), a0.data(), a.size() * sizeof(double)), 0) << "level " << level;
        EXPECT_EQ(std::memcmp(uu.data(), u0.data(), uu.size() * sizeof(double)), 0) << "level " << level;
        EXPECT_EQ(H, H0);
        EXPECT_EQ(V, V0);
    }
}

}  // namespace
}  // namespace kv::test
