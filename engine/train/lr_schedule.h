// The learning-rate schedule of a training run (reference §10.3): linear warm-up over the first
// W optimizer steps, lr (s + 1) / W at step index s, then cosine annealing to 0 over the
// remaining steps, lr (1 + cos(pi (s - W) / (S - W))) / 2 (PyTorch's CosineAnnealingLR with
// eta_min 0 and T_max = S - W, in closed form). W comes from lr_warmup_steps when >= 0, else
// floor(lr_warmup_fraction * S). Pure arithmetic: no state beyond the three numbers.
#pragma once

#include <cstdint>

namespace kv {

struct TrainConfig;

struct LrSchedule {
    double peak = 1e-3;     // the configured lr
    int64_t warmup = 0;     // W
    int64_t total = 1;      // S, optimizer steps of the whole run

    // lr of the optimizer step with 0-based index `step` (the step-th update).
    double lr_at(int64_t step) const;
};

// W from the run options: lr_warmup_steps when >= 0, else floor(fraction * total), at most total.
int64_t warmup_steps(const TrainConfig& t, int64_t total_steps);
LrSchedule lr_schedule_for(const TrainConfig& t, int64_t total_steps);

}  // namespace kv
