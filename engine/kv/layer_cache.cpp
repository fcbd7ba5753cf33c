// One layer's cache step (see layer_cache.h).
#include "layer_cache.h"

#include <tuple>

#include "engine/core/error.h"
#include "engine/memory/memory_tracker.h"
#include "engine/model/attention.h"
#include "engine/ops/ops.h"
#include "engine/telemetry/trace.h"

namespace kv {

LayerCache::LayerCache(int layer, std::unique_ptr<KVPolicy> policy, std::unique_ptr<KVBuffer> buffer)
    : layer_(layer), policy_(std::move(policy)), buffer_(std::move(buffer)) {}

void LayerCache::reset() {
    policy_->reset(0);
    log_.clear();
    chunk_ = 0;
}

void LayerCache::prefill_without_attention(const Tensor& k, const Tensor& v) {
    policy_->reset(k.size(0));
    log_.clear();
    chunk_ = 0;
    buffer_->prefill(k, v);
    policy_->prefill(k.size(2), features(Tensor(), k, v, 0.0f));
    chunk_ = 1;
}

void LayerCache::record_step(const SlotPlan& plan) const {
    if (!trace::active()) return;
    trace::cache_step(layer_, int(chunk_), plan.input_pos, int(plan.n), int(policy_->cache_length()), encode_plan(plan), trace_pass_);
    if (trace_pass_ != 0) return;
    std::vector<float> s = policy_->slot_scores();
    if (!s.empty())
        trace::scores(layer_, int(chunk_), s.data(), int(policy_->batch()), int(policy_->groups()), int(policy_->cache_length()), 0);
}

InsertFeatures LayerCache::features(const Tensor& q, const Tensor& k, const Tensor& v, float scale) const {
    InsertFeatures f;
    if (policy_->needs_query_vectors() && q.defined()) {
        f.queries = q.contiguous().to_f32_vector();
        f.query_heads = q.size(1);
        f.rope_inv_freq = rope_;
        f.attn_scale = scale;
    }
    if (policy_->needs_value_norm()) f.value_norm = ops::norm_last(v).to_f32_vector();
    if (policy_->needs_key_norm()) f.key_norm = ops::norm_last(k).to_f32_vector();
    if (policy_->needs_quant_error()) f.quant_error = buffer_->quant_errors(k, v);
    if (policy_->needs_key_vectors()) {
        f.keys = k.contiguous().to_f32_vector();
        f.head_dim = k.size(-1);
    }
    return f;
}

Tensor LayerCache::positions_tensor(Device device) const {
    const int64_t T = policy_->current_length(), L = policy_->cache_length();
    const std::vector<int32_t>& pos = policy_->token_positions();
    if (!policy_->per_row_positions()) {
        std::vector<int32_t> p(pos.begin(), pos.begin() + T);
        return Tensor::from_i32({1, 1, T}, p, {device, MemCategory::WORKSPACE, "slot positions"});
    }
    const int64_t B = policy_->batch(), G = policy_->groups();
    std::vector<int32_t> p((size_t)(B * G * T));
    for (int64_t r = 0; r < B * G; ++r) std::copy(pos.begin() + r * L, pos.begin() + r * L + T, p.begin() + r * T);
    return Tensor::from_i32({B, G, T}, p, {device, MemCategory::WORKSPACE, "slot positions"});
}

void LayerCache::attend(const Tensor& q, const Tensor& k, const Tensor& v, int64_t input_pos, float scale, Tensor& y) {
    const int64_t B = q.size(0), n = q.size(2);
    const Device dev = q.device();
    if (input_pos == 0) {
        policy_->reset(B);
        log_.clear();
        chunk_ = 0;
    } else if (input_pos != policy_->input_pos()) {
        throw Error(str("layer ", layer_, " cache: chunk starts at position ", input_pos, " but the cache has seen ",
                        policy_->input_pos(), " tokens"),
                    "chunks of a sequence must be fed in order, starting at position 0");
    } else if (B != policy_->batch()) {
        throw Error(str("layer ", layer_, " cache: batch size ", B, " differs from the prefill's ", policy_->batch()));
    }
    if (ids_ && ids_n_ == n) policy_->observe_tokens(*ids_, n);

    if (input_pos == 0) {
        if (n > policy_->cache_length())
            throw Error(str("layer ", layer_, " cache: a prefill of ", n, " tokens exceeds the cache length ", policy_->cache_length()),
                        "the driver's first chunk must be at most cache_length");
        {
            KV_TRACE_SPAN(trace::SpanCategory::CACHE_UPDATE, "cache update", .layer = layer_, .chunk = int(chunk_));
            MemoryLabelScope label(str("layer ", layer_, " cache update"));
            buffer_->prefill(k, v);
            policy_->prefill(n, features(q, k, v, scale));
        }
        SlotPlan p;
        p.n = n;
        p.rows = 1;
        for (int64_t t = 0; t < n; ++t) p.targets.push_back(int32_t(t));
        p.length_after = n;
        if (logging_) log_.append(p);
        // Attention on the raw new k, v (before any quantization), causal by position.
        {
            KV_TRACE_SPAN(trace::SpanCategory::ATTENTION, "sdpa", .layer = layer_, .chunk = int(chunk_));
            PlainAttention plain;
            plain.attend(layer_, q, k, v, 0, scale, y);
        }
        record_step(p);
        if (hook_) hook_({layer_, chunk_, &p, policy_.get(), nullptr});
        ++chunk_;
        return;
    }

    SlotPlan plan;
    if (replay_) {
        if (size_t(chunk_) >= replay_->size()) throw Error(str("layer ", layer_, " replay: the log has no chunk ", chunk_));
        plan = (*replay_)[size_t(chunk_)];
        if (plan.input_pos != input_pos || plan.n != n)
            throw Error(str("layer ", layer_, " replay: log chunk ", chunk_, " covers positions ", plan.input_pos, "+", plan.n,
                            ", the call ", input_pos, "+", n));
    } else {
        plan = policy_->prepare(n);
    }
    {
        KV_TRACE_SPAN(trace::SpanCategory::CACHE_UPDATE, "cache update", .layer = layer_, .chunk = int(chunk_));
        MemoryLabelScope label(str("layer ", layer_, " cache update"));
        InsertFeatures f = features(q, k, v, scale);
        buffer_->write(plan, k, v);
        policy_->apply(plan, f);
    }
    if (logging_) log_.append(plan);

    const int64_t T = policy_->current_length();
    Tensor K, V;
    if (!buffer_->fused_attention()) std::tie(K, V) = buffer_->read(T);
    Tensor kpos = positions_tensor(dev);
    Tensor qpos = position_range(input_pos, n, dev);
    // KIVI buffers attend over their packed bytes; the others over the K, V just read.
    auto sdpa = [&](Tensor& yy, const Tensor& qq, const Tensor& qp, Tensor* ws) {
        if (buffer_->fused_attention()) buffer_->attend(yy, qq, T, kpos, qp, scale, ws);
        else if (policy_->selects_reads()) policy_->attend(yy, qq, K, V, kpos, qp, scale, ws);
        else ops::sdpa_(yy, qq, K, V, kpos, qp, scale, 0, ws);
    };
    std::vector<float> w;
    const bool want = policy_->needs_attention_weights() && !replay_;
    {
        KV_TRACE_SPAN(trace::SpanCategory::ATTENTION, want ? "sdpa with weights" : "sdpa", .layer = layer_, .chunk = int(chunk_));
        MemoryLabelScope label(str("layer ", layer_, " attention"));
        if (!want) {
            sdpa(y, q, qpos, nullptr);
        } else {
            Tensor ws = Tensor::empty({B, policy_->groups(), T}, DType::F32, {dev, MemCategory::WORKSPACE, "attention weight sums"});
            const int64_t win = policy_->weights_query_window();
            if (win <= 0 || win >= n) {
                sdpa(y, q, qpos, &ws);
            } else {  // only the last `win` queries vote (snapkv)
                Tensor y0 = y.slice(2, 0, n - win), y1 = y.slice(2, n - win, n);
                sdpa(y0, q.slice(2, 0, n - win), qpos.slice(1, 0, n - win), nullptr);
                sdpa(y1, q.slice(2, n - win, n), qpos.slice(1, n - win, n), &ws);
            }
            w = ws.to_f32_vector();
        }
    }
    if (!replay_) {
        KV_TRACE_SPAN(trace::SpanCategory::SCORING, "scoring", .layer = layer_, .chunk = int(chunk_));
        MemoryLabelScope label(str("layer ", layer_, " scoring"));
        policy_->update(w, n);
    }
    record_step(plan);
    if (hook_) hook_({layer_, chunk_, &plan, policy_.get(), want ? &w : nullptr});
    ++chunk_;
}

}  // namespace kv
