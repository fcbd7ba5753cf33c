// The f32 activation formulas of kernels/common/element_math.h against their definitions in
// f64, written here: tanh (std::tanh in double), SiLU x / (1 + e^-x) and transformers' GELU
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), over a dense sweep of [-20, 20] (every
// regime: tanh's interpolant, its small-x branch and its clamp; exp's saturation) and the
// special values. The kernels (every CPU variant) are checked against cpu/ref/ by the op cases.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kernels/common/element_math.h"

namespace kv {
namespace {

// 0.5 (1 + tanh(u)) as e^u / (e^u + e^-u): the same value without 1 + tanh(u) cancelling in f64
// for u < -18 (which would make the reference, not the f32 formula, wrong there).
double gelu_tanh_f64(double x) {
    const double u = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
    return x * std::exp(u) / (std::exp(u) + std::exp(-u));
}

// Worst of |f(x) - ref(x)| / (|ref(x)| tol(x)) on a dense grid of [-20, 20] and a geometric
// grid toward 0 from both sides; |ref| below `floor` counts as `floor` (exp's f32 saturation).
// Below 1 passes.
template <class F, class R, class T>
double worst(F f, R ref, T tol, double floor, double* at) {
    double w = 0;
    auto check = [&](float x) {
        const double r = ref(double(x)), e = std::fabs(double(f(x)) - r) / (std::max(std::fabs(r), floor) * tol(double(x)));
        if (e > w) w = e, *at = x;
    };
    for (int i = -2000000; i <= 2000000; ++i) check(float(i * 1e-5));
    for (float x = 1e-30f; x < 1e-2f; x *= 1.01f) check(x), check(-x);
    return w;
}

TEST(ElementMath, TanhInterpolantIsWithinFewUlpOfF64Tanh) {
    double at = 0;
    // Eigen's bound for the interpolant: a few ulp (2.8e-7 measured with FMA, 4e-7 without).
    const double w = worst([](float x) { return kv_tanhf_poly(x); }, [](double x) { return std::tanh(x); }, [](double) { return 5e-7; },
                           1e-300, &at);
    EXPECT_LT(w, 1.0) << "worst at x = " << at;
    EXPECT_EQ(kv_tanhf_poly(0.0f), 0.0f);
    EXPECT_EQ(kv_tanhf_poly(3e-4f), 3e-4f);  // tanh(x) = x in f32 below 4e-4
    EXPECT_EQ(kv_tanhf_poly(std::numeric_limits<float>::infinity()), 1.0f);
    EXPECT_EQ(kv_tanhf_poly(-std::numeric_limits<float>::infinity()), -1.0f);
    EXPECT_EQ(kv_tanhf_poly(1e30f), 1.0f);
    EXPECT_TRUE(std::isnan(kv_tanhf_poly(std::numeric_limits<float>::quiet_NaN())));
    for (float x : {0.01f, 0.5f, 2.0f, 7.0f}) EXPECT_EQ(kv_tanhf_poly(-x), -kv_tanhf_poly(x));
    // Never beyond +-1, and monotone up to its error bound (p / q wiggles by a few ulp near the
    // clamp): soft-capping keeps the order of scores whose tanh differ by more than that.
    float prev = kv_tanhf_poly(-10.0f);
    for (int i = -100000; i <= 100000; ++i) {
        const float t = kv_tanhf_poly(float(i * 1e-4));
        ASSERT_LE(std::fabs(t), 1.0f) << "at x = " << i * 1e-4;
        ASSERT_GE(t, prev - 5e-7f) << "at x = " << i * 1e-4;
        prev = t;
    }
}

TEST(ElementMath, SiluAndGeluTanhMatchTheirF64Definitions) {
    double at = 0;
    // Relative 1e-6 (a few f32 ulp through exp and one division); results below 1e-30 (exp
    // saturating) count as absolute error against 1e-30.
    const auto flat = [](double) { return 1e-6; };
    const double silu = worst([](float x) { return kv_silu(x); }, [](double x) { return x / (1.0 + std::exp(-x)); }, flat, 1e-30, &at);
    EXPECT_LT(silu, 1.0) << "SiLU worst at x = " << at;
    const double sig = worst([](float x) { return kv_sigmoid(x); }, [](double x) { return 1.0 / (1.0 + std::exp(-x)); }, flat, 1e-30, &at);
    EXPECT_LT(sig, 1.0) << "sigmoid worst at x = " << at;
    // GELU's exponent u = sqrt(2/pi) (x + 0.044715 x^3) is rounded to f32 before exp, which turns
    // its relative rounding into a relative error of |u| ulp in e^u: the bound grows with |u|
    // (|u| = 35 at x = -9; measured 1.3e-5 there, under 2.2e-7 for |x| < 1).
    const auto by_u = [](double x) { return 1e-6 * (1.0 + std::fabs(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); };
    const double gelu = worst([](float x) { return kv_gelu_tanh(x); }, gelu_tanh_f64, by_u, 1e-30, &at);
    EXPECT_LT(gelu, 1.0) << "GELU-tanh worst at x = " << at;
}

}  // namespace
}  // namespace kv
