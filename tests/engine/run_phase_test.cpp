// Run phases: exclusive per-thread clocks (an inner phase pauses the outer one), and the open
// phase counted until now, checked against steady-clock times taken around the scopes.
#include "engine/telemetry/run_phase.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace kv {
namespace {

double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
}

TEST(RunPhase, AnInnerPhasePausesTheOuterOnesClock) {
    using clock = std::chrono::steady_clock;
    const PhaseSeconds s0 = PhaseScope::thread_seconds();
    const auto w0 = clock::now();
    clock::time_point w1, w2;
    {
        PhaseScope outer(RunPhase::POLICY_PASS);
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        w1 = clock::now();
        {
            PhaseScope inner(RunPhase::FIDELITY_REFERENCE);
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        w2 = clock::now();
    }
    const auto w3 = clock::now();
    const PhaseSeconds d = phase_seconds_since(s0, PhaseScope::thread_seconds());
    const double inner = d[size_t(RunPhase::FIDELITY_REFERENCE)], outer = d[size_t(RunPhase::POLICY_PASS)];
    EXPECT_GE(inner, 0.020);
    EXPECT_LE(inner, seconds_between(w1, w2));
    EXPECT_GE(outer, 0.005);
    // Exclusive: the outer phase's clock leaves the inner one's 20 ms out.
    EXPECT_LE(outer, seconds_between(w0, w3) - inner + 1e-9);
    EXPECT_NEAR(inner + outer, seconds_between(w0, w3), seconds_between(w0, w3) * 0.5);
    for (size_t p = 0; p < kNumRunPhases; ++p) {
        if (p != size_t(RunPhase::FIDELITY_REFERENCE) && p != size_t(RunPhase::POLICY_PASS)) {
            EXPECT_EQ(d[p], 0.0) << run_phase_name(RunPhase(p));
        }
    }
}

TEST(RunPhase, TheOpenPhaseCountsUntilNow) {
    const PhaseSeconds s0 = PhaseScope::thread_seconds();
    PhaseScope open(RunPhase::FINISH);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const PhaseSeconds d = phase_seconds_since(s0, PhaseScope::thread_seconds());
    EXPECT_GE(d[size_t(RunPhase::FINISH)], 0.010) << "the open phase's running time is part of 'so far'";
}

TEST(RunPhase, NamesAndInstrumentation) {
    EXPECT_STREQ(run_phase_name(RunPhase::FINISH), "finish");
    EXPECT_STREQ(run_phase_name(RunPhase::POLICY_PASS), "policy pass");
    EXPECT_FALSE(run_phase_is_instrumentation(RunPhase::FINISH)) << "releasing the model is the run's own time";
    EXPECT_TRUE(run_phase_is_instrumentation(RunPhase::TELEMETRY));
    EXPECT_TRUE(run_phase_is_instrumentation(RunPhase::KL_HEADS));
}

}  // namespace
}  // namespace kv
