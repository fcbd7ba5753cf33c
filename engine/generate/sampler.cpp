// Token sampling (see sampler.h).
#include "sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace kv {

int32_t argmax(const float* z, int64_t V) { return int32_t(std::max_element(z, z + V) - z); }

Candidates sampling_candidates(const float* z, int64_t V, const SamplingParams& p) {
    std::vector<int32_t> idx((size_t)V);
    std::iota(idx.begin(), idx.end(), 0);
    // Descending logit; ties by the lower id so results do not depend on sort internals.
    auto better = [z](int32_t a, int32_t b) { return z[a] > z[b] || (z[a] == z[b] && a < b); };
    int64_t keep = V;
    if (p.top_k > 0 && p.top_k < V) {
        keep = p.top_k;
        std::partial_sort(idx.begin(), idx.begin() + keep, idx.end(), better);
    } else {
        std::sort(idx.begin(), idx.end(), better);
    }
    idx.resize(size_t(keep));
    const double t = p.temperature > 0 ? p.temperature : 1.0;
    const double m = double(z[idx[0]]) / t;
    std::vector<double> pr(idx.size());
    double s = 0;
    for (size_t i = 0; i < idx.size(); ++i) s += (pr[i] = std::exp(double(z[idx[i]]) / t - m));
    for (auto& x : pr) x /= s;
    if (p.top_p < 1.0) {
        // smallest prefix (in descending probability) whose mass reaches top_p
        double mass = 0;
        size_t n = 0;
        while (n < pr.size()) {
            mass += pr[n++];
            if (mass >= p.top_p) break;
        }
        idx.resize(std::max<size_t>(n, 1));
        pr.resize(idx.size());
        double s2 = 0;
        for (double x : pr) s2 += x;
        for (auto& x : pr) x /= s2;
    }
    return {idx, pr};
}

int32_t sample_token(const float* z, int64_t V, const SamplingParams& p, std::mt19937_64& rng) {
    if (p.temperature <= 0) return argmax(z, V);
    Candidates c = sampling_candidates(z, V, p);
    double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng), acc = 0;
    for (size_t i = 0; i < c.ids.size(); ++i) {
        acc += c.probs[i];
        if (u < acc) return c.ids[i];
    }
    return c.ids.back();
}

}  // namespace kv
