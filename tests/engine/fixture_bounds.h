// The f32 logits bound of a model fixture (tests/fixtures/models/NAME), as a fraction of max
// |logit|: 1e-5, the rounding of f32 sums over a few hundred terms, for every family but one.
//
// Gemma 3n's random tiny decoder amplifies rounding about a hundredfold (one f32 rounding of its
// keys alone moves the logits by several 1e-6: tools/reference/gemma3n_sensitivity.py), so an
// f32 forward's error is a draw whose size depends on the order of every sum, not a measure of
// different math (its f64 forward is pinned within 3e-7 by ModelFixtureF64). On one Intel Xeon
// (2026-12-02) the fixture's worst input was 1.20e-5 off with the AVX-512 kernels, 4.8e-6 with
// AVX2's and 4.3e-6 with the baseline's, whole and in chunks of 1, 7 and 32; accumulating only
// RMSNorm's sums in f64 moved AVX2's to 9.6e-6, and taking only RMSNorm's or only SDPA's kernel
// from AVX-512 moved it to 9.2e-6 and 8.4e-6. 3e-5 is 2.5x the largest seen.
#pragma once

#include <string>

namespace kv::test {

inline double f32_fixture_tol(const std::string& fixture) { return fixture == "gemma3n_text" ? 3e-5 : 1e-5; }

}  // namespace kv::test
