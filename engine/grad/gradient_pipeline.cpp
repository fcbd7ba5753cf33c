// Gradient pipeline (see gradient_pipeline.h). Vocabulary: a row is a range of layers, a cell
// a range of chunks (the chunk plan's cells); phase 2 visits (row, cell) pairs top-down and
// right-to-left. Shapes: B batch, T tokens, E width, G KV heads, D head size.
//
// Index
//   [SECTION] rows and cells (the lattice)
//   [SECTION] chunk helpers and replay attention
//   [SECTION] loss through the replay (replay_loss)
//   [SECTION] one gradient run: phase 1 (forward, checkpoints), phase 2 (reverse over cells)
//   [SECTION] entry points
#include "gradient_pipeline.h"

#include <chrono>
#include <memory>

#include "checkpoint_store.h"
#include "engine/driver/chunk_loop.h"
#include "engine/core/error.h"
#include "engine/kv/kv_config.h"
#include "engine/model/altup_backward.h"
#include "engine/model/transformer_backward.h"
#include "engine/ops/ops.h"
#include "engine/telemetry/run_phase.h"
#include "engine/telemetry/trace.h"
#include "replay_cache.h"

namespace kv {

// =========================================================================================
// [SECTION] rows and cells (the lattice)
// =========================================================================================
std::vector<std::pair<int, int>> gradient_rows(int nl, int64_t lpc) {
    if (lpc < 1) throw Error(str("--grad.layers_per_cell: ", lpc, " must be at least 1"));
    std::vector<int> starts;
    for (int l = 0; l < nl; l += int(lpc)) starts.push_back(l);
    if (lpc > 1 && starts.size() > 1 && nl - starts.back() == 1) starts.pop_back();
    std::vector<std::pair<int, int>> rows;
    for (size_t i = 0; i < starts.size(); ++i) rows.push_back({starts[i], i + 1 < starts.size() ? starts[i + 1] : nl});
    return rows;
}

// =========================================================================================
// [SECTION] chunk helpers and replay attention
// =========================================================================================
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct CellRange {
    size_t c0, c1;       // chunks [c0, c1)
    int64_t start, len;  // tokens [start, start + len)
};

std::vector<CellRange> cell_ranges(const ChunkPlan& plan) {
    std::vector<CellRange> out;
    for (auto [c0, c1] : plan.cells) {
        const int64_t s = plan.starts[c0], e = plan.starts[c1 - 1] + plan.chunks[c1 - 1];
        out.push_back({c0, c1, s, e - s});
    }
    return out;
}

// Chunk tensors (B, n, E) of a cell joined into one (B, len, E) tensor.
Tensor join_chunks(const std::vector<Tensor>& xs, MemCategory cat, const std::string& label) {
    int64_t len = 0;
    for (const auto& x : xs) len += x.size(1);
    Tensor out = Tensor::empty({xs[0].size(0), len, xs[0].size(2)}, xs[0].dtype(), {xs[0].device(), cat, label});
    int64_t s = 0;
    for (const auto& x : xs) {
        Tensor d = out.slice(1, s, s + x.size(1));
        ops::copy_(d, x);
        s += x.size(1);
    }
    return out;
}

// The cell's (B, len, E) tensor cut into contiguous per-chunk tensors.
std::vector<Tensor> split_chunks(const Tensor& x, const ChunkPlan& plan, const CellRange& cr, MemCategory cat) {
    std::vector<Tensor> out;
    for (size_t c = cr.c0; c < cr.c1; ++c) {
        const int64_t s = plan.starts[c] - cr.start;
        Tensor t = Tensor::empty({x.size(0), plan.chunks[c], x.size(2)}, x.dtype(), {x.device(), cat, "chunk"});
        ops::copy_(t, x.slice(1, s, s + plan.chunks[c]));
        out.push_back(std::move(t));
    }
    return out;
}

// The block's LayerAttention during replays: layer l's replay cache.
class ReplayAttention final : public LayerAttention {
 public:
    ReplayAttention(std::vector<std::unique_ptr<ReplayLayerCache>>& caches, int l0, bool record)
        : caches_(caches), l0_(l0), record_(record) {}
    void attend(int layer, const Tensor& q, const Tensor& k, const Tensor& v, int64_t input_pos, float scale, int window,
                Tensor& y) override {
        // The caches were given each layer's window from the config (make_caches); a call with
        // another one would train against attention the model never computes.
        ReplayLayerCache& c = *caches_[size_t(layer - l0_)];
        if (window != c.window())
            throw Error(str("layer ", layer, ": the model attends with a window of ", window, " tokens, the gradient replay with ",
                            c.window()));
        c.set_rope_frequencies(rope_);
        c.forward(q, k, v, input_pos, scale, y, record_);
    }
    // A KV-shared layer reads its source's replay cache (the same row: GradientRun keeps them together).
    void attend_shared(int layer, int source, const Tensor& q, int64_t input_pos, float scale, int window, Tensor& y) override {
        if (source < l0_ || size_t(source - l0_) >= caches_.size())
            throw Error(str("layer ", layer, " reads layer ", source, "'s cache, which is not in the gradient replay's row"));
        caches_[size_t(source - l0_)]->forward_shared(layer, q, input_pos, scale, window, y);
    }
    // Set before each layer's attend (Transformer::block); a re-rotating replay turns with them.
    void set_rope_frequencies(const std::vector<double>* inv_freq) override { rope_ = inv_freq; }
    LayerState* layer_state(int layer) override { return caches_[size_t(layer - l0_)]->layer_state(); }

 private:
    std::vector<std::unique_ptr<ReplayLayerCache>>& caches_;
    int l0_;
    bool record_;
    const std::vector<double>* rope_ = nullptr;
};

class ReplayAttentionBackward final : public AttentionBackward {
 public:
    ReplayAttentionBackward(std::vector<std::unique_ptr<ReplayLayerCache>>& caches, int l0)
        : caches_(caches), l0_(l0), state_grads_(caches.size()) {}
    void backward(int layer, const Tensor& q, const Tensor& dy, float scale, Tensor& dq, Tensor& dk, Tensor& dv) override {
        caches_[size_t(layer - l0_)]->backward(q, dy, scale, dq, dk, dv);
    }
    void backward_shared(int layer, int source, const Tensor& q, const Tensor& dy, float scale, int window, Tensor& dq) override {
        if (source < l0_ || size_t(source - l0_) >= caches_.size())
            throw Error(str("layer ", layer, " reads layer ", source, "'s cache, which is not in the gradient replay's row"));
        caches_[size_t(source - l0_)]->backward_shared(layer, q, dy, scale, window, dq);
    }
    // One slot per layer for the row's whole reverse pass: a layer's chunks are reversed right
    // to left across the cells too, so the gradient a chunk leaves is the next one's to take.
    Tensor* layer_state_grad(int layer) override { return &state_grads_[size_t(layer - l0_)]; }

 private:
    std::vector<std::unique_ptr<ReplayLayerCache>>& caches_;
    int l0_;
    std::vector<Tensor> state_grads_;
};

std::vector<std::unique_ptr<ReplayLayerCache>> make_caches(const Transformer& m, int l0, int l1, int64_t B,
                                                           const std::vector<int64_t>& Ls,
                                                           const std::vector<std::vector<SlotPlan>>& plans,
                                                           std::shared_ptr<const ReadSelection> selection = nullptr) {
    const ModelConfig& c = m.config();
    std::vector<std::unique_ptr<ReplayLayerCache>> out;
    for (int l = l0; l < l1; ++l) {
        out.push_back(std::make_unique<ReplayLayerCache>(l, B, c.num_kv_heads, Ls[size_t(l)], c.head_dim, m.act_dtype(),
                                                         m.options().device, &plans[size_t(l)]));
        // A windowed layer kept its window by rule in the live cache (engine/kv/window_layer.h):
        // a read selection applies to the full-attention layers only.
        out.back()->set_read_selection(c.layer_window(l) > 0 ? nullptr : selection);
        out.back()->set_window(c.layer_window(l));
    }
    return out;
}

// Per-category maximum of two stats lists (phase peak over cells).
void merge_peaks(std::vector<DeviceMemoryStats>& into, const std::vector<DeviceMemoryStats>& s) {
    for (const auto& d : s) {
        auto it = std::find_if(into.begin(), into.end(), [&](const DeviceMemoryStats& x) { return x.device == d.device; });
        if (it == into.end()) {
            into.push_back(d);
            continue;
        }
        for (size_t k = 0; k < d.peak.size(); ++k) it->peak[k] = std::max(it->peak[k], d.peak[k]);
        it->peak_total = std::max(it->peak_total, d.peak_total);
    }
}

// Mean over the sequence of the final-norm states (B, E), for mean-pooled classification.
Tensor mean_pooled(const Transformer& m, const std::vector<Tensor>& finals_device, int64_t T) {
    Tensor sum;
    for (const auto& x : finals_device) {
        Tensor h = m.final_norm(x);  // (B, len, E)
        Tensor ones = Tensor::full({h.size(0), 1, h.size(1)}, h.dtype(), 1.0, {h.device(), MemCategory::WORKSPACE, "ones"});
        Tensor s = ops::matmul(ones, h, h.dtype());  // (B, 1, len) @ (B, len, E) -> (B, 1, E)
        if (!sum.defined())
            sum = s;
        else
            ops::add_(sum, sum, s);
    }
    std::vector<double> v = sum.to_f64_vector();
    for (double& x : v) x /= double(T);
    return Tensor::from_f64({sum.size(0), sum.size(2)}, v, sum.dtype(), {sum.device(), MemCategory::ACTIVATIONS, "pooled"});
}

// A KV-shared layer's reverse adds to its source's cache gradient before the source reverses the
// same chunk, and its forward reads the source's replay cache: rows from a source to its readers
// are joined into one.
std::vector<std::pair<int, int>> rows_keeping_kv_sources(const ModelConfig& c, std::vector<std::pair<int, int>> rows) {
    for (int64_t l = 0; l < c.num_layers; ++l) {
        if (!c.kv_shared(l)) continue;
        const int64_t src = c.kv_layer(l);
        size_t a = 0, b = 0;
        for (size_t r = 0; r < rows.size(); ++r) {
            if (src >= rows[r].first && src < rows[r].second) a = r;
            if (l >= rows[r].first && l < rows[r].second) b = r;
        }
        if (a < b) {
            rows[a].second = rows[b].second;
            rows.erase(rows.begin() + long(a) + 1, rows.begin() + long(b) + 1);
        }
    }
    return rows;
}

std::vector<int64_t> layer_cache_lengths(const KVCache& cache) {
    std::vector<int64_t> Ls;
    for (int l = 0; l < cache.num_layers(); ++l) Ls.push_back(cache.layer(l).policy().cache_length());
    return Ls;
}

}  // namespace

// =========================================================================================
// [SECTION] loss through the replay (replay_loss)
// =========================================================================================
double replay_loss(const Transformer& m, const std::vector<std::vector<SlotPlan>>& plans, const std::vector<int64_t>& Ls,
                   const Tensor& ids, const ChunkPlan& plan, const HeadSpec& head, double loss_scale, const Tensor* x0,
                   std::shared_ptr<const ReadSelection> selection) {
    const int nl = int(m.config().num_layers);
    const int64_t B = ids.size(0);
    auto caches = make_caches(m, 0, nl, B, Ls, plans, std::move(selection));
    for (auto& c : caches) c->load(nullptr);
    ReplayAttention att(caches, 0, false);
    HeadResult res;
    res.init(B);
    std::vector<Tensor> finals;
    ChunkLoopHooks hooks;
    hooks.inputs = [&](size_t ci) {
        std::vector<Tensor> xs;
        for (size_t c = plan.cells[ci].first; c < plan.cells[ci].second; ++c) {
            if (x0)
                xs.push_back(x0->slice(1, plan.starts[c], plan.starts[c] + plan.chunks[c]).clone());
            else
                xs.push_back(m.embed(ids.slice(1, plan.starts[c], plan.starts[c] + plan.chunks[c])));
        }
        return xs;
    };
    hooks.attention = [&](int, size_t) -> LayerAttention& { return att; };
    hooks.after_cell = [&](size_t, std::vector<Tensor>& xs) {
        finals.push_back(join_chunks(xs, MemCategory::ACTIVATIONS, "final states"));
    };
    run_chunk_loop(m, plan, hooks);
    // The head's loss through the same code the gradient uses (dx is discarded, and with it
    // the adapters' backward: a loss evaluation must not add to LoRA gradients).
    const std::vector<double> w = head_row_weights(head, loss_scale);
    HeadGrads no_grads;
    no_grads.adapters = false;
    Tensor pooled = head.kind == HeadKind::SEQ_CLASS && head.mean_pool ? mean_pooled(m, finals, head.T) : Tensor();
    double loss = 0;
    const auto crs = cell_ranges(plan);
    for (size_t i = 0; i < finals.size(); ++i) {
        Tensor dx = Tensor::empty(finals[i].shape(), finals[i].dtype(), {finals[i].device(), MemCategory::WORKSPACE, "dx"});
        loss += head_backward(m, finals[i], crs[i].start, head, w, dx, no_grads, int64_t(256) << 20, pooled);
    }
    return loss;
}

// =========================================================================================
// [SECTION] one gradient run: phase 1 (forward, checkpoints), phase 2 (reverse over cells)
// =========================================================================================
namespace {

// One gradient computation: the state both entry points share (checkpoints, rows, cells).
class GradientRun {
 public:
    GradientRun(const Transformer& model, const Tensor& ids, const ChunkPlan& plan, const HeadSpec& head, double loss_scale,
                const GradientOptions& opt, const GradientTargets& targets, const DriverCallbacks& cb)
        : model(model),
          mc(model.config()),
          ids(ids),
          plan(plan),
          head(head),
          loss_scale(loss_scale),
          opt(opt),
          targets(targets),
          cb(cb),
          nl(int(mc.num_layers)),
          B(ids.size(0)),
          T(ids.size(1)),
          E(mc.residual_width()),
          act(model.act_dtype()),
          dev(model.options().device),
          host(opt.host),
          tracker(current_memory_tracker()),
          layer_fmt(opt.layercp_qname),
          kv_fmt(opt.cachecp_qname.empty() ? opt.layercp_qname : opt.cachecp_qname),
          rows(rows_keeping_kv_sources(mc, gradient_rows(nl, opt.layers_per_cell))),
          crs(cell_ranges(plan)),
          ncells(crs.size()),
          row_at(size_t(nl), -1),
          layer_cp(rows.size(), std::vector<Tensor>(ncells)),
          final_cp(ncells) {
        if (act != DType::F32 && act != DType::F64)
            throw Error("gradients need f32 or f64 activations; the model runs in a 16-bit type",
                        "use --precision f32 for training");
        for (size_t r = 0; r < rows.size(); ++r) row_at[size_t(rows[r].first)] = int(r);
        st.rows = int64_t(rows.size());
        st.cells = int64_t(ncells);
        st.chunks = int64_t(plan.chunks.size());
        total_units = int64_t(plan.chunks.size()) * nl * 3;
    }

    // Phase 1 on the real cache; with `exact` the checkpoints come from replay_checkpoints().
    // A layer's buffer at the start of cell ci, taken from the phase-1 cache (full-precision
    // buffers only): the same state the row replay would rebuild, without recomputing it.
    void snapshot_forward_kv(KVCache& cache, int l, size_t ci) {
        KV_TRACE_SPAN(trace::SpanCategory::CHECKPOINT_COPY, "KV checkpoint", .layer = l, .cell_col = int(ci));
        LayerCache& lc = cache.layer(l);
        const KVPolicy& pol = lc.policy();
        const int64_t L = pol.cache_length(), T = pol.current_length(), G = mc.num_kv_heads, D = mc.head_dim;
        ReplayKVState s;
        // A layer without a token cache (short convolution) checkpoints its state and no K/V.
        const bool tokens = mc.has_kv_cache(l);
        if (tokens) {
            Tensor k = Tensor::zeros({B, G, L, D}, act, {dev, MemCategory::WORKSPACE, "KV snapshot"});
            Tensor v = Tensor::zeros({B, G, L, D}, act, {dev, MemCategory::WORKSPACE, "KV snapshot"});
            auto [K, V] = lc.buffer().read(T);
            Tensor kd = k.slice(2, 0, T), vd = v.slice(2, 0, T);
            ops::copy_(kd, K);
            ops::copy_(vd, V);
            s.K = kv_fmt.store(k, host, MemCategory::KV_CHECKPOINT, str("layer ", l, " key checkpoint, cell ", ci));
            s.V = kv_fmt.store(v, host, MemCategory::KV_CHECKPOINT, str("layer ", l, " value checkpoint, cell ", ci));
        }
        s.pos.assign(size_t(B * G * L), -1);
        if (tokens) {
            const std::vector<int32_t>& pos = pol.token_positions();
            for (int64_t r = 0; r < B * G; ++r)
                std::copy_n(pos.begin() + (pol.per_row_positions() ? r * L : 0), L, s.pos.begin() + r * L);
        }
        s.length = tokens ? T : 0;
        if (const LayerState* ls = cache.layer_state(l)) {  // a short convolution's state at the cell's start
            if (ls->values.defined()) s.state.values = ls->values.clone();
            s.state.next_pos = ls->next_pos;
        }
        s.chunk = int64_t(crs[ci].c0);
        s.input_pos = crs[ci].start;
        if (tokens) st.kv_checkpoint_bytes += s.K.nbytes() + s.V.nbytes();
        kv_forward[ci][size_t(l)] = std::move(s);
    }

    void phase1(Transformer& model_rw, KVCache& cache, bool exact, const std::vector<std::vector<SlotPlan>>* forced_plans) {
        kv_from_forward = !exact && opt.kv_checkpoints_from_forward && find_buffer(cache.config().buffer())->same_as_activations() && ncells > 1;
        // the replay rebuilds its own layout when heads share a pool or lengths change in the run
        if (!cache.fixed_slot_layout()) kv_from_forward = false;
        // KV-shared layers keep no buffer of their own in the live cache: the row replay rebuilds them
        if (mc.any_kv_shared()) kv_from_forward = false;
        if (kv_from_forward) kv_forward.assign(ncells, std::vector<ReplayKVState>(size_t(nl)));
        (void)model_rw;
        Transformer& model = model_rw;
        // ---- phase 1: the real forward, decisions logged, checkpoints at row starts ----------
        {
            auto phase = trace::span(trace::SpanCategory::RUN, "gradient phase 1 (forward)");
            PhaseScope forward_phase(RunPhase::POLICY_PASS);
            DriverCallbacks cb1;
            cb1.cancel = cb.cancel;
            cb1.progress = [&](int64_t d, int64_t) {
                if (cb.progress) cb.progress(d, total_units);
            };
            if (!exact) {
                cb1.layer_input = [&](int l, size_t ci, const std::vector<Tensor>& xs) {
                    if (kv_from_forward && ci > 0) snapshot_forward_kv(cache, l, ci);
                    if (row_at[size_t(l)] < 0) return;
                    KV_TRACE_SPAN(trace::SpanCategory::CHECKPOINT_COPY, "layer checkpoint", .layer = l, .cell_col = int(ci));
                    Tensor j = join_chunks(xs, MemCategory::ACTIVATIONS, "checkpoint staging");
                    layer_cp[size_t(row_at[size_t(l)])][ci] = layer_fmt.store(j, host, MemCategory::ACTIVATION_CHECKPOINT,
                                                                              str("layer ", l, " input checkpoint, cell ", ci));
                };
                cb1.final_output = [&](size_t ci, const std::vector<Tensor>& xs) {
                    KV_TRACE_SPAN(trace::SpanCategory::CHECKPOINT_COPY, "final checkpoint", .cell_col = int(ci));
                    Tensor j = join_chunks(xs, MemCategory::ACTIVATIONS, "checkpoint staging");
                    final_cp[ci] =
                        layer_fmt.store(j, host, MemCategory::ACTIVATION_CHECKPOINT, str("final output checkpoint, cell ", ci));
                };
            }
            if (forced_plans) {
                if (int(forced_plans->size()) != nl)
                    throw Error(str("forced plans: ", forced_plans->size(), " layers, the model has ", nl));
                cb1.replay = forced_plans;
            }
            cache.set_replay_logging(true);
            long_context_forward(model, cache, ids, plan, head, st.head, cb1, false);
            st.plans.resize(size_t(nl));
            for (int l = 0; l < nl; ++l) st.plans[size_t(l)] = cache.layer(l).replay_log().plans();
            cache.set_replay_logging(false);
            cache.release_buffers();
            st.loss = (head.kind == HeadKind::NEXT_TOKEN && head.average_loss_per_batch ? st.head.token_mean_loss() : st.head.mean_loss()) *
                      loss_scale;
        }
        Ls = layer_cache_lengths(cache);
        done_units = int64_t(plan.chunks.size()) * nl;
    }

    // Layer checkpoints from a full-precision replay of the logged decisions
    // (cell -> layer -> chunk).
    void replay_checkpoints() {
        // Checkpoints from a full-precision replay of the logged decisions (cell -> layer -> chunk).
        auto phase = trace::span(trace::SpanCategory::RUN, "gradient checkpoints (replay)");
        PhaseScope replay_phase(RunPhase::POLICY_PASS);  // the forward again, from checkpoints
        auto caches = make_caches(model, 0, nl, B, Ls, st.plans, opt.selection);
        for (auto& c : caches) c->load(nullptr);
        ReplayAttention att(caches, 0, false);
        ChunkLoopHooks hooks;
        hooks.inputs = [&](size_t ci) {
            std::vector<Tensor> xs;
            for (size_t c = crs[ci].c0; c < crs[ci].c1; ++c)
                xs.push_back(model.embed(ids.slice(1, plan.starts[c], plan.starts[c] + plan.chunks[c])));
            return xs;
        };
        hooks.attention = [&](int, size_t) -> LayerAttention& { return att; };
        hooks.before_layer = [&](int l, size_t ci, const std::vector<Tensor>& xs) {
            if (row_at[size_t(l)] >= 0)
                layer_cp[size_t(row_at[size_t(l)])][ci] =
                    layer_fmt.store(join_chunks(xs, MemCategory::ACTIVATIONS, "checkpoint staging"), host,
                                    MemCategory::ACTIVATION_CHECKPOINT, str("layer ", l, " input checkpoint, cell ", ci));
        };
        hooks.after_cell = [&](size_t ci, std::vector<Tensor>& xs) {
            final_cp[ci] = layer_fmt.store(join_chunks(xs, MemCategory::ACTIVATIONS, "checkpoint staging"), host,
                                           MemCategory::ACTIVATION_CHECKPOINT, str("final output checkpoint, cell ", ci));
        };
        run_chunk_loop(model, plan, hooks);
    }

    void finish_phase1(Clock::time_point t0) {
        for (const auto& r : layer_cp)
            for (const auto& t : r) st.layer_checkpoint_bytes += t.nbytes();
        for (const auto& t : final_cp) st.layer_checkpoint_bytes += t.nbytes();
        st.phase1_seconds = seconds_since(t0);
        st.phase1_memory = tracker.all_stats();
    }

    void phase2() {
        // ---- phase 2: head gradients, then rows top-down, cells right-to-left -----------------
        const auto t0 = Clock::now();
        tracker.reset_peaks();
        auto phase2 = trace::span(trace::SpanCategory::BACKWARD, "gradient phase 2 (backward)");
        PhaseScope backward_phase(RunPhase::BACKWARD);
        auto load_cp = [&](const Tensor& stored, const CellRange& cr, const char* what) {
            return layer_fmt.load(stored, {B, cr.len, E}, act, dev, MemCategory::ACTIVATIONS, what);
        };
        // Gradient slots per cell: first w.r.t. the final-layer output, then w.r.t. each row's input.
        std::vector<Tensor> gslot(ncells);
        {
            KV_TRACE_SPAN(trace::SpanCategory::HEAD, "head gradients");
            const std::vector<double> w = head_row_weights(head, loss_scale);
            HeadGrads hg;
            hg.model = targets.model;
            hg.class_weight = targets.class_weight;
            hg.class_bias = targets.class_bias;
            Tensor pooled;
            if (head.kind == HeadKind::SEQ_CLASS && head.mean_pool) {
                std::vector<Tensor> finals;
                for (size_t ci = 0; ci < ncells; ++ci) finals.push_back(load_cp(final_cp[ci], crs[ci], "final states"));
                pooled = mean_pooled(model, finals, T);
            }
            for (size_t ci = 0; ci < ncells; ++ci) {
                Tensor x = load_cp(final_cp[ci], crs[ci], "final states");
                Tensor dx = Tensor::empty(x.shape(), act, {dev, MemCategory::GRADIENTS, "head gradient"});
                st.replay_loss += head_backward(model, x, crs[ci].start, head, w, dx, hg, opt.max_logit_bytes, pooled);
                gslot[ci] =
                    Tensor::empty(dx.shape(), act, {host, MemCategory::ACTIVATION_CHECKPOINT, str("gradient slot, cell ", ci)});
                gslot[ci].copy_from(host == dev ? dx : dx.to(host));
            }
            final_cp.clear();
        }

        for (int r = int(rows.size()) - 1; r >= 0; --r) {
            const auto [l0, l1] = rows[size_t(r)];
            auto caches = make_caches(model, l0, l1, B, Ls, st.plans, opt.selection);
            // KV checkpoints at the start of cells 1.. from a replay of the row (cells 0 .. n-2).
            std::vector<std::vector<ReplayKVState>> kv_cp(ncells);
            if (kv_from_forward) {
                for (size_t ci = 1; ci < ncells; ++ci)
                    for (int l = l0; l < l1; ++l) kv_cp[ci].push_back(std::move(kv_forward[ci][size_t(l)]));
            } else if (ncells > 1) {
                auto s = trace::span(trace::SpanCategory::CELL, "row replay", {.cell_row = r});
                for (auto& c : caches) c->load(nullptr);
                ReplayAttention att(caches, l0, false);
                ChunkLoopHooks hooks;
                hooks.inputs = [&](size_t ci) {
                    return split_chunks(load_cp(layer_cp[size_t(r)][ci], crs[ci], "row input"), plan, crs[ci],
                                        MemCategory::ACTIVATIONS);
                };
                hooks.attention = [&](int, size_t) -> LayerAttention& { return att; };
                hooks.after_layer = [&](int, size_t ci) { tick(int64_t(crs[ci].c1 - crs[ci].c0)); };
                hooks.after_cell = [&](size_t ci, std::vector<Tensor>&) {
                    for (int l = l0; l < l1; ++l) {
                        KV_TRACE_SPAN(trace::SpanCategory::CHECKPOINT_COPY, "KV checkpoint", .layer = l, .cell_row = r,
                                      .cell_col = int(ci + 1));
                        ReplayKVState snap = caches[size_t(l - l0)]->snapshot(dev, MemCategory::WORKSPACE);
                        if (!mc.has_kv_cache(l)) {  // a short convolution: its state only, its cache stays empty
                            snap.K = snap.V = Tensor();
                            kv_cp[ci + 1].push_back(std::move(snap));
                            continue;
                        }
                        snap.K = kv_fmt.store(snap.K, host, MemCategory::KV_CHECKPOINT,
                                              str("layer ", l, " key checkpoint, cell ", ci + 1));
                        snap.V = kv_fmt.store(snap.V, host, MemCategory::KV_CHECKPOINT,
                                              str("layer ", l, " value checkpoint, cell ", ci + 1));
                        st.kv_checkpoint_bytes += snap.K.nbytes() + snap.V.nbytes();
                        kv_cp[ci + 1].push_back(std::move(snap));
                    }
                };
                run_chunk_loop(model, plan, hooks, {.cell_end = ncells - 1, .layer_begin = l0, .layer_end = l1});
            }
            // Cells right to left; the gradient w.r.t. each layer's KV state at a cell's start is
            // handed to the cell on its left (straight through quantized checkpoints).
            std::vector<Tensor> carried_k(size_t(l1 - l0)), carried_v(size_t(l1 - l0));
            ReplayAttention att(caches, l0, true);
            ReplayAttentionBackward attb(caches, l0);
            for (int ci = int(ncells) - 1; ci >= 0; --ci) {
                const CellRange& cr = crs[size_t(ci)];
                const uint64_t cell_t0 = now_ns();
                tracker.reset_peaks();
                auto cell_span = trace::span(trace::SpanCategory::CELL, "cell backward", {.cell_row = r, .cell_col = ci});
                for (int l = l0; l < l1; ++l) {
                    ReplayLayerCache& rc = *caches[size_t(l - l0)];
                    if (ci == 0)
                        rc.load(nullptr);
                    else {
                        ReplayKVState s = kv_cp[size_t(ci)][size_t(l - l0)];
                        const Shape ks = s.K.defined() && !kv_fmt.quantized()
                                             ? s.K.shape()
                                             : s.pool ? Shape{B, 1, s.pool, mc.head_dim}  // per-head lengths
                                                      : Shape{B, mc.num_kv_heads, Ls[size_t(l)], mc.head_dim};
                        if (s.K.defined()) {  // undefined: a layer without a token cache (its state only)
                            s.K = kv_fmt.load(s.K, ks, act, dev, MemCategory::WORKSPACE, "key checkpoint");
                            s.V = kv_fmt.load(s.V, ks, act, dev, MemCategory::WORKSPACE, "value checkpoint");
                        }
                        rc.load(&s);
                    }
                    const size_t i = size_t(l - l0);
                    rc.set_state_grad(carried_k[i].defined() ? &carried_k[i] : nullptr,
                                      carried_v[i].defined() ? &carried_v[i] : nullptr);
                }
                // forward with recording
                const size_t nc = cr.c1 - cr.c0;
                std::vector<std::vector<Tensor>> inputs(size_t(l1 - l0), std::vector<Tensor>(nc));
                std::vector<std::vector<BlockActivations>> acts(size_t(l1 - l0), std::vector<BlockActivations>(nc));
                {
                    ChunkLoopHooks hooks;
                    hooks.inputs = [&](size_t) {
                        return split_chunks(load_cp(layer_cp[size_t(r)][size_t(ci)], cr, "row input"), plan, cr,
                                            MemCategory::ACTIVATIONS);
                    };
                    hooks.attention = [&](int, size_t) -> LayerAttention& { return att; };
                    hooks.before_chunk = [&](int l, size_t c, const Tensor& x) { inputs[size_t(l - l0)][c - cr.c0] = x; };
                    hooks.save = [&](int l, size_t c) { return &acts[size_t(l - l0)][c - cr.c0]; };
                    hooks.after_layer = [&](int, size_t) { tick(int64_t(nc)); };
                    run_chunk_loop(model, plan, hooks,
                                   {.cell_begin = size_t(ci), .cell_end = size_t(ci) + 1, .layer_begin = l0, .layer_end = l1});
                }
                // backward: layers top-down, chunks right-to-left
                std::vector<Tensor> g =
                    split_chunks(gslot[size_t(ci)].device() == dev ? gslot[size_t(ci)] : gslot[size_t(ci)].to(dev), plan, cr,
                                 MemCategory::GRADIENTS);
                for (int l = l1 - 1; l >= l0; --l) {
                    const size_t i = size_t(l - l0);
                    for (int c = int(nc) - 1; c >= 0; --c) {
                        LayerGrads* lg = targets.model ? &targets.model->layers[size_t(l)] : nullptr;
                        g[size_t(c)] = block_backward(model, l, inputs[i][size_t(c)], acts[i][size_t(c)], g[size_t(c)],
                                                      plan.starts[cr.c0 + size_t(c)], attb, lg);
                        acts[i][size_t(c)] = BlockActivations();
                        inputs[i][size_t(c)] = Tensor();
                    }
                    tick(int64_t(nc));
                }
                Tensor gj = join_chunks(g, MemCategory::GRADIENTS, "row input gradient");
                gslot[size_t(ci)].copy_from(host == dev ? gj : gj.to(host));
                for (int l = l0; l < l1; ++l) {
                    const size_t i = size_t(l - l0);
                    if (ci > 0) {
                        carried_k[i] = caches[i]->state_grad_k().clone();
                        carried_v[i] = caches[i]->state_grad_v().clone();
                    }
                    caches[i]->clear_records();
                }
                trace::CellInfo info;
                info.row = r, info.col = ci, info.layer_begin = l0, info.layer_end = l1;
                info.chunk_begin = int32_t(cr.c0), info.chunk_end = int32_t(cr.c1);
                info.start_ns = cell_t0, info.end_ns = now_ns();
                info.peak_bytes = tracker.peak_total(dev);
                info.device = dev;
                trace::cell(info);
                merge_peaks(st.phase2_memory, tracker.all_stats());
            }
            layer_cp[size_t(r)].clear();
            if (opt.layers_final) opt.layers_final(l0);
        }

        // ---- embeddings ----
        for (size_t ci = 0; ci < ncells; ++ci) {
            const CellRange& cr = crs[ci];
            if (targets.model) {
                Tensor gx = gslot[ci].device() == dev ? gslot[ci] : gslot[ci].to(dev);
                Tensor idc = ids.slice(1, cr.start, cr.start + cr.len).contiguous();
                if (idc.device() != dev) idc = idc.to(dev);
                if (model.config().altup_enabled()) {
                    // Gemma 3n: the packed state's gradient to the scaled embeddings' (altup_embed's reverse)
                    Tensor e = ops::embedding(model.embedding(), idc, act);
                    if (model.config().embedding_scale != 1.0) ops::scale_(e, e, model.embedding_multiplier());
                    gx = altup_embed_backward(mc, model.altup_weights(), idc, e, gx, targets.model);
                }
                // x0 = scale * table[ids] (Gemma's sqrt(hidden)): the table's share is scale * dx0
                if (model.config().embedding_scale != 1.0) gx = ops::scale(gx, model.embedding_multiplier());
                ops::embedding_backward_(targets.model->embed, idc, gx, true);
            }
            if (targets.input_embedding_grad) {
                Tensor d = targets.input_embedding_grad->slice(1, cr.start, cr.start + cr.len);
                d.copy_from(gslot[ci].device() == d.device() ? gslot[ci] : gslot[ci].to(d.device()));
            }
        }
        st.phase2_seconds = seconds_since(t0);
        if (st.phase2_memory.empty()) st.phase2_memory = tracker.all_stats();
    }

    void tick(int64_t units) {
        done_units += units;
        if (cb.progress) cb.progress(std::min(done_units, total_units), total_units);
        if (cb.cancel && cb.cancel->load(std::memory_order_relaxed)) throw Cancelled();
    }

    const Transformer& model;
    const ModelConfig& mc;
    const Tensor& ids;
    const ChunkPlan& plan;
    const HeadSpec& head;
    double loss_scale;
    const GradientOptions& opt;
    const GradientTargets& targets;
    const DriverCallbacks& cb;
    const int nl;
    const int64_t B, T, E;
    const DType act;
    const Device dev, host;
    MemoryTracker& tracker;
    const CheckpointFormat layer_fmt, kv_fmt;
    const std::vector<std::pair<int, int>> rows;
    const std::vector<CellRange> crs;
    const size_t ncells;
    std::vector<int> row_at;
    std::vector<std::vector<Tensor>> layer_cp;
    std::vector<Tensor> final_cp;
    std::vector<int64_t> Ls;
    bool kv_from_forward = false;
    std::vector<std::vector<ReplayKVState>> kv_forward;  // [cell][layer], from phase 1
    GradientStats st;
    int64_t total_units = 0, done_units = 0;
};

}  // namespace

// =========================================================================================
// [SECTION] entry points
// =========================================================================================
GradientStats gradient_step(Transformer& model, KVCache& cache, const Tensor& ids, const ChunkPlan& plan, const HeadSpec& head,
                            double loss_scale, const GradientOptions& opt, const GradientTargets& targets,
                            const DriverCallbacks& cb, const std::vector<std::vector<SlotPlan>>* forced_plans) {
    // Gradients run through the expanded form (latent_qkv_backward); a latent cache's absorbed
    // attention keeps no reverse pass.
    if (model.config().latent_cache())
        throw Error(str(model.config().name, ": gradients through multi-head latent attention run through the expanded form; the model "
                        "caches latents (--model.mla_cache latent); expected --model.mla_cache expanded (training modes choose it)"));
    GradientOptions o = opt;
    o.selection = make_read_selection(cache.config());
    GradientRun run(model, ids, plan, head, loss_scale, o, targets, cb);
    const bool quantized_cache = !find_buffer(cache.config().buffer())->same_as_activations();
    const bool exact = opt.exact_checkpoints == GradientOptions::Exact::ON ||
                       (opt.exact_checkpoints == GradientOptions::Exact::AUTO && quantized_cache);
    const auto t0 = Clock::now();
    run.tracker.reset_peaks();
    run.phase1(model, cache, exact, forced_plans);
    if (exact) run.replay_checkpoints();
    run.finish_phase1(t0);
    run.phase2();
    return std::move(run.st);
}

GradientStats replay_gradient(const Transformer& model, const std::vector<std::vector<SlotPlan>>& plans,
                              const std::vector<int64_t>& cache_lengths, const Tensor& ids, const ChunkPlan& plan,
                              const HeadSpec& head, double loss_scale, const GradientOptions& opt,
                              const GradientTargets& targets, const DriverCallbacks& cb) {
    GradientRun run(model, ids, plan, head, loss_scale, opt, targets, cb);
    if (int(plans.size()) != run.nl)
        throw Error(str("replay gradient: plans for ", plans.size(), " layers, the model has ", run.nl));
    const auto t0 = Clock::now();
    run.tracker.reset_peaks();
    run.st.plans = plans;
    run.Ls = cache_lengths;
    run.replay_checkpoints();
    run.st.loss = run.st.replay_loss;  // set again by phase 2's head pass
    run.finish_phase1(t0);
    run.phase2();
    run.st.loss = run.st.replay_loss;
    return std::move(run.st);
}

}  // namespace kv
