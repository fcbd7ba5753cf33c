// The sliding-window layer's ring (see window_layer.h).
#include "engine/kv/window_layer.h"

#include <algorithm>

namespace kv {

int64_t window_layer_length(const KVCacheConfig& cfg, int64_t window, int64_t seq_length) {
    const int64_t chunk = cfg.max_chunk_size > 0 ? cfg.max_chunk_size : seq_length > 0 ? seq_length : window;
    const int64_t L = window - 1 + chunk;
    return seq_length > 0 ? std::min(L, seq_length) : L;
}

std::vector<int64_t> layer_lengths(const KVCacheConfig& cfg, const ModelConfig& model, int64_t seq_length) {
    std::vector<int64_t> Ls;
    for (int64_t l = 0; l < model.num_layers; ++l) {
        const int w = model.layer_window(l);
        Ls.push_back(w > 0 ? window_layer_length(cfg, w, seq_length) : cfg.length_for_layer(l, seq_length, model.num_layers));
    }
    return Ls;
}

BudgetLayers budget_layers(const KVCacheConfig& cfg, const ModelConfig& model, int64_t seq_length) {
    BudgetLayers b;
    b.policy_layers = 0;
    for (int64_t l = 0; l < model.num_layers; ++l) {
        if (model.kv_shared(l) || !model.has_kv_cache(l)) continue;  // reads another layer's cache, or keeps a state
        if (const int w = model.layer_window(l); w > 0) b.fixed_slots += window_layer_length(cfg, w, seq_length);
        else ++b.policy_layers;
    }
    return b;
}

namespace {

class WindowPolicy final : public KVPolicy {
   public:
    WindowPolicy(int64_t L, int64_t G, int64_t window) : KVPolicy(L, G), W_(window) {}
    const char* name() const override { return "window"; }
    bool per_row_positions() const override { return false; }
    const std::vector<int32_t>& token_positions() const override { return pos_; }
    void reset(int64_t batch) override {
        B_ = batch;
        T_ = P_ = 0;
        pos_.assign(size_t(L_), -1);
    }
    // A chunk fits while nothing is overwritten, or when the ring still holds the window - 1
    // keys before its first query after the overwrite (n <= L - W + 1).
    int64_t max_forward_length() const override { return std::max<int64_t>({L_ - T_, L_ - W_ + 1, 0}); }
    void prefill(int64_t n, const InsertFeatures&) override {
        if (n < 1 || n > L_) throw_chunk_error("window", n, L_, T_, L_, "a prefill must fit the window's ring");
        write(plan(n));
    }
    SlotPlan prepare(int64_t n) const override {
        const int64_t allowed = max_forward_length();
        if (n < 1 || n > allowed)
            throw_chunk_error("window", n, allowed, T_, L_, "the ring must keep the window - 1 keys before the chunk's first query");
        return plan(n);
    }
    void apply(const SlotPlan& p, const InsertFeatures&) override { write(p); }

   private:
    SlotPlan plan(int64_t n) const {
        SlotPlan p;
        p.input_pos = P_;
        p.n = n;
        p.rows = 1;
        for (int64_t t = 0; t < n; ++t) p.targets.push_back(int32_t((P_ + t) % L_));
        p.length_after = std::min(L_, T_ + n);
        return p;
    }
    void write(const SlotPlan& p) {
        for (int64_t t = 0; t < p.n; ++t) pos_[size_t(p.targets[size_t(t)])] = int32_t(p.input_pos + t);
        T_ = p.length_after;
        P_ = p.input_pos + p.n;
    }
    int64_t W_;
    std::vector<int32_t> pos_;
};

}  // namespace

std::unique_ptr<KVPolicy> make_window_policy(int64_t L, int64_t groups, int64_t window) {
    return std::make_unique<WindowPolicy>(L, groups, window);
}

bool is_window_policy(const KVPolicy& p) { return dynamic_cast<const WindowPolicy*>(&p) != nullptr; }

}  // namespace kv
