// Training (engine/train): the optimizers against naive f64 loops written from PyTorch's
// torch.optim formulas, the warm-up + cosine schedule at exact steps, clipping by the global
// norm, micro-batch accumulation against one larger micro-batch, LoRA on the passkey task
// lowering the validation loss, bitwise-identical losses after --resume, full and offload
// steps, QLoRA's NF4 base, and checkpoints that load back under PEFT / Hugging Face names.
// Tiny models run single-threaded: a thread-team wake-up per small op costs more than the work.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "engine/backend/backend_registry.h"
#include "engine/model/model_loader.h"
#include "engine/model/packed_weight.h"
#include "engine/train/grad_clip.h"
#include "engine/train/lr_schedule.h"
#include "engine/train/model_weights.h"
#include "engine/train/optimizer.h"
#include "engine/train/qlora.h"
#include "engine/train/train_checkpoint.h"
#include "engine/train/trainer.h"
#include "tests/support/test_support.h"

namespace kv::test {
namespace {

struct SingleThread {
    int saved = num_threads();
    SingleThread() { set_num_threads(1); }
    ~SingleThread() { set_num_threads(saved); }
};

std::string temp_dir(const std::string& name) {
    const auto p = std::filesystem::temp_directory_path() / ("kvlab_train_test_" + name + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(p);
    std::filesystem::create_directories(p);
    return p.string();
}

// ==== optimizers ===============================================================================

// PyTorch's documented algorithms (torch.optim.*, "Algorithm" boxes), one element at a time in
// f64, written from the formulas independently of kernels/common/optim_math.h.
struct RefOptim {
    explicit RefOptim(const OptimizerConfig& cfg) : c(cfg) {}
    OptimizerConfig c;
    std::vector<double> s1, s2;  // per element state
    int64_t t = 0;

    void step(std::vector<double>& p, const std::vector<double>& grad, double lr) {
        ++t;
        if (s1.empty()) s1.assign(p.size(), 0.0), s2.assign(p.size(), 0.0);
        // hyperparameters as the op receives them (f32 fields)
        const double b1 = double(float(c.beta1)), b2 = double(float(c.beta2)), eps = double(float(c.eps));
        const double wd = double(float(c.weight_decay)), mom = double(float(c.momentum)), damp = double(float(c.dampening));
        const double alpha = double(float(c.alpha)), rho = double(float(c.rho));
        lr = double(float(lr));
        for (size_t i = 0; i < p.size(); ++i) {
            double g = grad[i];
            switch (c.kind) {
                case OptimKind::ADAMW: {  // theta *= 1 - gamma lambda; m, v; m_hat, v_hat; theta -= gamma m_hat / (sqrt(v_hat) + eps)
                    p[i] *= 1.0 - lr * wd;
                    s1[i] = b1 * s1[i] + (1 - b1) * g;
                    s2[i] = b2 * s2[i] + (1 - b2) * g * g;
                    const double mh = s1[i] / (1 - std::pow(b1, double(t))), vh = s2[i] / (1 - std::pow(b2, double(t)));
                    p[i] -= lr * mh / (std::sqrt(vh) + eps);
                    break;
                }
                case OptimKind::ADAM: {  // g += lambda theta; then as above without decoupled decay
                    g += wd * p[i];
                    s1[i] = b1 * s1[i] + (1 - b1) * g;
                    s2[i] = b2 * s2[i] + (1 - b2) * g * g;
                    const double mh = s1[i] / (1 - std::pow(b1, double(t))), vh = s2[i] / (1 - std::pow(b2, double(t)));
                    p[i] -= lr * mh / (std::sqrt(vh) + eps);
                    break;
                }
                case OptimKind::ADAMAX: {  // m; u = max(b2 u, |g| + eps); theta -= gamma m / ((1 - b1^t) u)
                    g += wd * p[i];
                    s1[i] = b1 * s1[i] + (1 - b1) * g;
                    s2[i] = std::max(b2 * s2[i], std::fabs(g) + eps);
                    p[i] -= lr * s1[i] / ((1 - std::pow(b1, double(t))) * s2[i]);
                    break;
                }
                case OptimKind::SGD: {  // b_1 = g; b_t = mu b + (1 - tau) g; nesterov: g + mu b
                    g += wd * p[i];
                    if (mom != 0) {
                        s1[i] = t == 1 ? g : mom * s1[i] + (1 - damp) * g;
                        g = c.nesterov ? g + mom * s1[i] : s1[i];
                    }
                    p[i] -= lr * g;
                    break;
                }
                case OptimKind::RMSPROP: {  // v = alpha v + (1 - alpha) g^2; b = mu b + g / (sqrt(v) + eps)
                    g += wd * p[i];
                    s1[i] = alpha * s1[i] + (1 - alpha) * g * g;
                    if (mom > 0) {
                        s2[i] = mom * s2[i] + g / (std::sqrt(s1[i]) + eps);
                        p[i] -= lr * s2[i];
                    } else {
                        p[i] -= lr * g / (std::sqrt(s1[i]) + eps);
                    }
                    break;
                }
                case OptimKind::ADADELTA: {  // v; dx = sqrt(u + eps) / sqrt(v + eps) g; u = rho u + (1 - rho) dx^2
                    g += wd * p[i];
                    s1[i] = rho * s1[i] + (1 - rho) * g * g;
                    const double dx = std::sqrt(s2[i] + eps) / std::sqrt(s1[i] + eps) * g;
                    s2[i] = rho * s2[i] + (1 - rho) * dx * dx;
                    p[i] -= lr * dx;
                    break;
                }
                default: break;
            }
        }
    }
};

std::vector<std::pair<std::string, OptimizerConfig>> optimizer_cases() {
    std::vector<std::pair<std::string, OptimizerConfig>> v;
    auto add = [&](std::string name, OptimKind k, auto&& set) {
        OptimizerConfig c;
        c.kind = k;
        set(c);
        v.push_back({std::move(name), c});
    };
    add("adamw", OptimKind::ADAMW, [](OptimizerConfig& c) { c.weight_decay = 0.1; });
    add("adam", OptimKind::ADAM, [](OptimizerConfig& c) { c.weight_decay = 0.05, c.beta1 = 0.8, c.beta2 = 0.99; });
    add("adamax", OptimKind::ADAMAX, [](OptimizerConfig& c) { c.weight_decay = 0.01; });
    add("sgd", OptimKind::SGD, [](OptimizerConfig&) {});
    add("sgd_momentum", OptimKind::SGD, [](OptimizerConfig& c) { c.momentum = 0.9, c.dampening = 0.1, c.weight_decay = 0.01; });
    add("sgd_nesterov", OptimKind::SGD, [](OptimizerConfig& c) { c.momentum = 0.9, c.nesterov = true; });
    add("rmsprop", OptimKind::RMSPROP, [](OptimizerConfig& c) { c.alpha = 0.9; });
    add("rmsprop_momentum", OptimKind::RMSPROP, [](OptimizerConfig& c) { c.momentum = 0.5, c.weight_decay = 0.01; });
    add("adadelta", OptimKind::ADADELTA, [](OptimizerConfig& c) { c.rho = 0.95, c.eps = 1e-6; });
    return v;
}

TEST(TrainOptimizer, MatchesNaivePyTorchFormulasOverSteps) {
    std::mt19937_64 rng(seed_for("TrainOptimizer.formulas"));
    for (const auto& [name, cfg] : optimizer_cases()) {
        // Two parameters of different shapes; f64 so the comparison is tight.
        Tensor p0 = random_tensor({3, 5}, DType::F64, rng), p1 = random_tensor({7}, DType::F64, rng);
        Tensor g0 = Tensor::zeros({3, 5}, DType::F64), g1 = Tensor::zeros({7}, DType::F64);
        std::vector<double> r0 = p0.to_f64_vector(), r1 = p1.to_f64_vector();
        RefOptim ref0(cfg), ref1(cfg);
        Optimizer opt(cfg, {{"a.weight", &p0, &g0}, {"b.bias", &p1, &g1}});
        for (int s = 0; s < 6; ++s) {
            const double lr = (name == "adadelta" ? 1.0 : 1e-2) * (1.0 - 0.1 * s);  // as a schedule would vary it
            Tensor n0 = random_tensor({3, 5}, DType::F64, rng), n1 = random_tensor({7}, DType::F64, rng);
            g0.copy_from(n0), g1.copy_from(n1);
            opt.step(lr);
            ref0.step(r0, n0.to_f64_vector(), lr);
            ref1.step(r1, n1.to_f64_vector(), lr);
        }
        const std::vector<double> got0 = p0.to_f64_vector(), got1 = p1.to_f64_vector();
        for (size_t i = 0; i < r0.size(); ++i) EXPECT_NEAR(got0[i], r0[i], 1e-12 * (1 + std::fabs(r0[i]))) << name << " a[" << i << "]";
        for (size_t i = 0; i < r1.size(); ++i) EXPECT_NEAR(got1[i], r1[i], 1e-12 * (1 + std::fabs(r1[i]))) << name << " b[" << i << "]";
        EXPECT_EQ(opt.steps_taken(), 6);
    }
}

TEST(TrainOptimizer, F32ParametersFollowTheReferenceClosely) {
    std::mt19937_64 rng(seed_for("TrainOptimizer.f32"));
    for (const auto& [name, cfg] : optimizer_cases()) {
        Tensor p = random_tensor({64}, DType::F32, rng), g = Tensor::zeros({64}, DType::F32);
        std::vector<double> r = p.to_f64_vector();
        RefOptim ref(cfg);
        Optimizer opt(cfg, {{"w", &p, &g}});
        for (int s = 0; s < 5; ++s) {
            Tensor n = random_tensor({64}, DType::F32, rng);
            g.copy_from(n);
            opt.step(1e-2);
            ref.step(r, n.to_f64_vector(), 1e-2);
        }
        const std::vector<double> got = p.to_f64_vector();
        for (size_t i = 0; i < r.size(); ++i) EXPECT_NEAR(got[i], r[i], 2e-6 * (1 + std::fabs(r[i]))) << name << " [" << i << "]";
    }
}

TEST(TrainOptimizer, StateIsNamedAndResumesBitwise) {
    std::mt19937_64 rng(seed_for("TrainOptimizer.state"));
    OptimizerConfig cfg;  // AdamW
    cfg.weight_decay = 0.01;
    Tensor p = random_tensor({4, 4}, DType::F32, rng), g = Tensor::zeros({4, 4}, DType::F32);
    Optimizer a(cfg, {{"layer.weight", &p, &g}});
    std::vector<Tensor> grads;
    for (int s = 0; s < 5; ++s) grads.push_back(random_tensor({4, 4}, DType::F32, rng));
    for (int s = 0; s < 3; ++s) g.copy_from(grads[size_t(s)]), a.step(1e-2);
    TensorMap st = a.state_dict();
    ASSERT_EQ(st.size(), 2u);
    EXPECT_TRUE(st.count("layer.weight.exp_avg"));
    EXPECT_TRUE(st.count("layer.weight.exp_avg_sq"));
    // A second optimizer on a copy of the parameter, loaded from the saved state, continues
    // exactly like the first.
    Tensor q = p.clone(), h = Tensor::zeros({4, 4}, DType::F32);
    Optimizer b(cfg, {{"layer.weight", &q, &h}});
    TensorMap saved;
    for (auto& [k, t] : st) saved[k] = t.clone();
    b.load_state_dict(saved, a.steps_taken());
    for (int s = 3; s < 5; ++s) {
        g.copy_from(grads[size_t(s)]), a.step(1e-2);
        h.copy_from(grads[size_t(s)]), b.step(1e-2);
    }
    EXPECT_EQ(p.to_f32_vector(), q.to_f32_vector());
    TensorMap missing;
    EXPECT_THROW(b.load_state_dict(missing, 3), Error);
    EXPECT_EQ(optimizer_state_keys(OptimizerConfig{OptimKind::SGD}).size(), 0u);
    OptimizerConfig rms;
    rms.kind = OptimKind::RMSPROP, rms.momentum = 0.5;
    EXPECT_EQ(optimizer_state_keys(rms), (std::vector<std::string>{"square_avg", "momentum_buffer"}));
    EXPECT_EQ(optimizer_kind_from_name("AdamW"), OptimKind::ADAMW);
    EXPECT_EQ(optimizer_kind_from_name("RMSprop"), OptimKind::RMSPROP);
    EXPECT_THROW(optimizer_kind_from_name("lion"), Error);
}

// ==== schedule and clipping ====================================================================

TEST(TrainSchedule, WarmupThenCosineExactValues) {
    TrainConfig t;
    t.lr = 1e-3;
    t.lr_warmup_fraction = 0.2;
    LrSchedule s = lr_schedule_for(t, 10);  // W = floor(0.2 * 10) = 2, cosine over 8 steps
    EXPECT_EQ(s.warmup, 2);
    EXPECT_DOUBLE_EQ(s.lr_at(0), 0.5e-3);  // (0 + 1) / 2
    EXPECT_DOUBLE_EQ(s.lr_at(1), 1e-3);    // (1 + 1) / 2
    EXPECT_DOUBLE_EQ(s.lr_at(2), 1e-3);    // cos(0)
    EXPECT_NEAR(s.lr_at(6), 0.5e-3, 1e-18);  // cos(pi 4/8) = 0
    EXPECT_DOUBLE_EQ(s.lr_at(9), 1e-3 * 0.5 * (1 + std::cos(M_PI * 7.0 / 8.0)));
    EXPECT_DOUBLE_EQ(s.lr_at(3), 1e-3 * 0.5 * (1 + std::cos(M_PI * 1.0 / 8.0)));
    t.lr_warmup_fraction = 0.15;  // floor(0.15 * 20) = 3
    EXPECT_EQ(lr_schedule_for(t, 20).warmup, 3);
    t.lr_warmup_steps = 4;  // explicit steps win over the fraction
    s = lr_schedule_for(t, 20);
    EXPECT_EQ(s.warmup, 4);
    EXPECT_DOUBLE_EQ(s.lr_at(0), 0.25e-3);
    EXPECT_DOUBLE_EQ(s.lr_at(3), 1e-3);
    EXPECT_DOUBLE_EQ(s.lr_at(12), 1e-3 * 0.5 * (1 + std::cos(M_PI * 8.0 / 16.0)));
    t.lr_warmup_steps = 0;  // no warm-up: the first step runs at the peak
    EXPECT_DOUBLE_EQ(lr_schedule_for(t, 5).lr_at(0), 1e-3);
}

TEST(TrainClip, GlobalNormAfterClippingEqualsMaxNorm) {
    std::mt19937_64 rng(seed_for("TrainClip"));
    Tensor a = random_tensor({10, 3}, DType::F32, rng, -2, 2), b = random_tensor({17}, DType::F32, rng, -2, 2);
    double ref = 0;
    for (double x : a.to_f64_vector()) ref += x * x;
    for (double x : b.to_f64_vector()) ref += x * x;
    ref = std::sqrt(ref);
    EXPECT_NEAR(grad_global_norm({&a, &b}), ref, 1e-9 * ref);
    ASSERT_GT(ref, 2.0);
    const double before = clip_grad_norm_({&a, &b}, 1.0);
    EXPECT_NEAR(before, ref, 1e-9 * ref);
    // PyTorch: g *= max_norm / (total + 1e-6)
    EXPECT_NEAR(grad_global_norm({&a, &b}), 1.0 * ref / (ref + 1e-6), 1e-6);
    // below the limit nothing changes
    const std::vector<float> keep = a.to_f32_vector();
    EXPECT_NEAR(clip_grad_norm_({&a, &b}, 5.0), 1.0, 1e-6);
    EXPECT_EQ(a.to_f32_vector(), keep);
}

// ==== training runs on the tiny preset =========================================================

// Passkey retrieval on the tiny preset with an H2O cache shorter than the sequence.
RunConfig tiny_run(const std::string& mode, int64_t samples, double val_fraction) {
    RunConfig c;
    c.mode = mode;
    c.model = "tiny";
    c.data.name = "passkey";
    c.data.seq_length = 256;
    c.data.num_samples = samples;
    c.data.val_split_fraction = val_fraction;
    c.data.seed = 11;
    c.kv_cache.name = "h2o-default";
    c.kv_cache.cache_length = 64;
    c.driver.chunk_size = 16;
    c.train.micro_batch_size = 1;
    c.train.global_batch_size = 1;
    c.train.lr_warmup_steps = 0;
    c.train.save_interval = 0;
    return c;
}

LoadedModel tiny_model(uint64_t seed = 0) { return load_model("tiny", ModelOptions{}, seed); }

TEST(TrainLoop, TwoMicroBatchesOfOneEqualOneMicroBatchOfTwo) {
    SingleThread st;
    for (const std::string mode : {"finetune_long_lora", "finetune_long_full"}) {
        RunConfig c1 = tiny_run(mode, 4, 0.0);
        c1.train.micro_batch_size = 1, c1.train.global_batch_size = 2;
        RunConfig c2 = c1;
        c2.train.micro_batch_size = 2;
        LoadedModel m1 = tiny_model(), m2 = tiny_model();
        Trainer t1(c1, m1), t2(c2, m2);
        if (t1.lora()) {  // B = 0 at initialisation would leave dA = 0: give B values first
            std::mt19937_64 rng(3);
            for (size_t i = 0; i < t1.lora()->adapters().size(); ++i) {
                Tensor r = random_tensor(t1.lora()->adapters()[i].B.shape(), DType::F32, rng, -0.1, 0.1);
                t1.lora()->adapters()[i].B.copy_from(r);
                t2.lora()->adapters()[i].B.copy_from(r);
            }
        }
        const double l1 = t1.compute_gradients({{0}, {1}});
        const double l2 = t2.compute_gradients({{0, 1}});
        EXPECT_NEAR(l1, l2, 1e-5 * std::fabs(l2)) << mode;
        ASSERT_EQ(t1.params().size(), t2.params().size());
        for (size_t i = 0; i < t1.params().size(); ++i) {
            Comparison cmp = compare(*t1.params()[i].grad, *t2.params()[i].grad);
            EXPECT_LE(cmp.max_abs_err, 1e-5 * std::max(cmp.ref_scale, 1e-3)) << mode << " " << t1.params()[i].name << "\n" << cmp.report;
        }
    }
}

TEST(TrainLoop, AverageLossPerBatchFalseTrainsPerRow) {
    SingleThread st;
    // Passkey rows all have two target tokens (the letter and EOS): the batch token mean and
    // the mean of the rows' token means coincide, bitwise. The normalisations themselves, on
    // rows with different counts, are tested in grad_fd_test (GradLossNormalisation).
    RunConfig c1 = tiny_run("finetune_long_lora", 4, 0.0);
    c1.train.micro_batch_size = 2, c1.train.global_batch_size = 2;
    c1.train.max_steps = 2;
    RunConfig c0 = c1;
    c0.train.average_loss_per_batch = false;  // was refused
    LoadedModel m1 = tiny_model(), m0 = tiny_model();
    const TrainSummary s1 = run_train(c1, m1), s0 = run_train(c0, m0);
    ASSERT_EQ(s0.steps.size(), 2u);
    for (size_t i = 0; i < 2; ++i) EXPECT_EQ(s0.steps[i].loss, s1.steps[i].loss);
}

TEST(TrainLoop, LoraLowersPasskeyValidationLoss) {
    SingleThread st;
    // SFT on the answer (next_token_prediction: the answer letter, then EOS), gradients through
    // an H2O cache of 64 slots over 256-token prompts in chunks of 16. The adapters include
    // lm_head: with the tiny preset's frozen head (logits of about +-1) no change of the hidden
    // state can push a token's probability far above uniform, and q/v/proj alone plateau near
    // 5.0. A sweep of six data seeds at these settings went from 5.48-5.58 to 1.50-3.50.
    for (uint64_t seed : {11ull, 29ull}) {
        RunConfig c = tiny_run("finetune_long_lora", 20, 0.2);
        c.data.seed = seed;
        c.train.micro_batch_size = 2, c.train.global_batch_size = 2;
        c.train.max_steps = 10;
        c.train.lr = 2e-2;
        c.train.lora_targets = "q,v,head";
        LoadedModel lm = tiny_model();
        const auto t0 = std::chrono::steady_clock::now();
        TrainSummary s = run_train(c, lm);
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        ASSERT_GE(s.validations.size(), 2u);
        const double before = s.validations.front().loss, after = s.validations.back().loss;
        std::printf("seed %llu: validation loss %.4f -> %.4f over %lld steps (%lld val examples, %.1f s)\n", (unsigned long long)seed,
                    before, after, (long long)s.steps.size(), (long long)s.validations.back().examples, secs);
        EXPECT_EQ(s.validations.front().step, 0);
        EXPECT_EQ(s.validations.back().step, c.train.max_steps);
        EXPECT_EQ(s.validations.back().examples, 4);
        EXPECT_LT(after, 0.9 * before) << "seed " << seed;
        for (const auto& r : s.steps) {
            EXPECT_TRUE(std::isfinite(r.loss));
            EXPECT_GT(r.tokens, 0);
        }
    }
}

TEST(TrainLoop, ResumeContinuesWithIdenticalLosses) {
    SingleThread st;
    for (const std::string mode : {"finetune_long_lora", "finetune_long_full"}) {
        const std::string out = temp_dir("resume");
        RunConfig c = tiny_run(mode, 6, 0.0);
        c.train.max_steps = 4;
        c.train.lr = mode == "finetune_long_lora" ? 1e-2 : 1e-3;
        c.train.lr_warmup_steps = 1;
        c.train.save_interval = 2;
        c.train.out_dir = out;
        c.driver.randomize_chunk_sizes = true;  // the plans must be drawn identically after a resume
        LoadedModel a = tiny_model();
        TrainSummary full = run_train(c, a);
        ASSERT_EQ(full.steps.size(), 4u);
        const std::string ck = checkpoint_dir_name(out, 2);
        ASSERT_TRUE(std::filesystem::exists(ck + "/training_state.json"));

        RunConfig r = c;
        r.train.resume = ck;
        r.train.out_dir = out + "/resumed";
        LoadedModel b = tiny_model();
        TrainSummary rest = run_train(r, b);
        EXPECT_EQ(rest.start_step, 2);
        ASSERT_EQ(rest.steps.size(), 2u);
        for (size_t i = 0; i < 2; ++i) {
            EXPECT_EQ(rest.steps[i].step, full.steps[i + 2].step);
            EXPECT_EQ(rest.steps[i].loss, full.steps[i + 2].loss) << mode << " step " << rest.steps[i].step;  // bitwise
            EXPECT_EQ(rest.steps[i].lr, full.steps[i + 2].lr);
            EXPECT_EQ(rest.steps[i].grad_norm, full.steps[i + 2].grad_norm);
        }
        // A checkpoint of the other mode family is refused with a clear message.
        RunConfig wrong = c;
        wrong.mode = mode == "finetune_long_lora" ? "finetune_long_full" : "finetune_long_lora";
        wrong.train.resume = ck;
        LoadedModel w = tiny_model();
        EXPECT_THROW(Trainer(wrong, w), Error) << mode;
        std::filesystem::remove_all(out);
    }
}

TEST(TrainCheckpoint, OnlyTheNewestTrainingStatesAreKept) {
    SingleThread st;
    namespace fs = std::filesystem;
    const std::string out = temp_dir("state_num");
    RunConfig c = tiny_run("finetune_long_lora", 2, 0.0);
    c.train.max_steps = 5;
    c.train.lr = 1e-2;
    c.train.save_interval = 1;
    c.train.out_dir = out;
    EXPECT_EQ(c.train.training_state_num, 3);  // the reference's default
    LoadedModel lm = tiny_model();
    TrainSummary s = run_train(c, lm);
    ASSERT_EQ(s.checkpoints.size(), 6u);  // step-000001 .. step-000005, final
    const std::vector<std::string> kept = {checkpoint_dir_name(out, 4), checkpoint_dir_name(out, 5), out + "/final"};
    EXPECT_EQ(s.resumable, kept);
    for (const auto& dir : s.checkpoints) {
        const bool has_state = std::find(kept.begin(), kept.end(), dir) != kept.end();
        EXPECT_TRUE(fs::is_regular_file(dir + "/adapter_model.safetensors")) << dir;  // every checkpoint keeps its adapters
        EXPECT_EQ(fs::exists(dir + "/training_state.json"), has_state) << dir;
        EXPECT_EQ(fs::exists(dir + "/optimizer.safetensors"), has_state) << dir;
    }
    // A checkpoint without its state is refused by --resume with the file's name.
    RunConfig r = c;
    r.train.resume = checkpoint_dir_name(out, 1);
    LoadedModel b = tiny_model();
    try {
        Trainer t(r, b);
        ADD_FAILURE() << "resumed from a checkpoint without a training state";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("training_state.json"), std::string::npos) << e.what();
    }
    // 0 keeps every state.
    RunConfig all = c;
    all.train.max_steps = 2;
    all.train.training_state_num = 0;
    all.train.out_dir = out + "/all";
    LoadedModel m2 = tiny_model();
    TrainSummary s2 = run_train(all, m2);
    ASSERT_EQ(s2.checkpoints.size(), 3u);
    EXPECT_EQ(s2.resumable, s2.checkpoints);
    for (const auto& dir : s2.checkpoints) EXPECT_TRUE(fs::exists(dir + "/training_state.json")) << dir;
    std::filesystem::remove_all(out);
}

TEST(TrainLoop, CancelSavesAStateThatResumesWithIdenticalLosses) {
    SingleThread st;
    const std::string out = temp_dir("cancel");
    RunConfig c = tiny_run("finetune_long_lora", 6, 0.0);
    c.train.max_steps = 4;
    c.train.lr = 1e-2;
    c.train.lr_warmup_steps = 1;
    c.train.save_interval = 0;  // the only mid-run checkpoint is the one cancelling writes
    c.train.lora_dropout = 0.2;  // masks keyed on the micro-batch index: drawn again identically
    c.driver.randomize_chunk_sizes = true;
    LoadedModel a = tiny_model();
    const TrainSummary full = run_train(c, a);  // uninterrupted, no checkpoints
    ASSERT_EQ(full.steps.size(), 4u);

    // Cancel raised after step 2: step 3 stops inside the gradient pipeline.
    RunConfig cc = c;
    cc.train.out_dir = out;
    std::atomic<bool> cancel{false};
    TrainCallbacks cb;
    cb.cancel = &cancel;
    cb.on_step = [&](const TrainStepRecord& r) {
        if (r.step == 2) cancel = true;
    };
    LoadedModel b = tiny_model();
    const TrainSummary cut = run_train(cc, b, cb);
    EXPECT_TRUE(cut.cancelled);
    ASSERT_EQ(cut.steps.size(), 2u);
    EXPECT_EQ(cut.resume_checkpoint, checkpoint_dir_name(out, 2));
    EXPECT_EQ(cut.checkpoints, std::vector<std::string>{cut.resume_checkpoint});  // no final checkpoint
    EXPECT_TRUE(std::filesystem::exists(cut.resume_checkpoint + "/training_state.json"));
    EXPECT_TRUE(cut.merged_model.empty());

    RunConfig r = c;
    r.train.resume = cut.resume_checkpoint;
    LoadedModel m = tiny_model();
    const TrainSummary rest = run_train(r, m);
    EXPECT_FALSE(rest.cancelled);
    EXPECT_EQ(rest.start_step, 2);
    ASSERT_EQ(rest.steps.size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
        EXPECT_EQ(rest.steps[i].step, full.steps[i + 2].step);
        EXPECT_EQ(rest.steps[i].loss, full.steps[i + 2].loss) << "step " << rest.steps[i].step;  // bitwise
        EXPECT_EQ(rest.steps[i].grad_norm, full.steps[i + 2].grad_norm);
    }
    // Cancelled before any step finished and with nothing to resume from: nothing is saved.
    cancel = true;
    LoadedModel n = tiny_model();
    RunConfig early = cc;
    early.train.out_dir = out + "/early";
    const TrainSummary none = run_train(early, n, cb);
    EXPECT_TRUE(none.cancelled);
    EXPECT_TRUE(none.steps.empty());
    EXPECT_TRUE(none.resume_checkpoint.empty());
    EXPECT_TRUE(none.checkpoints.empty());
    std::filesystem::remove_all(out);
}

TEST(TrainLoop, LoraDropoutActsInTrainingStepsOnly) {
    SingleThread st;
    RunConfig c0 = tiny_run("finetune_long_lora", 5, 0.4);
    c0.train.lora_targets = "q,v,head";
    RunConfig c1 = c0;
    c1.train.lora_dropout = 0.3;
    LoadedModel m0 = tiny_model(), m1 = tiny_model();
    Trainer t0(c0, m0), t1(c1, m1);
    std::mt19937_64 rng(5);  // B = 0 at initialisation would hide the branch
    for (size_t i = 0; i < t0.lora()->adapters().size(); ++i) {
        Tensor r = random_tensor(t0.lora()->adapters()[i].B.shape(), DType::F32, rng, -0.2, 0.2);
        t0.lora()->adapters()[i].B.copy_from(r);
        t1.lora()->adapters()[i].B.copy_from(r);
    }
    const ValRecord v0 = t0.validate(), v1 = t1.validate();
    ASSERT_GT(v0.examples, 0);
    EXPECT_EQ(v0.loss, v1.loss);  // bitwise: validation never drops
    const int64_t ex = t0.data().split.train[0];
    const double l0 = t0.compute_gradients({{ex}}), l1 = t1.compute_gradients({{ex}});
    EXPECT_NE(l0, l1);
    EXPECT_FALSE(t1.lora()->in_training_pass());
    EXPECT_EQ(t1.validate().loss, v1.loss);
    // the same micro-batch index draws the same masks
    LoadedModel m2 = tiny_model();
    Trainer t2(c1, m2);
    for (size_t i = 0; i < t1.lora()->adapters().size(); ++i) t2.lora()->adapters()[i].B.copy_from(t1.lora()->adapters()[i].B);
    EXPECT_EQ(t2.compute_gradients({{ex}}), l1);
}

// seq_classification: a trainable Linear(E, C) on the final-norm state at the last position,
// one cross-entropy per row (its gradients are checked against finite differences in
// grad_fd_test). LoRA and full fine-tuning both lower the loss of a repeated batch; a batch of
// two rows has the mean of the rows' losses; the classifier is saved and resumed.
TEST(TrainLoop, SeqClassificationHeadTrains) {
    SingleThread st;
    namespace fs = std::filesystem;
    const std::string out = temp_dir("seq_class");
    for (const std::string mode : {"finetune_long_lora", "finetune_long_full"}) {
        RunConfig c = tiny_run(mode, 2, 0.0);
        c.train.head_model = "seq_classification";
        c.train.micro_batch_size = 2, c.train.global_batch_size = 2;  // both examples every step
        c.train.max_steps = 4;
        c.train.save_interval = 2;
        c.train.lr = mode == "finetune_long_lora" ? 2e-2 : 5e-3;
        c.train.out_dir = out + "/" + mode;
        LoadedModel lm = tiny_model();
        Trainer t(c, lm);
        int64_t classes = 0;
        for (auto& p : t.params())
            if (p.name == "score.weight") classes = p.param->size(0);
        EXPECT_EQ(classes, t.data().num_classes) << mode;
        ASSERT_GT(classes, 1);
        // one cross-entropy per row: the batch's loss is the mean of the rows' losses
        const double l01 = t.compute_gradients({{0, 1}}), l0 = t.compute_gradients({{0}}), l1 = t.compute_gradients({{1}});
        EXPECT_NEAR(l01, 0.5 * (l0 + l1), 1e-5 * l01) << mode;
        EXPECT_GT(l01, 0.1) << mode;
        const TrainSummary s = t.run();
        ASSERT_EQ(s.steps.size(), 4u) << mode;
        std::printf("%s seq_classification (%lld classes): loss %.4f -> %.4f\n", mode.c_str(), (long long)classes, s.steps.front().loss,
                    s.steps.back().loss);
        EXPECT_LT(s.steps.back().loss, 0.9 * s.steps.front().loss) << mode;  // 1.01 -> 0.79 (LoRA), 0.81 (full)
        EXPECT_TRUE(fs::is_regular_file(s.checkpoints.back() + "/classifier.safetensors")) << mode;
        // resume from step 2: the classifier comes back with the rest (steps 3 and 4 as before)
        RunConfig r = c;
        r.train.resume = checkpoint_dir_name(c.train.out_dir, 2);
        r.train.out_dir = out + "/" + mode + "_resumed";
        LoadedModel b = tiny_model();
        const TrainSummary rest = run_train(r, b);
        ASSERT_EQ(rest.steps.size(), 2u) << mode;
        EXPECT_EQ(rest.steps[0].loss, s.steps[2].loss) << mode;
        EXPECT_EQ(rest.steps[1].loss, s.steps[3].loss) << mode;
    }
    fs::remove_all(out);
}

TEST(TrainLoop, FullAndOffloadStepsReduceLossOnARepeatedBatch) {
    SingleThread st;
    for (const std::string mode : {"finetune_long_full", "finetune_offload_full", "finetune_offload_lora"}) {
        RunConfig c = tiny_run(mode, 1, 0.0);  // one example: every step sees the same batch
        c.train.max_steps = 3;
        c.train.lr = mode.find("lora") != std::string::npos ? 2e-2 : 2e-3;
        LoadedModel lm = tiny_model();
        TrainSummary s = run_train(c, lm);
        ASSERT_EQ(s.steps.size(), 3u) << mode;
        EXPECT_LT(s.steps.back().loss, s.steps.front().loss) << mode;
        if (mode.find("offload") != std::string::npos) {
            EXPECT_TRUE(s.offload);
            EXPECT_GT(s.offload_h2d_per_step, s.weight_bytes) << "phase 1 and phase 2 each clone the weights";
            EXPECT_GT(s.offload_d2h_per_step, 0u);
            EXPECT_EQ(s.offload_traffic.shards.size(), 4u);  // embedding, 2 rows of one layer, head
            if (mode == "finetune_offload_full") {
                EXPECT_EQ(s.offload_d2h_per_step, s.gradient_bytes);
            }
        }
        std::printf("%s: loss %.4f -> %.4f, h2d %zu B, d2h %zu B per step\n", mode.c_str(), s.steps.front().loss, s.steps.back().loss,
                    s.offload_h2d_per_step, s.offload_d2h_per_step);
    }
}

TEST(TrainLoop, QloraTrainsAdaptersOnAnNf4Base) {
    SingleThread st;
    RunConfig c = tiny_run("finetune_long_lora", 1, 0.0);
    c.train.qlora = true;
    c.train.max_steps = 3;
    c.train.lr = 2e-2;
    LoadedModel ref = tiny_model();
    LoadedModel lm = tiny_model();
    TrainSummary s = run_train(c, lm);
    EXPECT_TRUE(s.qlora);
    EXPECT_EQ(s.qlora_stats.tensors, 2 * 7);  // q, k, v, o, gate, up, down per layer
    // NF4: half a byte per element plus a 4-byte absmax per block of 64
    EXPECT_EQ(s.qlora_stats.nf4_bytes, s.qlora_stats.dense_bytes / 4 / 2 + s.qlora_stats.dense_bytes / 4 / 64 * 4);
    EXPECT_GT(s.qlora_stats.max_abs_error, 0.0);
    EXPECT_LT(s.steps.back().loss, s.steps.front().loss);
    // on the CPU with f32 activations the base is kept as packed NF4 blocks: it changed
    // (quantized) by at most the reported error, the embedding did not
    ASSERT_TRUE(s.qlora_stats.packed);
    ASSERT_TRUE(is_packed(lm.model->layer(0).wqkv));
    const Comparison q = compare(packed_to_f32(lm.model->layer(0).wqkv), ref.model->layer(0).wqkv);
    EXPECT_GT(q.max_abs_err, 0.0);
    EXPECT_LE(q.max_abs_err, s.qlora_stats.max_abs_error);
    EXPECT_EQ(compare(lm.model->embedding(), ref.model->embedding()).max_abs_err, 0.0);
    // and the model holds the NF4 size, not the floats
    EXPECT_EQ(ref.model->weight_bytes() - lm.model->weight_bytes(), s.qlora_stats.dense_bytes - s.qlora_stats.nf4_bytes);
    RunConfig bad = c;
    bad.mode = "finetune_long_full";
    LoadedModel m2 = tiny_model();
    EXPECT_THROW(Trainer(bad, m2), Error);
}

// The packed NF4 base and the in-place round trip hold the same weight values (level * absmax,
// one f32 multiply each), so a forward differs only in the matmuls' summation order.
TEST(TrainLoop, QloraPackedBaseEqualsTheRoundTrippedBase) {
    SingleThread st;
    LoadedModel packed = tiny_model(), trip = tiny_model();
    const QloraStats a = qlora_quantize_base(*packed.model);
    const QloraStats b = qlora_quantize_base(*trip.model, /*keep_packed=*/false);
    ASSERT_TRUE(a.packed);
    ASSERT_FALSE(b.packed);
    EXPECT_EQ(a.tensors, b.tensors);
    EXPECT_EQ(a.nf4_bytes, b.nf4_bytes);
    EXPECT_EQ(a.max_abs_error, b.max_abs_error);
    for (int l = 0; l < int(packed.model->config().num_layers); ++l) {
        const LayerWeights &P = packed.model->layer(l), &T = trip.model->layer(l);
        for (auto [p, t] : {std::pair{&P.wqkv, &T.wqkv}, {&P.wo, &T.wo}, {&P.w_gate_up, &T.w_gate_up}, {&P.w_down, &T.w_down}})
            EXPECT_EQ(compare(packed_to_f32(*p), *t).max_abs_err, 0.0) << "layer " << l;
    }
    std::mt19937 rng(uint32_t(seed_for("QloraPackedBaseEqualsTheRoundTrippedBase")));
    std::uniform_int_distribution<int> tok(0, int(packed.config.vocab_size) - 1);
    std::vector<int32_t> ids(40);
    for (auto& i : ids) i = tok(rng);
    const Tensor x = Tensor::from_i32({1, int64_t(ids.size())}, ids);
    const std::vector<float> lp = packed.model->forward(x).to_f32_vector(), lt = trip.model->forward(x).to_f32_vector();
    ASSERT_EQ(lp.size(), lt.size());
    double worst = 0, scale = 0;
    for (size_t i = 0; i < lt.size(); ++i) worst = std::max(worst, double(std::fabs(lp[i] - lt[i]))), scale = std::max(scale, double(std::fabs(lt[i])));
    EXPECT_LE(worst, 1e-5 * scale) << "logits of the packed and round-tripped NF4 bases";
}

TEST(TrainCheckpoint, AdaptersAndWeightsLoadBackUnderPeftAndHfNames) {
    SingleThread st;
    const std::string out = temp_dir("ckpt");
    {
        RunConfig c = tiny_run("finetune_long_lora", 1, 0.0);
        c.train.max_steps = 1;
        c.train.lr = 1e-2;
        c.train.out_dir = out + "/lora";
        LoadedModel lm = tiny_model();
        Trainer t(c, lm);
        TrainSummary s = t.run();
        ASSERT_FALSE(s.checkpoints.empty());
        const std::string dir = s.checkpoints.back();
        TensorMap saved = load_tensors(dir + "/adapter_model.safetensors");
        ASSERT_TRUE(saved.count("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"));
        ASSERT_TRUE(saved.count("base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"));
        EXPECT_EQ(saved.size(), 2u * 2u * 2u);  // 2 layers x {q, v} x {A, B}
        LoraConfig lc;
        lc.r = c.train.lora_r;
        lc.alpha = c.train.lora_alpha;
        lc.seed = 99;  // different initialisation: everything must come from the file
        Lora back(*lm.model, lc);
        back.load_state_dict(saved);
        for (size_t i = 0; i < back.adapters().size(); ++i) {
            EXPECT_EQ(compare(back.adapters()[i].A, t.lora()->adapters()[i].A).max_abs_err, 0.0);
            EXPECT_EQ(compare(back.adapters()[i].B, t.lora()->adapters()[i].B).max_abs_err, 0.0);
        }
        EXPECT_GT(compare(back.adapters()[0].B, Tensor::zeros(back.adapters()[0].B.shape(), DType::F32)).max_abs_err, 0.0);
        std::ifstream in(dir + "/adapter_config.json");
        nlohmann::json j = nlohmann::json::parse(in);
        EXPECT_EQ(j["peft_type"], "LORA");
        EXPECT_EQ(j["r"], 8);
        EXPECT_EQ(j["lora_alpha"], 16.0);
        EXPECT_EQ(j["target_modules"], nlohmann::json::array({"q_proj", "v_proj"}));
        // The final checkpoint also holds the base with the adapters merged in, as a model
        // folder: its logits are those of the base plus adapters.
        ASSERT_FALSE(s.merged_model.empty());
        LoadedModel merged = load_model(s.merged_model, ModelOptions{}, 0);
        const std::vector<int32_t> prompt = lm.tokenizer->encode("The pass key is 12345. Remember it. Answer:", true);
        Tensor ids = Tensor::from_i32({1, int64_t(prompt.size())}, prompt);
        const Comparison lg = compare(merged.model->forward(ids), lm.model->forward(ids));
        EXPECT_LE(lg.max_abs_err, 1e-4 * std::max(1.0, lg.ref_scale)) << lg.report;
        LoadedModel base = tiny_model();
        EXPECT_GT(compare(base.model->forward(ids), lm.model->forward(ids)).max_abs_err, 1e-6) << "the adapters changed nothing";
    }
    {
        RunConfig c = tiny_run("finetune_long_full", 1, 0.0);
        c.train.max_steps = 1;
        c.train.lr = 1e-3;
        c.train.out_dir = out + "/full";
        LoadedModel lm = tiny_model();
        TrainSummary s = run_train(c, lm);
        ASSERT_FALSE(s.checkpoints.empty());
        // The folder is a Hugging Face model folder: it loads as a model with the trained weights.
        LoadedModel back = load_model(s.checkpoints.back(), ModelOptions{}, 0);
        for (const auto& [name, t] : model_state_dict(*lm.model))
            EXPECT_EQ(compare(model_state_dict(*back.model).at(name), t).max_abs_err, 0.0) << name;
        LoadedModel fresh = tiny_model();
        EXPECT_GT(compare(back.model->layer(0).wqkv, fresh.model->layer(0).wqkv).max_abs_err, 0.0);
    }
    std::filesystem::remove_all(out);
}

}  // namespace
}  // namespace kv::test
