// Gradients with the cache policy in place against central finite differences in f64 of the
// replayed forward (the same decisions, full-precision K/V): dense caches, every policy with
// default and q8 buffers, with and without a grace ring, and every cell layout.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/backend/backend_registry.h"
#include "engine/grad/model_grads.h"
#include "grad_test_util.h"
#include "tests/support/test_support.h"

namespace kv::test {
namespace {

// Tiny f64 models make thousands of small op calls; waking a thread team for each costs more
// than the work, so these tests run single-threaded.
struct SingleThread {
    int saved = num_threads();
    SingleThread() { set_num_threads(1); }
    ~SingleThread() { set_num_threads(saved); }
};

struct Sample {
    std::string what;
    double grad, fd;
};

// Rounding floor of a central difference with h = 1e-5 on a loss of about 4 in f64:
// 2 ulp(4) / 2h ~ 1e-11; entries whose gradients are that small are compared absolutely.
constexpr double kFdNoise = 1e-10;

// Compares the pipeline's gradients with finite differences on `per_tensor` entries of every
// parameter tensor (spread over the tensor) and on embedding entries at `positions`.
// Passes when |g - fd| <= tol * max(|fd| over the tensor's samples) + kFdNoise.
void check_against_fd(Transformer& model, ModelGrads& grads, const Tensor& x0_grad, const Tensor& x0,
                      const std::function<double(const Tensor* x0)>& loss, int per_tensor, const std::vector<int64_t>& positions,
                      double tol, const std::string& ctx) {
    const double h = 1e-5;
    auto pairs = grads.pairs(model);
    for (auto& [name, wg] : pairs) {
        Tensor& w = *wg.first;
        const Tensor& g = *wg.second;
        const int64_t n = w.numel();
        std::vector<Sample> s;
        for (int k = 0; k < per_tensor; ++k) {
            const int64_t i = (n * (2 * k + 1)) / (2 * per_tensor) + (k * 7) % std::max<int64_t>(1, n / per_tensor);
            const int64_t idx = std::min(i, n - 1);
            s.push_back({name + "[" + std::to_string(idx) + "]", get_elem(g, idx),
                         central_difference(w, idx, h, [&] { return loss(nullptr); })});
        }
        double scale = 0;
        for (const auto& x : s) scale = std::max(scale, std::fabs(x.fd));
        if (scale < 1e-9) continue;  // e.g. an embedding row no sampled token uses
        for (const auto& x : s)
            EXPECT_LE(std::fabs(x.grad - x.fd), tol * scale + kFdNoise) << ctx << ": " << x.what << " grad " << x.grad << " fd " << x.fd;
    }
    // input embeddings: token positions, a few channels each
    Tensor xp = x0.clone();
    const int64_t T = x0.size(1), E = x0.size(2);
    std::vector<Sample> s;
    for (int64_t p : positions)
        for (int64_t e : {int64_t(0), E / 2 + 1, E - 1}) {
            const int64_t idx = p * E + e;  // batch row 0
            s.push_back({"x0[" + std::to_string(p) + "," + std::to_string(e) + "]", get_elem(x0_grad, idx),
                         central_difference(xp, idx, h, [&] { return loss(&xp); })});
        }
    (void)T;
    double scale = 0;
    for (const auto& x : s) scale = std::max(scale, std::fabs(x.fd));
    ASSERT_GT(scale, 0.0) << ctx;
    for (const auto& x : s)
        EXPECT_LE(std::fabs(x.grad - x.fd), tol * scale + kFdNoise) << ctx << ": " << x.what << " grad " << x.grad << " fd " << x.fd;
}

struct GradRun {
    GradientStats stats;
    ModelGrads grads;
    Tensor x0_grad;
};

GradRun run_gradient(Transformer& model, const KVCacheConfig& kc, const GradData& d, const ChunkPlan& plan, const GradientOptions& go) {
    GradRun r;
    const int64_t B = d.ids.size(0), T = d.ids.size(1);
    KVCache cache(kc, model.config(), Device{}, model.act_dtype(), T);
    r.grads = ModelGrads::zeros_like(model);
    r.x0_grad = Tensor::zeros({B, T, model.config().hidden_size}, model.act_dtype());
    GradientTargets tg;
    tg.model = &r.grads;
    tg.input_embedding_grad = &r.x0_grad;
    r.stats = gradient_step(model, cache, d.ids, plan, d.head, 1.0, go, tg);
    return r;
}

std::vector<int64_t> cache_lengths(const Transformer& m, int64_t L) { return std::vector<int64_t>(size_t(m.config().num_layers), L); }

class DenseGradient : public ::testing::TestWithParam<std::string> {};

TEST_P(DenseGradient, OneChunkMatchesFiniteDifferences) {
    SingleThread st1;
    const ModelConfig cfg = grad_test_config(GetParam(), 2);
    auto model = grad_test_model(cfg, DType::F64, seed_for("dense-grad-" + GetParam()));
    const int64_t B = 2, T = 20;
    GradData d = grad_test_data(cfg, B, T, 11);
    KVCacheConfig kc;
    kc.name = "dense-default";
    kc.cache_length = T;
    const ChunkPlan plan = grad_test_plan(cfg, T, T, T);
    ASSERT_EQ(plan.chunks.size(), 1u);
    GradRun r = run_gradient(*model, kc, d, plan, GradientOptions{});
    Tensor x0 = model->embed(d.ids);
    auto loss = [&](const Tensor* x) { return replay_loss(*model, r.stats.plans, cache_lengths(*model, T), d.ids, plan, d.head, 1.0, x); };
    // the loss phase 2 differentiates is the phase-1 loss (whose head reads f32 logits)
    EXPECT_NEAR(r.stats.replay_loss, loss(nullptr), 1e-12 * std::fabs(r.stats.loss));
    EXPECT_NEAR(r.stats.loss, loss(nullptr), 1e-6 * std::fabs(r.stats.loss));
    check_against_fd(*model, r.grads, r.x0_grad, x0, loss, 5, {0, 3, T / 2, T - 2}, 1e-6, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Archs, DenseGradient, ::testing::Values("llama", "qwen2", "qwen3"));

struct PolicyCase {
    std::string policy, buffer;
    int64_t grace;
};

void PrintTo(const PolicyCase& c, std::ostream* os) { *os << c.policy << "-" << c.buffer << " grace " << c.grace; }

std::string case_name(const ::testing::TestParamInfo<PolicyCase>& i) {
    std::string s = i.param.policy + "_" + i.param.buffer + (i.param.grace ? "_grace" : "");
    for (char& c : s)
        if (c == '-') c = '_';
    return s;
}

class PolicyGradient : public ::testing::TestWithParam<PolicyCase> {};

// Several chunks through a cache much shorter than the sequence: early tokens are evicted, so
// their embeddings' gradients come only from the chunks that saw them.
TEST_P(PolicyGradient, MatchesFiniteDifferencesOfTheReplayedForward) {
    SingleThread st1;
    const PolicyCase pc = GetParam();
    const ModelConfig cfg = grad_test_config("llama", 2);
    auto model = grad_test_model(cfg, DType::F64, seed_for("policy-grad"));
    const int64_t B = 2, T = 48, L = 16, chunk = 8;
    GradData d = grad_test_data(cfg, B, T, 12);
    KVCacheConfig kc;
    kc.name = pc.policy + "-" + pc.buffer;
    kc.cache_length = L;
    kc.grace_period = pc.grace;
    const ChunkPlan plan = grad_test_plan(cfg, T, L, chunk, 0.5);  // several cells
    ASSERT_GT(plan.cells.size(), 2u);
    GradRun r = run_gradient(*model, kc, d, plan, GradientOptions{});
    // the policy really evicted: some slot plans overwrite occupied slots
    bool evicted = false;
    for (const auto& p : r.stats.plans[0]) evicted = evicted || (p.input_pos >= L);
    EXPECT_TRUE(evicted);
    Tensor x0 = model->embed(d.ids);
    auto loss = [&](const Tensor* x) { return replay_loss(*model, r.stats.plans, cache_lengths(*model, L), d.ids, plan, d.head, 1.0, x); };
    EXPECT_NEAR(r.stats.replay_loss, loss(nullptr), 1e-12 * std::fabs(loss(nullptr)));
    check_against_fd(*model, r.grads, r.x0_grad, x0, loss, 3, {0, 2, 9, 17, 30, 46}, 1e-6, kc.name);
}

std::vector<PolicyCase> policy_cases() {
    std::vector<PolicyCase> out;
    for (const char* p : {"lastrec", "streaming", "h2o", "h2o-orig", "h2o-vlen", "tova", "snapkv", "knorm"})
        for (const char* b : {"default", "q8"}) {
            out.push_back({p, b, 0});
            if (std::string(p).rfind("h2o", 0) == 0 || std::string(p) == "tova") out.push_back({p, b, 4});
        }
    out.push_back({"qh2o", "q8", 0});
    out.push_back({"qh2o", "q8", 4});
    out.push_back({"qh2o-vlen", "q8", 0});
    return out;
}

INSTANTIATE_TEST_SUITE_P(Policies, PolicyGradient, ::testing::ValuesIn(policy_cases()), case_name);

// Rows of layers and cells of chunks only change the order of the work, never the gradient.
TEST(GradientLayout, CellLayoutDoesNotChangeGradients) {
    SingleThread st1;
    for (DType dt : {DType::F64, DType::F32}) {
        const ModelConfig cfg = grad_test_config("llama", 4);
        auto model = grad_test_model(cfg, dt, seed_for("layout-grad"));
        const int64_t B = 1, T = 64, L = 16, chunk = 8;
        GradData d = grad_test_data(cfg, B, T, 13);
        KVCacheConfig kc;
        kc.name = "h2o-default";
        kc.cache_length = L;
        kc.grace_period = 2;
        // one set of decisions for every layout
        const ChunkPlan plan0 = grad_test_plan(cfg, T, L, chunk, 1.0);
        GradRun ref = run_gradient(*model, kc, d, plan0, GradientOptions{});
        const double tol = dt == DType::F64 ? 1e-6 : 1e-5;
        for (int64_t lpc : {int64_t(1), int64_t(2), int64_t(4)})
            for (double mult : {0.5, 1.0, 4.0}) {
                const ChunkPlan plan = grad_test_plan(cfg, T, L, chunk, mult);
                GradientOptions go;
                go.layers_per_cell = lpc;
                KVCache cache(kc, cfg, Device{}, dt, T);
                ModelGrads g = ModelGrads::zeros_like(*model);
                GradientTargets tg;
                tg.model = &g;
                GradientStats st = gradient_step(*model, cache, d.ids, plan, d.head, 1.0, go, tg, {}, &ref.stats.plans);
                auto a = g.pairs(*model), b = ref.grads.pairs(*model);
                for (size_t i = 0; i < a.size(); ++i) {
                    std::vector<double> x = a[i].second.second->to_f64_vector(), y = b[i].second.second->to_f64_vector();
                    double scale = 0, err = 0;
                    for (size_t k = 0; k < x.size(); ++k) scale = std::max(scale, std::fabs(y[k])), err = std::max(err, std::fabs(x[k] - y[k]));
                    EXPECT_LE(err, tol * std::max(scale, 1e-12))
                        << a[i].first << " lpc " << lpc << " multiplier " << mult << " cells " << plan.cells.size();
                }
                EXPECT_EQ(st.rows, lpc == 1 ? 4 : lpc == 2 ? 2 : 1);
                EXPECT_EQ(st.cells, int64_t(plan.cells.size()));
            }
    }
}

}  // namespace
}  // namespace kv::test
