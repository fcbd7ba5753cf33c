// The learning-rate schedule (see lr_schedule.h).
#include "lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "engine/run/run_config.h"

namespace kv {

double LrSchedule::lr_at(int64_t step) const {
    if (step < 0) step = 0;
    if (step < warmup) return peak * double(step + 1) / double(warmup);
    const int64_t span = total - warmup;  // T_max of the cosine phase
    if (span <= 0) return peak;
    const double s = double(std::min(step - warmup, span));
    return peak * 0.5 * (1.0 + std::cos(M_PI * s / double(span)));
}

int64_t warmup_steps(const TrainConfig& t, int64_t total_steps) {
    int64_t w = t.lr_warmup_steps >= 0 ? t.lr_warmup_steps : int64_t(std::floor(t.lr_warmup_fraction * double(total_steps)));
    return std::clamp<int64_t>(w, 0, std::max<int64_t>(total_steps, 0));
}

LrSchedule lr_schedule_for(const TrainConfig& t, int64_t total_steps) {
    LrSchedule s;
    s.peak = t.lr;
    s.total = std::max<int64_t>(total_steps, 1);
    s.warmup = warmup_steps(t, s.total);
    return s;
}

}  // namespace kv
