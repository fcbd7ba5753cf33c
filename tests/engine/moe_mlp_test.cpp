// gpt-oss's mixture-of-experts MLP alone (engine/model/moe_mlp.h) on one layer with gate/up
// pre-activations of several units, so both clamps act: the forward against a float64 loop
// written here from transformers' GptOssTopKRouter / GptOssExperts (checkpoint layout: x @ W,
// gate and up in alternate columns), and the backward (input, router, experts) against central
// differences of sum(dout * out), with every routing gap and every distance to a clamp asserted
// far above the differences' step (the selection and the clamps are piecewise).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "engine/model/moe_mlp.h"
#include "engine/model/presets.h"
#include "tests/support/test_support.h"

namespace kv::test {
namespace {

constexpr int64_t kN = 4, kK = 2, kE = 6, kI = 5, kB = 1, kT = 7;

ModelConfig moe_config() {
    ModelConfig c = preset_config("tiny-gpt-oss");
    c.hidden_size = kE;
    c.intermediate_size = kI;
    c.moe.num_experts = kN;
    c.moe.top_k = kK;
    return c;
}

Tensor randn(const Shape& s, std::mt19937_64& rng, double scale) {
    std::normal_distribution<double> nd(0.0, scale);
    std::vector<double> v(size_t(s.numel()));
    for (double& x : v) x = nd(rng);
    return Tensor::from_f64(s, v);
}

// Checkpoint-named weights: gate/up of std 3 per entry (pre-activations of std ~7), router of order 1.
TensorMap moe_weights(uint64_t seed) {
    std::mt19937_64 rng(seed);
    TensorMap w;
    const std::string p = "model.layers.0.mlp.";
    w[p + "router.weight"] = randn({kN, kE}, rng, 1.0);
    w[p + "router.bias"] = randn({kN}, rng, 0.3);
    w[p + "experts.gate_up_proj"] = randn({kN, kE, 2 * kI}, rng, 3.0);
    w[p + "experts.gate_up_proj_bias"] = randn({kN, 2 * kI}, rng, 1.0);
    w[p + "experts.down_proj"] = randn({kN, kI, kE}, rng, 0.3);
    w[p + "experts.down_proj_bias"] = randn({kN, kE}, rng, 0.3);
    return w;
}

struct Reference {
    std::vector<double> out;
    double router_gap = 1e300, clamp_distance = 1e300;
    int64_t clamped = 0;
};

// The definition, token by token, from the checkpoint's tensors.
Reference reference(const TensorMap& w, const std::vector<double>& h, double limit, double alpha) {
    const std::string p = "model.layers.0.mlp.";
    const std::vector<double> Wr = w.at(p + "router.weight").to_f64_vector(), br = w.at(p + "router.bias").to_f64_vector(),
                              Wgu = w.at(p + "experts.gate_up_proj").to_f64_vector(),
                              bgu = w.at(p + "experts.gate_up_proj_bias").to_f64_vector(),
                              Wd = w.at(p + "experts.down_proj").to_f64_vector(), bd = w.at(p + "experts.down_proj_bias").to_f64_vector();
    Reference r;
    r.out.assign(size_t(kB * kT * kE), 0.0);
    for (int64_t t = 0; t < kB * kT; ++t) {
        const double* x = h.data() + t * kE;
        std::vector<std::pair<double, int64_t>> z;
        for (int64_t e = 0; e < kN; ++e) {
            double s = br[size_t(e)];
            for (int64_t c = 0; c < kE; ++c) s += Wr[size_t(e * kE + c)] * x[c];
            z.push_back({s, e});
        }
        std::sort(z.begin(), z.end(), [](auto a, auto b) { return a.first > b.first; });
        r.router_gap = std::min(r.router_gap, z[kK - 1].first - z[kK].first);
        double sum = 0;
        for (int64_t j = 0; j < kK; ++j) sum += std::exp(z[size_t(j)].first - z[0].first);
        for (int64_t j = 0; j < kK; ++j) {
            const int64_t e = z[size_t(j)].second;
            const double weight = std::exp(z[size_t(j)].first - z[0].first) / sum;
            std::vector<double> a(kI);
            for (int64_t i = 0; i < kI; ++i) {
                double g = bgu[size_t(e * 2 * kI + 2 * i)], u = bgu[size_t(e * 2 * kI + 2 * i + 1)];
                for (int64_t c = 0; c < kE; ++c) {
                    g += x[c] * Wgu[size_t((e * kE + c) * 2 * kI + 2 * i)];
                    u += x[c] * Wgu[size_t((e * kE + c) * 2 * kI + 2 * i + 1)];
                }
                r.clamp_distance = std::min({r.clamp_distance, std::fabs(g - limit), std::fabs(u - limit), std::fabs(u + limit)});
                r.clamped += (g > limit) + (std::fabs(u) > limit);
                g = std::min(g, limit);
                u = std::clamp(u, -limit, limit);
                a[size_t(i)] = (u + 1.0) * g / (1.0 + std::exp(-alpha * g));
            }
            for (int64_t c = 0; c < kE; ++c) {
                double y = bd[size_t(e * kE + c)];
                for (int64_t i = 0; i < kI; ++i) y += a[size_t(i)] * Wd[size_t((e * kI + i) * kE + c)];
                r.out[size_t(t * kE + c)] += weight * y;
            }
        }
    }
    return r;
}

TEST(MoeMlp, ForwardMatchesTheDefinitionWithBothClampsActing) {
    const ModelConfig cfg = moe_config();
    const TensorMap w = moe_weights(17);
    for (const DType dt : {DType::F64, DType::F32}) {
        LayerWeights L;
        load_experts(cfg, w, "model.layers.0.", dt, Device{}, L);
        std::mt19937_64 rng(5);
        const Tensor h = randn({kB, kT, kE}, rng, 1.0);
        const Reference ref = reference(w, h.to_f64_vector(), cfg.moe.limit, cfg.moe.alpha);
        ASSERT_GT(ref.router_gap, 1e-3);
        EXPECT_GT(ref.clamped, 4) << "the clamps must act";
        const std::vector<double> got = moe_mlp(cfg, L, 0, h.to(dt), dt).to_f64_vector();
        double scale = 0, err = 0;
        for (size_t i = 0; i < got.size(); ++i) {
            scale = std::max(scale, std::fabs(ref.out[i]));
            err = std::max(err, std::fabs(got[i] - ref.out[i]));
        }
        EXPECT_LE(err, (dt == DType::F64 ? 1e-12 : 1e-5) * scale) << (dt == DType::F64 ? "f64" : "f32");
    }
}

// loss = sum(dout * moe_mlp(h)); each parameter's and input's gradient against central
// differences (step 1e-6: every routing gap and clamp distance asserted above 1e-3).
TEST(MoeMlpGradient, ClampsAndRoutingMatchFiniteDifferences) {
    ModelConfig cfg = moe_config();
    const TensorMap w = moe_weights(23);
    LayerWeights L;
    load_experts(cfg, w, "model.layers.0.", DType::F64, Device{}, L);
    std::mt19937_64 rng(9);
    Tensor h = randn({kB, kT, kE}, rng, 1.0);
    const Tensor dout = randn({kB, kT, kE}, rng, 1.0);
    const Reference ref = reference(w, h.to_f64_vector(), cfg.moe.limit, cfg.moe.alpha);
    ASSERT_GT(ref.router_gap, 1e-3) << "a routing near-tie: the differences could see another selection";
    ASSERT_GT(ref.clamp_distance, 1e-3) << "a pre-activation next to a clamp";
    ASSERT_GT(ref.clamped, 4) << "the clamps must act";
    BlockActivations a;
    a.h2 = h;
    (void)moe_mlp(cfg, L, 0, h, DType::F64, &a);
    LayerGrads g;
    g.router = Tensor::zeros(L.router.shape(), DType::F64);
    g.router_bias = Tensor::zeros(L.router_bias.shape(), DType::F64);
    g.experts_gate_up = Tensor::zeros(L.experts_gate_up.shape(), DType::F64);
    g.experts_gate_up_bias = Tensor::zeros(L.experts_gate_up_bias.shape(), DType::F64);
    g.experts_down = Tensor::zeros(L.experts_down.shape(), DType::F64);
    g.experts_down_bias = Tensor::zeros(L.experts_down_bias.shape(), DType::F64);
    const Tensor dh = moe_mlp_backward(cfg, L, 0, a, dout, &g);
    const std::vector<double> dov = dout.to_f64_vector();
    auto loss = [&] {
        const std::vector<double> o = moe_mlp(cfg, L, 0, h, DType::F64).to_f64_vector();
        double s = 0;
        for (size_t i = 0; i < o.size(); ++i) s += o[i] * dov[i];
        return s;
    };
    const double step = 1e-6;
    int checked = 0;
    auto check = [&](const char* what, Tensor& t, const Tensor& grad) {
        double* p = t.data<double>();
        const std::vector<double> gv = grad.to_f64_vector();
        for (int64_t i = 0; i < t.numel(); ++i) {
            const double x = p[i];
            p[i] = x + step;
            const double lp = loss();
            p[i] = x - step;
            const double lm = loss();
            p[i] = x;
            const double fd = (lp - lm) / (2 * step);
            EXPECT_NEAR(gv[size_t(i)], fd, 1e-6 * std::max(1.0, std::fabs(fd))) << what << "[" << i << "]";
            ++checked;
        }
    };
    check("h", h, dh);
    check("router", L.router, g.router);
    check("router_bias", L.router_bias, g.router_bias);
    check("experts_gate_up", L.experts_gate_up, g.experts_gate_up);
    check("experts_gate_up_bias", L.experts_gate_up_bias, g.experts_gate_up_bias);
    check("experts_down", L.experts_down, g.experts_down);
    check("experts_down_bias", L.experts_down_bias, g.experts_down_bias);
    EXPECT_EQ(checked, kB * kT * kE + kN * kE + kN + kN * 2 * kI * kE + kN * 2 * kI + kN * kE * kI + kN * kE);
    std::printf("moe: router gap %.3g, clamp distance %.3g, %lld clamped entries\n", ref.router_gap, ref.clamp_distance,
                (long long)ref.clamped);
}

// The checkpoint's layout goes out as it came in.
TEST(MoeMlp, StateDictIsTheCheckpointsLayout) {
    const ModelConfig cfg = moe_config();
    const TensorMap w = moe_weights(31);
    LayerWeights L;
    load_experts(cfg, w, "model.layers.0.", DType::F64, Device{}, L);
    const TensorMap sd = experts_state_dict(cfg, L, "model.layers.0.");
    ASSERT_EQ(sd.size(), w.size());
    for (const auto& [name, t] : w) EXPECT_EQ(sd.at(name).to_f64_vector(), t.to_f64_vector()) << name;
}

}  // namespace
}  // namespace kv::test
