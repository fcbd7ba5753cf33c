// Layer lengths decided across layers (see layer_budget_policy.h).
#include "engine/kv/policies/layer_budget_policy.h"

#include <cmath>
#include <typeinfo>

namespace kv {

void LayerBudgetPolicy::link_layers(const std::vector<KVPolicy*>& all) {
    if (all.empty() || all[0] != this) return;  // layer 0 links everyone
    auto s = std::make_shared<Shared>();
    for (KVPolicy* p : all) {
        auto* c = dynamic_cast<LayerBudgetPolicy*>(p);
        if (!c || typeid(*c) != typeid(*this)) return;
        s->layers.push_back(c);
    }
    for (size_t i = 0; i < s->layers.size(); ++i) s->layers[i]->shared_ = s, s->layers[i]->index_ = i;
}

int64_t LayerBudgetPolicy::begin_call(int64_t input_pos, int64_t n) {
    if (input_pos == 0) {
        if (index_ == 0) shared_->begin_sequence();
        return L_;  // reset() put it back to F
    }
    // No say after the prefill (global-kvzip under a driver without the reconstruction pass):
    // the layer has none, and the others decide.
    if (!has_said()) say({});
    if (shared_->decided) {
        if (budget() != L_) relayout(budget());
    } else if (T_ + n > L_) {
        relayout(T_ + n);  // before the decision (a cell running ahead of later layers' prefills): grow, never evict
    }
    return L_;
}

void LayerBudgetPolicy::say(std::vector<double> v) {
    Shared& s = *shared_;
    if (s.said.empty()) s.begin_sequence();
    s.says[index_] = std::move(v);
    if (!s.said[index_]) s.said[index_] = 1, ++s.n_said;
    if (s.n_said < int64_t(s.layers.size()) || s.decided) return;
    std::vector<int64_t> floors;
    for (const LayerBudgetPolicy* p : s.layers) floors.push_back(std::max(p->F_, p->T_));
    s.budget = decide(s.says, floors, mean_L_ * int64_t(s.layers.size()));
    s.decided = true;
}

int64_t grow_only_initial_length(const KVCacheConfig& c, int64_t num_layers, double floor_fraction, int64_t min_length) {
    const int64_t L = c.cache_length;
    if (num_layers <= 1) return L;  // one layer: nothing to share out
    // Every layer keeps at least a fraction of L of earlier tokens besides a whole chunk
    // (max_chunk_size is the chunk size under the CLI): a layer of one chunk's length would
    // forget everything at every chunk.
    const int64_t f = int64_t(std::ceil(floor_fraction * double(L)));
    return std::min(L, std::max({f + c.max_chunk_size, min_length, int64_t(2)}));
}

}  // namespace kv
