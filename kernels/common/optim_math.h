// Per-element optimizer updates (PyTorch's documented torch.optim algorithms) shared by the
// CPU and CUDA OPTIMIZER_STEP kernels. Step-dependent constants (bias corrections) are derived
// once per call on the host in f64; nothing here allocates or loops over tensors.
#pragma once

#include <cmath>

#include "element_math.h"
#include "op.h"

namespace kv {

// Constants of one step in the compute type A (f32, or f64 for f64 calls).
template <class A>
struct OptimConsts {
    int kind;
    A lr, beta1, beta2, eps, wd, momentum, dampening, alpha, rho, grad_scale;
    A bc1;       // 1 - beta1^t
    A bc2_sqrt;  // sqrt(1 - beta2^t)
    A decay;     // 1 - lr * wd (AdamW's decoupled decay factor)
    int nesterov;
    int first_step;  // t == 1 (SGD initialises its momentum buffer with the gradient)
};

template <class A>
inline OptimConsts<A> optim_consts(const OptimParams& o) {
    OptimConsts<A> k;
    k.kind = o.kind;
    k.lr = A(o.lr), k.beta1 = A(o.beta1), k.beta2 = A(o.beta2), k.eps = A(o.eps), k.wd = A(o.weight_decay);
    k.momentum = A(o.momentum), k.dampening = A(o.dampening), k.alpha = A(o.alpha), k.rho = A(o.rho);
    k.grad_scale = A(o.grad_scale);
    const double t = double(o.step);
    k.bc1 = A(1.0 - std::pow(double(o.beta1), t));
    k.bc2_sqrt = A(std::sqrt(1.0 - std::pow(double(o.beta2), t)));
    k.decay = A(1.0 - double(o.lr) * double(o.weight_decay));
    k.nesterov = o.nesterov;
    k.first_step = o.step <= 1;
    return k;
}

KV_HD float kv_abs(float x) { return x < 0 ? -x : x; }
KV_HD double kv_abs(double x) { return x < 0 ? -x : x; }

// One element: p param, g raw gradient, s1/s2 the state slots of op.h's OPTIMIZER_STEP table
// (unused slots are ignored and may point at scratch).
template <class A>
KV_HD void kv_optim_update(const OptimConsts<A>& k, A* p, A g, A* s1, A* s2) {
    g *= k.grad_scale;
    const OptimKind kind = OptimKind(k.kind);
    if (kind != OptimKind::ADAMW && k.wd != A(0)) g += k.wd * *p;  // L2 penalty in the gradient
    switch (kind) {
        case OptimKind::ADAMW:
        case OptimKind::ADAM: {
            if (kind == OptimKind::ADAMW) *p *= k.decay;
            *s1 = k.beta1 * *s1 + (A(1) - k.beta1) * g;
            *s2 = k.beta2 * *s2 + (A(1) - k.beta2) * g * g;
            const A denom = kv_sqrt(*s2) / k.bc2_sqrt + k.eps;
            *p -= (k.lr / k.bc1) * *s1 / denom;
            break;
        }
        case OptimKind::ADAMAX: {
            *s1 = k.beta1 * *s1 + (A(1) - k.beta1) * g;
            const A a = k.beta2 * *s2, b = kv_abs(g) + k.eps;
            *s2 = a > b ? a : b;
            *p -= (k.lr / k.bc1) * *s1 / *s2;
            break;
        }
        case OptimKind::SGD: {
            if (k.momentum != A(0)) {
                *s1 = k.first_step ? g : k.momentum * *s1 + (A(1) - k.dampening) * g;
                g = k.nesterov ? g + k.momentum * *s1 : *s1;
            }
            *p -= k.lr * g;
            break;
        }
        case OptimKind::RMSPROP: {
            *s1 = k.alpha * *s1 + (A(1) - k.alpha) * g * g;
            const A avg = kv_sqrt(*s1) + k.eps;
            if (k.momentum > A(0)) {
                *s2 = k.momentum * *s2 + g / avg;
                *p -= k.lr * *s2;
            } else {
                *p -= k.lr * g / avg;
            }
            break;
        }
        case OptimKind::ADADELTA: {
            *s1 = k.rho * *s1 + (A(1) - k.rho) * g * g;
            const A delta = kv_sqrt(*s2 + k.eps) / kv_sqrt(*s1 + k.eps) * g;
            *s2 = k.rho * *s2 + (A(1) - k.rho) * delta * delta;
            *p -= k.lr * delta;
            break;
        }
        default: break;
    }
}

}  // namespace kv
