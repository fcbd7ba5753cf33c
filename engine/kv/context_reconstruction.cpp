// Context reconstruction pass (see context_reconstruction.h).
#include "engine/kv/context_reconstruction.h"

#include <algorithm>

#include "engine/core/error.h"
#include "engine/kv/layer_cache.h"
#include "engine/memory/memory_tracker.h"
#include "engine/ops/ops.h"
#include "engine/telemetry/run_phase.h"
#include "engine/telemetry/trace.h"

namespace kv {

namespace {

// The attention a reconstruction piece runs at one layer: over the cache's slots [0, T) and the
// piece's own keys (causal), which are never written to the cache; the policy then scores.
class ReconstructionAttention final : public LayerAttention {
   public:
    ReconstructionAttention(KVCache& cache, int64_t begin, int64_t end) : cache_(cache), begin_(begin), end_(end) {}
    void attend(int layer, const Tensor& q, const Tensor& k, const Tensor& v, int64_t input_pos, float scale, int window,
                Tensor& y) override {
        LayerCache& lc = cache_.layer(layer);
        KVPolicy& pol = lc.policy();
        const int64_t B = q.size(0), G = k.size(1), m = k.size(2), D = k.size(3), T = pol.current_length();
        if (input_pos != pol.input_pos())
            throw Error(str("layer ", layer, " reconstruction: its queries start at position ", input_pos, " but the cache has seen ",
                            pol.input_pos(), " tokens"),
                        "a chunk's reconstruction runs right after the chunk");
        const Device dev = q.device();
        MemoryLabelScope label(str("layer ", layer, " reconstruction"));
        if (pool_slots(pol) > 0) return attend_pool(lc, layer, q, k, v, input_pos, scale, window, y);
        auto [K, V] = lc.buffer().read(T);
        const TensorOptions wo{dev, MemCategory::WORKSPACE, "reconstruction keys and values"};
        Tensor Kc = Tensor::empty({B, G, T + m, D}, K.dtype(), wo), Vc = Tensor::empty({B, G, T + m, D}, V.dtype(), wo);
        Kc.slice(2, 0, T).copy_from(K);
        Kc.slice(2, T, T + m).copy_from(k);
        Vc.slice(2, 0, T).copy_from(V);
        Vc.slice(2, T, T + m).copy_from(v);
        const std::vector<int32_t>& pos = pol.token_positions();
        const int64_t rows = pol.per_row_positions() ? B * G : 1, L = pol.cache_length();
        std::vector<int32_t> kp((size_t)(rows * (T + m)));
        for (int64_t r = 0; r < rows; ++r) {
            std::copy(pos.begin() + r * L, pos.begin() + r * L + T, kp.begin() + r * (T + m));
            for (int64_t i = 0; i < m; ++i) kp[size_t(r * (T + m) + T + i)] = int32_t(input_pos + i);
        }
        const Tensor kpos = pol.per_row_positions() ? Tensor::from_i32({B, G, T + m}, kp, {dev, MemCategory::WORKSPACE, "slot positions"})
                                                    : Tensor::from_i32({1, 1, T + m}, kp, {dev, MemCategory::WORKSPACE, "slot positions"});
        {
            KV_TRACE_SPAN(trace::SpanCategory::ATTENTION, "reconstruction sdpa", .layer = layer);
            ops::sdpa_(y, q, Kc, Vc, kpos, position_range(input_pos, m, dev), scale, window, nullptr);
        }
        KV_TRACE_SPAN(trace::SpanCategory::SCORING, "reconstruction scoring", .layer = layer);
        score(pol, q, k, input_pos, scale, K.contiguous().to_f32_vector());
    }

   private:
    // Per-head lengths (ada-kvzip): the pool (B, 1, S, D) and the piece's own keys of every group
    // side by side, (B, 1, S + G m, D); head group g sees the pool slots it keeps and its own
    // piece (pooled_attention). The policy reads the pool once per group, (B, G, S, D), with the
    // positions telling it whose slot each is.
    void attend_pool(LayerCache& lc, int layer, const Tensor& q, const Tensor& k, const Tensor& v, int64_t input_pos, float scale,
                     int window, Tensor& y) {
        KVPolicy& pol = lc.policy();
        const int64_t B = q.size(0), G = k.size(1), m = k.size(2), D = k.size(3), S = pool_slots(pol), W = S + G * m;
        const Device dev = q.device();
        auto [K, V] = lc.buffer().read(S);
        const TensorOptions wo{dev, MemCategory::WORKSPACE, "reconstruction keys and values"};
        Tensor Kc = Tensor::empty({B, 1, W, D}, K.dtype(), wo), Vc = Tensor::empty({B, 1, W, D}, V.dtype(), wo);
        Kc.slice(2, 0, S).copy_from(K);
        Kc.slice(2, S, W).copy_from(k.contiguous().reshape({B, 1, G * m, D}));
        Vc.slice(2, 0, S).copy_from(V);
        Vc.slice(2, S, W).copy_from(v.contiguous().reshape({B, 1, G * m, D}));
        const std::vector<int32_t>& pos = pol.token_positions();  // (B, G, S)
        std::vector<int32_t> kp(size_t(B * G * W), -1);
        for (int64_t r = 0; r < B * G; ++r) {
            std::copy(pos.begin() + r * S, pos.begin() + (r + 1) * S, kp.begin() + r * W);
            for (int64_t i = 0; i < m; ++i) kp[size_t(r * W + S + (r % G) * m + i)] = int32_t(input_pos + i);
        }
        {
            KV_TRACE_SPAN(trace::SpanCategory::ATTENTION, "reconstruction sdpa", .layer = layer);
            pooled_attention(y, q, Kc, Vc, kp, G, position_range(input_pos, m, dev), scale, nullptr, window);
        }
        KV_TRACE_SPAN(trace::SpanCategory::SCORING, "reconstruction scoring", .layer = layer);
        const std::vector<float> pool = K.contiguous().to_f32_vector();  // (B, 1, S, D)
        std::vector<float> per_head(size_t(B * G * S * D));
        for (int64_t r = 0; r < B * G; ++r) std::copy_n(pool.begin() + (r / G) * S * D, S * D, per_head.begin() + r * S * D);
        score(pol, q, k, input_pos, scale, std::move(per_head));
    }

    // Hands the piece's queries and keys and the cache's keys (B, G, T, D) to the policy; a
    // windowed layer keeps its ring by rule and scores nothing.
    void score(KVPolicy& pol, const Tensor& q, const Tensor& k, int64_t input_pos, float scale, std::vector<float> cache_keys) const {
        ReconstructsContext* r = pol.capabilities().reconstructs_context;
        if (!r) return;
        ReconstructionInput in;
        in.queries = q.contiguous().to_f32_vector();
        in.own_keys = k.contiguous().to_f32_vector();
        in.cache_keys = std::move(cache_keys);
        in.query_heads = q.size(1);
        in.m = k.size(2);
        in.head_dim = k.size(3);
        in.query_pos = input_pos;
        in.chunk_begin = begin_;
        in.chunk_end = end_;
        in.scale = scale;
        r->observe_reconstruction(in);
    }

   private:
    KVCache& cache_;
    int64_t begin_, end_;
};

}  // namespace

std::unique_ptr<ContextReconstruction> make_context_reconstruction(Transformer& model, KVCache& cache) {
    if (cache.num_layers() == 0 || !cache.layer(0).policy().capabilities().reconstructs_context) return nullptr;
    return std::make_unique<ContextReconstruction>(model, cache);
}

ContextReconstruction::ContextReconstruction(Transformer& model, KVCache& cache)
    : model_(model), cache_(cache), prompt_(cache.layer(0).policy().capabilities().reconstructs_context->reconstruction_prompt()) {
    if (prompt_.piece < 1) throw Error("reconstruction: the policy's piece length must be at least 1");
    for (int l = 0; l < cache_.num_layers(); ++l) cache_.layer(l).set_reconstruction_armed(true);
}

ContextReconstruction::~ContextReconstruction() {
    for (int l = 0; l < cache_.num_layers(); ++l) cache_.layer(l).set_reconstruction_armed(false);
}

int64_t ContextReconstruction::max_piece_tokens(int64_t max_chunk) const {
    const int64_t head = std::max<int64_t>(int64_t(prompt_.first.size()), int64_t(prompt_.later.size()) + prompt_.quoted);
    return head + int64_t(prompt_.suffix.size()) + std::min(max_chunk, prompt_.piece);
}

ReconstructionChunk ContextReconstruction::prepare(const Tensor& ids, int64_t start) {
    PhaseScope phase(RunPhase::RECONSTRUCTION);
    const int64_t B = ids.size(0), n = ids.size(1), V = model_.config().vocab_size;
    const std::vector<int64_t> tok = ids.contiguous().to_i64_vector();
    if (start == 0) recent_.assign(size_t(B), {});
    if (int64_t(recent_.size()) != B) throw Error(str("reconstruction: chunk at position ", start, " has ", B, " rows, the sequence ", recent_.size()));
    auto check = [&](const std::vector<int32_t>& p) {
        for (int32_t id : p)
            if (id < 0 || id >= V)
                throw Error(str("reconstruction prompt: token id ", id, " is outside the model's vocabulary of ", V),
                            "the cache's tokenizer does not belong to this model");
    };
    check(prompt_.first), check(prompt_.later), check(prompt_.suffix);
    ReconstructionChunk c;
    c.query_pos = start + n;
    for (int64_t s = 0; s < n; s += prompt_.piece) {
        const int64_t e = std::min(n, s + prompt_.piece);
        std::vector<int32_t> all;
        for (int64_t b = 0; b < B; ++b) {
            std::vector<int32_t> row = start + s == 0 ? prompt_.first : prompt_.later;
            if (start + s > 0) {
                // the `quoted` tokens before the piece: the end of earlier chunks, then this chunk's
                std::vector<int32_t> before = recent_[size_t(b)];
                for (int64_t t = 0; t < s; ++t) before.push_back(int32_t(tok[size_t(b * n + t)]));
                const int64_t q = std::min<int64_t>(prompt_.quoted, int64_t(before.size()));
                row.insert(row.end(), before.end() - q, before.end());
            }
            row.insert(row.end(), prompt_.suffix.begin(), prompt_.suffix.end());
            for (int64_t t = s; t < e; ++t) row.push_back(int32_t(tok[size_t(b * n + t)]));
            all.insert(all.end(), row.begin(), row.end());
        }
        const int64_t m = int64_t(all.size()) / B;
        c.pieces.push_back({model_.embed(Tensor::from_i32({B, m}, all)), start + s, start + e});
    }
    for (int64_t b = 0; b < B; ++b) {
        std::vector<int32_t>& r = recent_[size_t(b)];
        for (int64_t t = 0; t < n; ++t) r.push_back(int32_t(tok[size_t(b * n + t)]));
        if (int64_t(r.size()) > prompt_.quoted) r.erase(r.begin(), r.end() - prompt_.quoted);
    }
    return c;
}

void ContextReconstruction::run_layer(int l, ReconstructionChunk& chunk) {
    PhaseScope phase(RunPhase::RECONSTRUCTION);
    for (auto& p : chunk.pieces) {
        ReconstructionAttention att(cache_, p.begin, p.end);
        p.x = model_.block(l, p.x, chunk.query_pos, att);
    }
    cache_.layer(l).finish_reconstruction();
}

}  // namespace kv
