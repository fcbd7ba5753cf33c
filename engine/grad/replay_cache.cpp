// Replay cache for gradients (see replay_cache.h).
#include "replay_cache.h"

#include <algorithm>
#include <limits>

#include "engine/core/error.h"
#include "engine/kv/buffers/buffer_common.h"
#include "engine/kv/key_rotation.h"
#include "engine/kv/layer_cache.h"
#include "engine/memory/memory_tracker.h"
#include "engine/model/attention.h"
#include "engine/ops/ops.h"
#include "engine/telemetry/trace.h"

namespace kv {

namespace {

// Slot list of one plan row r (rows == 1: shared by every (b, g)).
const int32_t* row_ptr(const std::vector<int32_t>& v, int64_t rows, int64_t r, int64_t m) {
    return v.data() + (rows == 1 ? 0 : r) * m;
}

}  // namespace

ReplayLayerCache::ReplayLayerCache(int layer, int64_t B, int64_t G, int64_t L, int64_t D, DType dtype, Device device,
                                   const std::vector<SlotPlan>* plans)
    : layer_(layer), B_(B), G_(G), L_(L), D_(D), dtype_(dtype), device_(device), plans_(plans) {}

void ReplayLayerCache::load(const ReplayKVState* s) {
    const std::string l = str("layer ", layer_, " replay ");
    // Per-head lengths: known from the log's first plan, before any gradient is carried in.
    const int64_t pool = plans_ && !plans_->empty() && plans_->front().length_after > L_ ? plans_->front().length_after : 0;
    if (pool != pool_) use_pool(pool);
    if (!K_.defined()) {
        K_ = Tensor::zeros({B_, G_, L_, D_}, dtype_, {device_, MemCategory::KV_CACHE, l + "keys"});
        V_ = Tensor::zeros({B_, G_, L_, D_}, dtype_, {device_, MemCategory::KV_CACHE, l + "values"});
    }
    records_.clear();
    if (s && s->pool != pool_)
        throw Error(str("layer ", layer_, " gradient replay: a checkpoint with a pool of ", s->pool, " slots for a layer of ", pool_));
    if (!s) {
        K_.fill(0.0);
        V_.fill(0.0);
        pos_.assign(size_t(B_ * G_ * (pool_ ? pool_ : L_)), -1);
        length_ = chunk_ = input_pos_ = 0;
        state_ = LayerState{};
        return;
    }
    if (s->K.defined()) {
        K_.copy_from(s->K);  // straight-through: a quantized checkpoint arrives dequantized
        V_.copy_from(s->V);
    } else {  // a layer without a token cache checkpoints its state only
        K_.fill(0.0);
        V_.fill(0.0);
    }
    pos_ = s->pos;
    length_ = s->length, chunk_ = s->chunk, input_pos_ = s->input_pos;
    // a copy: the replay's forward replaces the state, the checkpoint must not move with it
    state_.values = s->state.values.defined() ? s->state.values.clone() : Tensor();
    state_.next_pos = s->state.next_pos;
}

ReplayKVState ReplayLayerCache::snapshot(Device device, MemCategory cat) const {
    ReplayKVState s;
    const std::string l = str("layer ", layer_, " KV checkpoint ");
    s.K = Tensor::empty(K_.shape(), dtype_, {device, cat, l + "keys"});
    s.V = Tensor::empty(V_.shape(), dtype_, {device, cat, l + "values"});
    s.K.copy_from(device == device_ ? K_ : K_.to(device));
    s.V.copy_from(device == device_ ? V_ : V_.to(device));
    s.pos = pos_;
    s.length = length_, s.chunk = chunk_, s.input_pos = input_pos_;
    s.pool = pool_;
    if (state_.values.defined()) {
        s.state.values = Tensor::empty(state_.values.shape(), state_.values.dtype(), {device, cat, str("layer ", layer_, " state checkpoint")});
        s.state.values.copy_from(device == device_ ? state_.values : state_.values.to(device));
    }
    s.state.next_pos = state_.next_pos;
    return s;
}

void ReplayLayerCache::use_pool(int64_t S) {
    const std::string l = str("layer ", layer_, " replay ");
    pool_ = S;
    const int64_t Gs = S ? 1 : G_, Ls = S ? S : L_;
    K_ = Tensor::zeros({B_, Gs, Ls, D_}, dtype_, {device_, MemCategory::KV_CACHE, l + "keys"});
    V_ = Tensor::zeros({B_, Gs, Ls, D_}, dtype_, {device_, MemCategory::KV_CACHE, l + "values"});
    dK_ = dV_ = Tensor();
    pos_.assign(size_t(B_ * G_ * Ls), -1);
}

Tensor ReplayLayerCache::positions_tensor() const {
    const int64_t stride = pool_ ? pool_ : L_;
    std::vector<int32_t> p((size_t)(B_ * G_ * length_));
    for (int64_t r = 0; r < B_ * G_; ++r)
        std::copy(pos_.begin() + r * stride, pos_.begin() + r * stride + length_, p.begin() + r * length_);
    // An empty slot below length_ (per-head lengths filling up) is never visible; other
    // policies have none there.
    for (int32_t& x : p)
        if (x < 0) x = std::numeric_limits<int32_t>::max();
    return Tensor::from_i32({B_, G_, length_}, p, {device_, MemCategory::WORKSPACE, "slot positions"});
}

void ReplayLayerCache::forward(const Tensor& q, const Tensor& k, const Tensor& v, int64_t input_pos, float scale, Tensor& y,
                               bool record) {
    if (!K_.defined()) load(nullptr);
    if (size_t(chunk_) >= plans_->size()) throw Error(str("layer ", layer_, " gradient replay: the log has no chunk ", chunk_));
    const SlotPlan& plan = (*plans_)[size_t(chunk_)];
    const int64_t n = k.size(2);
    if (plan.input_pos != input_pos || plan.n != n || input_pos != input_pos_)
        throw Error(str("layer ", layer_, " gradient replay: log chunk ", chunk_, " covers positions ", plan.input_pos, "+",
                        plan.n, ", the call ", input_pos, "+", n, " (cache at ", input_pos_, ")"));
    if (plan.rows != 1 && plan.rows != B_ * G_)
        throw Error(
            str("layer ", layer_, " gradient replay: a plan with ", plan.rows, " rows for batch ", B_, " x ", G_, " groups"));
    if (chunk_ == 0 && plan.length_after > L_ && pool_ != plan.length_after) use_pool(plan.length_after);
    if (window_ > 0 && pool_)
        throw Error(str("layer ", layer_, " has a sliding window of ", window_,
                        " tokens; gradients through per-head cache lengths do not support sliding-window attention yet"));
    if (pool_) {
        forward_pooled(plan, q, k, v, input_pos, scale, y, record);
        return;
    }
    {
        KV_TRACE_SPAN(trace::SpanCategory::CACHE_UPDATE, "replay cache update", .layer = layer_, .chunk = int(chunk_));
        MemoryLabelScope label(str("layer ", layer_, " replay cache update"));
        if (record) {
            ChunkRecord rec;
            rec.plan = plan;
            rec.length_before = length_;
            rec.input_pos = input_pos;
            const int64_t m = plan.moves + plan.n;
            std::vector<int32_t> slots((size_t)(plan.rows * m));
            for (int64_t r = 0; r < plan.rows; ++r) {
                int32_t* s = slots.data() + r * m;
                if (plan.moves) std::copy_n(row_ptr(plan.move_to, plan.rows, r, plan.moves), plan.moves, s);
                std::copy_n(row_ptr(plan.targets, plan.rows, r, plan.n), plan.n, s + plan.moves);
            }
            rec.overwritten = slot_index(slots, plan.rows, B_, G_, m, device_);
            Tensor idx = rec.overwritten.expand({B_, G_, m, D_});
            rec.old_k = ops::gather(K_, 2, idx);
            rec.old_v = ops::gather(V_, 2, idx);
            rec.old_pos.resize(size_t(B_ * G_ * m));
            for (int64_t r = 0; r < B_ * G_; ++r) {
                const int32_t* s = slots.data() + (plan.rows == 1 ? 0 : r) * m;
                for (int64_t i = 0; i < m; ++i) rec.old_pos[size_t(r * m + i)] = pos_[size_t(r * L_ + s[i])];
            }
            // Value merges (merging-*, cam-*): a linear map on the values before the writes;
            // its targets are never overwritten by the plan, so they are saved apart.
            merge_values_in(V_, plan, &rec.merged);
            records_.push_back(std::move(rec));
        } else {
            merge_values_in(V_, plan);
        }
        // Key re-rotation: between chunks the kept keys sit at the ranks of their token
        // positions (after a prefill, the positions themselves), so those are the angles the
        // plan starts from.
        if (plan.rerotate) {
            rope_.assign(pos_.size(), -1);
            for (int64_t r = 0; r < B_ * G_; ++r) contiguous_rope_row(pos_.data() + r * L_, L_, rope_.data() + r * L_);
        }
        apply_plan_to(K_, V_, plan, k, v);
        // The slot positions through the one replay (plan.input_pos == input_pos, checked above).
        for (int64_t r = 0; r < B_ * G_; ++r) apply_plan_to_row(plan, r, pos_.data() + r * L_, L_);
        length_ = plan.length_after;
    }
    const Tensor qa = plan.rerotate ? rerotate(plan, q, record ? &records_.back() : nullptr) : q;
    {
        KV_TRACE_SPAN(trace::SpanCategory::ATTENTION, "sdpa", .layer = layer_, .chunk = int(chunk_));
        MemoryLabelScope label(str("layer ", layer_, " attention"));
        if (input_pos > 0 && selects()) {  // the prefill attends densely, as in the live cache
            if (window_ > 0)
                throw Error(str("layer ", layer_, " has a sliding window of ", window_,
                                " tokens; gradients through the cache's read selection do not support sliding-window attention"));
            std::vector<int32_t> sel;
            selection_->attend(y, qa, K_.slice(2, 0, length_), V_.slice(2, 0, length_), positions_tensor(), position_range(input_pos, n, device_),
                               scale, &sel);
            if (record) records_.back().sel = std::move(sel);
        } else {
            ops::sdpa_(y, qa, K_.slice(2, 0, length_), V_.slice(2, 0, length_), positions_tensor(),
                       position_range(input_pos, n, device_), scale, window_);
        }
    }
    ++chunk_;
    input_pos_ = input_pos + n;
}

Tensor ReplayLayerCache::rerotate(const SlotPlan& plan, const Tensor& q, ChunkRecord* rec) {
    if (pool_) throw Error(str("layer ", layer_, " gradient replay: key re-rotation over per-head pools is not supported"));
    std::vector<int32_t> shift(rope_.size(), 0);
    for (int64_t r = 0; r < B_ * G_; ++r) rerotate_row(plan, r, pos_.data() + r * L_, rope_.data() + r * L_, L_, shift.data() + r * L_);
    const int64_t qs = query_shift(pos_, B_ * G_, L_, plan.input_pos);
    if (freq_.empty()) return q;  // NoPE: nothing turns (the ranks still move with the plans)
    KV_TRACE_SPAN(trace::SpanCategory::CACHE_UPDATE, "replay key re-rotation", .layer = layer_, .chunk = int(chunk_));
    const TensorOptions o{device_, MemCategory::WORKSPACE, "re-rotated keys"};
    K_.copy_from(rotate_slots(K_, shift, B_ * G_, freq_, o));
    if (rec) rec->shift = std::move(shift), rec->qshift = qs, rec->freq = freq_;
    return qs == 0 ? q : rotate_all(q, qs, freq_, o);
}

void ReplayLayerCache::ensure_grads() {
    if (dK_.defined()) return;
    const std::string l = str("layer ", layer_, " cache gradient ");
    const Shape sh = pool_ ? Shape{B_, 1, pool_, D_} : Shape{B_, G_, L_, D_};
    dK_ = Tensor::zeros(sh, dtype_, {device_, MemCategory::GRADIENTS, l + "keys"});
    dV_ = Tensor::zeros(sh, dtype_, {device_, MemCategory::GRADIENTS, l + "values"});
}

// Per-head lengths: the plan (rows B G, no moves) over the pool; a slot written for head g
// is evicted from every other head of its batch row.
void ReplayLayerCache::forward_pooled(const SlotPlan& plan, const Tensor& q, const Tensor& k, const Tensor& v, int64_t input_pos,
                                      float scale, Tensor& y, bool record) {
    const int64_t n = plan.n, S = pool_, m = G_ * n;
    const SlotPlan pp = to_pool_plan(plan, B_, G_);
    {
        KV_TRACE_SPAN(trace::SpanCategory::CACHE_UPDATE, "replay cache update", .layer = layer_, .chunk = int(chunk_));
        MemoryLabelScope label(str("layer ", layer_, " replay cache update"));
        if (record) {
            ChunkRecord rec;
            rec.plan = plan;
            rec.length_before = length_;
            rec.input_pos = input_pos;
            rec.overwritten = slot_index(pp.targets, B_, B_, 1, m, device_);
            Tensor idx = rec.overwritten.expand({B_, 1, m, D_});
            rec.old_k = ops::gather(K_, 2, idx);
            rec.old_v = ops::gather(V_, 2, idx);
            rec.old_pos.resize(size_t(B_ * G_ * m));
            for (int64_t b = 0; b < B_; ++b)
                for (int64_t g = 0; g < G_; ++g)
                    for (int64_t i = 0; i < m; ++i)
                        rec.old_pos[size_t((b * G_ + g) * m + i)] = pos_[size_t((b * G_ + g) * S + pp.targets[size_t(b * m + i)])];
            records_.push_back(std::move(rec));
        }
        Tensor kk = k.contiguous().reshape({B_, 1, m, D_}), vv = v.contiguous().reshape({B_, 1, m, D_});
        apply_plan_to(K_, V_, pp, kk, vv);
        for (int64_t r = 0; r < B_ * G_; ++r) {
            const int64_t b = r / G_;
            for (int64_t t = 0; t < n; ++t) {
                const int32_t slot = plan.targets[size_t(r * n + t)];
                for (int64_t g = 0; g < G_; ++g) pos_[size_t((b * G_ + g) * S + slot)] = -1;
                pos_[size_t(r * S + slot)] = int32_t(input_pos + t);
            }
        }
        length_ = S;
    }
    {
        KV_TRACE_SPAN(trace::SpanCategory::ATTENTION, "sdpa", .layer = layer_, .chunk = int(chunk_));
        MemoryLabelScope label(str("layer ", layer_, " attention"));
        pooled_attention(y, q, K_, V_, pos_, G_, position_range(input_pos, n, device_), scale, nullptr);
    }
    ++chunk_;
    input_pos_ = input_pos + n;
}

void ReplayLayerCache::backward_pooled(const Tensor& q, const Tensor& dy, float scale, Tensor& dq, Tensor& dk, Tensor& dv) {
    ChunkRecord rec = std::move(records_.back());
    records_.pop_back();
    const SlotPlan& plan = rec.plan;
    const int64_t n = plan.n, S = pool_, m = G_ * n, R = q.size(1) / G_;
    MemoryLabelScope label(str("layer ", layer_, " attention backward"));
    {
        KV_TRACE_SPAN(trace::SpanCategory::ATTENTION, "sdpa backward", .layer = layer_, .chunk = int(chunk_ - 1));
        Tensor qpos = position_range(rec.input_pos, n, device_);
        ops::SdpaBackwardOptions o;
        o.accumulate_dk = o.accumulate_dv = true;
        // Attention sinks (gpt-oss): each group's call takes its R heads' sink logits and adds
        // to their entries of the sink gradient, as pooled_attention does forward.
        const Tensor* sinks = ops::AttentionSinks::current();
        Tensor* dsinks = ops::AttentionSinks::current_grad();
        for (int64_t g = 0; g < G_; ++g) {
            const Tensor group_sinks = sinks ? sinks->slice(0, g * R, (g + 1) * R) : Tensor();
            Tensor group_dsinks = sinks && dsinks ? dsinks->slice(0, g * R, (g + 1) * R) : Tensor();
            const ops::AttentionSinks sink_scope(sinks ? &group_sinks : nullptr, sinks && dsinks ? &group_dsinks : nullptr);
            // Other heads' slots are masked, so their gradient from head g is exactly zero.
            Tensor dqg = Tensor::empty({B_, R, n, D_}, dq.dtype(), {device_, MemCategory::WORKSPACE, "query gradient"});
            ops::sdpa_backward_(dqg, dK_, dV_, q.slice(1, g * R, (g + 1) * R).contiguous(), K_, V_,
                                pool_group_positions(pos_, B_, G_, S, g, device_), qpos, dy.slice(1, g * R, (g + 1) * R).contiguous(),
                                scale, o);
            Tensor dst = dq.slice(1, g * R, (g + 1) * R);
            dst.copy_from(dqg);
        }
    }
    KV_TRACE_SPAN(trace::SpanCategory::CACHE_UPDATE, "replay cache backward", .layer = layer_, .chunk = int(chunk_ - 1));
    // New tokens: their gradient is the pool's at their slots; the old content there got none.
    Tensor tidx = rec.overwritten.expand({B_, 1, m, D_});
    Tensor gk = ops::gather(dK_, 2, tidx), gv = ops::gather(dV_, 2, tidx);
    dk.copy_from(gk.reshape({B_, G_, n, D_}));
    dv.copy_from(gv.reshape({B_, G_, n, D_}));
    Tensor zeros = Tensor::zeros({B_, 1, m, D_}, dtype_, {device_, MemCategory::WORKSPACE, "zeros"});
    ops::scatter_(dK_, 2, tidx, zeros);
    ops::scatter_(dV_, 2, tidx, zeros);
    ops::scatter_(K_, 2, tidx, rec.old_k);
    ops::scatter_(V_, 2, tidx, rec.old_v);
    const SlotPlan pp = to_pool_plan(plan, B_, G_);
    for (int64_t b = 0; b < B_; ++b)
        for (int64_t g = 0; g < G_; ++g)
            for (int64_t i = 0; i < m; ++i)
                pos_[size_t((b * G_ + g) * S + pp.targets[size_t(b * m + i)])] = rec.old_pos[size_t((b * G_ + g) * m + i)];
    length_ = rec.length_before;
    input_pos_ = rec.input_pos;
    --chunk_;
}

void ReplayLayerCache::set_state_grad(const Tensor* dK, const Tensor* dV) {
    ensure_grads();
    if (dK)
        dK_.copy_from(*dK);
    else
        dK_.fill(0.0);
    if (dV)
        dV_.copy_from(*dV);
    else
        dV_.fill(0.0);
}

void ReplayLayerCache::backward(const Tensor& q, const Tensor& dy, float scale, Tensor& dq, Tensor& dk, Tensor& dv) {
    if (records_.empty()) throw Error(str("layer ", layer_, " gradient replay: backward without a recorded chunk"));
    ensure_grads();
    if (pool_) {
        backward_pooled(q, dy, scale, dq, dk, dv);
        return;
    }
    ChunkRecord rec = std::move(records_.back());
    records_.pop_back();
    const SlotPlan& plan = rec.plan;
    const int64_t n = plan.n, m = plan.moves + plan.n;
    MemoryLabelScope label(str("layer ", layer_, " attention backward"));
    // Key re-rotation: the chunk attended with its queries turned by qshift over keys turned
    // by shift; the gradients turn back (a rotation's inverse is its transpose).
    const bool turned = !rec.shift.empty();
    const TensorOptions to{device_, MemCategory::WORKSPACE, "re-rotated keys"};
    const Tensor qa = turned && rec.qshift != 0 ? rotate_all(q, rec.qshift, rec.freq, to) : q;
    {
        // F = dBuffer + dSDPA on the slots the chunk attended to
        KV_TRACE_SPAN(trace::SpanCategory::ATTENTION, "sdpa backward", .layer = layer_, .chunk = int(chunk_ - 1));
        Tensor dKs = dK_.slice(2, 0, length_), dVs = dV_.slice(2, 0, length_);
        ops::SdpaBackwardOptions o;
        o.accumulate_dk = o.accumulate_dv = true;
        o.window = window_;
        if (!rec.sel.empty())
            selection_->backward(dq, dKs, dVs, qa, K_.slice(2, 0, length_), V_.slice(2, 0, length_), pos_, L_, rec.input_pos, dy, scale,
                                 rec.sel);
        else
            ops::sdpa_backward_(dq, dKs, dVs, qa, K_.slice(2, 0, length_), V_.slice(2, 0, length_), positions_tensor(),
                                position_range(rec.input_pos, n, device_), dy, scale, o);
    }
    if (turned) {
        std::vector<int32_t> back(rec.shift.size());
        for (size_t i = 0; i < back.size(); ++i) back[i] = -rec.shift[i];
        if (rec.qshift != 0) dq.copy_from(rotate_all(dq, -rec.qshift, rec.freq, to));
        K_.copy_from(rotate_slots(K_, back, B_ * G_, rec.freq, to));
        dK_.copy_from(rotate_slots(dK_, back, B_ * G_, rec.freq, to));
    }
    KV_TRACE_SPAN(trace::SpanCategory::CACHE_UPDATE, "replay cache backward", .layer = layer_, .chunk = int(chunk_ - 1));
    // New tokens: their gradient is F at their slots; the old content there got none.
    Tensor tidx = slot_index(plan.targets, plan.rows, B_, G_, n, device_).expand({B_, G_, n, D_});
    ops::gather_(dk, dK_, 2, tidx);
    ops::gather_(dv, dV_, 2, tidx);
    Tensor zeros = Tensor::zeros({B_, G_, std::max(n, plan.moves), D_}, dtype_, {device_, MemCategory::WORKSPACE, "zeros"});
    ops::scatter_(dK_, 2, tidx, zeros.slice(2, 0, n));
    ops::scatter_(dV_, 2, tidx, zeros.slice(2, 0, n));
    // Grace-ring moves: content of `from` was copied to `to`, so the gradient at `to` flows
    // back to `from`; what `to` held before was discarded.
    if (plan.moves) {
        Tensor from = slot_index(plan.move_from, plan.rows, B_, G_, plan.moves, device_).expand({B_, G_, plan.moves, D_});
        Tensor to = slot_index(plan.move_to, plan.rows, B_, G_, plan.moves, device_).expand({B_, G_, plan.moves, D_});
        for (Tensor* d : {&dK_, &dV_}) {
            Tensor moved = ops::gather(*d, 2, to);
            ops::scatter_(*d, 2, to, zeros.slice(2, 0, plan.moves));
            Tensor at_from = ops::gather(*d, 2, from);
            ops::add_(at_from, at_from, moved);
            ops::scatter_(*d, 2, from, at_from);
        }
    }
    // Value merges: the gradient w.r.t. the merged values flows back through the linear map.
    merge_values_backward(dV_, plan);
    // Step the buffer back to its state before the chunk.
    Tensor oidx = rec.overwritten.expand({B_, G_, m, D_});
    ops::scatter_(K_, 2, oidx, rec.old_k);
    ops::scatter_(V_, 2, oidx, rec.old_v);
    restore_merged_values(V_, rec.merged);
    for (int64_t r = 0; r < B_ * G_; ++r) {
        const int64_t pr = plan.rows == 1 ? 0 : r;
        for (int64_t i = 0; i < m; ++i) {
            const int32_t slot =
                i < plan.moves ? plan.move_to[size_t(pr * plan.moves + i)] : plan.targets[size_t(pr * n + (i - plan.moves))];
            pos_[size_t(r * L_ + slot)] = rec.old_pos[size_t(r * m + i)];
        }
    }
    length_ = rec.length_before;
    input_pos_ = rec.input_pos;
    --chunk_;
}

namespace {
void check_shared_read(int reader, int source, int64_t pool, bool selects, bool rerotates) {
    const char* what = pool ? "per-head cache lengths" : selects ? "a read selection" : rerotates ? "key re-rotation" : nullptr;
    if (what)
        throw Error(str("layer ", reader, " reads layer ", source, "'s keys and values (cross-layer KV sharing); gradients through ", what,
                        " over a shared cache are not implemented"),
                    "train a model with KV-shared layers under a policy whose heads share one slot layout and that reads every slot it keeps");
}
}  // namespace

void ReplayLayerCache::forward_shared(int reader, const Tensor& q, int64_t input_pos, float scale, int window, Tensor& y) const {
    const int64_t n = q.size(2);
    if (chunk_ == 0 || input_pos_ != input_pos + n)
        throw Error(str("layer ", reader, " gradient replay: reads layer ", layer_, "'s cache for positions ", input_pos, "+", n,
                        ", which has seen ", input_pos_, " positions"));
    const SlotPlan& plan = (*plans_)[size_t(chunk_ - 1)];
    check_shared_read(reader, layer_, pool_, selects() && input_pos > 0, plan.rerotate);
    KV_TRACE_SPAN(trace::SpanCategory::ATTENTION, "sdpa (shared K/V)", .layer = reader, .chunk = int(chunk_ - 1));
    ops::sdpa_(y, q, K_.slice(2, 0, length_), V_.slice(2, 0, length_), positions_tensor(), position_range(input_pos, n, device_), scale,
               window);
}

void ReplayLayerCache::backward_shared(int reader, const Tensor& q, const Tensor& dy, float scale, int window, Tensor& dq) {
    if (records_.empty()) throw Error(str("layer ", reader, " gradient replay: reverse of a shared read of layer ", layer_,
                                          " without its recorded chunk"));
    const int64_t n = q.size(2);
    const ChunkRecord& rec = records_.back();
    check_shared_read(reader, layer_, pool_, !rec.sel.empty(), !rec.shift.empty());
    ensure_grads();
    KV_TRACE_SPAN(trace::SpanCategory::ATTENTION, "sdpa backward (shared K/V)", .layer = reader, .chunk = int(chunk_ - 1));
    Tensor dKs = dK_.slice(2, 0, length_), dVs = dV_.slice(2, 0, length_);
    ops::SdpaBackwardOptions o;
    o.accumulate_dk = o.accumulate_dv = true;
    o.window = window;
    ops::sdpa_backward_(dq, dKs, dVs, q, K_.slice(2, 0, length_), V_.slice(2, 0, length_), positions_tensor(),
                        position_range(rec.input_pos, n, device_), dy, scale, o);
}

void ReplayLayerCache::clear_records() {
    records_.clear();
}

}  // namespace kv
