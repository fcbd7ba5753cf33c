// OPTIMIZER_STEP over several steps against a hand-written f64 simulation of PyTorch's
// torch.optim implementations (written here in their implementation form: step_size =
// lr / bias_correction1, denom = sqrt(v) / sqrt(bias_correction2) + eps, ...; the op reference
// in kernels/cpu/ref follows the documented algorithm form instead), on a quadratic objective
// whose gradient is recomputed from each trajectory's own parameters. Plus hand-computed
// first steps, gradient clipping through GRAD_NORM_SQ, and the error messages.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "engine/core/error.h"
#include "engine/ops/ops.h"
#include "tests/support/test_support.h"

namespace kv::test {
namespace {

// f(theta) = 0.5 sum a_i (theta_i - c_i)^2, gradient a (theta - c).
struct Quadratic {
    std::vector<double> a, c;
    std::vector<double> grad(const std::vector<double>& th) const {
        std::vector<double> g(th.size());
        for (size_t i = 0; i < th.size(); ++i) g[i] = a[i] * (th[i] - c[i]);
        return g;
    }
    double value(const std::vector<double>& th) const {
        double s = 0;
        for (size_t i = 0; i < th.size(); ++i) s += 0.5 * a[i] * (th[i] - c[i]) * (th[i] - c[i]);
        return s;
    }
};

// PyTorch's single-tensor loops, f64, one parameter vector; state as PyTorch names it.
struct TorchSim {
    OptimParams o;
    std::vector<double> exp_avg, exp_avg_sq, exp_inf, momentum_buffer, square_avg, acc_delta;
    bool has_buffer = false;
    int64_t step = 0;

    void step_once(std::vector<double>& p, std::vector<double> g) {
        ++step;
        const size_t n = p.size();
        auto resize = [&](std::vector<double>& v) {
            if (v.empty()) v.assign(n, 0.0);
        };
        const double lr = o.lr, wd = o.weight_decay, eps = o.eps, b1 = o.beta1, b2 = o.beta2;
        for (auto& x : g) x *= o.grad_scale;
        switch (OptimKind(o.kind)) {
            case OptimKind::ADAMW:
            case OptimKind::ADAM: {
                resize(exp_avg), resize(exp_avg_sq);
                const double bc1 = 1 - std::pow(b1, double(step)), bc2 = 1 - std::pow(b2, double(step));
                const double step_size = lr / bc1, bc2_sqrt = std::sqrt(bc2);
                for (size_t i = 0; i < n; ++i) {
                    if (OptimKind(o.kind) == OptimKind::ADAMW) p[i] *= 1 - lr * wd;
                    else if (wd != 0) g[i] += wd * p[i];
                    exp_avg[i] += (g[i] - exp_avg[i]) * (1 - b1);  // lerp_
                    exp_avg_sq[i] = exp_avg_sq[i] * b2 + (1 - b2) * g[i] * g[i];
                    const double denom = std::sqrt(exp_avg_sq[i]) / bc2_sqrt + eps;
                    p[i] -= step_size * exp_avg[i] / denom;
                }
                break;
            }
            case OptimKind::ADAMAX: {
                resize(exp_avg), resize(exp_inf);
                const double clr = lr / (1 - std::pow(b1, double(step)));
                for (size_t i = 0; i < n; ++i) {
                    if (wd != 0) g[i] += wd * p[i];
                    exp_avg[i] += (g[i] - exp_avg[i]) * (1 - b1);
                    exp_inf[i] = std::max(exp_inf[i] * b2, std::fabs(g[i]) + eps);
                    p[i] -= clr * exp_avg[i] / exp_inf[i];
                }
                break;
            }
            case OptimKind::SGD: {
                const double mu = o.momentum, damp = o.dampening;
                for (size_t i = 0; i < n; ++i)
                    if (wd != 0) g[i] += wd * p[i];
                if (mu != 0) {
                    if (!has_buffer) {
                        momentum_buffer = g;  // torch.clone(grad)
                        has_buffer = true;
                    } else {
                        for (size_t i = 0; i < n; ++i) momentum_buffer[i] = momentum_buffer[i] * mu + (1 - damp) * g[i];
                    }
                    for (size_t i = 0; i < n; ++i) g[i] = o.nesterov ? g[i] + mu * momentum_buffer[i] : momentum_buffer[i];
                }
                for (size_t i = 0; i < n; ++i) p[i] -= lr * g[i];
                break;
            }
            case OptimKind::RMSPROP: {
                resize(square_avg);
                const double alpha = o.alpha, mu = o.momentum;
                if (mu > 0) resize(momentum_buffer);
                for (size_t i = 0; i < n; ++i) {
                    if (wd != 0) g[i] += wd * p[i];
                    square_avg[i] = square_avg[i] * alpha + (1 - alpha) * g[i] * g[i];
                    const double avg = std::sqrt(square_avg[i]) + eps;
                    if (mu > 0) {
                        momentum_buffer[i] = momentum_buffer[i] * mu + g[i] / avg;
                        p[i] -= lr * momentum_buffer[i];
                    } else {
                        p[i] -= lr * g[i] / avg;
                    }
                }
                break;
            }
            case OptimKind::ADADELTA: {
                resize(square_avg), resize(acc_delta);
                const double rho = o.rho;
                for (size_t i = 0; i < n; ++i) {
                    if (wd != 0) g[i] += wd * p[i];
                    square_avg[i] = square_avg[i] * rho + (1 - rho) * g[i] * g[i];
                    const double stdv = std::sqrt(square_avg[i] + eps);
                    const double delta = std::sqrt(acc_delta[i] + eps) / stdv * g[i];
                    acc_delta[i] = acc_delta[i] * rho + (1 - rho) * delta * delta;
                    p[i] -= lr * delta;
                }
                break;
            }
            default: break;
        }
    }
};

struct Named {
    const char* name;
    OptimParams o;
};

std::vector<Named> configurations() {
    std::vector<Named> v;
    OptimParams o;
    o.kind = int(OptimKind::ADAMW), o.lr = 0.05f, o.weight_decay = 0.1f;
    v.push_back({"adamw", o});
    o = OptimParams{};
    o.kind = int(OptimKind::ADAM), o.lr = 0.05f, o.weight_decay = 0.02f;
    v.push_back({"adam_l2", o});
    o = OptimParams{};
    o.kind = int(OptimKind::ADAMAX), o.lr = 0.02f, o.weight_decay = 0.01f;
    v.push_back({"adamax", o});
    o = OptimParams{};
    o.kind = int(OptimKind::SGD), o.lr = 0.1f, o.momentum = 0.9f, o.dampening = 0.2f, o.weight_decay = 0.01f;
    v.push_back({"sgd_momentum_dampening", o});
    o = OptimParams{};
    o.kind = int(OptimKind::SGD), o.lr = 0.1f, o.momentum = 0.5f, o.nesterov = 1;
    v.push_back({"sgd_nesterov", o});
    o = OptimParams{};
    o.kind = int(OptimKind::SGD), o.lr = 0.2f;
    v.push_back({"sgd_plain", o});
    o = OptimParams{};
    o.kind = int(OptimKind::RMSPROP), o.lr = 0.01f, o.weight_decay = 0.01f;
    v.push_back({"rmsprop", o});
    o = OptimParams{};
    o.kind = int(OptimKind::RMSPROP), o.lr = 0.01f, o.momentum = 0.7f, o.alpha = 0.9f;
    v.push_back({"rmsprop_momentum", o});
    o = OptimParams{};
    o.kind = int(OptimKind::ADADELTA), o.lr = 1.0f, o.rho = 0.9f, o.eps = 1e-6f, o.weight_decay = 0.01f;
    v.push_back({"adadelta", o});
    o = OptimParams{};
    o.kind = int(OptimKind::ADAMW), o.lr = 0.03f, o.weight_decay = 0.01f, o.grad_scale = 0.5f, o.beta1 = 0.8f, o.beta2 = 0.95f;
    v.push_back({"adamw_grad_scale", o});
    return v;
}

// Runs `steps` steps through ops::optimizer_step_ in `dt` and returns the trajectory.
std::vector<std::vector<double>> run_ops(const OptimParams& base, const Quadratic& f, std::vector<double> th, int steps, DType dt) {
    const Shape sh{int64_t(th.size())};
    Tensor p = Tensor::from_f64(sh, th, dt);
    const DType st = dt == DType::F64 ? DType::F64 : DType::F32;
    Tensor s1 = Tensor::zeros(sh, st), s2 = Tensor::zeros(sh, st);
    std::vector<std::vector<double>> out;
    for (int t = 1; t <= steps; ++t) {
        std::vector<double> cur = p.to_f64_vector();
        Tensor g = Tensor::from_f64(sh, f.grad(cur), dt);
        OptimParams o = base;
        o.step = t;
        ops::optimizer_step_(p, g, &s1, &s2, o);
        out.push_back(p.to_f64_vector());
    }
    return out;
}

TEST(OptimizerSteps, TrajectoriesMatchPyTorchFormulas) {
    std::mt19937_64 rng(seed_for("optimizer/trajectories"));
    std::uniform_real_distribution<double> u(-1.0, 1.0), pos(0.2, 3.0);
    const int n = 23, steps = 12;
    Quadratic f;
    std::vector<double> th0(n);
    for (int i = 0; i < n; ++i) {
        f.a.push_back(pos(rng));
        f.c.push_back(u(rng));
        th0[size_t(i)] = u(rng) * 2;
    }
    for (const Named& cfg : configurations()) {
        SCOPED_TRACE(cfg.name);
        TorchSim sim;
        sim.o = cfg.o;
        std::vector<double> th = th0;
        std::vector<std::vector<double>> want;
        for (int t = 0; t < steps; ++t) {
            sim.step_once(th, f.grad(th));
            want.push_back(th);
        }
        // f64: the same numbers up to rounding. f32: the trajectory runs in f32 (its own
        // gradients), so differences grow with the steps; 2e-5 of the parameter scale bounds
        // 12 steps of f32 rounding.
        for (DType dt : {DType::F64, DType::F32}) {
            auto got = run_ops(cfg.o, f, th0, steps, dt);
            const double tol = dt == DType::F64 ? 1e-12 : 2e-5;
            for (int t = 0; t < steps; ++t) {
                double worst = 0, scale = 0;
                for (int i = 0; i < n; ++i) {
                    worst = std::max(worst, std::fabs(got[size_t(t)][size_t(i)] - want[size_t(t)][size_t(i)]));
                    scale = std::max(scale, std::fabs(want[size_t(t)][size_t(i)]));
                }
                EXPECT_LE(worst / scale, tol) << (dt == DType::F64 ? "f64" : "f32") << " step " << t + 1;
            }
        }
        // And the objective went down (a sanity check that signs are right).
        EXPECT_LT(f.value(want.back()), f.value(th0));
    }
}

TEST(OptimizerSteps, HandComputedFirstSteps) {
    // Adam, step 1, no decay: m = (1-b1) g, v = (1-b2) g^2, so p -= lr g / (|g| + eps') with
    // eps' = eps * sqrt(1 - b2) / ... exactly: lr * g / (|g| + eps).
    Tensor p = Tensor::from_f64({3}, {1.0, -2.0, 0.5});
    Tensor g = Tensor::from_f64({3}, {0.3, -4.0, 1e-3});
    Tensor m = Tensor::zeros({3}, DType::F64), v = Tensor::zeros({3}, DType::F64);
    OptimParams o;
    o.kind = int(OptimKind::ADAM);
    o.lr = 0.1f;
    o.eps = 1e-8f;
    ops::optimizer_step_(p, g, &m, &v, o);
    const double lr = o.lr, eps = o.eps;
    std::vector<double> got = p.to_f64_vector();
    EXPECT_NEAR(got[0], 1.0 - lr * 0.3 / (0.3 + eps), 1e-15);
    EXPECT_NEAR(got[1], -2.0 + lr * 4.0 / (4.0 + eps), 1e-15);
    EXPECT_NEAR(got[2], 0.5 - lr * 1e-3 / (1e-3 + eps), 1e-15);
    // SGD momentum 0.9, dampening 0.5: b1 = g1 (no dampening on step 1), b2 = 0.9 b1 + 0.5 g2.
    Tensor q = Tensor::from_f64({1}, {1.0});
    Tensor buf = Tensor::zeros({1}, DType::F64);
    OptimParams s;
    s.kind = int(OptimKind::SGD);
    s.lr = 0.5f;
    s.momentum = 0.9f;
    s.dampening = 0.5f;
    s.step = 1;
    ops::optimizer_step_(q, Tensor::from_f64({1}, {2.0}), &buf, nullptr, s);
    EXPECT_NEAR(buf.item(), 2.0, 1e-15);
    EXPECT_NEAR(q.item(), 1.0 - 0.5 * 2.0, 1e-15);
    s.step = 2;
    ops::optimizer_step_(q, Tensor::from_f64({1}, {1.0}), &buf, nullptr, s);
    const double mu = s.momentum, b2 = mu * 2.0 + 0.5 * 1.0;
    EXPECT_NEAR(buf.item(), b2, 1e-7);
    EXPECT_NEAR(q.item(), 0.0 - 0.5 * b2, 1e-7);
    // AdamW decays before the Adam step: with a zero gradient only the decay acts.
    Tensor w = Tensor::from_f64({1}, {2.0});
    Tensor m1 = Tensor::zeros({1}, DType::F64), v1 = Tensor::zeros({1}, DType::F64);
    OptimParams aw;
    aw.lr = 0.1f;
    aw.weight_decay = 0.5f;
    ops::optimizer_step_(w, Tensor::zeros({1}, DType::F64), &m1, &v1, aw);
    EXPECT_NEAR(w.item(), 2.0 * (1.0 - double(aw.lr) * double(aw.weight_decay)), 1e-15);
}

TEST(OptimizerSteps, ClippingByGlobalNormThroughGradScale) {
    // Two gradient tensors, global norm from GRAD_NORM_SQ accumulated into one scalar, then the
    // clip coefficient max_norm / norm applied through grad_scale (SGD, so the step is exact).
    Tensor g1 = Tensor::from_f64({2}, {3.0, 0.0}, DType::F32), g2 = Tensor::from_f64({1}, {4.0}, DType::F32);
    Tensor acc = Tensor::zeros({1}, DType::F64);
    ops::grad_norm_sq_(acc, g1, true);
    ops::grad_norm_sq_(acc, g2, true);
    EXPECT_DOUBLE_EQ(acc.item(), 25.0);
    const double norm = std::sqrt(acc.item()), max_norm = 1.0;
    OptimParams s;
    s.kind = int(OptimKind::SGD);
    s.lr = 1.0f;
    s.grad_scale = float(max_norm / norm);
    Tensor p1 = Tensor::zeros({2}, DType::F32), p2 = Tensor::zeros({1}, DType::F32);
    ops::optimizer_step_(p1, g1, nullptr, nullptr, s);
    ops::optimizer_step_(p2, g2, nullptr, nullptr, s);
    EXPECT_NEAR(p1.to_f64_vector()[0], -0.6, 1e-7);
    EXPECT_NEAR(p2.item(), -0.8, 1e-7);
}

TEST(OptimizerSteps, ClearErrors) {
    Tensor p = Tensor::zeros({4}, DType::F32), g = Tensor::zeros({4}, DType::F32), m = Tensor::zeros({4}, DType::F32);
    OptimParams o;  // AdamW: two states
    try {
        ops::optimizer_step_(p, g, &m, nullptr, o);
        FAIL() << "missing state accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("adamw needs 2 state tensor(s); state2 is missing"), std::string::npos) << e.what();
    }
    Tensor v64 = Tensor::zeros({4}, DType::F64);
    try {
        ops::optimizer_step_(p, g, &m, &v64, o);
        FAIL() << "f64 state for an f32 param accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("state2 must be f32"), std::string::npos) << e.what();
    }
    o.step = 0;
    EXPECT_THROW(ops::optimizer_step_(p, g, &m, &m, o), Error);
    EXPECT_EQ(ops::optim_kind_from_name("rmsprop"), OptimKind::RMSPROP);
    try {
        ops::optim_kind_from_name("lion");
        FAIL();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("unknown optimizer 'lion'"), std::string::npos);
    }
}

}  // namespace
}  // namespace kv::test
