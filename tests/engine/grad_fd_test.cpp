// Gradients with the cache policy in place against central finite differences in f64 of the
// replayed forward (the same decisions, full-precision K/V): dense caches, every policy with
// default and q8 buffers, with and without a grace ring, and every cell layout.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "engine/backend/backend_registry.h"
#include "engine/core/error.h"
#include "engine/grad/lora.h"
#include "engine/model/altup.h"
#include "engine/model/model_grads.h"
#include "engine/kv/policies/policy_registry.h"
#include "grad_test_util.h"
#include "kv_test_util.h"
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

// Central difference with h = 1e-5, or with `extrapolate` Richardson's (4 D(h) - D(2h)) / 3:
// its truncation error is O(h^4) instead of O(h^2), for losses that curve strongly (Gemma's
// (1 + w) norms and scaled embeddings, LoRA on every site), at about 1.5x the rounding floor.
double fd_at(Tensor& t, int64_t i, bool extrapolate, const std::function<double()>& loss) {
    const double h = 1e-5, d = central_difference(t, i, h, loss);
    return extrapolate ? (4.0 * d - central_difference(t, i, 2 * h, loss)) / 3.0 : d;
}
double fd_noise(bool extrapolate) { return extrapolate ? 3 * kFdNoise : kFdNoise; }

// The largest |g - fd| / bound of the checks since the last reset: how close a test came to its
// bound (printed by the tests that measure their margin over seeds).
double worst_fraction = 0;
void note_fraction(double err, double bound) {
    worst_fraction = std::max(worst_fraction, err / bound);
}

// Gradient g of parameter w against finite differences on `per_tensor` entries spread over w.
// Passes when |g - fd| <= tol * max(|fd| over the samples) + kFdNoise; returns that max.
double check_tensor_against_fd(const std::string& name, Tensor& w, const Tensor& g, const std::function<double()>& loss,
                               int per_tensor, double tol, const std::string& ctx, bool extrapolate = false) {
    const int64_t n = w.numel();
    std::vector<Sample> s;
    for (int k = 0; k < per_tensor; ++k) {
        const int64_t i = (n * (2 * k + 1)) / (2 * per_tensor) + (k * 7) % std::max<int64_t>(1, n / per_tensor);
        const int64_t idx = std::min(i, n - 1);
        s.push_back({name + "[" + std::to_string(idx) + "]", get_elem(g, idx), fd_at(w, idx, extrapolate, loss)});
    }
    double scale = 0;
    for (const auto& x : s) scale = std::max(scale, std::fabs(x.fd));
    if (scale < 1e-9) return scale;  // e.g. an embedding row no sampled token uses
    for (const auto& x : s) note_fraction(std::fabs(x.grad - x.fd), tol * scale + fd_noise(extrapolate));
    for (const auto& x : s)
        EXPECT_LE(std::fabs(x.grad - x.fd), tol * scale + fd_noise(extrapolate))
            << ctx << ": " << x.what << " grad " << x.grad << " fd " << x.fd;
    return scale;
}

// Compares the pipeline's gradients with finite differences on `per_tensor` entries of every
// parameter tensor (spread over the tensor) and on embedding entries at `positions`.
// Passes when |g - fd| <= tol * max(|fd| over the tensor's samples) + kFdNoise.
void check_against_fd(Transformer& model, ModelGrads& grads, const Tensor& x0_grad, const Tensor& x0,
                      const std::function<double(const Tensor* x0)>& loss, int per_tensor, const std::vector<int64_t>& positions,
                      double tol, const std::string& ctx, bool extrapolate = false) {
    for (auto& [name, wg] : grads.pairs(model))
        check_tensor_against_fd(name, *wg.first, *wg.second, [&] { return loss(nullptr); }, per_tensor, tol, ctx, extrapolate);
    // input embeddings: token positions, a few channels each
    Tensor xp = x0.clone();
    const int64_t T = x0.size(1), E = x0.size(2);
    std::vector<Sample> s;
    for (int64_t p : positions)
        for (int64_t e : {int64_t(0), E / 2 + 1, E - 1}) {
            const int64_t idx = p * E + e;  // batch row 0
            s.push_back({"x0[" + std::to_string(p) + "," + std::to_string(e) + "]", get_elem(x0_grad, idx),
                         fd_at(xp, idx, extrapolate, [&] { return loss(&xp); })});
        }
    (void)T;
    double scale = 0;
    for (const auto& x : s) scale = std::max(scale, std::fabs(x.fd));
    ASSERT_GT(scale, 0.0) << ctx;
    for (const auto& x : s) note_fraction(std::fabs(x.grad - x.fd), tol * scale + fd_noise(extrapolate));
    for (const auto& x : s)
        EXPECT_LE(std::fabs(x.grad - x.fd), tol * scale + fd_noise(extrapolate)) << ctx << ": " << x.what << " grad " << x.grad << " fd " << x.fd;
}

struct GradRun {
    GradientStats stats;
    ModelGrads grads;
    Tensor x0_grad;
};

// byte_codec() with encoded bytes folded into the test models' 48-id vocabulary, so text a
// policy encodes (kvzip's reconstruction prompt) is valid input; '\n' (smart-lastrec's regex) and
// every decoded id < 48 are unchanged.
const TextCodec& folded_codec() {
    static const TextCodec c{byte_codec().decode, [](const std::string& s) {
                                 std::vector<int32_t> ids = byte_codec().encode(s);
                                 for (int32_t& i : ids) i %= 48;
                                 return ids;
                             }};
    return c;
}

GradRun run_gradient(Transformer& model, const KVCacheConfig& kc, const GradData& d, const ChunkPlan& plan, const GradientOptions& go) {
    GradRun r;
    const int64_t B = d.ids.size(0), T = d.ids.size(1);
    KVCache cache(kc, model.config(), Device{}, model.act_dtype(), T, &folded_codec());
    r.grads = ModelGrads::zeros_like(model);
    r.x0_grad = Tensor::zeros({B, T, model.config().residual_width()}, model.act_dtype());  // Gemma 3n: the packed state
    GradientTargets tg;
    tg.model = &r.grads;
    tg.input_embedding_grad = &r.x0_grad;
    r.stats = gradient_step(model, cache, d.ids, plan, d.head, 1.0, go, tg);
    return r;
}

std::vector<int64_t> cache_lengths(const Transformer& m, int64_t L) { return std::vector<int64_t>(size_t(m.config().num_layers), L); }

// The experts' piecewise parts against the finite differences' steps (at most 2e-5 on one
// entry): the smallest gap between a token's top_k-th and next router logit (a smaller one
// could swap the selection between the two sides of a difference) and the smallest distance of
// a selected expert's gate or up pre-activation from the clamps at +-limit. (The clamps' kinks
// are crossed in MoeMlpGradient.*, whose gates are large enough to reach them.)
struct ExpertMargins {
    double router_gap = 1e300, clamp_distance = 1e300;
    int64_t clamped = 0;
};
ExpertMargins expert_margins(const Transformer& m, const Tensor& ids) {
    const ModelConfig& c = m.config();
    ExpertMargins r;
    PlainAttention plain;
    Tensor x = m.embed(ids);
    for (int l = 0; l < int(c.num_layers); ++l) {
        BlockActivations a;
        x = m.block(l, x, 0, plain, &a);
        if (!c.experts_layer(l)) continue;
        const std::vector<double> z = a.moe_logits.to_f64_vector(), gu = a.gu.to_f64_vector();
        const int64_t N = c.moe.num_experts, K = c.moe.top_k, I = c.intermediate_size;
        for (size_t row = 0; row < z.size() / size_t(N); ++row) {
            std::vector<double> v(z.begin() + long(row * size_t(N)), z.begin() + long((row + 1) * size_t(N)));
            std::sort(v.begin(), v.end(), std::greater<double>());
            if (K < N) r.router_gap = std::min(r.router_gap, v[size_t(K - 1)] - v[size_t(K)]);
        }
        for (size_t i = 0; i < gu.size(); ++i) {
            const bool gate = int64_t(i) % (2 * I) < I;  // gate entries: clamped above; up: both sides
            const double d = gate ? std::fabs(gu[i] - c.moe.limit) : std::min(std::fabs(gu[i] - c.moe.limit), std::fabs(gu[i] + c.moe.limit));
            r.clamp_distance = std::min(r.clamp_distance, d);
            r.clamped += gate ? gu[i] > c.moe.limit : std::fabs(gu[i]) > c.moe.limit;
        }
    }
    return r;
}
void expect_clear_expert_margins(const Transformer& m, const Tensor& ids) {
    if (!m.config().has_experts()) return;
    const ExpertMargins em = expert_margins(m, ids);
    EXPECT_GT(em.router_gap, 1e-3) << "a near-tie in the routing: the finite differences could see another selection";
    EXPECT_GT(em.clamp_distance, 1e-3) << "an expert pre-activation next to a clamp";
    std::printf("experts: smallest router gap %.3g, smallest distance to a clamp %.3g, %lld clamped entries\n", em.router_gap,
                em.clamp_distance, (long long)em.clamped);
}

// Gemma 3n's gaussian top-k is piecewise smooth: a central difference whose step moves a gate
// entry across the cutoff measures the jump in the kept set, not the derivative. The smallest
// distance of a gate entry from its row's cutoff over the layers that sparsify (0 without any).
double topk_margin(const Transformer& m, const Tensor& ids) {
    const ModelConfig& c = m.config();
    double margin = 1e300;
    PlainAttention plain;
    std::vector<int> sources;
    for (int64_t l = 0; l < c.num_layers; ++l)
        if (c.kv_shared(l)) sources.push_back(int(c.kv_layer(l)));
    plain.retain(sources);
    Tensor x = m.embed(ids);
    for (int l = 0; l < int(c.num_layers); ++l) {
        BlockActivations a;
        x = m.block(l, x, 0, plain, &a);
        const double sp = c.layer_spec(l).activation_sparsity;
        if (!(sp > 0)) continue;
        const double z = double(float(normal_quantile(sp)));
        const std::vector<double> g = a.gate_pre.to_f64_vector();
        const int64_t I = c.intermediate_size;
        for (size_t r = 0; r < g.size() / size_t(I); ++r) {
            double mean = 0, var = 0;
            for (int64_t i = 0; i < I; ++i) mean += g[r * size_t(I) + size_t(i)];
            mean /= double(I);
            for (int64_t i = 0; i < I; ++i) var += (g[r * size_t(I) + size_t(i)] - mean) * (g[r * size_t(I) + size_t(i)] - mean);
            const double cut = mean + std::sqrt(var / double(I)) * z;
            for (int64_t i = 0; i < I; ++i) margin = std::min(margin, std::fabs(g[r * size_t(I) + size_t(i)] - cut));
        }
    }
    return margin == 1e300 ? 0.0 : margin;
}

// A test model (the first of seed, seed + 1, ...) whose piecewise parts stay clear of the finite
// differences' steps on `ids` (with `adapters` in place): Gemma 3n's gate entries 1e-4 or more
// from the top-k cutoff, an expert model's router gaps and clamp distances above 1e-3 (with the
// seeds the run draws, about one model in a hundred has a closer routing tie); other families:
// the model of `seed`.
constexpr double kTopkMargin = 1e-4;
std::unique_ptr<Transformer> clear_topk_model(const ModelConfig& cfg, uint64_t seed, const Tensor& ids,
                                              const std::function<void(Transformer&)>& adapters = {}) {
    for (uint64_t k = 0;; ++k) {
        auto m = grad_test_model(cfg, DType::F64, seed + k);
        if (adapters) adapters(*m);
        bool clear = !cfg.altup_enabled() || topk_margin(*m, ids) > kTopkMargin;
        if (clear && cfg.has_experts()) {
            const ExpertMargins em = expert_margins(*m, ids);
            clear = em.router_gap > 1e-3 && em.clamp_distance > 1e-3;
        }
        if (clear || k == 50) return m;
    }
}

class DenseGradient : public ::testing::TestWithParam<std::string> {};

TEST_P(DenseGradient, OneChunkMatchesFiniteDifferences) {
    SingleThread st1;
    const ModelConfig cfg = grad_test_config(GetParam(), 2);
    const int64_t B = 2, T = 20;
    GradData d = grad_test_data(cfg, B, T, 11);
    auto model = clear_topk_model(cfg, seed_for("dense-grad-" + GetParam()), d.ids);
    if (cfg.altup_enabled()) {
        EXPECT_GT(topk_margin(*model, d.ids), kTopkMargin);
    }
    KVCacheConfig kc;
    kc.name = "dense-default";
    kc.cache_length = T;
    const ChunkPlan plan = grad_test_plan(cfg, T, T, T);
    ASSERT_EQ(plan.chunks.size(), 1u);
    expect_clear_expert_margins(*model, d.ids);
    GradRun r = run_gradient(*model, kc, d, plan, GradientOptions{});
    Tensor x0 = model->embed(d.ids);
    auto loss = [&](const Tensor* x) { return replay_loss(*model, r.stats.plans, cache_lengths(*model, T), d.ids, plan, d.head, 1.0, x); };
    // the loss phase 2 differentiates is the phase-1 loss (whose head reads f32 logits)
    EXPECT_NEAR(r.stats.replay_loss, loss(nullptr), 1e-12 * std::fabs(r.stats.loss));
    EXPECT_NEAR(r.stats.loss, loss(nullptr), 1e-6 * std::fabs(r.stats.loss));
    // Gemma's (1 + w) norms on both sides and scaled embeddings curve the loss more; so do latent
    // attention's three norms in a row (attention norm, latent norms) before the keys (central
    // differences alone missed by 1.06e-10 against 1.04e-10 on 2 of 25 seeds); and LFM2's
    // convolution, cubic in in_proj's rows (b x, then c times that: up to 0.61 of the bound)
    // and the experts' routing weights (a softmax of router logits of order 1)
    const bool extrapolate = GetParam().rfind("gemma", 0) == 0 || GetParam().rfind("mla", 0) == 0 || GetParam() == "lfm2" ||
                             GetParam() == "gpt_oss_moe";
    worst_fraction = 0;
    // Gemma 3n has about 50 tensors (AltUp, LAUREL, per-layer inputs): 2 samples each keep it cheap
    check_against_fd(*model, r.grads, r.x0_grad, x0, loss, GetParam() == "gemma3n" ? 2 : 5, {0, 3, T / 2, T - 2}, 1e-6, GetParam(),
                     extrapolate);
    std::printf("%s: worst |grad - fd| is %.3f of its bound\n", GetParam().c_str(), worst_fraction);
}

INSTANTIATE_TEST_SUITE_P(Archs, DenseGradient,
                         ::testing::Values("llama", "qwen2", "qwen3", "smollm3", "phi3", "geglu", "gemma3", "olmo2",
                                           "gemma3_window", "mistral", "qwen2_window", "gemma2_softcap", "gpt_oss", "gpt_oss_moe", "mla", "mla_qlora",
                                           "lfm2", "gemma3n"));

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
// their embeddings' gradients come only from the chunks that saw them. Per-layer lengths come
// from the config (pyramidkv's default rule makes them differ).
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
    // pyramid: every layer keeps a window of a chunk plus the grace ring on top of its budget
    kc.snapkv_window = chunk + pc.grace;
    kc.kivi_group_size = 8;  // kivi: groups of 8 slots pack within L = 16
    kc.kivi_residual = 4;
    apply_required_options(kc);
    std::vector<int64_t> Ls;
    for (int64_t l = 0; l < cfg.num_layers; ++l) Ls.push_back(kc.length_for_layer(l, T, cfg.num_layers));
    ChunkPlanOptions po;
    po.chunk_size = chunk;
    po.cell_factor = cell_factor(cfg);
    po.chunks_per_cell_multiplier = 0.5;
    const ChunkPlan plan = plan_chunks(T, Ls, po);  // several cells
    ASSERT_GT(plan.cells.size(), 2u);
    GradRun r = run_gradient(*model, kc, d, plan, GradientOptions{});
    if (find_policy(pc.policy)->initial_layer_length)  // cake: the lengths its layers were given in the run
        for (int64_t l = 0; l < cfg.num_layers; ++l)
            for (const SlotPlan& p : r.stats.plans[size_t(l)]) Ls[size_t(l)] = std::max(Ls[size_t(l)], p.length_after);
    // the policy really evicted: some slot plans overwrite occupied slots
    bool evicted = false;
    for (const auto& p : r.stats.plans[0]) evicted = evicted || (p.input_pos >= Ls[0]);
    EXPECT_TRUE(evicted);
    Tensor x0 = model->embed(d.ids);
    auto loss = [&](const Tensor* x) { return replay_loss(*model, r.stats.plans, Ls, d.ids, plan, d.head, 1.0, x); };
    EXPECT_NEAR(r.stats.replay_loss, loss(nullptr), 1e-12 * std::fabs(loss(nullptr)));
    check_against_fd(*model, r.grads, r.x0_grad, x0, loss, 3, {0, 2, 9, 17, 30, 46}, 1e-6, kc.name);
}

// Every registered policy that evicts, on the default and q8 buffers (q8 alone where a
// quantized buffer is required), and with a grace ring where the policy has one.
std::vector<PolicyCase> policy_cases() {
    std::vector<PolicyCase> out;
    for (const PolicyInfo& p : policy_registry()) {
        if (!p.needs_cache_length) continue;  // dense never evicts: DenseGradient
        const bool grace = std::find(p.uses.begin(), p.uses.end(), "grace_period") != p.uses.end();
        for (const char* b : {"default", "q8"}) {
            if (p.needs_quantized_buffer && std::string(b) == "default") continue;
            if (!p.buffers.empty() && std::find(p.buffers.begin(), p.buffers.end(), b) == p.buffers.end()) continue;
            out.push_back({p.name, b, 0});
            if (grace) out.push_back({p.name, b, 4});
        }
        // KIVI: the same replayed full-precision forward; the decisions come from the packed cache.
        if (p.name == "h2o" || p.name == "lastrec") out.push_back({p.name, p.name == "h2o" ? "kivi2" : "kivi4", 0});
        // The deployed floating-point formats, an asymmetric pair and TurboQuant, likewise.
        if (p.name == "h2o") out.push_back({p.name, "fp8_e4m3", 0}), out.push_back({p.name, "nvfp4", 0});
        if (p.name == "lastrec") out.push_back({p.name, "k8v4", 0});
        if (p.name == "h2o") out.push_back({p.name, "turboquant", 0});  // rotated codes, scores from decoded keys
        // ThinK's pruned key channels: decisions from the pruned keys, the replayed forward full precision
        if (p.name == "h2o" || p.name == "snapkv") out.push_back({p.name, "think", 0});
    }
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

// ==== loss normalisation ==========================================================================

// keys_values' average_loss_per_batch: true divides each row's summed token loss by the batch's
// mean target count (the batch loss is the mean over all target tokens), false by the row's own
// count (the mean of the rows' token means). Rows with different target counts tell them apart;
// both gradients match finite differences of their replayed losses.
TEST(GradLossNormalisation, AverageLossPerBatchIsTheBatchTokenMean) {
    SingleThread st1;
    const ModelConfig cfg = grad_test_config("llama", 2);
    auto model = grad_test_model(cfg, DType::F64, seed_for("loss-normalisation"));
    const int64_t B = 3, T = 24, L = 16, chunk = 8;
    GradData d = grad_test_data(cfg, B, T, 17);
    for (int64_t t = 0; t < 14; ++t) d.head.token_targets[size_t(2 * T + t)] = -100;  // row 2: few targets
    std::vector<double> nz(B, 0.0);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T; ++t) nz[size_t(b)] += d.head.token_targets[size_t(b * T + t)] != -100;
    ASSERT_NE(nz[0], nz[2]);
    KVCacheConfig kc;
    kc.name = "h2o-default";
    kc.cache_length = L;
    const ChunkPlan plan = grad_test_plan(cfg, T, L, chunk, 0.5);
    const double scale = 0.25;
    std::vector<double> x0_grads[2];
    for (bool per_batch : {false, true}) {
        d.head.average_loss_per_batch = per_batch;
        GradRun r = run_gradient(*model, kc, d, plan, GradientOptions{});
        // the normalisation from phase 1's per-row sums and counts, by hand
        double expect = 0;
        const double total = nz[0] + nz[1] + nz[2];
        for (int64_t b = 0; b < B; ++b) {
            ASSERT_EQ(r.stats.head.count[size_t(b)], nz[size_t(b)]);
            expect += per_batch ? r.stats.head.loss_sum[size_t(b)] / total : r.stats.head.loss_sum[size_t(b)] / (double(B) * nz[size_t(b)]);
        }
        auto loss = [&](const Tensor* x) { return replay_loss(*model, r.stats.plans, cache_lengths(*model, L), d.ids, plan, d.head, scale, x); };
        const double l0 = loss(nullptr);
        // run_gradient used scale 1; the loss scales linearly
        EXPECT_NEAR(r.stats.loss, expect, 1e-12 * expect) << "per_batch " << per_batch;
        EXPECT_NEAR(l0, scale * expect, 1e-6 * scale * expect) << "per_batch " << per_batch;
        // gradients at scale 0.25, as a micro-batch of a larger global batch
        KVCache cache(kc, cfg, Device{}, DType::F64, T);
        ModelGrads g = ModelGrads::zeros_like(*model);
        Tensor x0_grad = Tensor::zeros({B, T, cfg.hidden_size}, DType::F64);
        GradientTargets tg;
        tg.model = &g;
        tg.input_embedding_grad = &x0_grad;
        const GradientStats st = gradient_step(*model, cache, d.ids, plan, d.head, scale, GradientOptions{}, tg, {}, &r.stats.plans);
        EXPECT_NEAR(st.replay_loss, l0, 1e-12 * l0);
        x0_grads[per_batch] = x0_grad.to_f64_vector();
        check_against_fd(*model, g, x0_grad, model->embed(d.ids), loss, 2, {0, 5, 12, 22}, 1e-6,
                         per_batch ? "average_loss_per_batch" : "per row");
    }
    // Rows do not interact, so row b's input gradient differs between the two only by the
    // ratio of its loss weights, (1 / sum nz) / (1 / (B nz_b)): B nz_b / sum nz (3/4 .. 3/2 here).
    const double total = nz[0] + nz[1] + nz[2];
    const int64_t per_row = T * cfg.hidden_size;
    for (int64_t b = 0; b < B; ++b) {
        const double ratio = double(B) * nz[size_t(b)] / total;
        double err = 0, ref = 0;
        for (int64_t i = b * per_row; i < (b + 1) * per_row; ++i) {
            err = std::max(err, std::fabs(x0_grads[1][size_t(i)] - ratio * x0_grads[0][size_t(i)]));
            ref = std::max(ref, std::fabs(x0_grads[1][size_t(i)]));
        }
        EXPECT_GT(ref, 0.0) << "row " << b;
        EXPECT_LE(err, 1e-10 * ref) << "row " << b << " weight ratio " << ratio;
    }
    EXPECT_GT(std::fabs(double(B) * nz[2] / total - 1.0), 0.2) << "row 2's weights must tell the normalisations apart";
}

// ==== seq_classification head ===================================================================

// The trainable Linear(E, C) head on the final-norm state (pooled at the last position or the
// mean), one cross-entropy per row, through an evicting cache: its weight and bias gradients,
// the model's and the input embeddings' against finite differences of the replayed loss.
TEST(SeqClassGradient, ClassWeightBiasAndModelMatchFiniteDifferences) {
    SingleThread st1;
    const ModelConfig cfg = grad_test_config("llama", 2);
    auto model = grad_test_model(cfg, DType::F64, seed_for("seq-class-grad"));
    const int64_t B = 2, T = 32, L = 16, chunk = 8, C = 3, E = cfg.hidden_size;
    GradData d = grad_test_data(cfg, B, T, 16);
    std::mt19937_64 rng(seed_for("seq-class-head"));
    for (bool mean_pool : {false, true}) {
        HeadSpec head;
        head.kind = HeadKind::SEQ_CLASS;
        head.B = B, head.T = T;
        head.labels = {2, 0};
        head.class_weight = random_tensor({C, E}, DType::F64, rng, -0.5, 0.5);
        head.class_bias = random_tensor({C}, DType::F64, rng, -0.5, 0.5);
        head.mean_pool = mean_pool;
        KVCacheConfig kc;
        kc.name = "h2o-default";
        kc.cache_length = L;
        const ChunkPlan plan = grad_test_plan(cfg, T, L, chunk, 0.5);
        ASSERT_GT(plan.cells.size(), 1u);
        KVCache cache(kc, cfg, Device{}, DType::F64, T);
        ModelGrads grads = ModelGrads::zeros_like(*model);
        Tensor x0_grad = Tensor::zeros({B, T, E}, DType::F64);
        Tensor dw = Tensor::zeros({C, E}, DType::F64), db = Tensor::zeros({C}, DType::F64);
        GradientTargets tg;
        tg.model = &grads;
        tg.input_embedding_grad = &x0_grad;
        tg.class_weight = &dw, tg.class_bias = &db;
        const double scale = 0.5;  // a micro-batch's share of the global batch
        const GradientStats st = gradient_step(*model, cache, d.ids, plan, head, scale, GradientOptions{}, tg);
        const std::vector<int64_t> Ls(size_t(cfg.num_layers), L);
        auto loss = [&](const Tensor* x) { return replay_loss(*model, st.plans, Ls, d.ids, plan, head, scale, x); };
        const double l0 = loss(nullptr);
        const std::string ctx = mean_pool ? "seq_classification mean" : "seq_classification last";
        EXPECT_NEAR(st.replay_loss, l0, 1e-12 * std::fabs(l0)) << ctx;
        EXPECT_NEAR(st.loss, l0, 1e-6 * std::fabs(l0)) << ctx;
        EXPECT_GT(check_tensor_against_fd("score.weight", head.class_weight, dw, [&] { return loss(nullptr); }, 9, 1e-6, ctx), 0.0);
        EXPECT_GT(check_tensor_against_fd("score.bias", head.class_bias, db, [&] { return loss(nullptr); }, 3, 1e-6, ctx), 0.0);
        // the C biases' gradients sum to 0 (softmax), per row: a check FD samples would not make
        double sum = 0;
        for (double v : db.to_f64_vector()) sum += v;
        EXPECT_NEAR(sum, 0.0, 1e-12) << ctx;
        Tensor x0 = model->embed(d.ids);
        check_against_fd(*model, grads, x0_grad, x0, loss, 2, {0, 7, 20, T - 1}, 1e-6, ctx);
    }
}

// ==== LoRA dropout ===============================================================================

// LoRA on every target with B != 0 (at B = 0, dA would be 0 and the test blind).
std::unique_ptr<Lora> dropout_test_lora(const Transformer& model, double p, uint64_t seed) {
    LoraConfig lc;
    lc.r = 4;
    lc.alpha = 8;
    lc.dropout = p;
    lc.targets = {"q", "k", "v", "proj", "mlp", "head"};
    if (model.config().has_experts()) lc.targets = {"q", "k", "v", "proj", "head"};  // the experts take no adapters
    lc.seed = seed;
    auto lora = std::make_unique<Lora>(model, lc);
    std::mt19937_64 rng(seed + 1);
    for (auto& a : lora->adapters()) a.B.copy_from(random_tensor(a.B.shape(), a.B.dtype(), rng, -0.3, 0.3));
    return lora;
}

// Dropout 0.3 on every LoRA site through an evicting cache over several cells: the adapters'
// and the input embeddings' gradients are those of the replayed loss of the same training
// pass (one mask for phase 1, every cell's recompute and every finite-difference evaluation).
TEST(LoraDropoutGradient, MatchesFiniteDifferencesOfTheSamePass) {
    SingleThread st1;
    const ModelConfig cfg = grad_test_config("llama", 2);
    auto model = grad_test_model(cfg, DType::F64, seed_for("lora-dropout-grad"));
    const int64_t B = 2, T = 40, L = 16, chunk = 8;
    GradData d = grad_test_data(cfg, B, T, 14);
    auto lora = dropout_test_lora(*model, 0.3, 5);
    model->set_adapters(lora.get());
    KVCacheConfig kc;
    kc.name = "h2o-default";
    kc.cache_length = L;
    const ChunkPlan plan = grad_test_plan(cfg, T, L, chunk, 0.5);
    ASSERT_GT(plan.cells.size(), 2u);
    lora->begin_training_pass(7);
    KVCache cache(kc, cfg, Device{}, DType::F64, T);
    Tensor x0_grad = Tensor::zeros({B, T, cfg.residual_width()}, DType::F64);
    GradientTargets tg;
    tg.input_embedding_grad = &x0_grad;
    const GradientStats st = gradient_step(*model, cache, d.ids, plan, d.head, 1.0, GradientOptions{}, tg);
    const std::vector<int64_t> Ls(size_t(cfg.num_layers), L);
    auto loss = [&](const Tensor* x) { return replay_loss(*model, st.plans, Ls, d.ids, plan, d.head, 1.0, x); };
    const double l0 = loss(nullptr);
    EXPECT_NEAR(st.replay_loss, l0, 1e-12 * std::fabs(l0));
    EXPECT_NEAR(st.loss, l0, 1e-6 * std::fabs(l0));  // phase 1 (f32 logits in its head) drew the same masks
    int checked = 0;
    for (auto& a : lora->adapters()) {
        checked += check_tensor_against_fd(a.module + ".lora_A", a.A, a.dA, [&] { return loss(nullptr); }, 3, 1e-6, "dropout 0.3") > 0;
        checked += check_tensor_against_fd(a.module + ".lora_B", a.B, a.dB, [&] { return loss(nullptr); }, 3, 1e-6, "dropout 0.3") > 0;
    }
    EXPECT_EQ(checked, int(2 * lora->adapters().size()));
    // the input embeddings: their gradient passes the masks of the q/k/v and gate/up sites.
    // h = 1e-6: with adapters on every site the loss can curve enough at an embedding entry
    // that h = 1e-5 leaves a truncation error of ~1e-6 relative (it shrinks as h^2; the f64
    // rounding floor at h = 1e-6 is ~1e-9)
    Tensor x0 = model->embed(d.ids), xp = x0.clone();
    std::vector<Sample> s;
    for (int64_t p : {int64_t(0), int64_t(5), int64_t(17), int64_t(38)})
        for (int64_t e : {int64_t(1), cfg.hidden_size / 2, cfg.hidden_size - 1}) {
            const int64_t idx = (T + p) * cfg.hidden_size + e;  // batch row 1
            s.push_back({"x0[1," + std::to_string(p) + "," + std::to_string(e) + "]", get_elem(x0_grad, idx),
                         central_difference(xp, idx, 1e-6, [&] { return loss(&xp); })});
        }
    double scale = 0;
    for (const auto& x : s) scale = std::max(scale, std::fabs(x.fd));
    ASSERT_GT(scale, 0.0);
    for (const auto& x : s) EXPECT_LE(std::fabs(x.grad - x.fd), 1e-6 * scale + kFdNoise) << x.what << " grad " << x.grad << " fd " << x.fd;
    // the masks are really there: another pass, or none, gives another loss
    lora->begin_training_pass(8);
    EXPECT_GT(std::fabs(loss(nullptr) - l0), 1e-6 * std::fabs(l0));
    lora->end_training_pass();
    EXPECT_GT(std::fabs(loss(nullptr) - l0), 1e-6 * std::fabs(l0));
    model->set_adapters(nullptr);
}

// One LoRA step through each newer layer type (NoPE, partial rotary with fused projections,
// GELU-tanh MLP, Gemma 3 blocks: four (1 + w) norms, q/k norm, scaled embeddings, a RoPE base
// per layer; OLMo 2 blocks: output norms, q/k norm over the projection), adapters on every
// site, through a dense cache: every adapter's gradient equals finite differences of the
// replayed loss.
class LoraLayerTypeGradient : public ::testing::TestWithParam<std::string> {};

TEST_P(LoraLayerTypeGradient, AdaptersMatchFiniteDifferences) {
    SingleThread st1;
    const ModelConfig cfg = grad_test_config(GetParam(), 2);
    const int64_t B = 1, T = 16;
    GradData d = grad_test_data(cfg, B, T, 21);
    std::unique_ptr<Lora> lora;
    auto model = clear_topk_model(cfg, seed_for("lora-layer-grad-" + GetParam()), d.ids, [&](Transformer& m) {
        lora = dropout_test_lora(m, 0.0, 3);
        m.set_adapters(lora.get());
    });
    if (cfg.altup_enabled()) {
        EXPECT_GT(topk_margin(*model, d.ids), kTopkMargin);
    }
    expect_clear_expert_margins(*model, d.ids);
    KVCacheConfig kc;
    kc.name = "dense-default";
    kc.cache_length = T;
    const ChunkPlan plan = grad_test_plan(cfg, T, T, 8);
    lora->begin_training_pass(1);
    KVCache cache(kc, cfg, Device{}, DType::F64, T);
    Tensor x0_grad = Tensor::zeros({B, T, cfg.residual_width()}, DType::F64);
    GradientTargets tg;
    tg.input_embedding_grad = &x0_grad;
    const GradientStats st = gradient_step(*model, cache, d.ids, plan, d.head, 1.0, GradientOptions{}, tg);
    const std::vector<int64_t> Ls(size_t(cfg.num_layers), T);
    auto loss = [&](const Tensor* x) { return replay_loss(*model, st.plans, Ls, d.ids, plan, d.head, 1.0, x); };
    const double l0 = loss(nullptr);
    EXPECT_NEAR(st.replay_loss, l0, 1e-12 * std::fabs(l0));
    int checked = 0;
    worst_fraction = 0;
    for (auto& a : lora->adapters()) {
        if (cfg.latent_attention() && a.site == LinearSite::O) {
            // o_proj's input is cached padded from v_head_dim to head_dim with zeros: lora_A's
            // padding columns get no gradient; the others are compared one by one.
            const int64_t HS = cfg.head_dim, VD = cfg.latent.v_head_dim, in = a.A.size(1);
            double scale = 0;
            std::vector<Sample> s;
            for (int64_t k = 0; k < 6; ++k) {
                const int64_t row = k % a.A.size(0), col = (k * 7) % (in / HS) * HS + k % VD, idx = row * in + col;
                s.push_back({a.module + ".lora_A[" + std::to_string(idx) + "]", get_elem(a.dA, idx),
                             fd_at(a.A, idx, true, [&] { return loss(nullptr); })});
                scale = std::max(scale, std::fabs(s.back().fd));
            }
            for (const auto& x : s) note_fraction(std::fabs(x.grad - x.fd), 1e-6 * scale + fd_noise(true));
            for (const auto& x : s)
                EXPECT_LE(std::fabs(x.grad - x.fd), 1e-6 * scale + fd_noise(true))
                    << x.what << " grad " << x.grad << " fd " << x.fd;
            for (int64_t i = 0; i < a.A.numel(); ++i)
                if ((i % in) % HS >= VD) {
                    ASSERT_EQ(get_elem(a.dA, i), 0.0) << "padding column of " << a.module << ".lora_A";
                }
            checked += scale > 0;
        } else {
            // extrapolated: adapters with B != 0 on every site make the loss curve strongly in them
            checked += check_tensor_against_fd(
                           a.module + ".lora_A", a.A, a.dA, [&] { return loss(nullptr); }, 3, 1e-6, GetParam(), true) > 0;
        }
        checked += check_tensor_against_fd(
                       a.module + ".lora_B", a.B, a.dB, [&] { return loss(nullptr); }, 3, 1e-6, GetParam(), true) > 0;
    }
    EXPECT_EQ(checked, int(2 * lora->adapters().size()));
    std::printf("%s: worst |grad - fd| is %.3f of its bound\n", GetParam().c_str(), worst_fraction);
    lora->end_training_pass();
    model->set_adapters(nullptr);
}

INSTANTIATE_TEST_SUITE_P(LayerTypes, LoraLayerTypeGradient,
                         ::testing::Values("smollm3", "phi3", "geglu", "gemma3", "olmo2", "gemma3_window", "mistral", "qwen2_window",
                                           "gemma2_softcap", "gpt_oss", "gpt_oss_moe", "mla", "mla_qlora", "lfm2", "gemma3n"));

// LoRA's 'mlp' target names the gated MLP's Linear maps; a mixture of experts has none, and says so.
TEST(LoraTargets, MlpOnAMixtureOfExpertsIsRefusedByName) {
    const ModelConfig cfg = grad_test_config("gpt_oss_moe", 2);
    auto model = grad_test_model(cfg, DType::F64, 5);
    LoraConfig lc;
    lc.targets = {"q", "mlp"};
    try {
        Lora lora(*model, lc);
        FAIL() << "expected a refusal";
    } catch (const Error& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("'mlp'"), std::string::npos) << m;
        EXPECT_NE(m.find("layer 0 of grad-test-gpt_oss is a mixture of 4 experts (gpt-oss), which takes no adapters"), std::string::npos)
            << m;
    }
}

// A chunked run's gradients against the same sequence as one chunk: every named tensor (each
// with a gradient) and the input embeddings within 1e-10 of the reference's largest entry.
// Returns how many tensor names contain one of `marks` (the family's own tensors).
template <class Model>
int expect_chunked_equals_whole(Model& model, GradRun& r, GradRun& whole, const std::string& ctx,
                                std::initializer_list<const char*> marks) {
    auto got = r.grads.pairs(model), ref = whole.grads.pairs(model);
    EXPECT_EQ(got.size(), ref.size()) << ctx;
    int marked = 0;
    for (size_t i = 0; i < std::min(got.size(), ref.size()); ++i) {
        const std::vector<double> x = got[i].second.second->to_f64_vector(), y = ref[i].second.second->to_f64_vector();
        double scale = 0, err = 0;
        for (size_t k = 0; k < x.size(); ++k) scale = std::max(scale, std::fabs(y[k])), err = std::max(err, std::fabs(x[k] - y[k]));
        EXPECT_GT(scale, 0.0) << got[i].first << " has no gradient";
        EXPECT_LE(err, 1e-10 * scale) << got[i].first << ", " << ctx;
        for (const char* m : marks) marked += got[i].first.find(m) != std::string::npos;
    }
    const std::vector<double> x0 = r.x0_grad.to_f64_vector(), ref_x0 = whole.x0_grad.to_f64_vector();
    double scale = 0, err = 0;
    for (size_t k = 0; k < x0.size(); ++k) scale = std::max(scale, std::fabs(ref_x0[k])), err = std::max(err, std::fabs(x0[k] - ref_x0[k]));
    EXPECT_LE(err, 1e-10 * scale) << "input embeddings, " << ctx;
    return marked;
}

// LFM2's short convolutions carry a state of conv_kernel - 1 inputs from chunk to chunk, so their
// reverse pass carries the state's gradient back across chunks and cells. Independent reference:
// the same sequence as one chunk (no state crosses a chunk; the convolution sees zeros before
// position 0 only). Chunks of 2 tokens against kernels of 3 and 4 (a state longer than a chunk
// spans two chunks), several cells, rows of one and two layers, KV checkpoints from the forward
// and from the row replay: every weight's and input embedding's gradient and the loss agree.
TEST(Lfm2Gradient, ChunkedMatchesTheWholeSequence) {
    SingleThread st1;
    for (int64_t kernel : {int64_t(3), int64_t(4)}) {
        ModelConfig cfg = grad_test_config("lfm2", 3);  // convolution, attention, convolution
        cfg.conv_kernel = kernel;
        auto model = grad_test_model(cfg, DType::F64, seed_for("lfm2-chunked-grad"));
        const int64_t B = 2, T = 24;
        GradData d = grad_test_data(cfg, B, T, 31);
        KVCacheConfig kc;
        kc.name = "dense-default";
        kc.cache_length = T;
        GradRun whole = run_gradient(*model, kc, d, grad_test_plan(cfg, T, T, T), GradientOptions{});
        for (int64_t lpc : {int64_t(1), int64_t(2)})
            for (bool from_forward : {true, false}) {
                const ChunkPlan plan = grad_test_plan(cfg, T, 8, 2, 0.5);  // cells sized as for 8 slots
                ASSERT_GT(plan.cells.size(), 2u);
                GradientOptions go;
                go.layers_per_cell = lpc;
                go.kv_checkpoints_from_forward = from_forward;
                GradRun r = run_gradient(*model, kc, d, plan, go);
                const std::string ctx = str("kernel ", kernel, " rows of ", lpc, from_forward ? ", KV from the forward" : ", KV replayed",
                                            ", ", plan.cells.size(), " cells");
                EXPECT_NEAR(r.stats.replay_loss, whole.stats.replay_loss, 1e-12 * whole.stats.replay_loss) << ctx;
                // KV checkpoints at the starts of cells 1.. for the attention layer alone (K and V of
                // B G T D doubles); the convolutions checkpoint their (B, kernel - 1, E) states only
                EXPECT_EQ(r.stats.kv_checkpoint_bytes, (plan.cells.size() - 1) * 2 * size_t(B * cfg.num_kv_heads * T * cfg.head_dim) * 8)
                    << ctx;
                const int conv_tensors = expect_chunked_equals_whole(*model, r, whole, ctx, {".conv."});
                EXPECT_EQ(conv_tensors, 6) << ctx;  // in_proj, taps and out_proj of layers 0 and 2
            }
    }
}

// Through an evicting cache (h2o on the attention layer, the convolutions' states untouched by
// it) in chunks of 3 over several cells: full fine-tuning's gradients, the convolution's taps and
// projections included, match finite differences of the replayed loss.
TEST(Lfm2Gradient, ThroughAnEvictingCacheMatchesFiniteDifferences) {
    SingleThread st1;
    const ModelConfig cfg = grad_test_config("lfm2", 3);
    auto model = grad_test_model(cfg, DType::F64, seed_for("lfm2-h2o-grad"));
    const int64_t B = 1, T = 36, L = 12;
    GradData d = grad_test_data(cfg, B, T, 32);
    KVCacheConfig kc;
    kc.name = "h2o-default";
    kc.cache_length = L;
    const ChunkPlan plan = grad_test_plan(cfg, T, L, 3, 0.5);
    ASSERT_GT(plan.cells.size(), 2u);
    GradRun r = run_gradient(*model, kc, d, plan, GradientOptions{});
    bool evicted = false;
    for (const auto& p : r.stats.plans[1]) evicted = evicted || p.input_pos >= L;
    EXPECT_TRUE(evicted);
    Tensor x0 = model->embed(d.ids);
    auto loss = [&](const Tensor* x) { return replay_loss(*model, r.stats.plans, cache_lengths(*model, L), d.ids, plan, d.head, 1.0, x); };
    EXPECT_NEAR(r.stats.replay_loss, loss(nullptr), 1e-12 * std::fabs(loss(nullptr)));
    worst_fraction = 0;
    check_against_fd(*model, r.grads, r.x0_grad, x0, loss, 3, {0, 1, 2, 10, 20, 33}, 1e-6, "lfm2 h2o", true);
    std::printf("lfm2 h2o: worst |grad - fd| is %.3f of its bound\n", worst_fraction);
}

// Gemma 3n (grad_test_config "gemma3n": AltUp, LAUREL, per-layer inputs, the gaussian top-k gate
// in layer 0, layers 2 and 3 reading the K/V of layers 0 and 1). Chunked against the whole
// sequence: one chunk per cell (a KV-shared layer reads its source right after the same chunk),
// rows of one and two layers (the gradient pipeline joins a source's row with its readers'),
// KV checkpoints replayed. Every weight's gradient, the AltUp, LAUREL and per-layer tensors and
// the sources' k/v rows included, and the input embeddings' agree with the whole sequence's.
TEST(Gemma3nGradient, ChunkedMatchesTheWholeSequence) {
    SingleThread st1;
    const ModelConfig cfg = grad_test_config("gemma3n", 4);
    ASSERT_EQ(cfg.kv_layer(2), 0);
    ASSERT_EQ(cfg.kv_layer(3), 1);
    auto model = grad_test_model(cfg, DType::F64, seed_for("gemma3n-chunked-grad"));
    const int64_t B = 2, T = 12;
    GradData d = grad_test_data(cfg, B, T, 41);
    KVCacheConfig kc;
    kc.name = "dense-default";
    kc.cache_length = T;
    GradRun whole = run_gradient(*model, kc, d, grad_test_plan(cfg, T, T, T), GradientOptions{});
    for (int64_t lpc : {int64_t(1), int64_t(2)}) {
        const ChunkPlan plan = grad_test_plan(cfg, T, 6, 3);  // a prefill of 6, then chunks of 3
        ASSERT_EQ(plan.cells.size(), 3u);                      // one chunk per cell
        GradientOptions go;
        go.layers_per_cell = lpc;
        GradRun r = run_gradient(*model, kc, d, plan, go);
        const std::string ctx = str("rows of ", lpc);
        EXPECT_NEAR(r.stats.replay_loss, whole.stats.replay_loss, 1e-12 * whole.stats.replay_loss) << ctx;
        const int altup_tensors = expect_chunked_equals_whole(*model, r, whole, ctx, {".altup.", ".laurel.", "per_layer", "altup_"});
        // per layer: router norm, router, prediction, correction, output scale, LAUREL's three, the
        // per-layer input's gate, projection and norm; the model's table, projection, norm and 2 x 2 stream maps
        EXPECT_EQ(altup_tensors, 4 * 11 + 7) << ctx;
    }
}

// Through an evicting cache (h2o on the full layers; the windowed layers keep their window) in
// chunks of 3: every weight's gradient (full fine-tuning) and the packed input state's match
// central differences of the replayed loss. The source layers' k and v rows are checked one by
// one: their gradient comes from their own queries and from the layers that read them.
TEST(Gemma3nGradient, ThroughAnEvictingCacheMatchesFiniteDifferences) {
    SingleThread st1;
    const ModelConfig cfg = grad_test_config("gemma3n", 4);
    const int64_t B = 1, T = 12, L = 6;
    GradData d = grad_test_data(cfg, B, T, 42);
    // the top-k sits in windowed layer 0, whose gate the evicting cache does not change
    auto model = clear_topk_model(cfg, seed_for("gemma3n-h2o-grad"), d.ids);
    EXPECT_GT(topk_margin(*model, d.ids), kTopkMargin);
    KVCacheConfig kc;
    kc.name = "h2o-default";
    kc.cache_length = L;
    const ChunkPlan plan = grad_test_plan(cfg, T, L, 3);
    GradRun r = run_gradient(*model, kc, d, plan, GradientOptions{});
    bool evicted = false;
    for (const auto& p : r.stats.plans[1]) evicted = evicted || p.input_pos >= L;
    EXPECT_TRUE(evicted);
    Tensor x0 = model->embed(d.ids);
    // h2o's L on the full layers; the windowed ones keep a ring of the whole sequence, which the window masks
    std::vector<int64_t> Ls;
    for (int64_t l = 0; l < cfg.num_layers; ++l) Ls.push_back(cfg.layer_window(l) > 0 ? T : L);
    auto loss = [&](const Tensor* x) { return replay_loss(*model, r.stats.plans, Ls, d.ids, plan, d.head, 1.0, x); };
    EXPECT_NEAR(r.stats.replay_loss, loss(nullptr), 1e-12 * std::fabs(loss(nullptr)));
    EXPECT_NEAR(r.stats.loss, loss(nullptr), 1e-6 * std::fabs(r.stats.loss));
    worst_fraction = 0;
    check_against_fd(*model, r.grads, r.x0_grad, x0, loss, 2, {0, 5, 10}, 1e-6, "gemma3n h2o", true);
    // the sources' k/v projection rows (q rows NH HS, then G HS of k, then G HS of v)
    const int64_t E = cfg.hidden_size, Q = cfg.num_heads * cfg.head_dim, K = cfg.num_kv_heads * cfg.head_dim;
    for (int src : {0, 1}) {
        Tensor& w = model->mutable_layer(src).wqkv;
        const Tensor& g = r.grads.layers[size_t(src)].wqkv;
        for (int64_t row : {Q + 1, Q + K + 3})
            for (int64_t col : {int64_t(2), E - 5}) {
                const int64_t idx = row * E + col;
                const double fd = fd_at(w, idx, true, [&] { return loss(nullptr); });
                EXPECT_NEAR(get_elem(g, idx), fd, 1e-6 * std::fabs(fd) + fd_noise(true)) << "layer " << src << " qkv row " << row;
                EXPECT_NE(fd, 0.0);
            }
    }
    std::printf("gemma3n h2o: worst |grad - fd| is %.3f of its bound\n", worst_fraction);
}

// A KV-shared layer's read through a policy that selects what each query reads (quest) has no
// reverse pass in the replay: refused by name.
TEST(Gemma3nGradient, SharedReadThroughAReadSelectionIsRefusedByName) {
    SingleThread st1;
    const ModelConfig cfg = grad_test_config("gemma3n", 4);  // layer 3 reads full layer 1 (windowed layers select nothing)
    auto model = grad_test_model(cfg, DType::F64, seed_for("gemma3n-quest-grad"));
    const int64_t T = 16, chunk = 4;
    GradData d = grad_test_data(cfg, 1, T, 43);
    KVCacheConfig kc;
    kc.name = "quest-default";
    kc.cache_length = 0;
    kc.policy_options = {{"quest_page_size", 2.0}, {"quest_pages", 2.0}};
    try {
        (void)run_gradient(*model, kc, d, grad_test_plan(cfg, T, chunk, chunk), GradientOptions{});
        FAIL() << "expected a refusal";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("layer 3 reads layer 1's keys and values (cross-layer KV sharing); gradients through a read "
                                             "selection over a shared cache are not implemented"),
                  std::string::npos)
            << e.what();
    }
}

// Sliding windows through an evicting cache over several cells (h2o on the full-attention layers,
// rings holding more than the window on the windowed ones, which must not see it): the replay's loss is the live
// pass's (the window masks the same keys in both), and every gradient matches finite
// differences of it.
TEST(WindowedGradient, ThroughAnEvictingCacheMatchesFiniteDifferences) {
    SingleThread st1;
    for (const std::string arch : {"mistral", "gemma3_window"}) {
        const ModelConfig cfg = grad_test_config(arch, 2);
        auto model = grad_test_model(cfg, DType::F64, seed_for("windowed-grad-" + arch));
        const int64_t B = 1, T = 40, L = 16, chunk = 4;
        GradData d = grad_test_data(cfg, B, T, 17);
        KVCacheConfig kc;
        kc.name = "h2o-default";
        kc.cache_length = L;
        const ChunkPlan plan = grad_test_plan(cfg, T, L, chunk, 0.5);
        ASSERT_GT(plan.cells.size(), 2u);
        GradRun r = run_gradient(*model, kc, d, plan, GradientOptions{});
        Tensor x0 = model->embed(d.ids);
        // h2o's L on full-attention layers; windowed layers keep their window by rule, here (no
        // largest chunk given) a ring of the whole sequence, which the window still masks.
        std::vector<int64_t> Ls;
        for (int64_t l = 0; l < cfg.num_layers; ++l) Ls.push_back(cfg.layer_window(l) > 0 ? T : L);
        auto loss = [&](const Tensor* x) { return replay_loss(*model, r.stats.plans, Ls, d.ids, plan, d.head, 1.0, x); };
        const double l0 = loss(nullptr);
        EXPECT_NEAR(r.stats.replay_loss, l0, 1e-12 * std::fabs(l0)) << arch;
        EXPECT_NEAR(r.stats.loss, l0, 1e-6 * std::fabs(l0)) << arch << ": the replay does not attend as the live cache did";
        check_against_fd(*model, r.grads, r.x0_grad, x0, loss, 3, {0, 3, 11, 25, 38}, 1e-6, arch, true);
    }
}

// The draws are uniform: the dropped fraction is p within 5 standard deviations, pairs of
// neighbouring columns, positions and rows are dropped together with probability p^2, and the
// mask of a token does not depend on how the sequence was cut into chunks.
TEST(LoraDropout, DroppedFractionAndIndependence) {
    for (double p : {0.1, 0.3, 0.5}) {
        int64_t n = 0, dropped = 0, pairs = 0, both = 0;
        for (int layer : {-1, 0, 3})
            for (int64_t row = 0; row < 2; ++row)
                for (int64_t pos = 0; pos < 300; ++pos) {
                    bool prev = false;
                    for (int64_t col = 0; col < 64; ++col) {
                        const bool drop = lora_dropout_uniform(42, 3, layer, LinearSite::QKV, row, pos, col) < p;
                        const bool next_pos = lora_dropout_uniform(42, 3, layer, LinearSite::QKV, row, pos + 1, col) < p;
                        const bool other_row = lora_dropout_uniform(42, 3, layer, LinearSite::QKV, row + 2, pos, col) < p;
                        ++n, dropped += drop;
                        if (col > 0) ++pairs, both += drop && prev;
                        ++pairs, both += drop && next_pos;
                        ++pairs, both += drop && other_row;
                        prev = drop;
                    }
                }
        const double f = double(dropped) / double(n), sd = std::sqrt(p * (1 - p) / double(n));
        EXPECT_NEAR(f, p, 5 * sd) << "p " << p << " over " << n << " draws";
        const double f2 = double(both) / double(pairs), sd2 = std::sqrt(p * p * (1 - p * p) / double(pairs));
        EXPECT_NEAR(f2, p * p, 5 * sd2) << "p " << p << " pairs";
    }
    // Through the adapter: multipliers 0 or 1 / (1 - p), keyed on absolute positions.
    const ModelConfig cfg = grad_test_config("llama", 2);
    auto model = grad_test_model(cfg, DType::F32, seed_for("lora-dropout-mask"));
    auto lora = dropout_test_lora(*model, 0.3, 9);
    std::mt19937_64 rng(1);
    const Tensor x = random_tensor({2, 48, cfg.hidden_size}, DType::F32, rng);
    EXPECT_FALSE(lora->dropout_mask(0, LinearSite::QKV, x, 0).defined()) << "no training pass: no mask";
    lora->begin_training_pass(11);
    const std::vector<float> whole = lora->dropout_mask(0, LinearSite::QKV, x, 100).to_f32_vector();
    const std::vector<float> a = lora->dropout_mask(0, LinearSite::QKV, x.slice(1, 0, 20).contiguous(), 100).to_f32_vector();
    const std::vector<float> b = lora->dropout_mask(0, LinearSite::QKV, x.slice(1, 20, 48).contiguous(), 120).to_f32_vector();
    const int64_t E = cfg.hidden_size;
    int64_t zeros = 0;
    for (int64_t r = 0; r < 2; ++r)
        for (int64_t t = 0; t < 48; ++t)
            for (int64_t e = 0; e < E; ++e) {
                const float w = whole[size_t((r * 48 + t) * E + e)];
                const float cut = t < 20 ? a[size_t((r * 20 + t) * E + e)] : b[size_t((r * 28 + t - 20) * E + e)];
                ASSERT_EQ(w, cut) << "row " << r << " position " << 100 + t << " column " << e;
                ASSERT_TRUE(w == 0.0f || w == float(1.0 / 0.7)) << w;
                zeros += w == 0.0f;
            }
    const double n = double(2 * 48 * E), f = double(zeros) / n;
    EXPECT_NEAR(f, 0.3, 5 * std::sqrt(0.3 * 0.7 / n));
    EXPECT_NE(whole, lora->dropout_mask(1, LinearSite::QKV, x, 100).to_f32_vector()) << "layers draw their own masks";
    EXPECT_NE(whole, lora->dropout_mask(0, LinearSite::GATE_UP, x, 100).to_f32_vector()) << "sites draw their own masks";
    lora->begin_training_pass(12);
    EXPECT_NE(whole, lora->dropout_mask(0, LinearSite::QKV, x, 100).to_f32_vector()) << "passes draw their own masks";
    lora->end_training_pass();
}

// Outside a training pass (validation, evaluation, generation) LoRA with dropout computes
// exactly what LoRA without dropout computes; inside one it does not.
TEST(LoraDropout, OffOutsideTrainingPassesExactly) {
    SingleThread st1;
    const ModelConfig cfg = grad_test_config("llama", 2);
    auto model = grad_test_model(cfg, DType::F32, seed_for("lora-dropout-eval"));
    auto with = dropout_test_lora(*model, 0.3, 21);
    auto without = dropout_test_lora(*model, 0.0, 21);  // same seed: the same A and B
    GradData d = grad_test_data(cfg, 2, 24, 15);
    model->set_adapters(without.get());
    const std::vector<float> ref = model->forward(d.ids).to_f32_vector();
    model->set_adapters(with.get());
    EXPECT_EQ(model->forward(d.ids).to_f32_vector(), ref);
    with->begin_training_pass(0);
    EXPECT_NE(model->forward(d.ids).to_f32_vector(), ref);
    with->end_training_pass();
    EXPECT_EQ(model->forward(d.ids).to_f32_vector(), ref);
    without->begin_training_pass(0);  // p = 0: a training pass changes nothing
    model->set_adapters(without.get());
    EXPECT_EQ(model->forward(d.ids).to_f32_vector(), ref);
    model->set_adapters(nullptr);
}

// duo (docs/POLICIES.md#duo) is not in PolicyGradient's loop (cache_length 0 means the whole
// sequence for it): mixed layers, a pool of one 16-slot retrieval head and one 8-slot streaming
// head, evicting by overwriting; the replayed forward's gradients match finite differences.
TEST(DuoGradient, MixedLayersMatchFiniteDifferencesOfTheReplayedForward) {
    SingleThread st1;
    const ModelConfig cfg = grad_test_config("llama", 2);
    auto model = grad_test_model(cfg, DType::F64, seed_for("duo-grad"));
    const int64_t B = 2, T = 48;
    GradData d = grad_test_data(cfg, B, T, 12);
    KVCacheConfig kc;
    kc.name = "duo-default";
    kc.cache_length = 16;
    kc.duo_gates = "pattern:10";
    kc.policy_options = {{"duo_sinks", 2}, {"duo_recent", 6}};
    std::vector<int64_t> Ls;
    for (int64_t l = 0; l < cfg.num_layers; ++l) Ls.push_back(kc.length_for_layer(l, T, cfg.num_layers));
    policy_plan_lengths(kc, cfg.num_kv_heads, Ls);
    ASSERT_EQ(Ls, std::vector<int64_t>(size_t(cfg.num_layers), 8));  // the streaming heads' capacity
    ChunkPlanOptions po;
    po.chunk_size = 4;
    po.cell_factor = cell_factor(cfg);
    po.chunks_per_cell_multiplier = 0.5;
    const ChunkPlan plan = plan_chunks(T, Ls, po);
    ASSERT_GT(plan.cells.size(), 2u);
    expect_clear_expert_margins(*model, d.ids);
    GradRun r = run_gradient(*model, kc, d, plan, GradientOptions{});
    Tensor x0 = model->embed(d.ids);
    auto loss = [&](const Tensor* x) { return replay_loss(*model, r.stats.plans, Ls, d.ids, plan, d.head, 1.0, x); };
    EXPECT_NEAR(r.stats.replay_loss, loss(nullptr), 1e-12 * std::fabs(loss(nullptr)));
    check_against_fd(*model, r.grads, r.x0_grad, x0, loss, 3, {0, 2, 9, 17, 30, 46}, 1e-6, kc.name);
}

// lukv-* (docs/POLICIES.md#lukv-per-head-ratio-tables) runs in PolicyGradient's loop with the
// registry's uniform table; here with unequal budgets: every layer's pool of a 16-slot head and
// an 8-slot head (pattern:1,0.5, L = 16) under H2O's scores; the replayed forward's gradients
// match finite differences.
TEST(LukvGradient, UnequalHeadBudgetsMatchFiniteDifferencesOfTheReplayedForward) {
    SingleThread st1;
    const ModelConfig cfg = grad_test_config("llama", 2);
    ASSERT_EQ(cfg.num_kv_heads, 2);
    auto model = grad_test_model(cfg, DType::F64, seed_for("lukv-grad"));
    const int64_t B = 2, T = 48;
    GradData d = grad_test_data(cfg, B, T, 12);
    KVCacheConfig kc;
    kc.name = "lukv-h2o-default";
    kc.cache_length = 16;
    kc.head_ratios = "pattern:1,0.5";
    std::vector<int64_t> Ls;
    for (int64_t l = 0; l < cfg.num_layers; ++l) Ls.push_back(kc.length_for_layer(l, T, cfg.num_layers));
    policy_plan_lengths(kc, cfg.num_kv_heads, Ls);
    ASSERT_EQ(Ls, std::vector<int64_t>(size_t(cfg.num_layers), 8));  // the smaller head's budget
    ChunkPlanOptions po;
    po.chunk_size = 4;
    po.cell_factor = cell_factor(cfg);
    po.chunks_per_cell_multiplier = 0.5;
    const ChunkPlan plan = plan_chunks(T, Ls, po);
    ASSERT_GT(plan.cells.size(), 2u);
    expect_clear_expert_margins(*model, d.ids);
    GradRun r = run_gradient(*model, kc, d, plan, GradientOptions{});
    ASSERT_EQ(r.stats.plans[0].back().length_after, 24);  // the pool: 16 + 8 slots
    Tensor x0 = model->embed(d.ids);
    auto loss = [&](const Tensor* x) { return replay_loss(*model, r.stats.plans, Ls, d.ids, plan, d.head, 1.0, x); };
    EXPECT_NEAR(r.stats.replay_loss, loss(nullptr), 1e-12 * std::fabs(loss(nullptr)));
    check_against_fd(*model, r.grads, r.x0_grad, x0, loss, 3, {0, 2, 9, 17, 30, 46}, 1e-6, kc.name);
}

}  // namespace
}  // namespace kv::test

namespace kv::test {
namespace {

// quest: gradients flow through the pages each query read (a small budget, so most chunks read
// a minority of the pages), checked against finite differences of the replayed quest forward.
TEST(QuestGradient, SelectedPagesMatchFiniteDifferences) {
    SingleThread st1;
    const ModelConfig cfg = grad_test_config("llama", 2);
    // A fixed model, not a per-run draw: the loss is piecewise smooth in the weights (each query
    // reads its top pages), and for about 1 in 12 random models a central difference (h = 1e-5)
    // straddles a point where a page swaps in, so the difference measures the jump, not the
    // derivative (seen as 2.0 vs 2e-6 on one CI run). This model's selections have no swap within
    // h of any sampled weight (checked under the avx512, avx2 and base kernels).
    auto model = grad_test_model(cfg, DType::F64, 0x9e57);
    const int64_t B = 2, T = 48, chunk = 8, page = 4, pages = 2;
    GradData d = grad_test_data(cfg, B, T, 13);
    KVCacheConfig kc;
    kc.name = "quest-default";
    kc.cache_length = 0;
    kc.policy_options = {{"quest_page_size", double(page)}, {"quest_pages", double(pages)}};
    const std::vector<int64_t> Ls(size_t(cfg.num_layers), T);  // quest keeps every token
    ChunkPlanOptions po;
    po.chunk_size = chunk;
    po.cell_factor = cell_factor(cfg);
    po.chunks_per_cell_multiplier = 0.5;
    // A prefill of one chunk, then chunks that select pages (a plan over the whole length
    // would be one dense prefill).
    const ChunkPlan plan = plan_chunks(T, std::vector<int64_t>(size_t(cfg.num_layers), chunk), po);
    ASSERT_GT(plan.chunks.size(), 3u);
    expect_clear_expert_margins(*model, d.ids);
    GradRun r = run_gradient(*model, kc, d, plan, GradientOptions{});
    Tensor x0 = model->embed(d.ids);
    auto loss = [&](const Tensor* x) { return replay_loss(*model, r.stats.plans, Ls, d.ids, plan, d.head, 1.0, x, make_read_selection(kc)); };
    // The selection matters (the dense loss differs), and phase 2 differentiates phase 1's loss.
    const double dense = replay_loss(*model, r.stats.plans, Ls, d.ids, plan, d.head, 1.0, nullptr);
    EXPECT_GT(std::fabs(loss(nullptr) - dense), 1e-6 * std::fabs(dense));
    EXPECT_NEAR(r.stats.loss, loss(nullptr), 1e-9 * std::fabs(r.stats.loss));
    EXPECT_NEAR(r.stats.replay_loss, loss(nullptr), 1e-12 * std::fabs(loss(nullptr)));
    check_against_fd(*model, r.grads, r.x0_grad, x0, loss, 3, {0, 2, 9, 17, 30, 46}, 1e-6, kc.name);
}

// Attention sinks (gpt-oss: layer 0 sliding, layer 1 full, a learned sink logit per head) through
// quest's selection: the gradient replay's one-head SDPA backward per (row, head, query) takes
// its head's sink and adds to its entry of the sink gradient. Every parameter (self_attn.sinks
// included) and the input embeddings against finite differences of the replayed quest forward.
// A fixed model and data, as in QuestGradient (a difference must not straddle a page swap):
// this one's selections have no swap within h of any sampled weight under the avx512, avx2 and
// base kernels.
TEST(QuestGradient, WithAttentionSinksMatchesFiniteDifferences) {
    SingleThread st1;
    const ModelConfig cfg = grad_test_config("gpt_oss", 2);
    ASSERT_TRUE(cfg.attention_sinks);
    auto model = grad_test_model(cfg, DType::F64, 0x9e57);
    const int64_t B = 2, T = 48, chunk = 8, page = 4, pages = 2;
    GradData d = grad_test_data(cfg, B, T, 13);
    KVCacheConfig kc;
    kc.name = "quest-default";
    kc.cache_length = 0;
    kc.policy_options = {{"quest_page_size", double(page)}, {"quest_pages", double(pages)}};
    const std::vector<int64_t> Ls(size_t(cfg.num_layers), T);  // quest keeps every token; the window masks layer 0
    ChunkPlanOptions po;
    po.chunk_size = chunk;
    po.cell_factor = cell_factor(cfg);
    po.chunks_per_cell_multiplier = 0.5;
    const ChunkPlan plan = plan_chunks(T, std::vector<int64_t>(size_t(cfg.num_layers), chunk), po);
    ASSERT_GT(plan.chunks.size(), 3u);
    expect_clear_expert_margins(*model, d.ids);
    GradRun r = run_gradient(*model, kc, d, plan, GradientOptions{});
    Tensor x0 = model->embed(d.ids);
    auto loss = [&](const Tensor* x) { return replay_loss(*model, r.stats.plans, Ls, d.ids, plan, d.head, 1.0, x, make_read_selection(kc)); };
    const double dense = replay_loss(*model, r.stats.plans, Ls, d.ids, plan, d.head, 1.0, nullptr);
    EXPECT_GT(std::fabs(loss(nullptr) - dense), 1e-6 * std::fabs(dense)) << "the selection must matter";
    EXPECT_NEAR(r.stats.loss, loss(nullptr), 1e-9 * std::fabs(r.stats.loss));
    EXPECT_NEAR(r.stats.replay_loss, loss(nullptr), 1e-12 * std::fabs(loss(nullptr)));
    // The full layer's sink gradient is not zero (its heads' sinks take mass in every row).
    const std::vector<double> ds = r.grads.layers[1].sinks.to_f64_vector();
    double norm = 0;
    for (double x : ds) norm = std::max(norm, std::fabs(x));
    EXPECT_GT(norm, 1e-6);
    check_against_fd(*model, r.grads, r.x0_grad, x0, loss, 3, {0, 2, 9, 17, 30, 46}, 1e-6, kc.name + " sinks");
}

// Attention sinks through a per-head pool (ada-snapkv, evicting: 16 slots over 48 tokens on the
// full layer): the gradient replay's SDPA backward per KV-head group takes its heads' sinks and
// adds to their entries of the sink gradient, as pooled_attention does forward.
TEST(PooledGradient, WithAttentionSinksMatchesFiniteDifferences) {
    SingleThread st1;
    const ModelConfig cfg = grad_test_config("gpt_oss", 2);
    auto model = grad_test_model(cfg, DType::F64, seed_for("pooled-sinks-grad"));
    const int64_t B = 2, T = 48, L = 16, chunk = 8;
    GradData d = grad_test_data(cfg, B, T, 12);
    KVCacheConfig kc;
    kc.name = "ada-snapkv-default";
    kc.cache_length = L;
    kc.snapkv_window = chunk;
    apply_required_options(kc);
    const ChunkPlan plan = grad_test_plan(cfg, T, L, chunk, 0.5);
    ASSERT_GT(plan.cells.size(), 2u);
    GradRun r = run_gradient(*model, kc, d, plan, GradientOptions{});
    std::vector<int64_t> Ls;  // windowed layers keep their window by rule (a ring of the sequence here)
    for (int64_t l = 0; l < cfg.num_layers; ++l) Ls.push_back(cfg.layer_window(l) > 0 ? T : kc.length_for_layer(l, T, cfg.num_layers));
    bool evicted = false;
    for (const auto& p : r.stats.plans[1]) evicted = evicted || (p.input_pos >= Ls[1]);
    EXPECT_TRUE(evicted);
    Tensor x0 = model->embed(d.ids);
    auto loss = [&](const Tensor* x) { return replay_loss(*model, r.stats.plans, Ls, d.ids, plan, d.head, 1.0, x); };
    const double l0 = loss(nullptr);
    EXPECT_NEAR(r.stats.replay_loss, l0, 1e-12 * std::fabs(l0));
    EXPECT_NEAR(r.stats.loss, l0, 1e-6 * std::fabs(l0)) << "the replay does not attend as the live cache did";
    check_against_fd(*model, r.grads, r.x0_grad, x0, loss, 3, {0, 2, 9, 17, 30, 46}, 1e-6, kc.name + " sinks");
}

}  // namespace
}  // namespace kv::test
