// The optimizer of a training run (reference §10.3): PyTorch's torch.optim update rules for
// AdamW (default), Adam, Adamax, SGD (momentum, dampening, nesterov), RMSprop and Adadelta over
// a list of named parameters. The per-element math is the OPTIMIZER_STEP op
// (kernels/common/optim_math.h); this file owns the parameter list, the state tensors (named
// "<param>.<PyTorch state key>", so a run saves and resumes them) and the step counter.
// It never computes or clips gradients, and it never chooses the learning rate (lr_schedule.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/tensor.h"
#include "engine/core/model_config.h"
#include "kernels/common/op.h"

namespace kv {

struct TrainConfig;

// Hyperparameters (PyTorch's names and defaults; lr is the peak, the schedule scales it).
struct OptimizerConfig {
    OptimKind kind = OptimKind::ADAMW;
    double lr = 1e-3;
    double weight_decay = 0.0;  // decoupled for AdamW, L2 (added to the gradient) for the others
    double beta1 = 0.9, beta2 = 0.999;  // Adam, AdamW, Adamax
    double eps = 1e-8;                  // all but SGD
    double momentum = 0.0;              // SGD, RMSprop
    double dampening = 0.0;             // SGD
    bool nesterov = false;              // SGD
    double alpha = 0.99;                // RMSprop smoothing
    double rho = 0.9;                   // Adadelta
};

// "AdamW", "adamw", ... -> kind; throws kv::Error listing the names.
OptimKind optimizer_kind_from_name(const std::string& name);
// The run options (--optimizer, --train.lr, --train.weight_decay, ...).
OptimizerConfig optimizer_config_from_train(const TrainConfig& t);

// PyTorch's state keys of one parameter, in OPTIMIZER_STEP's slot order (dst2, dst3):
// AdamW/Adam {exp_avg, exp_avg_sq}, Adamax {exp_avg, exp_inf}, SGD {momentum_buffer} (when
// momentum != 0), RMSprop {square_avg, momentum_buffer} (the buffer when momentum > 0),
// Adadelta {square_avg, acc_delta}.
std::vector<std::string> optimizer_state_keys(const OptimizerConfig& cfg);

// One trainable tensor and its gradient (both owned elsewhere; updated in place).
struct OptimizerParam {
    std::string name;      // e.g. "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    Tensor* param = nullptr;
    Tensor* grad = nullptr;  // same shape as param
};

class Optimizer {
   public:
    // State tensors (zeros, f32; f64 for f64 params) are allocated on each parameter's device
    // in the optimizer memory category. Throws kv::Error for duplicate names or shape mismatches.
    Optimizer(const OptimizerConfig& cfg, std::vector<OptimizerParam> params);

    // One update of every parameter with learning rate `lr` (the schedule's value for this
    // step); the step counter t advances first (bias corrections use t >= 1).
    void step(double lr);
    // Sets every gradient to zero.
    void zero_grad();

    const OptimizerConfig& config() const { return cfg_; }
    const std::vector<OptimizerParam>& params() const { return params_; }
    int64_t steps_taken() const { return t_; }
    size_t state_bytes() const;
    size_t param_bytes() const;

    // The state as "<param name>.<key>" tensors (views of the live state, not copies).
    TensorMap state_dict() const;
    // Restores a state saved by state_dict() after `steps_taken` steps. Every tensor must be
    // present with its shape; throws kv::Error naming the first missing or mis-shaped one.
    void load_state_dict(const TensorMap& state, int64_t steps_taken);

   private:
    OptimizerConfig cfg_;
    std::vector<OptimizerParam> params_;
    std::vector<std::vector<Tensor>> state_;  // per param, optimizer_state_keys() order
    int64_t t_ = 0;
};

}  // namespace kv
