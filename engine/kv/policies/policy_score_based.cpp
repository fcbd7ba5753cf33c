// Score-based eviction machinery (see policy_score_based.h and reference §4.4).
#include "engine/kv/policies/policy_score_based.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "engine/core/error.h"

namespace kv {

ScorePolicy::ScorePolicy(const KVCacheConfig& cfg, int64_t L, int64_t G)
    : KVPolicy(L, G), grace_(cfg.grace_period), keep_initial_fraction_(cfg.keep_initial_fraction), max_chunk_(cfg.max_chunk_size) {
    if (grace_ >= L) throw Error(str("grace_period ", grace_, " must be smaller than the cache length ", L));
    if (max_chunk_ > L / 2) max_chunk_ = 0;  // as keys_values: silently off when larger than L/2
}

void ScorePolicy::reset(int64_t batch) {
    B_ = batch;
    T_ = P_ = 0;
    pos_.assign(size_t(rows() * L_), -1);
    next_.clear();
    next_k_ = 0;
    use_initial_rule_ = false;
    next_grace_pos_ = L_ - grace_;
    prefill_length_ = 0;
}

int64_t ScorePolicy::max_forward_length() const {
    int64_t m = L_ - grace_;
    if (T_ < L_) m = std::min(m, L_ - T_);
    if (max_chunk_ > 0) m = std::min(m, max_chunk_);
    return m;
}

void ScorePolicy::prefill(int64_t n, const InsertFeatures& f) {
    if (n < 1 || n > L_) throw_chunk_error(name(), n, L_, 0, L_, "a prefill must fit the cache");
    for (int64_t r = 0; r < rows(); ++r)
        for (int64_t t = 0; t < n; ++t) {
            pos_[size_t(r * L_ + t)] = int32_t(t);
            init_slot(r, t, f, r * n + t);
        }
    T_ = P_ = prefill_length_ = n;
    use_initial_rule_ = n == L_;
    next_grace_pos_ = L_ - grace_;
}

SlotPlan ScorePolicy::prepare(int64_t n) const {
    if (P_ == 0) throw Error(str(name(), " cache: the first call of a sequence must be a prefill"));
    if (n < 1 || n > max_forward_length())
        throw_chunk_error(name(), n, max_forward_length(), T_, L_,
                          T_ < L_ && T_ + n > L_ ? "the chunk straddles the point where the cache becomes full"
                                                 : "the chunk is longer than max_forward_length");
    SlotPlan p;
    p.input_pos = P_;
    p.n = n;
    p.length_after = std::min(L_, T_ + n);
    if (T_ < L_) {  // still filling: free slots [T, T+n), same for every row
        p.rows = 1;
        for (int64_t t = 0; t < n; ++t) p.targets.push_back(int32_t(T_ + t));
        return p;
    }
    // Full: base slots I per row (initial rule: a shared range past the protected prefix).
    const bool shared = use_initial_rule_;
    p.rows = shared ? 1 : rows();
    std::vector<int32_t> I((size_t)(p.rows * n));
    if (shared) {
        // keys_values: keep = min(int(f * L), L - n). Also kept clear of the grace ring so the
        // rule can never overwrite it (reference §15.10).
        int64_t keep = std::min<int64_t>(int64_t(keep_initial_fraction_ * double(L_)), L_ - grace_ - n);
        keep = std::max<int64_t>(keep, 0);
        for (int64_t t = 0; t < n; ++t) I[size_t(t)] = int32_t(keep + t);
    } else {
        if (next_k_ < n) throw Error(str(name(), " cache: no eviction candidates computed for a chunk of ", n));
        for (int64_t r = 0; r < p.rows; ++r)
            for (int64_t t = 0; t < n; ++t) I[size_t(r * n + t)] = next_[size_t(r * next_k_ + t)];
    }
    if (grace_ == 0) {
        p.targets = std::move(I);
        return p;
    }
    // Grace ring [L - grace, L): the oldest n2 ring tokens (from next_grace_pos) leave the
    // ring into I[:n2]; new tokens [0, n1) go to I[n2:], new tokens [n1, n) into the ring.
    const int64_t n2 = std::min(n, grace_), n1 = n - n2, ring0 = L_ - grace_;
    p.moves = n2;
    p.targets.resize(size_t(p.rows * n));
    p.move_from.resize(size_t(p.rows * n2));
    p.move_to.resize(size_t(p.rows * n2));
    for (int64_t r = 0; r < p.rows; ++r) {
        for (int64_t j = 0; j < n2; ++j) {
            const int32_t J = int32_t(ring0 + (next_grace_pos_ - ring0 + j) % grace_);
            p.move_from[size_t(r * n2 + j)] = J;
            p.move_to[size_t(r * n2 + j)] = I[size_t(r * n + j)];
            p.targets[size_t(r * n + n1 + j)] = J;
        }
        for (int64_t t = 0; t < n1; ++t) p.targets[size_t(r * n + t)] = I[size_t(r * n + n2 + t)];
    }
    return p;
}

void ScorePolicy::apply(const SlotPlan& p, const InsertFeatures& f) {
    const bool was_full = T_ == L_;
    for (int64_t r = 0; r < rows(); ++r) {
        const int64_t pr = p.rows == 1 ? 0 : r;
        int32_t* row = pos_.data() + r * L_;
        for (int64_t m = 0; m < p.moves; ++m) {
            const int32_t from = p.move_from[size_t(pr * p.moves + m)], to = p.move_to[size_t(pr * p.moves + m)];
            row[to] = row[from];
            move_slot(r, from, to);
        }
        for (int64_t t = 0; t < p.n; ++t) {
            const int32_t slot = p.targets[size_t(pr * p.n + t)];
            row[slot] = int32_t(p.input_pos + t);
            init_slot(r, slot, f, r * p.n + t);
        }
    }
    T_ = p.length_after;
    P_ = p.input_pos + p.n;
    if (was_full) {
        use_initial_rule_ = false;
        // The ring pointer moves by n only when n <= grace (else the whole ring was replaced
        // and its oldest element sits at the same index).
        if (grace_ > 0 && p.n <= grace_) next_grace_pos_ = L_ - grace_ + (next_grace_pos_ - (L_ - grace_) + p.n) % grace_;
    } else if (T_ == L_) {
        next_grace_pos_ = L_ - grace_;
    }
}

void ScorePolicy::update(const std::vector<float>& w, int64_t n) {
    accumulate(w, n);
    if (T_ == L_) choose_next();
}

void ScorePolicy::choose_next() {
    const int64_t cand = L_ - grace_;
    std::vector<float> S((size_t)(rows() * cand));
    eviction_scores(S);
    next_k_ = max_chunk_ > 0 ? std::min(max_chunk_, cand) : cand;
    next_.assign(size_t(rows() * next_k_), 0);
    std::vector<int32_t> idx((size_t)cand);
    for (int64_t r = 0; r < rows(); ++r) {
        const float* s = S.data() + r * cand;
        std::iota(idx.begin(), idx.end(), 0);
        auto less = [s](int32_t a, int32_t b) { return s[a] < s[b] || (s[a] == s[b] && a < b); };
        // `less` is a total order: selecting the k lowest, then sorting them, gives partial_sort's
        // result in about a third of the comparisons
        if (next_k_ < cand) std::nth_element(idx.begin(), idx.begin() + next_k_, idx.end(), less);
        std::sort(idx.begin(), idx.begin() + next_k_, less);
        std::copy(idx.begin(), idx.begin() + next_k_, next_.begin() + r * next_k_);
    }
}

std::vector<float> ScorePolicy::slot_scores() const {
    if (T_ < L_) return {};
    const int64_t cand = L_ - grace_;
    std::vector<float> S((size_t)(rows() * cand));
    eviction_scores(S);
    std::vector<float> out((size_t)(rows() * L_), std::numeric_limits<float>::infinity());  // ring: never evicted
    for (int64_t r = 0; r < rows(); ++r) std::copy(S.begin() + r * cand, S.begin() + (r + 1) * cand, out.begin() + r * L_);
    return out;
}

}  // namespace kv
