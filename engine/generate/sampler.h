// Choosing the next token from a row of logits (LitGPT's sample, with one deliberate fix):
// top-k keeps the k best; temperature divides the logits; top-p keeps the smallest set of
// most probable tokens whose mass reaches p; then a seeded multinomial draw. Temperature 0 is
// greedy (LitGPT would still sample with top_p = 1; we do not).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace kv {

struct SamplingParams {
    double temperature = 0.8;
    int64_t top_k = 50;    // 0: off
    double top_p = 1.0;    // 1: off
};

// Indices of the candidates that survive top-k / top-p (for tests and the UI), sorted by
// descending probability, and their renormalised probabilities.
struct Candidates {
    std::vector<int32_t> ids;
    std::vector<double> probs;
};
Candidates sampling_candidates(const float* logits, int64_t V, const SamplingParams& p);

int32_t argmax(const float* logits, int64_t V);
int32_t sample_token(const float* logits, int64_t V, const SamplingParams& p, std::mt19937_64& rng);

}  // namespace kv
