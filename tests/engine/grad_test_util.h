// Helpers for the gradient tests: small f64/f32 models with random weights, random token
// data with next-token targets, central finite differences of the replayed loss.
#pragma once

#include <functional>
#include <random>
#include <vector>

#include "engine/driver/chunk_plan.h"
#include "engine/driver/head_model.h"
#include "engine/grad/gradient_pipeline.h"
#include "engine/kv/kv_cache.h"
#include "engine/model/presets.h"
#include "engine/model/transformer.h"

namespace kv::test {

// A Llama-style model small enough for finite differences (E 32, 3 layers, GQA 4/2, HS 8).
ModelConfig grad_test_config(const std::string& arch = "llama", int64_t layers = 3);
std::unique_ptr<Transformer> grad_test_model(const ModelConfig& cfg, DType dtype, uint64_t seed);

struct GradData {
    Tensor ids;  // (B, T) int32
    HeadSpec head;
};
// Random ids; targets = next token, with a few positions ignored (-100).
GradData grad_test_data(const ModelConfig& cfg, int64_t B, int64_t T, uint64_t seed);

ChunkPlan grad_test_plan(const ModelConfig& cfg, int64_t T, int64_t L, int64_t chunk, double multiplier = 1.0);

// Element i of a contiguous CPU f64/f32 tensor, as a reference to change in place.
double get_elem(const Tensor& t, int64_t i);
void set_elem(Tensor& t, int64_t i, double v);

// Central difference (f(x+h) - f(x-h)) / 2h of `loss` w.r.t. element i of `t`.
double central_difference(Tensor& t, int64_t i, double h, const std::function<double()>& loss);

}  // namespace kv::test
