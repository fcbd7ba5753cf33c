// Helpers for KV-cache tests: drive one LayerCache with random q/k/v chunk by chunk while
// keeping every inserted k/v by token position, so tests can check buffers and positions
// against what really went in.
#pragma once

#include <map>
#include <random>
#include <vector>

#include "engine/kv/kv_cache.h"
#include "engine/core/model_config.h"
#include "tests/support/test_support.h"

namespace kv::test {

// One layer's activations to feed in place of random ones (a real model's, captured once):
// q (B, NH, T, D), k and v (B, G, T, D) for positions 0 .. T - 1, post-RoPE as attend() gets them.
struct LayerActivations {
    int64_t B = 0, G = 0, NH = 0, D = 0, T = 0;
    std::vector<float> q, k, v;
};

struct LayerHarness {
    int64_t B = 2, G = 2, NH = 4, D = 16, L = 24;
    KVCacheConfig cfg;
    ModelConfig model;
    std::unique_ptr<KVCache> cache;
    std::mt19937_64 rng;
    // history[(b*G+g)][pos] = (k row, v row)
    std::vector<std::map<int64_t, std::pair<std::vector<float>, std::vector<float>>>> history;
    std::vector<Tensor> last_q, last_k, last_v;  // the most recent chunk
    // The chunk's attention input (B, n, NH * D) handed to the cache before each call (policies
    // that read hidden states, kvzap), from a stream of its own so the q/k/v draws stay as they were.
    std::mt19937_64 hidden_rng{0x6b767a6170ull};
    Tensor last_h;
    std::vector<std::map<int64_t, std::vector<float>>> hidden_history;  // [b][position] = its E values
    std::vector<std::pair<int64_t, Tensor>> all_q;  // every chunk's (input position, q)
    int64_t P = 0;

    const LayerActivations* given = nullptr;  // set: step() feeds these instead of random values

    LayerHarness(const std::string& name, int64_t L_, uint64_t seed, int64_t grace = 0, int64_t D_ = 16);
    // The shape of `acts` (which must outlive the harness); step(n) feeds its positions [P, P + n).
    LayerHarness(const std::string& name, int64_t L_, const LayerActivations& acts);
    // One call of n tokens; returns y (B, NH, n, D).
    Tensor step(int64_t n);
    LayerCache& layer() { return cache->layer(0); }

   private:
    void build(const std::string& name, int64_t grace);
};

// A byte-level text codec (ids 0..255 are bytes) for policies that read the prompt.
const TextCodec& byte_codec();
// The options a registered policy requires (PolicyInfo::required) applied to cfg.
void apply_required_options(KVCacheConfig& cfg);
// A policy of cache `name` ("{policy}-{buffer}") with L slots, 2 KV heads, its required options.
std::unique_ptr<KVPolicy> make_test_policy(const std::string& name, int64_t L);

// Max |k - hist| allowed for a stored row of a buffer format, from the row's own range.
double buffer_tolerance(const std::string& buffer, const std::vector<float>& row_all_heads, const std::vector<float>& head_row);

// Ada-KV's eviction rule as kvpress' AdaKVPress states it, in f64: the G n pool slots (sorted)
// of one batch row evicted before tokens P .. P + n - 1, given the heads' scores sc (G, S) and
// positions pos (G, S) (-1: another head's slot), grace period and safeguard alpha.
std::vector<int32_t> ada_reference(int64_t G, int64_t S, int64_t L, const std::vector<double>& sc, const std::vector<int32_t>& pos,
                                   int64_t n, int64_t P, int64_t grace, double alpha);

// Every query the harness fed at positions >= sink, per (b, query head) (index b * NH + h), rotated
// back to before RoPE (angle -p theta_i on the pairs (i, i + D/2)), in f64: what expected-attention
// keeps statistics of.
std::vector<std::vector<std::vector<double>>> prerope_queries(const LayerHarness& h, const std::vector<double>& theta, int64_t sink);

// Expected-attention's moments of a future query, in f64: the mean mu and population covariance C
// of one head's pre-RoPE queries Q (each of D values), moved by the mean rotation Rb over the next F
// positions from Pa (angle p theta_i on the pairs (i, i + D/2)): mean' = Rb mu, cov' = Rb C Rb^T
// (row-major D x D).
struct FutureQueryMoments {
    std::vector<double> mean, cov;
};
FutureQueryMoments future_query_moments(const std::vector<std::vector<double>>& Q, const std::vector<double>& theta, int64_t Pa, int64_t F,
                                        int64_t D);

// SDPA in f64 of queries q (B, NH, n, D) over a decoded cache k, v (B, G, T, D), every key
// visible, query head h reading KV head h / (NH / G): the reference buffer tests hold
// ops::sdpa_ to. Returns (B, NH, n, D).
std::vector<double> sdpa_f64(const std::vector<float>& q, const std::vector<double>& k, const std::vector<double>& v, int64_t B, int64_t NH,
                             int64_t G, int64_t n, int64_t T, int64_t D, double scale);

}  // namespace kv::test
