// The merge-on-evict wrapper (see value_merge_policy.h).
#include "engine/kv/policies/value_merge_policy.h"

#include <algorithm>

#include "engine/core/cache_name.h"
#include "engine/core/error.h"

namespace kv {

ValueMergePolicy::ValueMergePolicy(const PolicyArgs& a, const std::string& inner_name, std::string name, FeatureSet own_features,
                                   bool own_weights)
    : ScorePolicy(a.cfg, a.L, a.G), name_(std::move(name)), own_features_(own_features), own_weights_(own_weights) {
    const PolicyInfo* info = find_policy(inner_name);
    if (!info) throw Error(str(name_, ": the wrapped scorer '", inner_name, "' is not a registered policy"));
    KVCacheConfig c = a.cfg;
    c.name = CacheName{inner_name, a.cfg.buffer()}.text();
    std::unique_ptr<KVPolicy> p = build_policy(*info, PolicyArgs{c, a.L, a.G, a.layer, a.text});
    inner_.reset(dynamic_cast<ScorePolicy*>(p.get()));
    if (!inner_) throw Error(str(name_, ": '", inner_name, "' is not a score policy (it keeps no per-slot eviction score)"));
    (void)p.release();
}

void ValueMergePolicy::reset(int64_t batch) {
    ScorePolicy::reset(batch);
    inner_->reset(batch);
    count_.assign(size_t(rows() * L_), 0.0);
    attn_.assign(size_t(rows() * L_), 0.0);
    keys_.clear();
    D_ = 0;
}

void ValueMergePolicy::prefill(int64_t n, const InsertFeatures& f) {
    inner_->prefill(n, f);
    ScorePolicy::prefill(n, f);
}

void ValueMergePolicy::update(const std::vector<float>& w, int64_t n) {
    inner_->update(w, n);
    ScorePolicy::update(w, n);
}

void ValueMergePolicy::add_merge(SlotPlan& p, int64_t r, int32_t to, int32_t from, double keep, double take) {
    p.merge_row.push_back(int32_t(r));
    p.merge_to.push_back(to);
    p.merge_from.push_back(from);
    p.merge_keep.push_back(float(keep));
    p.merge_take.push_back(float(take));
}

SlotPlan ValueMergePolicy::prepare(int64_t n) const {
    SlotPlan p = ScorePolicy::prepare(n);
    if (T_ < L_) return p;  // filling: nothing leaves
    std::vector<uint8_t> written(static_cast<size_t>(L_)), moved(static_cast<size_t>(L_));
    std::vector<int32_t> evicted, kept;
    for (int64_t r = 0; r < rows(); ++r) {
        const int64_t pr = p.rows == 1 ? 0 : r;
        std::fill(written.begin(), written.end(), 0);
        std::fill(moved.begin(), moved.end(), 0);
        for (int64_t m = 0; m < p.moves; ++m) {
            written[size_t(p.move_to[size_t(pr * p.moves + m)])] = 1;
            moved[size_t(p.move_from[size_t(pr * p.moves + m)])] = 1;
        }
        for (int64_t t = 0; t < p.n; ++t) written[size_t(p.targets[size_t(pr * p.n + t)])] = 1;
        evicted.clear(), kept.clear();
        const int32_t* pos = pos_.data() + r * L_;
        for (int64_t s = 0; s < L_; ++s) {
            if (pos[s] < 0) continue;
            if (!written[size_t(s)]) kept.push_back(int32_t(s));
            else if (!moved[size_t(s)]) evicted.push_back(int32_t(s));  // overwritten, its token moved nowhere
        }
        if (!evicted.empty() && !kept.empty()) plan_row_merges(r, evicted, kept, p);
    }
    return p;
}

void ValueMergePolicy::apply(const SlotPlan& plan, const InsertFeatures& f) {
    // The merges come first, as the buffer applies them: a target absorbs its sources' counts.
    for (size_t i = 0; i < plan.merges(); ++i) {
        const int64_t r = plan.merge_row[i];
        if (r < 0 || r >= rows() || plan.merge_to[i] < 0 || plan.merge_to[i] >= L_ || plan.merge_from[i] < 0 || plan.merge_from[i] >= L_)
            throw Error(str(name_, " cache: a value merge of row ", r, " between slots ", plan.merge_from[i], " and ", plan.merge_to[i],
                            " lies outside the ", rows(), " rows of ", L_, " slots"));
        count_[size_t(r * L_ + plan.merge_to[i])] += count_[size_t(r * L_ + plan.merge_from[i])];
    }
    inner_->apply(plan, f);
    ScorePolicy::apply(plan, f);
}

void ValueMergePolicy::init_slot(int64_t r, int64_t slot, const InsertFeatures& f, int64_t i) {
    count_[size_t(r * L_ + slot)] = 1.0;
    attn_[size_t(r * L_ + slot)] = 0.0;
    if (!own_features_.has(Feature::KeyVectors)) return;
    if (D_ == 0) {
        D_ = f.head_dim;
        keys_.assign(size_t(rows() * L_ * D_), 0.0f);
    }
    std::copy_n(f.keys.begin() + i * D_, D_, keys_.begin() + (r * L_ + slot) * D_);
}

void ValueMergePolicy::move_slot(int64_t r, int64_t from, int64_t to) {
    count_[size_t(r * L_ + to)] = count_[size_t(r * L_ + from)];
    attn_[size_t(r * L_ + to)] = attn_[size_t(r * L_ + from)];
    if (D_ > 0) std::copy_n(keys_.begin() + (r * L_ + from) * D_, D_, keys_.begin() + (r * L_ + to) * D_);
}

void ValueMergePolicy::accumulate(const std::vector<float>& w, int64_t n) {
    (void)n;
    if (w.empty()) return;
    const int64_t T = T_;
    for (int64_t r = 0; r < rows(); ++r)
        for (int64_t j = 0; j < T; ++j) attn_[size_t(r * L_ + j)] += double(w[size_t(r * T + j)]);
}

void ValueMergePolicy::eviction_scores(std::vector<float>& S) const {
    const int64_t cand = L_ - grace();
    const std::vector<float> inner = inner_->slot_scores();  // (rows, L) once the cache is full
    for (int64_t r = 0; r < rows(); ++r) std::copy_n(inner.begin() + r * L_, cand, S.begin() + r * cand);
}

}  // namespace kv
