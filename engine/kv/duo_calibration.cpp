// DuoAttention calibration (see duo_calibration.h).
#include "engine/kv/duo_calibration.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "engine/core/error.h"
#include "engine/kv/policies/duo_gates.h"
#include "engine/model/attention.h"
#include "engine/ops/ops.h"

namespace kv {

namespace {

struct Dims {
    int64_t B, NH, n, HS, G, R;
};

Dims dims_of(const Tensor& q, const Tensor& k) {
    Dims d{q.size(0), q.size(1), q.size(2), q.size(3), k.size(1), 0};
    if (d.G < 1 || d.NH % d.G != 0) throw Error(str("mixed attention: ", d.NH, " query heads for ", d.G, " KV heads"));
    d.R = d.NH / d.G;
    return d;
}

Tensor key_positions(int64_t n, Device dev) {
    std::vector<int32_t> p((size_t)n);
    for (int64_t i = 0; i < n; ++i) p[size_t(i)] = int32_t(i);
    return Tensor::from_i32({1, 1, n}, p, {dev, MemCategory::WORKSPACE, "slot positions"});
}

// The streaming keys of query i: [0, min(sink, i + 1)) and [max(sink, i - recent + 1), i].
template <class F>
void for_streaming_keys(int64_t i, int64_t sink, int64_t recent, F&& f) {
    const int64_t a = std::min(sink, i + 1);
    for (int64_t j = 0; j < a; ++j) f(j);
    for (int64_t j = std::max(a, i - recent + 1); j <= i; ++j) f(j);
}

// Softmax weights of query (b, h, i) over its streaming keys, in key order.
void streaming_weights(const Dims& d, const std::vector<double>& q, const std::vector<double>& k, int64_t b, int64_t h, int64_t i,
                       double scale, int64_t sink, int64_t recent, std::vector<int64_t>& keys, std::vector<double>& p) {
    keys.clear();
    p.clear();
    const double* qi = q.data() + ((b * d.NH + h) * d.n + i) * d.HS;
    const int64_t g = h / d.R;
    double mx = -INFINITY;
    for_streaming_keys(i, sink, recent, [&](int64_t j) {
        const double* kj = k.data() + ((b * d.G + g) * d.n + j) * d.HS;
        double s = 0;
        for (int64_t e = 0; e < d.HS; ++e) s += qi[e] * kj[e];
        s *= scale;
        keys.push_back(j);
        p.push_back(s);
        mx = std::max(mx, s);
    });
    double z = 0;
    for (double& x : p) z += (x = std::exp(x - mx));
    for (double& x : p) x /= z;
}

}  // namespace

void mixed_attention_forward(Tensor& y, const Tensor& q, const Tensor& k, const Tensor& v, const std::vector<double>& alpha,
                             float scale, int64_t sink, int64_t recent, MixedAttentionSaved* save) {
    const Dims d = dims_of(q, k);
    if (int64_t(alpha.size()) != d.G) throw Error(str("mixed attention: ", alpha.size(), " gates for ", d.G, " KV heads"));
    const Device dev = q.device();
    Tensor full = Tensor::empty({d.B, d.NH, d.n, d.HS}, q.dtype(), {dev, MemCategory::ACTIVATIONS, "full attention output"});
    Tensor qpos = position_range(0, d.n, dev);
    ops::sdpa_(full, q, k, v, key_positions(d.n, dev), qpos, scale);
    const std::vector<double> qv = q.contiguous().to_f64_vector(), kv_ = k.contiguous().to_f64_vector(),
                              vv = v.contiguous().to_f64_vector(), fv = full.to_f64_vector();
    std::vector<double> st(fv.size(), 0.0), out(fv.size());
    std::vector<int64_t> keys;
    std::vector<double> p;
    for (int64_t b = 0; b < d.B; ++b)
        for (int64_t h = 0; h < d.NH; ++h) {
            const int64_t g = h / d.R;
            for (int64_t i = 0; i < d.n; ++i) {
                streaming_weights(d, qv, kv_, b, h, i, scale, sink, recent, keys, p);
                double* yi = st.data() + ((b * d.NH + h) * d.n + i) * d.HS;
                for (size_t m = 0; m < keys.size(); ++m) {
                    const double* vj = vv.data() + ((b * d.G + g) * d.n + keys[m]) * d.HS;
                    for (int64_t e = 0; e < d.HS; ++e) yi[e] += p[m] * vj[e];
                }
                const size_t o = size_t(((b * d.NH + h) * d.n + i) * d.HS);
                for (int64_t e = 0; e < d.HS; ++e) out[o + e] = alpha[size_t(g)] * fv[o + e] + (1 - alpha[size_t(g)]) * st[o + e];
            }
        }
    Tensor yt = Tensor::from_f64({d.B, d.NH, d.n, d.HS}, out, q.dtype(), {dev, MemCategory::WORKSPACE, "mixed attention output"});
    ops::copy_(y, yt);
    if (save) {
        save->full = full;
        save->stream = std::move(st);
    }
}

void mixed_attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, std::vector<double>& dalpha, const Tensor& q, const Tensor& k,
                              const Tensor& v, const std::vector<double>& alpha, float scale, int64_t sink, int64_t recent,
                              const MixedAttentionSaved& saved, const Tensor& dy) {
    const Dims d = dims_of(q, k);
    const Device dev = q.device();
    const std::vector<double> dyv = dy.contiguous().to_f64_vector(), fv = saved.full.to_f64_vector();
    if (dyv.size() != saved.stream.size() || int64_t(dalpha.size()) != d.G)
        throw Error("mixed attention backward: saved outputs or gate gradients of another shape");
    // dalpha_g = sum over its heads of dy . (full - streaming); the full part's dy is alpha dy.
    std::vector<double> dyf(dyv.size());
    for (int64_t b = 0; b < d.B; ++b)
        for (int64_t h = 0; h < d.NH; ++h) {
            const int64_t g = h / d.R;
            const size_t o = size_t((b * d.NH + h) * d.n * d.HS), m = size_t(d.n * d.HS);
            double s = 0;
            for (size_t i = o; i < o + m; ++i) {
                s += dyv[i] * (fv[i] - saved.stream[i]);
                dyf[i] = alpha[size_t(g)] * dyv[i];
            }
            dalpha[size_t(g)] += s;
        }
    Tensor dyft = Tensor::from_f64({d.B, d.NH, d.n, d.HS}, dyf, q.dtype(), {dev, MemCategory::WORKSPACE, "attention gradient"});
    ops::sdpa_backward_(dq, dk, dv, q, k, v, key_positions(d.n, dev), position_range(0, d.n, dev), dyft, scale);

    // The streaming part, (1 - alpha) dy, in f64.
    const std::vector<double> qv = q.contiguous().to_f64_vector(), kv_ = k.contiguous().to_f64_vector(),
                              vv = v.contiguous().to_f64_vector();
    std::vector<double> gq = dq.contiguous().to_f64_vector(), gk = dk.contiguous().to_f64_vector(), gv = dv.contiguous().to_f64_vector();
    std::vector<int64_t> keys;
    std::vector<double> p, dp;
    for (int64_t b = 0; b < d.B; ++b)
        for (int64_t h = 0; h < d.NH; ++h) {
            const int64_t g = h / d.R;
            const double w = 1 - alpha[size_t(g)];
            if (w == 0) continue;
            for (int64_t i = 0; i < d.n; ++i) {
                streaming_weights(d, qv, kv_, b, h, i, scale, sink, recent, keys, p);
                const size_t qi = size_t(((b * d.NH + h) * d.n + i) * d.HS);
                dp.assign(keys.size(), 0.0);
                double dot = 0;
                for (size_t m = 0; m < keys.size(); ++m) {
                    const size_t vj = size_t(((b * d.G + g) * d.n + keys[m]) * d.HS);
                    double s = 0;
                    for (int64_t e = 0; e < d.HS; ++e) {
                        s += w * dyv[qi + e] * vv[vj + e];
                        gv[vj + e] += p[m] * w * dyv[qi + e];
                    }
                    dp[m] = s;
                    dot += p[m] * s;
                }
                for (size_t m = 0; m < keys.size(); ++m) {
                    const double ds = p[m] * (dp[m] - dot) * scale;
                    const size_t kj = size_t(((b * d.G + g) * d.n + keys[m]) * d.HS);
                    for (int64_t e = 0; e < d.HS; ++e) {
                        gq[qi + e] += ds * kv_[kj + e];
                        gk[kj + e] += ds * qv[qi + e];
                    }
                }
            }
        }
    auto put = [&](Tensor& t, const std::vector<double>& x) {
        Tensor s = Tensor::from_f64(t.shape(), x, t.dtype(), {dev, MemCategory::WORKSPACE, "attention gradient"});
        ops::copy_(t, s);
    };
    put(dq, gq);
    put(dk, gk);
    put(dv, gv);
}

namespace {

// The model's attention in a calibration forward: every layer mixed with its gates.
class MixedLayers final : public LayerAttention, public AttentionBackward {
   public:
    MixedLayers(const std::vector<double>& alpha, int64_t layers, int64_t G, const DuoCalibrationConfig& cfg)
        : alpha_(alpha), G_(G), cfg_(cfg), k_(size_t(layers)), v_(size_t(layers)), saved_(size_t(layers)), dalpha_(alpha.size(), 0.0) {}
    void attend(int layer, const Tensor& q, const Tensor& k, const Tensor& v, int64_t input_pos, float scale, int window,
                Tensor& y) override {
        if (input_pos != 0) throw Error("duo calibration: a sample is one chunk from position 0");
        // The mixed (full + streaming) attention has no window term: refuse, never ignore it.
        if (window > 0)
            throw Error(str("duo calibration: layer ", layer, " has a sliding window of ", window, " tokens, which calibration does not support"));
        k_[size_t(layer)] = k.contiguous().clone();
        v_[size_t(layer)] = v.contiguous().clone();
        mixed_attention_forward(y, q, k, v, gates(layer), scale, cfg_.sink, cfg_.recent, &saved_[size_t(layer)]);
    }
    void backward(int layer, const Tensor& q, const Tensor& dy, float scale, Tensor& dq, Tensor& dk, Tensor& dv) override {
        std::vector<double> da(size_t(G_), 0.0);
        mixed_attention_backward(dq, dk, dv, da, q, k_[size_t(layer)], v_[size_t(layer)], gates(layer), scale, cfg_.sink, cfg_.recent,
                                 saved_[size_t(layer)], dy);
        for (int64_t g = 0; g < G_; ++g) dalpha_[size_t(layer * G_ + g)] += da[size_t(g)];
    }
    const std::vector<double>& dalpha() const { return dalpha_; }

   private:
    std::vector<double> gates(int layer) const {
        return std::vector<double>(alpha_.begin() + layer * G_, alpha_.begin() + (layer + 1) * G_);
    }
    const std::vector<double>& alpha_;
    int64_t G_;
    const DuoCalibrationConfig& cfg_;
    std::vector<Tensor> k_, v_;
    std::vector<MixedAttentionSaved> saved_;
    std::vector<double> dalpha_;
};

// The mixed attention calibration differentiates is plain softmax attention: a sink logit in the
// denominator or soft-capped scores would make its gates fit another attention than the model's.
void refuse_unmodelled_attention(const ModelConfig& c) {
    if (c.attention_sinks)
        throw Error(str("duo calibration: ", c.name, " has attention sinks (a learned logit per head in the softmax), "
                        "which calibration's mixed attention does not model; expected a model without sinks"));
    if (c.attn_logit_softcap > 0)
        throw Error(str("duo calibration: ", c.name, " soft-caps attention scores (attn_logit_softcapping ", c.attn_logit_softcap,
                        "), which calibration's mixed attention does not model; expected a model without soft-capping"));
}

}  // namespace

double duo_calibration_loss(const Transformer& model, const std::vector<int32_t>& ids, const std::vector<double>& alpha,
                            const DuoCalibrationConfig& cfg, std::vector<double>* dalpha, double* distance) {
    const ModelConfig& c = model.config();
    refuse_unmodelled_attention(c);
    const int64_t nl = c.num_layers, G = c.num_kv_heads, n = int64_t(ids.size()), E = c.hidden_size;
    if (int64_t(alpha.size()) != nl * G) throw Error(str("duo calibration: ", alpha.size(), " gates for ", nl, " x ", G, " KV heads"));
    const int64_t sup = std::min(cfg.supervised, n);
    if (sup < 1) throw Error("duo calibration: an empty sample");
    Tensor idt = Tensor::from_i32({1, n}, ids, {model.embedding().device(), MemCategory::WORKSPACE, "calibration ids"});

    // The full-attention model's final hidden states: the target.
    std::vector<double> href;
    {
        PlainAttention plain;
        Tensor x = model.embed(idt);
        for (int l = 0; l < int(nl); ++l) x = model.block(l, x, 0, plain);
        href = model.final_norm(x).to_f64_vector();
    }
    MixedLayers mixed(alpha, nl, G, cfg);
    std::vector<Tensor> xin(static_cast<size_t>(nl));
    std::vector<BlockActivations> acts(static_cast<size_t>(nl));
    Tensor x = model.embed(idt);
    for (int l = 0; l < int(nl); ++l) {
        xin[size_t(l)] = x;
        x = model.block(l, x, 0, mixed, dalpha ? &acts[size_t(l)] : nullptr);
    }
    const std::vector<double> h = model.final_norm(x).to_f64_vector();
    double D = 0;
    std::vector<double> dh(h.size(), 0.0);
    const double norm = 1.0 / double(sup * E);
    for (int64_t t = n - sup; t < n; ++t)
        for (int64_t e = 0; e < E; ++e) {
            const size_t i = size_t(t * E + e);
            const double diff = h[i] - href[i];
            D += diff * diff * norm;
            dh[i] = 2 * diff * norm;
        }
    double l1 = 0;
    for (double a : alpha) l1 += std::abs(a);
    const double N = double(alpha.size());
    if (distance) *distance = D;
    if (dalpha) {
        Tensor dht = Tensor::from_f64(x.shape(), dh, x.dtype(), {x.device(), MemCategory::ACTIVATIONS, "hidden state gradient"});
        Tensor dx = Tensor::empty(x.shape(), x.dtype(), {x.device(), MemCategory::ACTIVATIONS, "hidden state gradient"});
        ops::rmsnorm_backward_(dx, nullptr, x, model.final_norm_weight(), dht, float(c.rms_norm_eps), float(c.norm_weight_offset));
        for (int l = int(nl) - 1; l >= 0; --l) dx = block_backward(model, l, xin[size_t(l)], acts[size_t(l)], dx, 0, mixed, nullptr);
        dalpha->assign(alpha.size(), 0.0);
        for (size_t i = 0; i < alpha.size(); ++i) (*dalpha)[i] = mixed.dalpha()[i] + cfg.reg * (alpha[i] < 0 ? -1.0 : 1.0) / N;
    }
    return D + cfg.reg * l1 / N;
}

std::vector<double> calibrate_duo(const Transformer& model, const std::vector<std::vector<int32_t>>& samples,
                                  const DuoCalibrationConfig& cfg, const std::function<void(const DuoCalibrationStep&)>& progress) {
    if (samples.empty()) throw Error("duo calibration: no samples");
    if (cfg.steps < 1) throw Error(str("duo calibration: ", cfg.steps, " steps; expected >= 1"));
    const ModelConfig& c = model.config();
    refuse_unmodelled_attention(c);
    const size_t N = size_t(c.num_layers * c.num_kv_heads);
    std::vector<double> alpha(N, std::clamp(cfg.init, 0.0, 1.0)), m(N, 0.0), v(N, 0.0), g;
    const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
    for (int64_t s = 0; s < cfg.steps; ++s) {
        DuoCalibrationStep st{s + 1, cfg.steps, 0, 0};
        st.loss = duo_calibration_loss(model, samples[size_t(s) % samples.size()], alpha, cfg, &g, &st.distance);
        // Adam, then the projection onto [0, 1] (the paper clamps the gates).
        const double c1 = 1 - std::pow(b1, double(s + 1)), c2 = 1 - std::pow(b2, double(s + 1));
        for (size_t i = 0; i < N; ++i) {
            m[i] = b1 * m[i] + (1 - b1) * g[i];
            v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
            alpha[i] = std::clamp(alpha[i] - cfg.lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + eps), 0.0, 1.0);
        }
        if (progress) progress(st);
    }
    return alpha;
}

std::string run_duo_calibration(const CalibrationRun& run) {
    DuoCalibrationConfig cfg;
    cfg.steps = int64_t(run.option("steps"));
    cfg.lr = run.option("lr");
    cfg.reg = run.option("reg");
    cfg.sink = int64_t(run.option("sink"));
    cfg.recent = int64_t(run.option("recent"));
    cfg.supervised = int64_t(run.option("supervised"));
    const std::vector<double> alpha = calibrate_duo(run.model, run.samples, cfg, [&](const DuoCalibrationStep& s) {
        run.progress(s.step, s.steps, str("loss ", s.loss, " (hidden-state distance ", s.distance, ")"));
    });
    DuoGates g;
    g.model = run.model_name;
    g.layers = run.layers;
    g.kv_heads = run.kv_heads;
    g.sink = cfg.sink;
    g.recent = cfg.recent;
    g.gates = alpha;
    write_duo_gates(run.output, g);
    // The ranking, highest gate first: what the sparsity option cuts.
    std::vector<size_t> order(alpha.size());
    std::iota(order.begin(), order.end(), size_t(0));
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return alpha[a] > alpha[b]; });
    std::string line = str(alpha.size(), " gates; highest first:");
    char buf[64];
    for (size_t i = 0; i < std::min<size_t>(order.size(), 8); ++i) {
        std::snprintf(buf, sizeof buf, " L%zu.H%zu=%.3f", order[i] / size_t(g.kv_heads), order[i] % size_t(g.kv_heads),
                      alpha[order[i]]);
        line += buf;
    }
    return line;
}

}  // namespace kv
