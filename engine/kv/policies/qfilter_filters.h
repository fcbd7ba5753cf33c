// Q-Filters (docs/POLICIES.md#qfilter): one unit vector per (layer, KV head), the main
// direction of that head's post-RoPE queries, written by `kvlab calibrate qfilter` and read by
// the `qfilter` policy (--kv_cache.qfilter). The file is text, versioned, small (layers x
// kv_heads rows of head_dim numbers):
//
//   kvlab-qfilter 1
//   model tiny
//   layers 2
//   kv_heads 2
//   head_dim 4
//   tokens 2048
//   filters
//   0.5 -0.5 0.5 0.5          (layer 0, KV head 0)
//   ...
//
// `tokens` records how many positions the calibration saw (informational). Lines starting with
// '#' are comments.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kv {

struct QFilters {
    std::string model;  // informational
    int64_t layers = 0, kv_heads = 0, head_dim = 0;
    int64_t tokens = 0;           // calibration positions (informational)
    int64_t axis = -1;            // "axis:C": every filter is e_C (no file); filters stays empty
    std::vector<double> filters;  // (layers, kv_heads, head_dim) row-major, unit rows
    const double* filter(int64_t layer, int64_t head) const { return filters.data() + (layer * kv_heads + head) * head_dim; }
};

constexpr int kQFilterVersion = 1;

// Throws kv::Error naming the file and what was wrong (missing, not a filter file, newer
// version, bad number, wrong count) and what was expected.
QFilters read_qfilters(const std::string& path);
void write_qfilters(const std::string& path, const QFilters& f);
std::string format_qfilters(const QFilters& f);
QFilters parse_qfilters(const std::string& text, const std::string& what);

// The filters of --kv_cache.qfilter for a model of `layers` x `kv_heads`: a filter file, or
// (for tests and demos) "axis:C", every head's filter the unit vector of channel C (head_dim
// 0: checked when the keys arrive). Throws naming the option when the file does not match.
QFilters qfilters_for_model(const std::string& option, int64_t layers, int64_t kv_heads);

// The filter of one head from its queries' second-moment matrix C = sum_i q_i q_i^T (D x D,
// f64) and their sum s = sum_i q_i: the top eigenvector of C (= the top right singular vector
// of the query matrix), by power iteration in f64 on C^256 (eight squarings, each rescaled, so
// a small eigen-gap still converges) until the direction moves by less than 1e-15 (1 - |cos|)
// or 10000 steps, signed so that <s, f> >= 0 (the mean query projects positively).
std::vector<double> qfilter_direction(const std::vector<double>& C, const std::vector<double>& s, int64_t D);

}  // namespace kv
