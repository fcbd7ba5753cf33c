// Head reverse pass (see head_backward.h).
#include "head_backward.h"

#include <algorithm>

#include "engine/model/altup.h"
#include "engine/model/altup_backward.h"
#include "engine/model/transformer_backward.h"
#include "engine/model/packed_weight.h"
#include "engine/core/error.h"
#include "engine/memory/memory_tracker.h"
#include "engine/ops/ops.h"
#include "engine/telemetry/trace.h"
#include "engine/model/grad_math.h"

namespace kv {

std::vector<double> head_row_weights(const HeadSpec& head, double scale) {
    std::vector<double> w((size_t)head.B, scale / double(head.B));
    if (head.kind != HeadKind::NEXT_TOKEN) return w;
    std::vector<int64_t> count((size_t)head.B, 0);
    int64_t total = 0;
    for (int64_t b = 0; b < head.B; ++b) {
        for (int64_t t = 0; t < head.T; ++t) count[size_t(b)] += head.token_targets[size_t(b * head.T + t)] != -100;
        total += count[size_t(b)];
    }
    for (int64_t b = 0; b < head.B; ++b) {
        if (head.average_loss_per_batch) w[size_t(b)] = total > 0 ? scale / double(total) : 0.0;
        else w[size_t(b)] = count[size_t(b)] > 0 ? scale / (double(head.B) * double(count[size_t(b)])) : 0.0;
    }
    return w;
}

namespace {

// dh (B, m, E) and the parameter gradients of logits = lm_head(h, input_pos) given dlogits.
Tensor lm_head_backward(const Transformer& m, const Tensor& h, int64_t input_pos, const Tensor& dlogits, const HeadGrads& g) {
    Tensor dh = linear_input_grad_any(dlogits, m.lm_head_weight(), h.dtype());
    if (m.adapters() && g.adapters) m.adapters()->backward(-1, LinearSite::HEAD, h, input_pos, dlogits, dh);
    if (g.model) linear_weight_grad(g.model->tied ? g.model->embed : g.model->lm_head, nullptr, h, dlogits);
    return dh;
}

// dx of h = final_norm(x) given dh (written into dx).
void final_norm_backward(const Transformer& m, const Tensor& x, const Tensor& dh, Tensor& dx, const HeadGrads& g) {
    if (m.config().altup_enabled()) {  // Gemma 3n: the streams were merged before the norm (altup_unembed)
        const Tensor merged = altup_unembed(m.config(), m.altup_weights(), x, x.dtype());
        Tensor dm = Tensor::empty(merged.shape(), x.dtype(), {x.device(), MemCategory::ACTIVATIONS, "merged stream gradient"});
        ops::rmsnorm_backward_(dm, g.model ? &g.model->norm : nullptr, merged, m.final_norm_weight(), dh,
                               float(m.config().rms_norm_eps), float(m.config().norm_weight_offset));
        ops::copy_(dx, altup_unembed_backward(m.config(), m.altup_weights(), x, dm, g.model));
        return;
    }
    ops::rmsnorm_backward_(dx, g.model ? &g.model->norm : nullptr, x, m.final_norm_weight(), dh,
                           float(m.config().rms_norm_eps), float(m.config().norm_weight_offset));
}

double weighted_sum(const Tensor& loss, const std::vector<double>& wrow, int64_t per_row) {
    std::vector<double> l = loss.to_f64_vector();
    double s = 0;
    for (size_t i = 0; i < l.size(); ++i) s += wrow[i / size_t(per_row)] * l[i];
    return s;
}

}  // namespace

double head_backward(const Transformer& m, const Tensor& x, int64_t start, const HeadSpec& head,
                     const std::vector<double>& wrow, Tensor& dx, const HeadGrads& g, int64_t max_logit_bytes,
                     const Tensor& pooled) {
    const int64_t B = x.size(0), n = x.size(1), E = m.config().hidden_size, V = m.config().vocab_size;
    const Device dev = x.device();
    const DType dt = x.dtype();
    const DType ldt = dt == DType::F64 ? DType::F64 : DType::F32;
    const bool has_last = start + n == head.T;
    KV_TRACE_SPAN(trace::SpanCategory::HEAD, "head backward");
    MemoryLabelScope label("head backward");
    dx.fill(0.0);
    double loss = 0;
    switch (head.kind) {
        case HeadKind::NEXT_TOKEN: {
            const int64_t block = std::max<int64_t>(1, max_logit_bytes / (B * V * int64_t(dtype_size(ldt))));
            for (int64_t s = 0; s < n; s += block) {
                const int64_t e = std::min(n, s + block), len = e - s;
                std::vector<int32_t> tg((size_t)(B * len));
                std::vector<double> wt((size_t)(B * len));
                bool any = false;
                for (int64_t b = 0; b < B; ++b)
                    for (int64_t t = 0; t < len; ++t) {
                        const int32_t y = head.token_targets[size_t(b * head.T + start + s + t)];
                        tg[size_t(b * len + t)] = y;
                        wt[size_t(b * len + t)] = y == -100 ? 0.0 : wrow[size_t(b)];
                        any = any || y != -100;
                    }
                if (!any) continue;
                Tensor xs = x.slice(1, s, e);
                Tensor h = m.final_norm(xs);
                Tensor logits = m.lm_head(h, start + s);  // (B, len, V)
                Tensor targets = Tensor::from_i32({B, len}, tg, {dev, MemCategory::WORKSPACE, "targets"});
                const std::vector<double> ce = ops::cross_entropy(logits, targets).to_f64_vector();
                for (size_t i = 0; i < wt.size(); ++i) loss += tg[i] == -100 ? 0.0 : wt[i] * ce[i];
                Tensor dloss = Tensor::from_f64({B, len}, wt, ldt, {dev, MemCategory::WORKSPACE, "loss weights"});
                Tensor dlogits = Tensor::empty(logits.shape(), ldt, {dev, MemCategory::ACTIVATIONS, "dlogits"});
                ops::cross_entropy_backward_(dlogits, logits, targets, 1.0f, dloss);
                m.final_softcap_backward_(dlogits, logits);
                Tensor dh = lm_head_backward(m, h, start + s, dlogits, g);
                Tensor dxs = dx.slice(1, s, e);
                final_norm_backward(m, xs, dh, dxs, g);
            }
            return loss;
        }
        case HeadKind::CLASS_ON_LOGITS: {
            if (!has_last) return 0.0;
            Tensor xs = x.slice(1, n - 1, n);
            Tensor h = m.final_norm(xs);
            Tensor logits = m.lm_head(h, start + n - 1);  // (B, 1, V)
            std::vector<int32_t> lab(head.labels.begin(), head.labels.end());
            Tensor targets = Tensor::from_i32({B, 1}, lab, {dev, MemCategory::WORKSPACE, "labels"});
            Tensor subset = Tensor::from_i32({int64_t(head.class_tokens.size())}, head.class_tokens,
                                             {dev, MemCategory::WORKSPACE, "class tokens"});
            Tensor ce = ops::cross_entropy(logits, targets, subset);
            loss = weighted_sum(ce, wrow, 1);
            Tensor dloss = Tensor::from_f64({B, 1}, wrow, ldt, {dev, MemCategory::WORKSPACE, "loss weights"});
            Tensor dlogits = Tensor::empty(logits.shape(), ldt, {dev, MemCategory::ACTIVATIONS, "dlogits"});
            ops::cross_entropy_backward_(dlogits, logits, targets, 1.0f, dloss, subset);
            m.final_softcap_backward_(dlogits, logits);
            Tensor dh = lm_head_backward(m, h, start + n - 1, dlogits, g);
            Tensor dxs = dx.slice(1, n - 1, n);
            final_norm_backward(m, xs, dh, dxs, g);
            return loss;
        }
        case HeadKind::SEQ_CLASS: {
            const int64_t C = head.class_weight.size(0);
            std::vector<int32_t> lab(head.labels.begin(), head.labels.end());
            Tensor targets = Tensor::from_i32({B, 1}, lab, {dev, MemCategory::WORKSPACE, "labels"});
            Tensor dloss = Tensor::from_f64({B, 1}, wrow, ldt, {dev, MemCategory::WORKSPACE, "loss weights"});
            // logits (B, 1, C) of the pooled final-norm state
            auto logits_of = [&](const Tensor& p) {
                Tensor z = ops::linear(p, head.class_weight, ldt);
                if (head.class_bias.defined()) ops::add_(z, z, head.class_bias.reshape({1, 1, C}));
                return z;
            };
            if (!head.mean_pool) {
                if (!has_last) return 0.0;
                Tensor xs = x.slice(1, n - 1, n);
                Tensor h = m.final_norm(xs);  // (B, 1, E)
                Tensor z = logits_of(h);
                loss = weighted_sum(ops::cross_entropy(z, targets), wrow, 1);
                Tensor dz = Tensor::empty(z.shape(), ldt, {dev, MemCategory::ACTIVATIONS, "dlogits"});
                ops::cross_entropy_backward_(dz, z, targets, 1.0f, dloss);
                Tensor dh = grad::mm(dz, head.class_weight, dt);
                if (g.class_weight) linear_weight_grad(*g.class_weight, g.class_bias, h, dz);
                Tensor dxs = dx.slice(1, n - 1, n);
                final_norm_backward(m, xs, dh, dxs, g);
                return loss;
            }
            // mean pooling: every position gets dpool / T; the loss is counted once, with
            // the last range
            Tensor p = pooled.reshape({B, 1, E});
            Tensor z = logits_of(p);
            if (has_last) loss = weighted_sum(ops::cross_entropy(z, targets), wrow, 1);
            Tensor dz = Tensor::empty(z.shape(), ldt, {dev, MemCategory::ACTIVATIONS, "dlogits"});
            ops::cross_entropy_backward_(dz, z, targets, 1.0f, dloss);
            if (g.class_weight && has_last) linear_weight_grad(*g.class_weight, g.class_bias, p, dz);
            std::vector<double> wmean(wrow);
            for (double& w : wmean) w /= double(head.T);  // the mean's 1/T, in the loss weights' precision
            Tensor dloss_mean = Tensor::from_f64({B, 1}, wmean, ldt, {dev, MemCategory::WORKSPACE, "loss weights"});
            ops::cross_entropy_backward_(dz, z, targets, 1.0f, dloss_mean);
            Tensor dp = grad::mm(dz, head.class_weight, dt);  // (B, 1, E)
            Tensor dh = Tensor::empty({B, n, E}, dt, {dev, MemCategory::ACTIVATIONS, "dh"});
            ops::copy_(dh, dp.expand({B, n, E}));
            final_norm_backward(m, x, dh, dx, g);
            return loss;
        }
    }
    return loss;
}

}  // namespace kv
