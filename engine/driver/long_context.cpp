// Long-context forward driver (see long_context.h).
#include "long_context.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "engine/memory/memory_tracker.h"
#include "engine/ops/ops.h"
#include "engine/telemetry/trace.h"
#include "engine/kv/context_reconstruction.h"
#include "chunk_loop.h"

namespace kv {

double cell_factor(const ModelConfig& cfg) {
    // A KV-shared layer reads its source's cache as it stands after the same chunk; a cell runs
    // layer-major, so its source would be ahead by the cell's later chunks: one chunk per cell.
    if (cfg.any_kv_shared()) return 0.0;
    return 2.0 * double(cfg.num_kv_heads) * double(cfg.head_dim) / double(cfg.hidden_size);
}

namespace {

// Index of the first non-finite element of a host f32/bf16 tensor, or -1 (also for tensors it
// cannot read cheaply: other dtypes, device memory). One bit test per element, no early exit
// inside a block, so it vectorises; costs a read of the chunk's activations.
int64_t first_nonfinite(const Tensor& t) {
    if (t.device().type != DeviceType::CPU || !t.is_contiguous()) return -1;
    const int64_t n = t.numel();
    constexpr int64_t kBlock = 4096;
    if (t.dtype() == DType::F32) {
        const uint32_t* p = static_cast<const uint32_t*>(t.data_ptr());
        for (int64_t b = 0; b < n; b += kBlock) {
            const int64_t e = std::min(n, b + kBlock);
            uint32_t any = 0;
            for (int64_t i = b; i < e; ++i) any |= uint32_t((p[i] & 0x7f800000u) == 0x7f800000u);
            if (any)
                for (int64_t i = b; i < e; ++i)
                    if ((p[i] & 0x7f800000u) == 0x7f800000u) return i;
        }
    } else if (t.dtype() == DType::BF16) {
        const uint16_t* p = static_cast<const uint16_t*>(t.data_ptr());
        for (int64_t b = 0; b < n; b += kBlock) {
            const int64_t e = std::min(n, b + kBlock);
            uint16_t any = 0;
            for (int64_t i = b; i < e; ++i) any |= uint16_t((p[i] & 0x7f80) == 0x7f80);
            if (any)
                for (int64_t i = b; i < e; ++i)
                    if ((p[i] & 0x7f80) == 0x7f80) return i;
        }
    }
    return -1;
}

// A non-finite activation stops the run where it first appeared: a NaN would otherwise flow into
// a loss that reads like a result ("mean loss nan", status done).
[[noreturn]] void nonfinite_stop(const std::string& where, int64_t index) {
    throw Error(str("non-finite value (nan or inf) first appeared in ", where, " (element ", index, "); the run stopped"),
                "the weights or the configuration make the computation overflow (check the model file, "
                "rms_norm_eps, --precision)");
}

// Classification from (B, 1, V) logits, on the loss op: log p(k) = -cross_entropy(z, k) over
// the classes (the class tokens' columns when `subset` is given), one op call per class (C is
// small); the label's is the loss, the largest the prediction. Only (B) values per class come
// back to the host.
void class_scores(const Tensor& logits, const Tensor& subset, const HeadSpec& head, int64_t B, int64_t start, HeadResult& out) {
    const int64_t C = subset.defined() ? subset.size(0) : logits.size(2);
    const TensorOptions wo{logits.device(), MemCategory::WORKSPACE, "class index"};
    out.class_logprob.assign(size_t(B * C), 0.0);
    for (int64_t k = 0; k < C; ++k) {
        const std::vector<double> ce =
            ops::cross_entropy(logits, Tensor::from_i32({B, 1}, std::vector<int32_t>(size_t(B), int32_t(k)), wo), subset).to_f64_vector();
        for (int64_t b = 0; b < B; ++b) {
            if (!std::isfinite(ce[size_t(b)]))
                nonfinite_stop(str("the class logits of the chunk at position ", start), b * logits.size(2));
            out.class_logprob[size_t(b * C + k)] = -ce[size_t(b)];
        }
    }
    for (int64_t b = 0; b < B; ++b) {
        const double* lp = out.class_logprob.data() + b * C;
        out.prediction[size_t(b)] = int32_t(std::max_element(lp, lp + C) - lp);
        out.loss_sum[size_t(b)] -= lp[head.labels[size_t(b)]];
        out.count[size_t(b)] += 1.0;
        if (head.record_token_loss) out.token_loss[size_t(b * head.T + head.T - 1)] = float(-lp[head.labels[size_t(b)]]);
    }
}


// Feed one chunk's final-norm states (B, n, E) at positions [start, start+n) to the head.
void head_chunk(const Transformer& model, const Tensor& h, int64_t start, bool last_chunk, const HeadSpec& head, HeadResult& out) {
    const int64_t B = h.size(0), n = h.size(1), E = h.size(2);
    switch (head.kind) {
        case HeadKind::NEXT_TOKEN: {
            // Only positions with a target need logits; skip the chunk if it has none.
            bool any = false;
            std::vector<int32_t> tg((size_t)(B * n));
            std::vector<int64_t> rb((size_t)(B * n));
            for (int64_t b = 0; b < B; ++b)
                for (int64_t t = 0; t < n; ++t) {
                    const int32_t y = head.token_targets[size_t(b * head.T + start + t)];
                    tg[size_t(b * n + t)] = y;
                    rb[size_t(b * n + t)] = b;
                    any = any || y >= 0;
                }
            if (!any && !last_chunk) return;
            Tensor logits = model.lm_head(h, start);  // (B, n, V) f32
            const int64_t V = logits.size(2);
            // Checked in place on the host; device logits are checked through their row losses.
            if (const int64_t bad = first_nonfinite(logits); bad >= 0)
                nonfinite_stop(str("the logits (lm_head) of the chunk at position ", start), bad);
            if (any && head.record_argmax) {
                // Per-position predictions (the repeat task's copy accuracy): the only case that
                // brings the chunk's B x n x V logits to the host.
                const std::vector<float> z = logits.to_f32_vector();
                for (int64_t r = 0; r < B * n; ++r)
                    if (tg[size_t(r)] >= 0) {
                        const float* zr = z.data() + r * V;
                        out.target_argmax.push_back(int32_t(std::max_element(zr, zr + V) - zr));
                    }
            }
            if (any) {
                // The loss op the reverse pass uses (head_backward.cpp), on the logits' device:
                // only the (B, n) row losses come back to the host, not B x n x V logits.
                for (int32_t& y : tg)
                    if (y < 0) y = -100;
                Tensor targets = Tensor::from_i32({B, n}, tg, {logits.device(), MemCategory::WORKSPACE, "targets"});
                const std::vector<double> ce = ops::cross_entropy(logits, targets).to_f64_vector();  // (B, n)
                for (size_t r = 0; r < tg.size(); ++r)
                    if (tg[r] >= 0) {
                        if (!std::isfinite(ce[r]))
                            nonfinite_stop(str("the logits (lm_head) of the chunk at position ", start), int64_t(r) * V);
                        out.loss_sum[size_t(rb[r])] += ce[r];
                        out.count[size_t(rb[r])] += 1.0;
                        if (head.record_token_loss) out.token_loss[size_t(rb[r]) * size_t(head.T) + size_t(start) + r % size_t(n)] = float(ce[r]);
                    }
            }
            if (last_chunk) {
                const std::vector<float> z = logits.slice(1, n - 1, n).to_f32_vector();  // (B, 1, V)
                for (int64_t b = 0; b < B; ++b) {
                    const float* zr = z.data() + b * V;
                    out.prediction[size_t(b)] = int32_t(std::max_element(zr, zr + V) - zr);
                }
            }
            return;
        }
        case HeadKind::CLASS_ON_LOGITS: {
            if (!last_chunk) return;
            Tensor logits = model.lm_head(h.slice(1, n - 1, n), start + n - 1);  // (B, 1, V)
            const TensorOptions wo{logits.device(), MemCategory::WORKSPACE, "class tokens"};
            class_scores(logits, Tensor::from_i32({int64_t(head.class_tokens.size())}, head.class_tokens, wo), head, B, start, out);
            return;
        }
        case HeadKind::SEQ_CLASS: {
            std::vector<float> hv = h.to_f32_vector();
            if (out.pool_sum.empty()) out.pool_sum.assign(size_t(B * E), 0.0);
            if (head.mean_pool) {
                for (int64_t b = 0; b < B; ++b)
                    for (int64_t t = 0; t < n; ++t)
                        for (int64_t e = 0; e < E; ++e) out.pool_sum[size_t(b * E + e)] += hv[size_t((b * n + t) * E + e)];
                out.pooled += n;
            }
            if (!last_chunk) return;
            // The pooled (or last) hidden state through the linear head on the op set; the loss
            // and class log-probabilities from the loss op, as for every head.
            std::vector<float> x(size_t(B * E));
            for (int64_t b = 0; b < B; ++b)
                for (int64_t e = 0; e < E; ++e)
                    x[size_t(b * E + e)] = head.mean_pool ? float(out.pool_sum[size_t(b * E + e)] / double(out.pooled))
                                                          : hv[size_t((b * n + n - 1) * E + e)];
            const Tensor& W = head.class_weight;
            const DType dt = W.dtype() == DType::F64 ? DType::F64 : DType::F32;
            Tensor xt = Tensor::from_f32({B, 1, E}, x, W.dtype(), {W.device(), MemCategory::ACTIVATIONS, "pooled hidden state"});
            Tensor logits = ops::linear(xt, W, dt);  // (B, 1, C)
            if (head.class_bias.defined()) ops::add_(logits, logits, head.class_bias.reshape({1, 1, W.size(0)}));
            class_scores(logits, Tensor{}, head, B, start, out);
            return;
        }
    }
}

}  // namespace

void long_context_forward(Transformer& model, KVCache& cache, const Tensor& ids, const ChunkPlan& plan, const HeadSpec& head,
                          HeadResult& out, const DriverCallbacks& cb, bool keep_context_width) {
    const int64_t B = ids.size(0), T = ids.size(1);
    const int nl = int(model.config().num_layers);
    // Reconstruction-scored policies (kvzip): after chunk c went through layer l, its
    // reconstruction pieces go through layer l too (engine/kv/context_reconstruction.h), so layer l's scores are
    // final before chunk c + 1 evicts; the pieces sit past the sequence, hence the wider RoPE.
    std::unique_ptr<ContextReconstruction> rec = make_context_reconstruction(model, cache);
    const int64_t rec_tokens = rec ? rec->max_piece_tokens(*std::max_element(plan.chunks.begin(), plan.chunks.end())) : 0;
    if (!keep_context_width) model.set_context_width(std::max<int64_t>(T + rec_tokens, 1));
    cache.reset();
    out.init(B);
    if (head.record_token_loss) out.token_loss.assign(size_t(B * T), std::numeric_limits<float>::quiet_NaN());
    const int64_t total = int64_t(plan.chunks.size()) * nl;
    int64_t done = 0;
    static const trace::Name kHead("head");
    std::vector<ReconstructionChunk> rxs;  // the cell's reconstruction pieces, one per chunk
    size_t cell_c0 = 0;                    // the cell's first chunk
    std::vector<int32_t> tok;              // the chunk's token ids, alive for its block's calls
    std::optional<ChunkCall> call;
    // Per chunk of the cell, the KV bytes every layer keeps (logical) and holds (physical) once it
    // has taken the chunk; a cell runs layer-major, so the sums are whole when the cell ends and go
    // out as metrics at step = the run's tokens through the chunk (what a paged buffer frees).
    static const trace::Name kLogical("kv_logical_bytes"), kPhysical("kv_physical_bytes");
    std::vector<std::pair<double, double>> chunk_bytes;
    ChunkLoopHooks hooks;
    hooks.inputs = [&](size_t ci) {
        const auto [c0, c1] = plan.cells[ci];
        cell_c0 = c0;
        chunk_bytes.assign(c1 - c0, {0.0, 0.0});
        std::vector<Tensor> xs;
        for (size_t c = c0; c < c1; ++c) xs.push_back(model.embed(ids.slice(1, plan.starts[c], plan.starts[c] + plan.chunks[c])));
        for (size_t c = c0; c < c1 && rec; ++c)
            rxs.push_back(rec->prepare(ids.slice(1, plan.starts[c], plan.starts[c] + plan.chunks[c]), plan.starts[c]));
        return xs;
    };
    hooks.before_layer = cb.layer_input;
    hooks.before_chunk = [&](int, size_t, const Tensor&) {
        if (cb.cancel && cb.cancel->load(std::memory_order_relaxed)) throw Cancelled();
    };
    hooks.attention = [&](int, size_t c) -> LayerAttention& {
        // The chunk's inputs go with its calls (policies that read the text, forced plans).
        tok = chunk_ids(ids.slice(1, plan.starts[c], plan.starts[c] + plan.chunks[c]));
        return call.emplace(cb.attention ? *cb.attention : cache, ChunkInput{.ids = &tok, .replay = cb.replay});
    };
    hooks.after_chunk = [&](int l, size_t c, const Tensor& y) {
        if (int64_t bad = first_nonfinite(y); bad >= 0)
            nonfinite_stop(str("the output of layer ", l, " (transformer block) in chunk ", c), bad);
        if (rec) rec->run_layer(l, rxs[c - cell_c0]);
        if (trace::active() && l < cache.num_layers()) {
            chunk_bytes[c - cell_c0].first += double(cache.layer(l).logical_bytes());
            chunk_bytes[c - cell_c0].second += double(cache.layer(l).buffer().bytes());
        }
        ++done;
        if (cb.progress) cb.progress(done, total);
        if (trace::active()) {
            trace::ProgressInfo pi;
            // (layer, chunk) steps stay per sample: the cell-grid view draws one grid per sample from them.
            pi.chunks_done = int32_t(done);
            pi.chunks_total = int32_t(total);
            // monotonic across the cell -> layer -> chunk order
            pi.tokens_done = cb.run_tokens_before + T * done / (total + cb.units_after);
            pi.tokens_total = cb.run_tokens_total > 0 ? cb.run_tokens_total : T;
            trace::progress(pi);
        }
    };
    hooks.after_cell = [&](size_t ci, std::vector<Tensor>& xs) {
        const auto [c0, c1] = plan.cells[ci];
        if (cb.final_output) cb.final_output(ci, xs);
        if (trace::active())
            for (size_t c = c0; c < c1; ++c) {
                const int64_t step = cb.run_tokens_before + plan.starts[c] + plan.chunks[c];
                trace::metric(kLogical, step, chunk_bytes[c - c0].first);
                trace::metric(kPhysical, step, chunk_bytes[c - c0].second);
            }
        {
            auto head_span = trace::span(trace::SpanCategory::HEAD, kHead, {.cell_col = int(ci)});
            for (size_t c = c0; c < c1; ++c) {
                Tensor h = model.final_norm(xs[c - c0]);
                head_chunk(model, h, plan.starts[c], c + 1 == plan.chunks.size(), head, out);
            }
        }
        rxs.clear();  // freed with the cell, before its activations
    };
    run_chunk_loop(model, plan, hooks, {.spans = true});
    cache.flush();
}

}  // namespace kv
