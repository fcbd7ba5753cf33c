// KVzap's surrogate (docs/POLICIES.md#kvzap): per (layer, KV head) a linear map from a token's
// hidden state at the layer's attention input (after the attention norm, E values) to the log of
// the KVzip score the token would get, pred = w . h + b. Written by `kvlab calibrate kvzap`
// (engine/kv/kvzap_calibration.h) and read by the `kvzap` policy (--kv_cache.kvzap). The file is
// text in the calibration-file framing (calibration_file.h), one row of E + 1 numbers per
// (layer, KV head), the weights then the bias:
//
//   kvlab-kvzap 1
//   model tiny
//   layers 2
//   kv_heads 2
//   hidden_size 64
//   tokens 512
//   weights
//   0.01 -0.2 ... 0.3 -7.5      (layer 0, KV head 0: w_0 .. w_63, b)
//   ...
//
// `tokens` records how many (token, layer) samples each layer's fit saw (informational).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kv {

struct KVzapWeights {
    std::string model;  // informational
    int64_t layers = 0, kv_heads = 0, hidden_size = 0;
    int64_t tokens = 0;        // tokens each layer was fitted on (informational)
    int64_t seed = -1;         // "seed:N": pseudo-random rows for tests and demos (no file); w stays empty
    std::vector<double> w;     // (layers, kv_heads, hidden_size + 1) row-major: weights, then the bias
    const double* row(int64_t layer, int64_t head) const { return w.data() + (layer * kv_heads + head) * (hidden_size + 1); }
};

constexpr int kKVzapVersion = 1;

// Throws kv::Error naming the file and what was wrong (missing, not a surrogate file, newer
// version, bad number, wrong count) and what was expected.
KVzapWeights read_kvzap_weights(const std::string& path);
void write_kvzap_weights(const std::string& path, const KVzapWeights& w);
std::string format_kvzap_weights(const KVzapWeights& w);
KVzapWeights parse_kvzap_weights(const std::string& text, const std::string& what);

// The surrogate of --kv_cache.kvzap for a model of `layers` x `kv_heads`: a surrogate file, or
// (for tests and demos) "seed:N", rows drawn from N (seeded_kvzap_row; the hidden size is known
// when the first hidden states arrive). Throws naming the option and the command that makes the
// file when it is missing or made for another model.
KVzapWeights kvzap_weights_for_model(const std::string& option, int64_t layers, int64_t kv_heads);

// "seed:N"'s row of (layer, head) for hidden size E: E + 1 values, weights uniform in
// [-1, 1] / sqrt(E) from a counter hash of (seed, layer, head, index), bias 0.
std::vector<double> seeded_kvzap_row(int64_t seed, int64_t layer, int64_t head, int64_t E);

}  // namespace kv
