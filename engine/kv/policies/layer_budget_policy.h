// The machinery of policies whose layers' lengths are decided once per sequence, across layers
// (cake, global-kvzip; CrossLayerLengths): every layer starts at one short length F (its
// prefill), each layer has its say once it has seen its prefill (cake: its preference;
// global-kvzip: its prefill's scores), and when the last layer has, the subclass turns the says
// into budgets that are fixed for the rest of the sequence. Lengths only grow: a layer that runs
// ahead of later layers' prefills grows to take its chunks until the decision, and is never
// given less than it holds. docs/POLICIES.md#cake, #kvzip.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/kv/kv_policy.h"

namespace kv {

class LayerBudgetPolicy : public KVPolicy, public CrossLayerLengths {
   public:
    // ---- CrossLayerLengths -----------------------------------------------------------------
    // Layer 0 links every layer of its own class; a model whose layers run other policies too
    // (none today) leaves each layer deciding alone.
    void link_layers(const std::vector<KVPolicy*>& layers) override;
    int64_t begin_call(int64_t input_pos, int64_t n) override;

   protected:
    // L: this layer's initial length F; mean_L: the mean length the budgets share out (N mean_L).
    LayerBudgetPolicy(int64_t L, int64_t G, int64_t mean_L) : KVPolicy(L, G), F_(L), mean_L_(mean_L), shared_(std::make_shared<Shared>()) {
        shared_->layers = {this};
    }
    // This layer's say (at most once per sequence); the last layer's decides.
    void say(std::vector<double> v);
    bool has_said() const { return !shared_->said.empty() && shared_->said[index_]; }
    bool decided() const { return shared_->decided; }
    int64_t budget() const { return shared_->budget[index_]; }  // decided() only
    int64_t initial_length() const { return F_; }

    // The budgets from every layer's say (empty for a layer that had none: a driver without the
    // pass it says from), no layer below floors[l] (F, or what it holds), summing to total.
    virtual std::vector<int64_t> decide(const std::vector<std::vector<double>>& says, const std::vector<int64_t>& floors,
                                        int64_t total) const = 0;
    // Re-stride the per-slot state to L slots per row (slots [0, min(L, old L)) kept); sets L_.
    virtual void relayout(int64_t L) = 0;

   private:
    struct Shared {
        std::vector<LayerBudgetPolicy*> layers;
        std::vector<std::vector<double>> says;
        std::vector<char> said;
        int64_t n_said = 0;
        bool decided = false;
        std::vector<int64_t> budget;
        void begin_sequence() {
            says.assign(layers.size(), {});
            said.assign(layers.size(), 0);
            n_said = 0;
            decided = false;
            budget.clear();
        }
    };
    int64_t F_, mean_L_;
    std::shared_ptr<Shared> shared_;
    size_t index_ = 0;
};

// v, rows of `old_L` values, as rows of `L` (the first min(L, old_L) of each kept, the rest
// `fill`); empty or mis-sized v becomes rows of `fill`.
template <class T>
void restride_rows(std::vector<T>& v, int64_t rows, int64_t old_L, int64_t L, T fill) {
    std::vector<T> out(size_t(rows * L), fill);
    if (v.size() == size_t(rows * old_L))
        for (int64_t r = 0; r < rows; ++r) std::copy_n(v.begin() + r * old_L, std::min(L, old_L), out.begin() + r * L);
    v = std::move(out);
}

// The short length every layer of a policy that decides layer lengths during the sequence
// starts at (cake, global-kvzip; PolicyInfo::initial_layer_length): a fraction of
// cache_length of earlier tokens besides a whole chunk (max_chunk_size), at least min_length,
// at most cache_length; a single layer has nothing to share out and keeps cache_length.
int64_t grow_only_initial_length(const KVCacheConfig& c, int64_t num_layers, double floor_fraction, int64_t min_length);

}  // namespace kv
