// Gradient clipping by the global norm (see grad_clip.h).
#include "grad_clip.h"

#include <cmath>
#include <map>

#include "engine/ops/ops.h"

namespace kv {

double grad_global_norm(const std::vector<const Tensor*>& grads) {
    // One f64 accumulator per device, summed on the host.
    std::map<std::pair<int, int>, Tensor> acc;
    for (const Tensor* g : grads) {
        if (!g || !g->defined() || g->numel() == 0) continue;
        const Device d = g->device();
        auto key = std::make_pair(int(d.type), d.index);
        auto it = acc.find(key);
        if (it == acc.end()) {
            it = acc.emplace(key, Tensor::zeros({1}, DType::F64, {d, MemCategory::WORKSPACE, "gradient norm"})).first;
        }
        ops::grad_norm_sq_(it->second, *g, true);
    }
    double sq = 0;
    for (auto& [k, t] : acc) sq += t.item();
    return std::sqrt(sq);
}

double clip_grad_norm_(const std::vector<Tensor*>& grads, double max_norm) {
    std::vector<const Tensor*> c(grads.begin(), grads.end());
    const double total = grad_global_norm(c);
    if (max_norm <= 0 || !std::isfinite(total)) return total;
    // PyTorch: clip_coef = max_norm / (total + 1e-6), clamped to 1 and applied as a multiply
    // (a factor of exactly 1 changes nothing, so skip the pass).
    const double coef = max_norm / (total + 1e-6);
    if (coef >= 1.0) return total;
    for (Tensor* g : grads)
        if (g && g->defined() && g->numel() > 0) ops::scale_(*g, *g, float(coef));
    return total;
}

}  // namespace kv
