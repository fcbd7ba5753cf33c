// DuoAttention gates (docs/POLICIES.md#duo): one value in [0, 1] per KV head of a model, written
// by `kvlab calibrate duo` and read by the `duo` policy (--kv_cache.duo_gates). The file is
// text, versioned, small (layers x kv_heads numbers):
//
//   kvlab-duo-gates 1
//   model tiny
//   layers 2
//   kv_heads 2
//   sink 4
//   recent 16
//   gates
//   0.981 0.004
//   0.012 0.997
//
// `sink`/`recent` record the streaming mask the calibration used (informational: the policy's
// own options decide at run time). Lines starting with '#' are comments.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kv {

struct DuoGates {
    std::string model;           // informational
    int64_t layers = 0, kv_heads = 0;
    int64_t sink = 0, recent = 0;  // the calibration's streaming mask
    std::vector<double> gates;   // (layers, kv_heads) row-major, each in [0, 1]
};

constexpr int kDuoGatesVersion = 1;

// Throws kv::Error naming the file and what was wrong (missing, not a gate file, newer
// version, bad number, wrong count) and what was expected.
DuoGates read_duo_gates(const std::string& path);
void write_duo_gates(const std::string& path, const DuoGates& g);
std::string format_duo_gates(const DuoGates& g);
DuoGates parse_duo_gates(const std::string& text, const std::string& what);

// The gates of --kv_cache.duo_gates for a model of `layers` x `kv_heads`: a gate file, or (for
// tests and demos) "pattern:BITS", BITS a string of 0/1 cycled over the heads in (layer, head)
// order ("pattern:1": every head a retrieval head). Throws naming the option when the file does
// not match the model's shape.
DuoGates duo_gates_for_model(const std::string& option, int64_t layers, int64_t kv_heads);

// 1 = retrieval head, per (layer, head). sparsity < 0: gate >= threshold; else the paper's
// sparsity option: the round(sparsity * N) lowest gates over the whole model are streaming
// heads (ties: the later head in (layer, head) order is the streaming one).
std::vector<uint8_t> duo_retrieval_heads(const DuoGates& g, double threshold, double sparsity);

}  // namespace kv
