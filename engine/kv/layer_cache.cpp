// One layer's cache step (see layer_cache.h).
#include "engine/kv/layer_cache.h"

#include <algorithm>
#include <limits>
#include <tuple>

#include "engine/core/error.h"
#include "engine/kv/key_rotation.h"
#include "engine/memory/memory_tracker.h"
#include "engine/model/attention.h"
#include "engine/ops/ops.h"
#include "engine/telemetry/trace.h"

namespace kv {

LayerCache::ReadPath LayerCache::choose_read_path(const KVPolicy& policy, const KVBuffer& buffer) {
    if (pool_slots(policy) > 0) return ReadPath::POOLED;  // a policy's pool is fixed when it is made
    if (buffer.fused_attention()) return ReadPath::FUSED;
    if (policy.capabilities().selects_reads) return ReadPath::SELECTION;
    return ReadPath::SDPA;
}

LayerCache::LayerCache(int layer, std::unique_ptr<KVPolicy> policy, std::unique_ptr<KVBuffer> buffer)
    : layer_(layer), policy_(std::move(policy)), buffer_(std::move(buffer)), read_path_(choose_read_path(*policy_, *buffer_)) {
    if (pooled() && buffer_->per_head_rows())
        throw Error(str("--kv_cache.name: the '", buffer_->name(), "' buffer keeps its key channels per KV head, but policy '",
                        policy_->name(), "' pools the heads' slots in one table (per-head lengths) in layer ", layer_,
                        "; expected a policy with one slot table per head"));
}

void LayerCache::reset() {
    finish_reconstruction();
    policy_->reset(0);
    log_.clear();
    chunk_ = 0;
}

void LayerCache::prefill_without_attention(const Tensor& k, const Tensor& v) {
    policy_->reset(k.size(0));
    log_.clear();
    chunk_ = 0;
    head_dim_ = k.size(-1);
    buffer_->prefill(k, v);
    policy_->prefill(k.size(2), features(Tensor(), k, v, 0.0f));
    chunk_ = 1;
}

void LayerCache::record_step(const SlotPlan& plan) const {
    if (!trace::active()) return;
    trace::cache_step(layer_, int(chunk_), plan.input_pos, int(plan.n), int(policy_->cache_length()), encode_plan(plan), trace_pass_);
    if (trace_pass_ != 0 || pooled()) return;  // pooled scores are (B, G, pool), not (B, G, L)
    std::vector<float> s = policy_->slot_scores();
    if (!s.empty())
        trace::scores(layer_, int(chunk_), s.data(), int(policy_->batch()), int(policy_->groups()), int(policy_->cache_length()), 0);
}

InsertFeatures LayerCache::features(const Tensor& q, const Tensor& k, const Tensor& v, float scale) const {
    InsertFeatures f;
    const FeatureSet need = policy_->needs_features();
    if (need.has(Feature::QueryVectors) && q.defined()) {
        f.queries = q.contiguous().to_f32_vector();
        f.query_heads = q.size(1);
        f.rope_inv_freq = rope_;
        f.attn_scale = scale;
    }
    if (need.has(Feature::ValueNorm)) f.value_norm = ops::norm_last(v).to_f32_vector();
    if (need.has(Feature::KeyNorm)) f.key_norm = ops::norm_last(k).to_f32_vector();
    if (need.has(Feature::QuantError)) f.quant_error = buffer_->quant_errors(k, v);
    if (need.has(Feature::KeyVectors)) {
        f.keys = k.contiguous().to_f32_vector();
        f.head_dim = k.size(-1);
    }
    if (need.has(Feature::ValueVectors)) {
        f.values = v.contiguous().to_f32_vector();
        f.head_dim = v.size(-1);
    }
    if (need.has(Feature::HiddenStates)) {
        if (!input_.defined())
            throw Error(str("layer ", layer_, " cache: policy '", policy_->name(), "' scores tokens from the layer's input hidden states, "
                            "which this call was not given"),
                        "run the cache under the model's blocks (Transformer::block hands them over with set_layer_input)");
        if (input_.ndim() != 3 || input_.size(0) != k.size(0) || input_.size(1) != k.size(2))
            throw Error(str("layer ", layer_, " cache: the hidden states given have shape ", input_.shape().str(), "; expected (", k.size(0),
                            ", ", k.size(2), ", E) for the call's tokens"));
        f.hidden = input_.contiguous().to_f32_vector();
        f.hidden_size = input_.size(2);
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

SlotPlan LayerCache::pooled_prefill_plan(int64_t B, int64_t n) const {
    const int64_t G = policy_->groups();
    SlotPlan p;
    p.n = n;
    p.rows = B * G;
    for (int64_t r = 0; r < B * G; ++r)
        for (int64_t t = 0; t < n; ++t) p.targets.push_back(int32_t(t * G + r % G));
    p.length_after = pool_slots(*policy_);
    return p;
}

SlotPlan to_pool_plan(const SlotPlan& plan, int64_t B, int64_t G) {
    if (plan.rows != B * G || plan.moves != 0)
        throw Error(str("a per-head-length plan needs ", B * G, " rows and no moves; it has ", plan.rows, " rows and ", plan.moves, " moves"));
    // Row (b, g)'s token t is entry g * n + t of batch row b: the (B, G, n, D) keys viewed as
    // (B, 1, G n, D).
    SlotPlan p;
    p.input_pos = plan.input_pos;
    p.n = G * plan.n;
    p.rows = B;
    p.targets = plan.targets;
    p.length_after = plan.length_after;
    return p;
}

Tensor pool_group_positions(const std::vector<int32_t>& pos, int64_t B, int64_t G, int64_t S, int64_t g, Device device) {
    // Slots another head keeps (or nobody) are never visible: position INT32_MAX > any query.
    std::vector<int32_t> p((size_t)(B * S));
    for (int64_t b = 0; b < B; ++b)
        for (int64_t s = 0; s < S; ++s) {
            const int32_t x = pos[size_t((b * G + g) * S + s)];
            p[size_t(b * S + s)] = x < 0 ? std::numeric_limits<int32_t>::max() : x;
        }
    return Tensor::from_i32({B, 1, S}, p, {device, MemCategory::WORKSPACE, "slot positions"});
}

void pooled_attention(Tensor& y, const Tensor& q, const Tensor& K, const Tensor& V, const std::vector<int32_t>& pos, int64_t G,
                      const Tensor& qpos, float scale, Tensor* wsum, int window) {
    // One SDPA per head group over the slots that group keeps, gathered out of the pool: a
    // masked SDPA over the whole pool would score and skip the G - 1 other heads' slots too
    // (3x the attention work of one head's cache for SmolLM2's 3 KV heads). Kept slots stay in
    // pool order; a batch row keeping fewer than another is padded with slots it cannot see.
    const int64_t B = q.size(0), R = q.size(1) / G, S = K.size(2), D = K.size(3);
    const Device dev = q.device();
    // Attention sinks (gpt-oss): each group's SDPA takes the sink logits of its own R heads.
    const Tensor* sinks = ops::AttentionSinks::current();
    std::vector<int32_t> idx, kp;
    for (int64_t g = 0; g < G; ++g) {
        int64_t Tg = 0;
        for (int64_t b = 0; b < B; ++b) {
            int64_t c = 0;
            for (int64_t s = 0; s < S; ++s) c += pos[size_t((b * G + g) * S + s)] >= 0;
            Tg = std::max(Tg, c);
        }
        Tg = std::max<int64_t>(Tg, 1);
        idx.assign(size_t(B * Tg), 0), kp.assign(size_t(B * Tg), 0);
        for (int64_t b = 0; b < B; ++b) {
            const int32_t* p = pos.data() + (b * G + g) * S;
            int64_t t = 0;
            for (int64_t s = 0; s < S && t < Tg; ++s)
                if (p[s] >= 0) idx[size_t(b * Tg + t)] = int32_t(s), kp[size_t(b * Tg + t++)] = p[s];
            for (int64_t s = 0; s < S && t < Tg; ++s)  // padding: distinct slots, never visible
                if (p[s] < 0) idx[size_t(b * Tg + t)] = int32_t(s), kp[size_t(b * Tg + t++)] = std::numeric_limits<int32_t>::max();
        }
        const Tensor index = Tensor::from_i32({B, 1, Tg, 1}, idx, {dev, MemCategory::WORKSPACE, "pool slots of a head"});
        const Tensor Kg = ops::gather(K, 2, index.expand({B, 1, Tg, D})), Vg = ops::gather(V, 2, index.expand({B, 1, Tg, D}));
        const Tensor kpos = Tensor::from_i32({B, 1, Tg}, kp, {dev, MemCategory::WORKSPACE, "slot positions"});
        Tensor yg = y.slice(1, g * R, (g + 1) * R);
        Tensor wg;
        if (wsum) wg = Tensor::empty({B, 1, Tg}, DType::F32, {dev, MemCategory::WORKSPACE, "attention weight sums"});
        const Tensor group_sinks = sinks ? sinks->slice(0, g * R, (g + 1) * R) : Tensor();
        const ops::AttentionSinks sink_scope(sinks ? &group_sinks : nullptr);
        ops::sdpa_(yg, q.slice(1, g * R, (g + 1) * R), Kg, Vg, kpos, qpos, scale, window, wsum ? &wg : nullptr);
        if (wsum) {  // slots the group does not keep got no weight
            Tensor full = Tensor::zeros({B, 1, S}, DType::F32, {dev, MemCategory::WORKSPACE, "attention weight sums"});
            ops::scatter_(full, 2, index.reshape({B, 1, Tg}), wg);
            Tensor dst = wsum->slice(1, g, g + 1);
            dst.copy_from(full);
        }
    }
}

void LayerCache::pooled_sdpa(Tensor& y, const Tensor& q, const Tensor& K, const Tensor& V, const Tensor& qpos, float scale,
                             Tensor* wsum, int window) const {
    pooled_attention(y, q, K, V, policy_->token_positions(), policy_->groups(), qpos, scale, wsum, window);
}

void LayerCache::attend(const Tensor& q, const Tensor& k, const Tensor& v, int64_t input_pos, float scale, int window, Tensor& y,
                        const ChunkInput& in) {
    Tensor* lse_out = in.lse;
    struct Consume {  // the attention input belongs to this call only
        Tensor& t;
        ~Consume() { t = Tensor(); }
    } consume{input_};
    finish_reconstruction();  // a chunk whose reconstruction never came still reports
    lse_written_ = false;
    head_dim_ = k.size(-1);
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
    const PolicyCapabilities& caps = policy_->capabilities();
    // MLA: a chunk that runs expanded (the prefill, or an SDPA read of stored vectors as they
    // are) reads the absorbed queries only where the policy or the buffer looks at queries.
    if (in.expansion) {
        const bool expanded =
            in.expansion->wants(n) && (input_pos == 0 || (read_path_ == ReadPath::SDPA && !caps.rerotates_keys));
        if (!expanded || policy_->needs_features().has(Feature::QueryVectors) || buffer_->observes_queries())
            in.expansion->ensure_queries();
    }
    if (caps.reads_tokens && in.ids) {
        if (int64_t(in.ids->size()) != B * n)
            throw Error(str("layer ", layer_, " cache: the chunk's token ids hold ", in.ids->size(), " values; the call has ", B, " x ", n, " tokens"),
                        "pass the ids of exactly the chunk being attended");
        caps.reads_tokens->observe_tokens(*in.ids, n);
    }
    // A length decided during the sequence (cake): the buffer follows the policy.
    if (caps.cross_layer_lengths)
        if (const int64_t L = caps.cross_layer_lengths->begin_call(input_pos, n); L > 0 && L != buffer_->slots()) buffer_->resize_slots(L);

    if (input_pos == 0) {
        if (n > policy_->cache_length())
            throw Error(str("layer ", layer_, " cache: a prefill of ", n, " tokens exceeds the cache length ", policy_->cache_length()),
                        "the driver's first chunk must be at most cache_length");
        {
            KV_TRACE_SPAN(trace::SpanCategory::CACHE_UPDATE, "cache update", .layer = layer_, .chunk = int(chunk_));
            MemoryLabelScope label(str("layer ", layer_, " cache update"));
            if (pooled()) {  // head g's token t -> pool slot t * G + g: one contiguous write
                const int64_t G = k.size(1), D = k.size(3);
                buffer_->prefill(k.transpose(1, 2).contiguous().reshape({B, 1, n * G, D}),
                                 v.transpose(1, 2).contiguous().reshape({B, 1, n * G, D}));
            } else {
                buffer_->observe_queries(q);
                buffer_->prefill(k, v);
            }
            policy_->prefill(n, features(q, k, v, scale));
        }
        SlotPlan p;
        p.n = n;
        p.rows = 1;
        for (int64_t t = 0; t < n; ++t) p.targets.push_back(int32_t(t));
        p.length_after = n;
        if (pooled()) p = pooled_prefill_plan(B, n);
        if (logging_) log_.append(p);
        // Attention on the raw new k, v (before any quantization), causal by position.
        {
            KV_TRACE_SPAN(trace::SpanCategory::ATTENTION, "sdpa", .layer = layer_, .chunk = int(chunk_));
            PlainAttention plain;
            if (in.expansion && in.expansion->wants(n)) {  // MLA: the raw latents decompressed per head
                LatentExpansion& ex = *in.expansion;
                const auto [Ke, Ve] = ex.expand(k);
                plain.attend(layer_, ex.q, Ke, Ve, 0, scale, window, ex.y);
                ex.ran = true;
            } else {
                plain.attend(layer_, q, k, v, 0, scale, window, y);
            }
        }
        finish_step(p, nullptr, in.replay != nullptr);
        return;
    }

    SlotPlan plan;
    const bool replayed = in.replay != nullptr;
    if (replayed) {
        if (size_t(layer_) >= in.replay->size()) throw Error(str("layer ", layer_, " replay: the plans cover ", in.replay->size(), " layers"));
        const std::vector<SlotPlan>& log = (*in.replay)[size_t(layer_)];
        if (size_t(chunk_) >= log.size()) throw Error(str("layer ", layer_, " replay: the log has no chunk ", chunk_));
        plan = log[size_t(chunk_)];
        if (plan.input_pos != input_pos || plan.n != n)
            throw Error(str("layer ", layer_, " replay: log chunk ", chunk_, " covers positions ", plan.input_pos, "+", plan.n,
                            ", the call ", input_pos, "+", n));
    } else {
        plan = policy_->prepare(n);
        plan.rerotate = caps.rerotates_keys != nullptr;  // the log says so, for the gradient replay
    }
    {
        KV_TRACE_SPAN(trace::SpanCategory::CACHE_UPDATE, "cache update", .layer = layer_, .chunk = int(chunk_));
        MemoryLabelScope label(str("layer ", layer_, " cache update"));
        InsertFeatures f = features(q, k, v, scale);
        if (pooled()) {
            const int64_t G = k.size(1), D = k.size(3);
            buffer_->write(to_pool_plan(plan, B, G), k.contiguous().reshape({B, 1, G * n, D}), v.contiguous().reshape({B, 1, G * n, D}));
        } else {
            buffer_->observe_queries(q);
            // Merged values (merging-*, cam-*) are read from slots the write may overwrite.
            if (plan.merges()) buffer_->merge_values(plan);
            buffer_->write(plan, k, v);
        }
        policy_->apply(plan, f);
    }
    if (logging_) log_.append(plan);
    if (buffer_->compacts()) compact_buffer();
    // Key re-rotation: the kept keys and this chunk's queries take their contiguous RoPE positions.
    const Tensor qa = caps.rerotates_keys ? rerotate(q) : q;

    const int64_t T = pooled() ? pool_slots(*policy_) : policy_->current_length();
    Tensor K, V;
    // KIVI buffers attend over their packed bytes; the others over the K, V just read.
    if (read_path_ != ReadPath::FUSED) std::tie(K, V) = buffer_->read(T);
    Tensor kpos = pooled() ? Tensor() : positions_tensor(dev);
    Tensor qpos = position_range(input_pos, n, dev);
    Tensor* lse = lse_out && read_path_ == ReadPath::SDPA && ops::sdpa_lse_supported(dev) ? lse_out : nullptr;
    // MLA in the expanded form (latent_expansion.h): SDPA of the per-head queries over the held
    // latents decompressed per head, the output into the expansion's y. The other read paths
    // (and re-rotated keys) attend over the stored vectors as they are: the absorbed form.
    LatentExpansion* ex =
        in.expansion && in.expansion->wants(n) && read_path_ == ReadPath::SDPA && !caps.rerotates_keys ? in.expansion : nullptr;
    Tensor Ke, Ve;
    if (ex) {
        KV_TRACE_SPAN(trace::SpanCategory::ATTENTION, "expand latents", .layer = layer_, .chunk = int(chunk_));
        std::tie(Ke, Ve) = ex->expand(K);
    }
    // The expanded form's weight sums are per query head (B, NH, T); the policy's groups
    // average their heads' sums, as ops::sdpa_ does for a group, so it sees the absorbed form's.
    auto expanded_sdpa = [&](Tensor& yy, const Tensor& qq, const Tensor& qp, Tensor* ws, Tensor* ls) {
        if (!ws) return ops::sdpa_(yy, qq, Ke, Ve, kpos, qp, scale, window, nullptr, ls);
        const int64_t NH = qq.size(1), G = ws->size(1), R = NH / G;
        Tensor wh = Tensor::empty({B, NH, T}, DType::F32, {dev, MemCategory::WORKSPACE, "attention weight sums"});
        ops::sdpa_(yy, qq, Ke, Ve, kpos, qp, scale, window, &wh, ls);
        const std::vector<float> per_head = wh.to_f32_vector();
        std::vector<double> group(size_t(B * G * T), 0.0);
        for (int64_t b = 0; b < B; ++b)
            for (int64_t h = 0; h < NH; ++h)
                for (int64_t t = 0; t < T; ++t) group[size_t((b * G + h / R) * T + t)] += double(per_head[size_t((b * NH + h) * T + t)]);
        for (double& x : group) x /= double(R);
        ws->copy_from(Tensor::from_f64({B, G, T}, group, DType::F32, {dev, MemCategory::WORKSPACE, "attention weight sums"}));
    };
    auto sdpa = [&](Tensor& yy, const Tensor& qq, const Tensor& qp, Tensor* ws, int64_t q0 = 0) {  // qq: queries [q0, q0 + n')
        // The window masks by slot position, so it holds over any set of kept slots: an
        // evicting policy may drop keys inside the window but never adds one outside it.
        switch (read_path_) {
            case ReadPath::POOLED: pooled_sdpa(yy, qq, K, V, qp, scale, ws, window); return;
            case ReadPath::FUSED: buffer_->attend(yy, qq, T, kpos, qp, scale, ws, window); return;
            case ReadPath::SELECTION: caps.selects_reads->attend_selection(yy, qq, K, V, kpos, qp, scale, ws, window); return;
            case ReadPath::SDPA:
                if (ex) {
                    Tensor ls = lse ? lse->slice(2, q0, q0 + qq.size(2)) : Tensor();
                    expanded_sdpa(yy, qq, qp, ws, lse ? &ls : nullptr);
                } else if (lse) {
                    Tensor ls = lse->slice(2, q0, q0 + qq.size(2));
                    ops::sdpa_(yy, qq, K, V, kpos, qp, scale, window, ws, &ls);
                } else {
                    ops::sdpa_(yy, qq, K, V, kpos, qp, scale, window, ws);
                }
                return;
        }
    };
    std::vector<float> w;
    const bool want = policy_->needs_attention_weights() && !replayed;
    {
        KV_TRACE_SPAN(trace::SpanCategory::ATTENTION, want ? "sdpa with weights" : "sdpa", .layer = layer_, .chunk = int(chunk_));
        MemoryLabelScope label(str("layer ", layer_, " attention"));
        Tensor ws;
        if (want) ws = Tensor::empty({B, policy_->groups(), T}, DType::F32, {dev, MemCategory::WORKSPACE, "attention weight sums"});
        // Only the last `win` queries vote (snapkv). A replay splits the chunk the same way: the
        // kernels' rounding depends on how many queries a call has, and a replay is bit-exact.
        const int64_t win = policy_->needs_attention_weights() ? policy_->weights_query_window() : 0;
        Tensor& Y = ex ? ex->y : y;
        const Tensor& Q = ex ? ex->q : qa;
        if (win <= 0 || win >= n) {
            sdpa(Y, Q, qpos, want ? &ws : nullptr);
        } else {
            Tensor y0 = Y.slice(2, 0, n - win), y1 = Y.slice(2, n - win, n);
            sdpa(y0, Q.slice(2, 0, n - win), qpos.slice(1, 0, n - win), nullptr);
            sdpa(y1, Q.slice(2, n - win, n), qpos.slice(1, n - win, n), want ? &ws : nullptr, n - win);
        }
        if (ex) ex->ran = true;
        if (want) w = ws.to_f32_vector();
    }
    if (!replayed) {
        KV_TRACE_SPAN(trace::SpanCategory::SCORING, "scoring", .layer = layer_, .chunk = int(chunk_));
        MemoryLabelScope label(str("layer ", layer_, " scoring"));
        policy_->update(w, n);
    }
    lse_written_ = lse != nullptr;
    finish_step(plan, want ? &w : nullptr, replayed);
}

void LayerCache::attend_shared(int reader, const Tensor& q, int64_t input_pos, float scale, int window, Tensor& y) {
    const int64_t B = q.size(0), n = q.size(2);
    const Device dev = q.device();
    if (chunk_ == 0 || policy_->input_pos() != input_pos + n || B != policy_->batch())
        throw Error(str("layer ", reader, " reads layer ", layer_, "'s keys and values for positions ", input_pos, "..", input_pos + n - 1,
                        " (batch ", B, "), but that cache has seen ", policy_->input_pos(), " positions (batch ", policy_->batch(), ")"),
                    "a KV-shared layer runs right after its source has taken the same chunk (one chunk per cell)");
    KV_TRACE_SPAN(trace::SpanCategory::ATTENTION, "sdpa (shared K/V)", .layer = reader, .chunk = int(chunk_ - 1));
    MemoryLabelScope label(str("layer ", reader, " attention over layer ", layer_, "'s cache"));
    const int64_t T = pooled() ? pool_slots(*policy_) : policy_->current_length();
    Tensor K, V;
    if (read_path_ != ReadPath::FUSED) std::tie(K, V) = buffer_->read(T);
    const Tensor kpos = pooled() ? Tensor() : positions_tensor(dev);
    const Tensor qpos = position_range(input_pos, n, dev);
    // Key re-rotation: the source's call turned the stored keys and its own queries; the reader's
    // queries turn by the same shift (the keys are already turned, so they are not touched again).
    Tensor qa = q;
    if (const RerotatesKeys* rk = policy_->capabilities().rerotates_keys; rk && rope_ && !rope_->empty() && rk->chunk_query_shift() != 0)
        qa = rotate_all(q, rk->chunk_query_shift(), *rope_, {dev, MemCategory::WORKSPACE, "re-rotated queries"});
    switch (read_path_) {
        case ReadPath::POOLED: pooled_sdpa(y, qa, K, V, qpos, scale, nullptr, window); return;
        case ReadPath::FUSED: buffer_->attend(y, qa, T, kpos, qpos, scale, nullptr, window); return;
        case ReadPath::SELECTION:
            policy_->capabilities().selects_reads->attend_selection(y, qa, K, V, kpos, qpos, scale, nullptr, window);
            return;
        case ReadPath::SDPA: ops::sdpa_(y, qa, K, V, kpos, qpos, scale, window); return;
    }
}

Tensor LayerCache::rerotate(const Tensor& q) {
    const RerotatesKeys& rk = *policy_->capabilities().rerotates_keys;
    if (!rope_ || rope_->empty()) return q;  // a NoPE layer (or no model): no angle to move
    const int64_t T = policy_->current_length(), L = policy_->cache_length(), rows = rk.key_shift_rows();
    const std::vector<int32_t>& sh = rk.key_shifts();
    std::vector<int32_t> s(size_t(rows * T));
    bool any = false;
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t t = 0; t < T; ++t) any |= (s[size_t(r * T + t)] = sh[size_t(r * L + t)]) != 0;
    const TensorOptions o{q.device(), MemCategory::WORKSPACE, "re-rotated keys"};
    if (any) {
        KV_TRACE_SPAN(trace::SpanCategory::CACHE_UPDATE, "key re-rotation", .layer = layer_, .chunk = int(chunk_));
        auto [K, V] = buffer_->read(T);
        const Tensor Kr = rotate_slots(K, s, rows, *rope_, o);
        // A buffer whose read is a view of its storage (the full-precision ones) takes the turned
        // keys in place; any other gets every filled slot rewritten through its write.
        bool in_place = false;
        for (Tensor* st : buffer_->storage_tensors()) in_place |= st && st->defined() && K.storage() == st->storage();
        if (in_place) {
            K.copy_from(Kr);
        } else {
            SlotPlan all;
            all.input_pos = policy_->input_pos();
            all.n = T;
            all.rows = 1;
            for (int64_t t = 0; t < T; ++t) all.targets.push_back(int32_t(t));
            all.length_after = T;
            buffer_->write(all, Kr, V.clone());
        }
    }
    const int64_t qs = rk.chunk_query_shift();
    return qs == 0 ? q : rotate_all(q, qs, *rope_, o);
}

size_t LayerCache::logical_bytes() const {
    if (!buffer_->allocated() || policy_->batch() == 0) return 0;
    const std::vector<int32_t>& pos = policy_->token_positions();
    int64_t kept = 0;  // (b, head, slot) entries with a token
    for (int32_t p : pos) kept += p >= 0;
    // Positions shared by all rows (L) stand for every (b, head) row.
    if (!policy_->per_row_positions() && !pooled()) kept *= policy_->batch() * policy_->groups();
    const int64_t D = policy_->batch() > 0 && !pos.empty() ? head_dim_ : 0;
    const double tensors = buffer_->values_are_keys() ? 1.0 : 2.0;  // a latent cache stores one vector per slot
    return size_t(double(kept) * tensors * double(D) * buffer_->bits_per_element() / 8.0);
}

void LayerCache::compact_buffer() {
    KV_TRACE_SPAN(trace::SpanCategory::CACHE_UPDATE, "compact blocks", .layer = layer_, .chunk = int(chunk_));
    const int64_t B = policy_->batch(), G = policy_->groups(), L = policy_->cache_length();
    const std::vector<int32_t>& pos = policy_->token_positions();
    std::vector<uint8_t> kept(size_t(B * L), 0);  // a slot is kept while any head of its row keeps it
    for (int64_t b = 0; b < B; ++b)
        for (int64_t s = 0; s < L; ++s) {
            if (!policy_->per_row_positions()) {
                kept[size_t(b * L + s)] = pos[size_t(s)] >= 0;
                continue;
            }
            for (int64_t g = 0; g < G && !kept[size_t(b * L + s)]; ++g) kept[size_t(b * L + s)] = pos[size_t((b * G + g) * L + s)] >= 0;
        }
    buffer_->compact(kept);
}

void LayerCache::finish_step(const SlotPlan& plan, const std::vector<float>* w, bool replayed) {
    if (rec_armed_ && !replayed && !w) {  // telemetry after the reconstruction pass (set_reconstruction_armed)
        rec_plan_ = plan;
        rec_pending_ = true;
        return;
    }
    record_step(plan);
    if (hook_) hook_({layer_, chunk_, &plan, policy_.get(), w});
    ++chunk_;
}

void LayerCache::set_reconstruction_armed(bool on) {
    if (!on) finish_reconstruction();
    rec_armed_ = on;
}

void LayerCache::finish_reconstruction() {
    if (!rec_pending_) return;
    rec_pending_ = false;
    record_step(rec_plan_);
    if (hook_) hook_({layer_, chunk_, &rec_plan_, policy_.get(), nullptr});
    ++chunk_;
}

}  // namespace kv
