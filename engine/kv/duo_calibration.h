// DuoAttention calibration (Xiao et al., ICLR 2025, §3.2): every KV head's attention output is
// mixed, y = alpha * full + (1 - alpha) * streaming (sinks + recent mask), alpha per KV head in
// [0, 1], and the alphas are trained to keep the model's final hidden states (after the final
// norm) close to the full-attention model's on synthetic retrieval data, with an L1 penalty
// pushing heads toward streaming:
//   loss = mean_{b, supervised t, e} (h_mix - h_full)^2 + lambda * mean_g alpha_g
// The model is frozen; gradients come from the model's own block backward with the mixed
// attention op below as its attention. The trained alphas are the gates of the `duo` policy
// (engine/kv/policies/duo_gates.h). docs/POLICIES.md#duo.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/core/tensor.h"
#include "engine/kv/calibration_registry.h"
#include "engine/model/transformer.h"
#include "engine/model/transformer_backward.h"

namespace kv {

// ---- the mixed attention op ----------------------------------------------------------------
// One chunk from position 0 (a whole calibration sequence). q (B, NH, n, HS), k/v (B, G, n, HS)
// (any float dtype, computed in the tensors' dtype for the full part and f64 for the streaming
// part); alpha (G). Streaming: key j visible to query i iff j <= i and (j < sink or
// j > i - recent). y (B, NH, n, HS) = alpha_g * full + (1 - alpha_g) * streaming, g = h / (NH/G).
struct MixedAttentionSaved {
    Tensor full;                 // (B, NH, n, HS) full-attention output
    std::vector<double> stream;  // (B, NH, n, HS) streaming output
};
void mixed_attention_forward(Tensor& y, const Tensor& q, const Tensor& k, const Tensor& v, const std::vector<double>& alpha,
                             float scale, int64_t sink, int64_t recent, MixedAttentionSaved* save = nullptr);
// dq (B, NH, n, HS), dk, dv (B, G, n, HS) (overwritten) and dalpha (G, added to) given dy.
void mixed_attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, std::vector<double>& dalpha, const Tensor& q, const Tensor& k,
                              const Tensor& v, const std::vector<double>& alpha, float scale, int64_t sink, int64_t recent,
                              const MixedAttentionSaved& saved, const Tensor& dy);

// ---- calibration ---------------------------------------------------------------------------
struct DuoCalibrationConfig {
    int64_t sink = 64, recent = 256;   // the paper's streaming mask
    int64_t steps = 100;
    double lr = 0.02;                  // the paper's Adam learning rate
    double reg = 0.05;                 // lambda of the L1 term
    int64_t supervised = 32;           // last positions of each sample whose hidden states count
    double init = 1.0;                 // every head starts as a retrieval head (the paper's init)
};

struct DuoCalibrationStep {
    int64_t step = 0, steps = 0;
    double loss = 0, distance = 0;     // total and the hidden-state part
};

// Calibrates the gates of `model` on the samples (token ids, each at least `supervised` long),
// one sample per step, cycling. Returns alpha (layers, kv_heads) row-major in [0, 1].
std::vector<double> calibrate_duo(const Transformer& model, const std::vector<std::vector<int32_t>>& samples,
                                  const DuoCalibrationConfig& cfg,
                                  const std::function<void(const DuoCalibrationStep&)>& progress = {});

// The loss and d loss / d alpha of one sample at given alphas (the calibration's step; also the
// FD test's subject).
double duo_calibration_loss(const Transformer& model, const std::vector<int32_t>& ids, const std::vector<double>& alpha,
                            const DuoCalibrationConfig& cfg, std::vector<double>* dalpha, double* distance = nullptr);

// `kvlab calibrate duo`: calibrates with the run's options (steps, lr, reg, sink, recent,
// supervised), writes the gate file and returns the highest gates, highest first.
std::string run_duo_calibration(const CalibrationRun& run);

}  // namespace kv
