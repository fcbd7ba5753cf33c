// Every op case on every backend: the CPU against the naive f64 reference (kernels/cpu/ref),
// other backends against the CPU. Checks NaN/inf agreement, the relative error bound of the
// case, and that nothing outside the output view was written (guard bytes).
// Without a GPU, CUDA cases report SKIPPED with the reason from the backend.
#include <gtest/gtest.h>

#include "engine/backend/backend_registry.h"
#include "engine/ops/ops.h"
#include "kernels/cpu/ref/ref_ops.h"
#include "op_cases.h"
#include "tests/support/test_support.h"

namespace kv::test {
namespace {

struct Param {
    size_t case_index;
    const char* backend;  // "cpu" or "cuda"
};

void PrintTo(const Param& p, std::ostream* os) { *os << p.backend << ":" << op_cases()[p.case_index].name; }

std::string param_name(const testing::TestParamInfo<Param>& info) {
    std::string n = std::string(info.param.backend) + "_" + op_cases()[info.param.case_index].name;
    for (char& c : n)
        if (!isalnum((unsigned char)c)) c = '_';
    return n;
}

std::vector<Param> all_params() {
    std::vector<Param> ps;
    for (const char* be : {"cpu", "cuda"})
        for (size_t i = 0; i < op_cases().size(); ++i) ps.push_back({i, be});
    return ps;
}

class OpConsistency : public testing::TestWithParam<Param> {};

// The f64 reference result for the builder's call (dst initial contents preserved for ops
// that read or partially write dst); ref2 receives the second output when there is one.
Tensor reference(const CaseBuilder& b, Tensor* ref2) {
    Tensor ref = Tensor::empty(b.dst.shape(), dtype_is_float(b.dst.dtype()) ? DType::F64 : DType::I64);
    ref.copy_from(b.dst);
    OpCall c = b.call;
    c.dst = ref.view();
    if (b.dst2.defined()) {
        *ref2 = Tensor::zeros(b.dst2.shape(), DType::F64);
        c.dst2 = ref2->view();
    }
    kv::ref::compute(c);
    return ref;
}

TEST_P(OpConsistency, MatchesReference) {
    const OpCase& oc = op_cases()[GetParam().case_index];
    const std::string backend = GetParam().backend;
    CaseBuilder b(seed_for(oc.name));
    oc.build(b);
    ASSERT_TRUE(b.dst.defined()) << "case did not create an output";

    if (backend == "cpu") {
        Tensor ref2;
        Tensor ref = reference(b, &ref2);
        OpCall call = b.call;
        ASSERT_TRUE(cpu_backend().supports_op(call)) << "cpu backend does not support " << oc.name;
        ops::dispatch(call);
        Comparison cmp = compare(b.dst, ref);
        EXPECT_FALSE(cmp.nonfinite_mismatch) << "NaN/inf differ from the reference\n" << cmp.report;
        EXPECT_LE(cmp.rel_err, oc.max_err) << oc.name << ": relative error " << cmp.rel_err << " > " << oc.max_err << "\n"
                                           << cmp.report;
        std::string where;
        EXPECT_TRUE(guards_intact(b, &where)) << "wrote outside the output view at " << where;
        if (b.dst2.defined()) {
            Comparison c2 = compare(b.dst2, ref2);
            EXPECT_FALSE(c2.nonfinite_mismatch) << "second output: NaN/inf differ\n" << c2.report;
            EXPECT_LE(c2.rel_err, oc.max_err) << oc.name << ": second output relative error " << c2.rel_err << "\n" << c2.report;
        }
        return;
    }

    // CUDA: same inputs on the device, compared with the CPU result.
    if (!cuda_available()) GTEST_SKIP() << "CUDA backend unavailable: " << cuda_status();
    Device gpu{DeviceType::CUDA, 0};
    Tensor cpu_out = b.dst.clone();
    {
        OpCall call = b.call;
        call.dst = cpu_out.view();
        ops::dispatch(call);
    }
    std::vector<Tensor> dsrcs;
    OpCall call = b.call;
    call.nsrc = 0;
    for (const Tensor& s : b.srcs) {
        dsrcs.push_back(s.contiguous().to(gpu));
        call.src[call.nsrc++] = dsrcs.back().view();
    }
    Tensor ddst = b.dst.contiguous().to(gpu);
    call.dst = ddst.view();
    Tensor cpu_out2, ddst2;
    if (b.dst2.defined()) {
        cpu_out2 = b.dst2.clone();
        OpCall c2 = b.call;
        c2.dst = b.dst.clone().view();
        c2.dst2 = cpu_out2.view();
        ops::dispatch(c2);
        ddst2 = b.dst2.to(gpu);
        call.dst2 = ddst2.view();
    }
    ops::dispatch(call);
    Tensor back = ddst.to(Device{});
    if (b.dst2.defined()) {
        Comparison c2 = compare(ddst2.to(Device{}), cpu_out2);
        EXPECT_LE(c2.rel_err, oc.max_err) << oc.name << " (cuda vs cpu, second output)\n" << c2.report;
    }
    Comparison cmp = compare(back, cpu_out);
    EXPECT_FALSE(cmp.nonfinite_mismatch) << "NaN/inf differ from the CPU\n" << cmp.report;
    EXPECT_LE(cmp.rel_err, oc.max_err) << oc.name << " (cuda vs cpu)\n" << cmp.report;
}

INSTANTIATE_TEST_SUITE_P(AllOps, OpConsistency, testing::ValuesIn(all_params()), param_name);

// Adding an op without adding a case is a review failure: every OpKind has at least one.
TEST(OpConsistencyCoverage, EveryOpKindHasACase) {
    std::vector<bool> seen(size_t(OpKind::COUNT), false);
    for (const OpCase& c : op_cases()) {
        CaseBuilder b(1);
        c.build(b);
        seen[size_t(b.call.op)] = true;
    }
    for (size_t k = 0; k < seen.size(); ++k) EXPECT_TRUE(seen[k]) << "no consistency case for op " << op_kind_name(OpKind(k));
}

}  // namespace
}  // namespace kv::test
