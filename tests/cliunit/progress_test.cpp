// The progress bar's ETA (app/cli/progress.h): none until the estimate is stable, then the
// remaining work at the observed rate.
#include <gtest/gtest.h>

#include "app/cli/progress.h"

namespace kv::cli {
namespace {

TEST(EtaEstimator, NoneBeforeTwoSecondsOrFivePercent) {
    EtaEstimator e;
    EXPECT_LT(e.update(0.5, 10, 100), 0);   // 10% but too early
    EXPECT_LT(e.update(1.9, 40, 100), 0);
    EtaEstimator f;
    EXPECT_LT(f.update(5.0, 4, 100), 0);    // late but only 4%
    EXPECT_LT(f.update(10.0, 4, 100), 0);
}

TEST(EtaEstimator, SteadyRateGivesRemainingOverRate) {
    // 30 units per second of 1000: after the first estimate, the next agrees with it.
    EtaEstimator e;
    EXPECT_LT(e.update(2.0, 60, 1000), 0);  // one estimate alone is not yet stable
    EXPECT_NEAR(e.update(3.0, 90, 1000), (1000 - 90) / 30.0, 1e-9);
    EXPECT_NEAR(e.update(20.0, 600, 1000), (1000 - 600) / 30.0, 1e-9);  // stays shown
}

TEST(EtaEstimator, NoneWhileTheRateJumps) {
    // A fast start (cached work) then a slow rate: estimates disagree, so none is shown.
    EtaEstimator e;
    EXPECT_LT(e.update(2.0, 100, 1000), 0);   // says 18 s
    EXPECT_LT(e.update(3.0, 110, 1000), 0);   // says 24 s, not 17
    EXPECT_LT(e.update(4.0, 120, 1000), 0);   // says 29 s, not 23
}

TEST(EtaEstimator, NoneWhenDone) {
    EtaEstimator e;
    EXPECT_LT(e.update(10.0, 100, 100), 0);
}

}  // namespace
}  // namespace kv::cli
