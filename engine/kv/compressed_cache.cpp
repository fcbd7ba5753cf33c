// Compress-then-ask's compressed context (see compressed_cache.h).
#include "engine/kv/compressed_cache.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <limits>
#include <numeric>

#include "engine/core/error.h"
#include "engine/kv/compressed_cache_codec.h"
#include "engine/ops/ops.h"

namespace kv {

CompressedCache::CompressedCache(std::string cache_name, int64_t context_length, int64_t rope_width, std::vector<CompressedLayer> layers)
    : name_(std::move(cache_name)), context_length_(context_length), rope_width_(rope_width), layers_(std::move(layers)) {
    for (size_t l = 0; l < layers_.size(); ++l) {
        const CompressedLayer& c = layers_[l];
        const int64_t rows = c.K.size(0) * c.K.size(1), kept = c.K.size(2);
        if (c.K.ndim() != 4 || c.V.ndim() != 4 || c.K.size(0) != c.V.size(0) || c.K.size(1) != c.V.size(1) || c.K.size(2) != c.V.size(2) ||
            int64_t(c.positions.size()) != rows * kept || (!c.scores.empty() && c.scores.size() != c.positions.size()))
            throw Error(str("compressed cache layer ", l, ": K, V and positions disagree on the kept slots"));
        for (int32_t p : c.positions)
            if (p != kUnusedSlotPosition && (p < 0 || p >= context_length))
                throw Error(str("compressed cache layer ", l, ": kept position ", p, " is outside the context [0, ", context_length, ")"));
    }
    rewind();
}

void CompressedCache::rewind() {
    K_.clear(), V_.clear(), pos_.clear(), ctx_left_.clear(), ctx_score_.clear(), shared_rows_.clear();
    for (const CompressedLayer& c : layers_) {
        K_.push_back(c.K);
        V_.push_back(c.V);
        pos_.push_back(c.positions);
        rows_ = c.K.size(0) * c.K.size(1);
        const int64_t kept = c.K.size(2);
        ctx_left_.push_back(kept);
        ctx_score_.push_back(c.scores);
        bool shared = true;
        for (int64_t r = 1; r < rows_ && shared; ++r)
            shared = std::equal(c.positions.begin(), c.positions.begin() + kept, c.positions.begin() + r * kept);
        shared_rows_.push_back(shared);
    }
    appended_.assign(layers_.size(), 0);
    pending_.assign(layers_.size(), {});
    for (size_t l = 0; l < layers_.size(); ++l) pending_[l].assign(ctx_score_[l].size(), 0.0f);
    rescored_at_.assign(layers_.size(), 0);
}

void CompressedCache::set_decode_rescore(int64_t every) {
    if (every < 0) throw Error(str("--kv_cache.decode_rescore_every: ", every, "; expected 0 (never) or a number of decoded tokens"));
    if (every > 0 && decode_ratio_ <= 0.0)
        throw Error("--kv_cache.decode_rescore_every: re-scores the slots a decoding budget evicts; expected --kv_cache.decode_ratio with it");
    rescore_every_ = every;
}

void CompressedCache::set_decode_threshold(double threshold, int64_t window) {
    if (window < 0) throw Error(str("--kv_cache.threshold_window: ", window, "; expected 0 or more recent positions to protect"));
    if (decode_ratio_ > 0.0)
        throw Error("--kv_cache.threshold_decode: a decoding threshold and --kv_cache.decode_ratio are two budgets; expected one of them");
    for (const CompressedLayer& c : layers_)
        if (c.scores.empty())
            throw Error(str("--kv_cache.threshold_decode: the cache of '", name_, "' holds no scores of its kept slots (a policy that "
                            "chooses by position), so no threshold applies while decoding; expected a policy that scores slots"));
    threshold_decode_ = true, decode_threshold_ = threshold, decode_window_ = window;
}

void CompressedCache::evict_below_threshold(int layer) {
    const size_t l = size_t(layer);
    const int64_t total = slots(layer), ctx = ctx_left_[l];
    const int64_t recent = context_length_ + appended_[l] - decode_window_;  // positions >= recent are protected
    const std::vector<float>& sc = ctx_score_[l];
    std::vector<std::vector<int32_t>> keep((size_t)rows_);
    int64_t width = 0, evicted = 0;
    for (int64_t r = 0; r < rows_; ++r) {
        for (int64_t j = 0; j < ctx; ++j) {
            const int32_t p = pos_[l][size_t(r * total + j)];
            if (p == kUnusedSlotPosition) continue;
            if (p >= recent || double(sc[size_t(r * ctx + j)]) >= decode_threshold_) keep[size_t(r)].push_back(int32_t(j));
            else ++evicted;
        }
        width = std::max(width, int64_t(keep[size_t(r)].size()));
    }
    if (evicted == 0) return;
    // Per row: its kept context slots, unused slots up to the longest row (they read slot 0;
    // their position masks them), then the appended tokens.
    std::vector<int32_t> index, pos;
    std::vector<float> score, pend;
    for (int64_t r = 0; r < rows_; ++r) {
        const std::vector<int32_t>& k = keep[size_t(r)];
        for (int64_t i = 0; i < width; ++i) {
            const bool used = i < int64_t(k.size());
            const int32_t j = used ? k[size_t(i)] : 0;
            index.push_back(j);
            pos.push_back(used ? pos_[l][size_t(r * total + j)] : kUnusedSlotPosition);
            score.push_back(used ? sc[size_t(r * ctx + j)] : -std::numeric_limits<float>::infinity());
            pend.push_back(used ? pending_[l][size_t(r * ctx + j)] : 0.0f);
        }
        for (int64_t j = ctx; j < total; ++j) index.push_back(int32_t(j)), pos.push_back(pos_[l][size_t(r * total + j)]);
    }
    const Tensor& K0 = K_[l];
    const int64_t B = K0.size(0), G = K0.size(1), D = K0.size(3), keep_n = width + (total - ctx);
    const Tensor idx = Tensor::from_i32({B, G, keep_n, 1}, index, {K0.device(), MemCategory::WORKSPACE, "kept slots"}).expand({B, G, keep_n, D});
    K_[l] = ops::gather(K0, 2, idx);
    V_[l] = ops::gather(V_[l], 2, idx);
    pos_[l] = std::move(pos);
    ctx_score_[l] = std::move(score);
    pending_[l] = std::move(pend);
    ctx_left_[l] = width;
}

void CompressedCache::set_decode_ratio(double r) {
    if (!(r >= 0.0 && r < 1.0)) throw Error(str("--kv_cache.decode_ratio: ", r, "; expected a ratio in [0, 1)"));
    if (r > 0.0 && threshold_decode_)
        throw Error("--kv_cache.decode_ratio: a decoding ratio and --kv_cache.threshold_decode are two budgets; expected one of them");
    if (r > 0.0)
        for (size_t l = 0; l < layers_.size(); ++l) {
            const CompressedLayer& c = layers_[l];
            if (c.scores.empty())
                throw Error(str("--kv_cache.decode_ratio: the cache of '", name_, "' holds no scores of its kept slots (a policy that "
                                "chooses by position), so nothing ranks them while decoding; expected a policy that scores slots"));
            if (std::find(c.positions.begin(), c.positions.end(), kUnusedSlotPosition) != c.positions.end())
                throw Error("--kv_cache.decode_ratio: the cache has unused slots (a score threshold); expected a ratio or count budget");
        }
    decode_ratio_ = r;
}

void CompressedCache::evict_to_budget(int layer) {
    const size_t l = size_t(layer);
    const int64_t total = slots(layer), ctx = ctx_left_[l], app = total - ctx;
    const int64_t seen = context_length_ + appended_[l];
    const int64_t budget = int64_t(double(seen) * (1.0 - decode_ratio_));  // floor, as kvpress's int()
    const int64_t drop = total - budget;
    if (drop <= 0) return;
    if (drop > ctx)
        throw Error(str("--kv_cache.decode_ratio: ", decode_ratio_, " leaves ", budget, " slots after ", seen, " tokens seen, fewer than the ",
                        app, " tokens asked, which are never evicted; expected a smaller ratio or a shorter question"));
    // Per row the context slots to keep: all but the `drop` lowest-scoring (ties: the earlier goes).
    const std::vector<float>& sc = ctx_score_[l];
    std::vector<float> summed;
    if (shared_rows_[l]) {
        summed.assign(size_t(ctx), 0.0f);
        for (int64_t r = 0; r < rows_; ++r)
            for (int64_t j = 0; j < ctx; ++j) summed[size_t(j)] += sc[size_t(r * ctx + j)];
    }
    std::vector<int32_t> index;  // (rows, total - drop) slots kept
    std::vector<int32_t> pos;
    std::vector<float> score, pend;
    std::vector<int32_t> order((size_t)ctx);
    for (int64_t r = 0; r < rows_; ++r) {
        const float* s = shared_rows_[l] ? summed.data() : sc.data() + r * ctx;
        std::iota(order.begin(), order.end(), 0);
        std::partial_sort(order.begin(), order.begin() + drop, order.end(),
                          [s](int32_t a, int32_t b) { return s[a] < s[b] || (s[a] == s[b] && a < b); });
        std::vector<bool> gone((size_t)ctx, false);
        for (int64_t i = 0; i < drop; ++i) gone[size_t(order[size_t(i)])] = true;
        for (int64_t j = 0; j < total; ++j) {
            if (j < ctx && gone[size_t(j)]) continue;
            index.push_back(int32_t(j));
            pos.push_back(pos_[l][size_t(r * total + j)]);
            if (j < ctx) score.push_back(sc[size_t(r * ctx + j)]), pend.push_back(pending_[l][size_t(r * ctx + j)]);
        }
    }
    const Tensor& K0 = K_[l];
    const int64_t B = K0.size(0), G = K0.size(1), D = K0.size(3), keep = total - drop;
    const Tensor idx = Tensor::from_i32({B, G, keep, 1}, index, {K0.device(), MemCategory::WORKSPACE, "kept slots"}).expand({B, G, keep, D});
    K_[l] = ops::gather(K0, 2, idx);
    V_[l] = ops::gather(V_[l], 2, idx);
    pos_[l] = std::move(pos);
    ctx_score_[l] = std::move(score);
    pending_[l] = std::move(pend);
    ctx_left_[l] = ctx - drop;
}

int64_t CompressedCache::kept_total(int l) const {
    const std::vector<int32_t>& pos = layers_[size_t(l)].positions;
    return int64_t(std::count_if(pos.begin(), pos.end(), [](int32_t p) { return p != kUnusedSlotPosition; }));
}

std::vector<int64_t> CompressedCache::kept_rows(int l) const {
    const CompressedLayer& c = layers_[size_t(l)];
    const int64_t rows = c.K.size(0) * c.K.size(1), width = c.K.size(2);
    std::vector<int64_t> out((size_t)rows, 0);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < width; ++i) out[size_t(r)] += c.positions[size_t(r * width + i)] != kUnusedSlotPosition ? 1 : 0;
    return out;
}

size_t CompressedCache::kept_bytes() const {
    size_t b = 0;
    for (const CompressedLayer& c : layers_) b += c.K.nbytes() + c.V.nbytes();
    return b;
}

size_t CompressedCache::logical_bytes() const {
    size_t b = 0;
    for (int l = 0; l < num_layers(); ++l) {
        const Tensor& K = layers_[size_t(l)].K;
        if (K.defined() && K.ndim() == 4) b += size_t(kept_total(l) * K.size(3)) * 2 * dtype_size(K.dtype());
    }
    return b;
}

void CompressedCache::attend(int layer, const Tensor& q, const Tensor& k, const Tensor& v, int64_t input_pos, float scale, int window,
                             Tensor& y) {
    if (layer < 0 || layer >= num_layers()) throw Error(str("compressed cache: layer ", layer, " of ", num_layers()));
    const size_t l = size_t(layer);
    const int64_t next = context_length_ + appended_[l];
    if (input_pos != next)
        throw Error(str("compressed cache layer ", layer, ": tokens at position ", input_pos, " but the next position is ", next),
                    "questions follow the compressed context in order (rewind() between questions)");
    const Tensor& K0 = K_[l];
    const int64_t B = K0.size(0), G = K0.size(1), len = K0.size(2), D = K0.size(3), n = k.size(2);
    if (k.size(0) != B || k.size(1) != G || k.size(3) != D)
        throw Error(str("compressed cache layer ", layer, ": new keys of shape (", k.size(0), ", ", k.size(1), ", n, ", k.size(3),
                        ") do not match the cache's (", B, ", ", G, ", n, ", D, ")"));
    const Device dev = q.device();
    const TensorOptions opt{dev, MemCategory::KV_CACHE, "compressed cache"};
    Tensor K = Tensor::empty({B, G, len + n, D}, K0.dtype(), opt), V = Tensor::empty({B, G, len + n, D}, K0.dtype(), opt);
    if (len > 0) {
        Tensor kd = K.slice(2, 0, len), vd = V.slice(2, 0, len);
        kd.copy_from(K0);
        vd.copy_from(V_[l]);
    }
    {
        Tensor kd = K.slice(2, len, len + n), vd = V.slice(2, len, len + n);
        kd.copy_from(k);
        vd.copy_from(v);
    }
    std::vector<int32_t> pos((size_t)(B * G * (len + n)));
    for (int64_t r = 0; r < B * G; ++r) {
        std::copy(pos_[l].begin() + r * len, pos_[l].begin() + (r + 1) * len, pos.begin() + r * (len + n));
        for (int64_t t = 0; t < n; ++t) pos[size_t(r * (len + n) + len + t)] = int32_t(input_pos + t);
    }
    const Tensor kpos = Tensor::from_i32({B, G, len + n}, pos, {dev, MemCategory::WORKSPACE, "slot positions"});
    const bool rescore = decode_ratio_ > 0.0 && rescore_every_ > 0;
    if (rescore) {
        // The weight sums of these queries on the context slots, gathered until the next re-score.
        Tensor ws = Tensor::empty({B, G, len + n}, DType::F32, {dev, MemCategory::WORKSPACE, "attention weight sums"});
        ops::sdpa_(y, q, K, V, kpos, position_range(input_pos, n, dev), scale, window, &ws);
        const std::vector<float> w = ws.to_f32_vector();
        const int64_t ctx = ctx_left_[l];
        for (int64_t r = 0; r < B * G; ++r)
            for (int64_t j = 0; j < ctx; ++j) pending_[l][size_t(r * ctx + j)] += w[size_t(r * (len + n) + j)];
    } else {
        ops::sdpa_(y, q, K, V, kpos, position_range(input_pos, n, dev), scale, window);
    }
    K_[l] = K, V_[l] = V, pos_[l] = std::move(pos);
    appended_[l] += n;
    if (rescore && appended_[l] - rescored_at_[l] >= rescore_every_) {
        for (size_t i = 0; i < ctx_score_[l].size(); ++i) ctx_score_[l][i] += pending_[l][i], pending_[l][i] = 0.0f;
        rescored_at_[l] = appended_[l];
    }
    if (decode_ratio_ > 0.0) evict_to_budget(layer);  // after the tokens attended, as a decoding press compresses
    if (threshold_decode_) evict_below_threshold(layer);
}

namespace {

// The kept slots of a policy that scores them: per row the `keep` highest (ties: the later
// slot, as ScorePolicy evicts the lower slot first), or one set for all rows from the scores
// summed over rows. Returns (rows, keep) slot indices, ascending per row.
std::vector<int32_t> top_slots(const std::vector<float>& scores, int64_t rows, int64_t L, int64_t T, int64_t keep, bool per_row) {
    std::vector<int32_t> out;
    std::vector<int32_t> idx((size_t)T);
    auto pick = [&](const float* s) {
        std::iota(idx.begin(), idx.end(), 0);
        std::partial_sort(idx.begin(), idx.begin() + keep, idx.end(),
                          [s](int32_t a, int32_t b) { return s[a] > s[b] || (s[a] == s[b] && a > b); });
        std::vector<int32_t> k(idx.begin(), idx.begin() + keep);
        std::sort(k.begin(), k.end());
        return k;
    };
    if (per_row) {
        for (int64_t r = 0; r < rows; ++r) {
            const auto k = pick(scores.data() + r * L);
            out.insert(out.end(), k.begin(), k.end());
        }
        return out;
    }
    std::vector<float> sum((size_t)T, 0.0f);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < T; ++j) sum[size_t(j)] += scores[size_t(r * L + j)];
    const auto k = pick(sum.data());
    for (int64_t r = 0; r < rows; ++r) out.insert(out.end(), k.begin(), k.end());
    return out;
}

// The positions a position-only policy keeps of T tokens in `keep` slots: its own eviction run
// over the positions alone (it reads no K, V or weights, so this is exactly what it would keep).
std::vector<int32_t> positional_keep(const KVCacheConfig& cfg, int layer, int64_t B, int64_t G, int64_t T, int64_t keep) {
    KVCacheConfig c = cfg;
    c.cache_length = keep;
    c.layer_cache_lengths.clear();
    c.layer_cache_rule.clear();
    std::unique_ptr<KVPolicy> p = make_policy(c, keep, G, nullptr, layer);
    p->reset(B);
    p->prefill(std::min(keep, T), InsertFeatures{});
    while (p->input_pos() < T) {
        const int64_t n = std::min(p->max_forward_length(), T - p->input_pos());
        if (n < 1) throw Error(str("policy '", cfg.policy(), "' cannot take more tokens once its ", keep, " slots are full"));
        const SlotPlan plan = p->prepare(n);
        p->apply(plan, InsertFeatures{});
        p->update({}, n);
    }
    const std::vector<int32_t>& pos = p->token_positions();
    const int64_t L = p->cache_length();
    std::vector<int32_t> out;
    for (int64_t r = 0; r < B * G; ++r) {
        const int32_t* row = pos.data() + (p->per_row_positions() ? r * L : 0);
        std::vector<int32_t> k;
        for (int64_t s = 0; s < L; ++s)
            if (row[s] >= 0) k.push_back(row[s]);
        std::sort(k.begin(), k.end());
        if (int64_t(k.size()) != keep)
            throw Error(str("policy '", cfg.policy(), "' kept ", k.size(), " of ", T, " positions in ", keep, " slots; expected ", keep));
        out.insert(out.end(), k.begin(), k.end());
    }
    return out;
}

// The slots of the threshold budget: per row those whose score is >= t or whose position is
// among the last `window` (slot j holds position j), or one set for all rows by the mean score
// over rows; rows padded to the longest with -1 (unused). Returns (rows, width) slot indices and
// sets width.
std::vector<int32_t> threshold_slots(const std::vector<float>& scores, int64_t rows, int64_t L, int64_t T, double t, int64_t window,
                                     bool per_row, int64_t& width) {
    std::vector<std::vector<int32_t>> kept((size_t)rows);
    const int64_t recent = T - window;  // positions >= recent are protected
    if (per_row) {
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t j = 0; j < T; ++j)
                if (j >= recent || double(scores[size_t(r * L + j)]) >= t) kept[size_t(r)].push_back(int32_t(j));
    } else {
        std::vector<int32_t> k;
        for (int64_t j = 0; j < T; ++j) {
            double m = 0;
            for (int64_t r = 0; r < rows; ++r) m += double(scores[size_t(r * L + j)]);
            if (j >= recent || m / double(rows) >= t) k.push_back(int32_t(j));
        }
        kept.assign((size_t)rows, k);
    }
    width = 0;
    for (const auto& k : kept) width = std::max(width, int64_t(k.size()));
    std::vector<int32_t> out((size_t)(rows * width), -1);
    for (int64_t r = 0; r < rows; ++r) std::copy(kept[size_t(r)].begin(), kept[size_t(r)].end(), out.begin() + r * width);
    return out;
}

// The score a threshold is applied to: row r's own, or the mean over rows for one set per layer.
float threshold_score(const std::vector<float>& scores, int64_t rows, int64_t L, int64_t r, int64_t j, bool per_row) {
    if (per_row) return scores[size_t(r * L + j)];
    double m = 0;
    for (int64_t q = 0; q < rows; ++q) m += double(scores[size_t(q * L + j)]);
    return float(m / double(rows));
}

// compress_cache and compress_cache_threshold: `keep` slots per row, or (threshold set) the
// slots scoring at least *threshold.
CompressedCache compress_impl(KVCache& cache, const KVCacheConfig& cfg, int64_t keep, const double* threshold, int64_t rope_width,
                              int64_t window) {
    const std::string policy = cfg.policy();
    const PolicyInfo* info = find_policy(policy);
    std::vector<CompressedLayer> layers;
    int64_t context = -1;
    for (int l = 0; l < cache.num_layers(); ++l) {
        LayerCache& lc = cache.layer(l);
        const KVPolicy& p = lc.policy();
        if (p.capabilities().rerotates_keys)
            throw Error(str("--protocol compress-then-ask: policy '", policy, "' re-rotates the kept keys to contiguous RoPE positions, "
                            "which a compressed cache (keys at their token positions) does not record"),
                        "use the wrapped policy without key re-rotation, or --protocol eval_long / generation");
        if (pool_slots(p) > 0)
            throw Error(str("--protocol compress-then-ask: policy '", policy, "' shares one slot pool among a layer's heads, which "
                            "one compression to a per-head count does not express; expected a policy with per-layer or per-head slots"));
        const int64_t T = p.current_length(), B = p.batch(), G = p.groups(), L = p.cache_length();
        if (context < 0) context = p.input_pos();
        if (T != p.input_pos() || T != context)
            throw Error(str("--protocol compress-then-ask: layer ", l, " of policy '", policy, "' holds ", T, " of the context's ", context,
                            " tokens before compressing; expected all of them (a policy that changes layer lengths cannot be "
                            "compressed once)"));
        if (L != T)
            throw Error(str("--protocol compress-then-ask: policy '", policy, "' sizes layer ", l, " to ", L, " slots for a context of ", T,
                            " (a per-layer budget rule), which one compression of every layer to the same count does not express; "
                            "expected a policy with one budget for all layers"));
        if (!threshold && (keep < 1 || keep > T)) throw Error(str("compress-then-ask: keeping ", keep, " slots of a context of ", T, " tokens; expected 1 to ", T));
        // The context cache evicted nothing, so slot j of every row holds token position j.
        const std::vector<int32_t>& tp = p.token_positions();
        for (int64_t r = 0; r < (p.per_row_positions() ? B * G : 1); ++r)
            for (int64_t j = 0; j < T; ++j)
                if (tp[size_t(r * L + j)] != int32_t(j))
                    throw Error(str("compress-then-ask: layer ", l, " slot ", j, " holds position ", tp[size_t(r * L + j)],
                                    "; the context pass must not evict"));
        CompressedLayer out;
        const std::vector<float> scores = p.slot_scores();
        std::vector<int32_t> slots;
        if (threshold) {
            if (scores.empty())
                throw Error(str("--kv_cache.score_threshold: policy '", policy, "' has no slot scores after the context (it chooses by "
                                "position), so no threshold applies; expected a policy that scores slots (h2o, snapkv, knorm, ...)"));
            for (float x : scores)
                if (std::isnan(x))
                    throw Error(str("--kv_cache.score_threshold: policy '", policy, "' has no score for some slots of layer ", l,
                                    " (NaN); expected a policy that scores every slot"));
            int64_t width = 0;
            const std::vector<int32_t> picked = threshold_slots(scores, B * G, L, T, *threshold, window, p.per_row_positions(), width);
            for (int64_t r = 0; r < B * G; ++r)
                for (int64_t i = 0; i < width; ++i) {
                    const int32_t j = picked[size_t(r * width + i)];
                    slots.push_back(j < 0 ? 0 : j);  // an unused slot reads slot 0; its position masks it
                    out.positions.push_back(j < 0 ? kUnusedSlotPosition : j);
                    out.scores.push_back(j < 0 ? -std::numeric_limits<float>::infinity() : threshold_score(scores, B * G, L, r, j, p.per_row_positions()));
                }
            keep = width;
        } else if (keep < T && info && !info->evicts)
            throw Error(str("--protocol compress-then-ask: policy '", policy, "' never evicts, so it cannot drop ", T - keep,
                            " of the context's ", T, " tokens; expected a policy that evicts (h2o, snapkv, knorm, lastrec, ...)"));
        else if (keep == T) {  // nothing to drop (a dense reference, ratio 0): every policy keeps all
            slots.resize(size_t(B * G * T));
            for (int64_t r = 0; r < B * G; ++r) std::iota(slots.begin() + r * T, slots.begin() + (r + 1) * T, 0);
            if (!scores.empty())
                for (int64_t r = 0; r < B * G; ++r)
                    for (int64_t j = 0; j < T; ++j) out.scores.push_back(scores[size_t(r * L + j)]);
        } else if (!scores.empty()) {
            for (float x : scores)
                if (std::isnan(x))
                    throw Error(str("--protocol compress-then-ask: policy '", policy, "' has no score for some slots of layer ", l,
                                    " (NaN), so it cannot rank them; expected a policy that scores every slot"));
            slots = top_slots(scores, B * G, L, T, keep, p.per_row_positions());
            for (int64_t r = 0; r < B * G; ++r)
                for (int64_t i = 0; i < keep; ++i) out.scores.push_back(scores[size_t(r * L + slots[size_t(r * keep + i)])]);
        } else {
            if (p.needs_attention_weights() || !info || !info->evicts)
                throw Error(str("--protocol compress-then-ask: policy '", policy, "' ",
                                info && !info->evicts ? "never evicts" : "has no slot scores after the context",
                                ", so it cannot choose what to keep; expected a policy that evicts (h2o, snapkv, knorm, lastrec, ...)"));
            try {
                slots = positional_keep(cfg, l, B, G, T, keep);
            } catch (const Error& e) {
                throw Error(str("--protocol compress-then-ask: policy '", policy, "' cannot replay its eviction over the context's positions: ",
                                e.what()));
            }
        }
        if (!threshold) out.positions = slots;  // slot j holds position j
        lc.buffer().flush();
        auto [Kf, Vf] = lc.buffer().read(T);
        const int64_t D = Kf.size(3);
        const Device dev = Kf.device();
        if (keep == 0) {  // a threshold above every score of the layer
            const TensorOptions opt{dev, MemCategory::KV_CACHE, "compressed cache"};
            out.K = Tensor::empty({B, G, 0, D}, Kf.dtype(), opt);
            out.V = Tensor::empty({B, G, 0, D}, Vf.dtype(), opt);
        } else {
            const Tensor index = Tensor::from_i32({B, G, keep, 1}, slots, {dev, MemCategory::WORKSPACE, "kept slots"}).expand({B, G, keep, D});
            out.K = ops::gather(Kf, 2, index);
            out.V = ops::gather(Vf, 2, index);
        }
        layers.push_back(std::move(out));
    }
    return CompressedCache(cache.name(), std::max<int64_t>(context, 0), rope_width, std::move(layers));
}

}  // namespace

CompressedCache compress_cache(KVCache& cache, const KVCacheConfig& cfg, int64_t keep, int64_t rope_width) {
    return compress_impl(cache, cfg, keep, nullptr, rope_width, 0);
}

CompressedCache compress_cache_threshold(KVCache& cache, const KVCacheConfig& cfg, double threshold, int64_t rope_width, int64_t window) {
    if (window < 0) throw Error(str("--kv_cache.threshold_window: ", window, "; expected 0 or more recent context positions to protect"));
    return compress_impl(cache, cfg, 0, &threshold, rope_width, window);
}

void save_compressed_cache(const CompressedCache& cache, const std::vector<int32_t>& context, const std::string& path) {
    if (int64_t(context.size()) != cache.context_length())
        throw Error(str("--kv_cache.save: a context of ", context.size(), " tokens for a cache compressed from ", cache.context_length()));
    CompressedCacheImage img;
    img.cache_name = cache.cache_name();
    img.context_length = cache.context_length();
    img.context_fingerprint = token_fingerprint(context);
    img.rope_width = cache.rope_width();
    for (int l = 0; l < cache.num_layers(); ++l) {
        const CompressedLayer& c = cache.layer(l);
        img.B = c.K.size(0), img.G = c.K.size(1), img.D = c.K.size(3);
        img.dtype = uint32_t(c.K.dtype());
        img.layers.push_back({c.K.size(2), c.positions, c.scores, c.K.to_f32_vector(), c.V.to_f32_vector()});
    }
    const std::vector<uint8_t> bytes = encode_compressed_cache(img);
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    f.close();
    if (!f) throw Error(str("--kv_cache.save: cannot write '", path, "'"), "expected a writable file path");
}

CompressedCache load_compressed_cache(const std::string& path, Device device, const std::vector<int32_t>* expect_context) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Error(str("--kv_cache.load: cannot open '", path, "'"), "expected a file written by --kv_cache.save");
    const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    CompressedCacheImage img;
    try {
        img = decode_compressed_cache(bytes.data(), bytes.size());
    } catch (const Error& e) {
        throw Error(str("--kv_cache.load '", path, "': ", e.what()));
    }
    const DType dt = DType(img.dtype);
    if (dt != DType::F32 && dt != DType::BF16 && dt != DType::F16)
        throw Error(str("--kv_cache.load '", path, "': K/V dtype code ", img.dtype, "; expected f32, bf16 or f16"));
    if (expect_context) {
        if (int64_t(expect_context->size()) != img.context_length || token_fingerprint(*expect_context) != img.context_fingerprint)
            throw Error(str("--kv_cache.load '", path, "': the file holds a compressed context of ", img.context_length,
                            " tokens that is not this sample's context (", expect_context->size(), " tokens)"),
                        "expected the file --kv_cache.save wrote for the same data and seed");
    }
    std::vector<CompressedLayer> layers;
    const TensorOptions opt{device, MemCategory::KV_CACHE, "compressed cache"};
    for (auto& L : img.layers) {
        CompressedLayer c;
        c.positions = std::move(L.positions);
        c.scores = std::move(L.scores);
        c.K = Tensor::from_f32({img.B, img.G, L.kept, img.D}, L.K, dt, opt);
        c.V = Tensor::from_f32({img.B, img.G, L.kept, img.D}, L.V, dt, opt);
        layers.push_back(std::move(c));
    }
    return CompressedCache(img.cache_name, img.context_length, img.rope_width, std::move(layers));
}

}  // namespace kv
