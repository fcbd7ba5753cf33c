// Gradient clipping by the global L2 norm (PyTorch's torch.nn.utils.clip_grad_norm_ with
// norm_type 2): total = sqrt(sum over every gradient element of g^2); when max_norm > 0 every
// gradient is multiplied by min(1, max_norm / (total + 1e-6)). The norm is accumulated in f64.
// Only gradients are touched; parameters and optimizer state are not.
#pragma once

#include <vector>

#include "engine/core/tensor.h"

namespace kv {

// sqrt(sum of squares) over all the tensors (any float dtypes, any devices).
double grad_global_norm(const std::vector<const Tensor*>& grads);

// Clips in place; returns the norm before clipping (what PyTorch returns and logs report).
// max_norm <= 0 only measures. A non-finite norm leaves the gradients unchanged.
double clip_grad_norm_(const std::vector<Tensor*>& grads, double max_norm);

}  // namespace kv
