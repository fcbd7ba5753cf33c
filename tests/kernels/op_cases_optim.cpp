// Optimizer cases: OPTIMIZER_STEP for every OptimKind (weight decay, momentum, dampening,
// nesterov, first and later steps, gradient scaling; f32/f64/bf16 parameters with f32 or f64
// state) and GRAD_NORM_SQ (long, strided, accumulated). Multi-step trajectories against
// PyTorch's formulas: optimizer_test.cpp.
#include "op_cases.h"

namespace kv::test {
namespace {

const char* dn(DType t) {
    static const char* n[] = {"f32", "f64", "f16", "bf16", "i32", "i64", "u8"};
    return n[int(t)];
}

struct Oc {
    std::string tag;
    OptimParams o;
    DType param;
    Shape shape;
};

OptimParams make(OptimKind k, float lr, float wd, int64_t step) {
    OptimParams o;
    o.kind = int(k);
    o.lr = lr;
    o.weight_decay = wd;
    o.step = step;
    return o;
}

RegisterOpCases reg([](std::vector<OpCase>& cases) {
    std::vector<Oc> ocs;
    for (DType pd : {DType::F32, DType::F64, DType::BF16}) {
        const Shape sh = pd == DType::F32 ? Shape{37, 130} : Shape{5, 11};
        ocs.push_back({"adamw_step7_wd", make(OptimKind::ADAMW, 1e-2f, 0.1f, 7), pd, sh});
        ocs.push_back({"adam_step1_l2", make(OptimKind::ADAM, 1e-2f, 0.05f, 1), pd, sh});
        ocs.push_back({"adamax_step3", make(OptimKind::ADAMAX, 2e-3f, 0.01f, 3), pd, sh});
        OptimParams sgd = make(OptimKind::SGD, 0.1f, 0.01f, 4);
        sgd.momentum = 0.9f;
        sgd.dampening = 0.1f;
        ocs.push_back({"sgd_momentum_dampening_step4", sgd, pd, sh});
        OptimParams rms = make(OptimKind::RMSPROP, 1e-2f, 0.0f, 2);
        ocs.push_back({"rmsprop_step2", rms, pd, sh});
        ocs.push_back({"adadelta_step5_wd", make(OptimKind::ADADELTA, 1.0f, 0.02f, 5), pd, sh});
    }
    {
        OptimParams o = make(OptimKind::SGD, 0.05f, 0.0f, 1);
        o.momentum = 0.8f;
        o.dampening = 0.5f;  // ignored on the first step: b = g
        ocs.push_back({"sgd_momentum_first_step", o, DType::F32, {9, 17}});
        o.step = 2;
        o.nesterov = 1;
        o.dampening = 0.0f;
        ocs.push_back({"sgd_nesterov_step2", o, DType::F32, {9, 17}});
        OptimParams plain = make(OptimKind::SGD, 0.05f, 0.1f, 3);
        ocs.push_back({"sgd_plain_no_state", plain, DType::F32, {9, 17}});
        OptimParams rm = make(OptimKind::RMSPROP, 1e-2f, 0.01f, 3);
        rm.momentum = 0.5f;
        rm.alpha = 0.9f;
        ocs.push_back({"rmsprop_momentum_step3", rm, DType::F32, {9, 17}});
        OptimParams aw = make(OptimKind::ADAMW, 3e-4f, 0.01f, 100);
        aw.grad_scale = 0.25f;
        aw.beta1 = 0.8f;
        aw.beta2 = 0.95f;
        aw.eps = 1e-6f;
        ocs.push_back({"adamw_grad_scale_betas_step100", aw, DType::F32, {9, 17}});
    }
    for (const Oc& oc : ocs) {
        const DType st = oc.param == DType::F64 ? DType::F64 : DType::F32;
        const std::string name = std::string("optimizer_step/") + dn(oc.param) + "/" + oc.tag;
        cases.push_back({name, tol_for(oc.param), [oc, st](CaseBuilder& b) {
                             b.call.op = OpKind::OPTIMIZER_STEP;
                             b.call.p.opt = oc.o;
                             b.src(b.input(oc.shape, oc.param == DType::BF16 ? DType::BF16 : st, Layout::STRIDED, -2.0, 2.0));
                             b.output(oc.shape, oc.param, Layout::CONTIG, true, -1.0, 1.0);
                             const int slots = optimizer_state_slots(oc.o);
                             const OptimKind k = OptimKind(oc.o.kind);
                             // First moments and momentum buffers may be negative; second moments,
                             // Adamax's u and Adadelta's accumulators are not.
                             const bool s1_pos = k == OptimKind::RMSPROP || k == OptimKind::ADADELTA;
                             if (slots >= 1) b.output2(oc.shape, st, true, s1_pos ? 0.0 : -0.5, 0.5);
                             if (slots >= 2) b.output3(oc.shape, st, true, k == OptimKind::RMSPROP ? -0.5 : 0.01, 0.5);
                         }});
    }
    cases.push_back({"grad_norm_sq/f32/large_70001", tol_for(DType::F32), [](CaseBuilder& b) {
                         b.call.op = OpKind::GRAD_NORM_SQ;
                         b.src(b.input({70001}, DType::F32));
                         b.output({1}, DType::F32);
                     }});
    cases.push_back({"grad_norm_sq/bf16->f64/strided_accumulate", tol_for(DType::F64), [](CaseBuilder& b) {
                         b.call.op = OpKind::GRAD_NORM_SQ;
                         b.call.p.accumulate = KV_ACC_DST;
                         b.src(b.input({7, 33}, DType::BF16, Layout::STRIDED));
                         b.output({1}, DType::F64, Layout::CONTIG, true, 0.0, 5.0);
                     }});
    cases.push_back({"grad_norm_sq/f64/transposed_3x4x5", tol_for(DType::F64), [](CaseBuilder& b) {
                         b.call.op = OpKind::GRAD_NORM_SQ;
                         b.src(b.input({3, 4, 5}, DType::F64, Layout::TRANSPOSED));
                         b.output({}, DType::F64);
                     }});
});

}  // namespace
}  // namespace kv::test
