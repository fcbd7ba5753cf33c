// Every op case on every backend: the CPU against the naive f64 reference (kernels/cpu/ref),
// other backends against the CPU. Checks NaN/inf agreement, the relative error bound of the
// case, and that nothing outside the output view was written (guard bytes).
// Without a GPU, CUDA cases report SKIPPED with the reason from the backend.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <set>

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

// An f64 (i64) copy of an output with its initial contents (ops read, accumulate into or
// partially write their outputs).
Tensor wide_copy(const Tensor& t) {
    Tensor w = Tensor::empty(t.shape(), dtype_is_float(t.dtype()) ? DType::F64 : DType::I64);
    w.copy_from(t);
    return w;
}

// The f64 reference result for the builder's call; ref2/ref3 receive the second and third
// outputs when there are any.
Tensor reference(const CaseBuilder& b, Tensor* ref2, Tensor* ref3) {
    Tensor ref = wide_copy(b.dst);
    OpCall c = b.call;
    c.dst = ref.view();
    if (b.dst2.defined()) {
        *ref2 = wide_copy(b.dst2);
        c.dst2 = ref2->view();
    }
    if (b.dst3.defined()) {
        *ref3 = wide_copy(b.dst3);
        c.dst3 = ref3->view();
    }
    kv::ref::compute(c);
    return ref;
}

void expect_close(const Tensor& got, const Tensor& ref, double max_err, const std::string& what) {
    Comparison cmp = compare(got, ref);
    EXPECT_FALSE(cmp.nonfinite_mismatch) << what << ": NaN/inf differ from the reference\n" << cmp.report;
    EXPECT_LE(cmp.rel_err, max_err) << what << ": relative error " << cmp.rel_err << " > " << max_err << "\n" << cmp.report;
}

TEST_P(OpConsistency, MatchesReference) {
    const OpCase& oc = op_cases()[GetParam().case_index];
    const std::string backend = GetParam().backend;
    CaseBuilder b(seed_for(oc.name));
    oc.build(b);
    ASSERT_TRUE(b.dst.defined()) << "case did not create an output";

    if (backend == "cpu") {
        Tensor ref2, ref3;
        Tensor ref = reference(b, &ref2, &ref3);
        OpCall call = b.call;
        ASSERT_TRUE(cpu_backend().supports_op(call)) << "cpu backend does not support " << oc.name;
        ops::dispatch(call);
        expect_close(b.dst, ref, oc.max_err, oc.name);
        if (b.dst2.defined()) expect_close(b.dst2, ref2, oc.max_err, oc.name + " (second output)");
        if (b.dst3.defined()) expect_close(b.dst3, ref3, oc.max_err, oc.name + " (third output)");
        std::string where;
        EXPECT_TRUE(guards_intact(b, &where)) << "wrote outside the output view at " << where;
        return;
    }

    // CUDA: same inputs (and initial outputs) on the device, compared with the CPU result.
    if (!cuda_available()) GTEST_SKIP() << "CUDA backend unavailable: " << cuda_status();
    // Soft-capped attention is computed by the CPU backend only (the CUDA backend refuses it).
    if (b.call.p.softcap != 0.0f) GTEST_SKIP() << "soft-capped SDPA runs on the CPU backend only";
    Device gpu{DeviceType::CUDA, 0};
    Tensor cpu_out = b.dst.clone(), cpu_out2, cpu_out3;
    {
        OpCall call = b.call;
        call.dst = cpu_out.view();
        if (b.dst2.defined()) {
            cpu_out2 = b.dst2.clone();
            call.dst2 = cpu_out2.view();
        }
        if (b.dst3.defined()) {
            cpu_out3 = b.dst3.clone();
            call.dst3 = cpu_out3.view();
        }
        ops::dispatch(call);
    }
    std::vector<Tensor> dsrcs;
    OpCall call = b.call;
    call.nsrc = 0;
    for (const Tensor& s : b.srcs) {
        if (!s.defined()) {
            call.src[call.nsrc++] = TensorView{};
            continue;
        }
        dsrcs.push_back(s.contiguous().to(gpu));
        call.src[call.nsrc++] = dsrcs.back().view();
    }
    Tensor ddst = b.dst.contiguous().to(gpu), ddst2, ddst3;
    call.dst = ddst.view();
    if (b.dst2.defined()) {
        ddst2 = b.dst2.contiguous().to(gpu);
        call.dst2 = ddst2.view();
    }
    if (b.dst3.defined()) {
        ddst3 = b.dst3.contiguous().to(gpu);
        call.dst3 = ddst3.view();
    }
    ops::dispatch(call);
    expect_close(ddst.to(Device{}), cpu_out, oc.max_err, oc.name + " (cuda vs cpu)");
    if (b.dst2.defined()) expect_close(ddst2.to(Device{}), cpu_out2, oc.max_err, oc.name + " (cuda vs cpu, second output)");
    if (b.dst3.defined()) expect_close(ddst3.to(Device{}), cpu_out3, oc.max_err, oc.name + " (cuda vs cpu, third output)");
}

INSTANTIATE_TEST_SUITE_P(AllOps, OpConsistency, testing::ValuesIn(all_params()), param_name);

// Every CPU kernel variant this CPU can execute (an AVX-512 machine also runs the AVX2 and
// base variants), every case against the f64 reference with the case's own bound. The
// cases above run the variant chosen at start-up; these call each variant's backend
// directly. A variant the CPU cannot execute is skipped with the instructions it lacks.
class OpConsistencyVariant : public testing::TestWithParam<const char*> {};

TEST_P(OpConsistencyVariant, EveryCaseMatchesReference) {
    const std::string name = GetParam();
    KernelBackend* be = cpu_variant_backend(name);
    if (!be) {
        for (const CpuVariant& v : cpu_variants())
            if (v.name == name) {
                if (!v.cpu_supports) GTEST_SKIP() << "this CPU cannot run the " << name << " variant (lacks " << v.missing << ")";
                FAIL() << "the " << name << " variant is not built or does not load: " << v.status;
            }
        GTEST_SKIP() << "this build has no " << name << " variant (KVLAB_NATIVE=ON builds none)";
    }
    EXPECT_EQ(be->kernel_variant(), name);
    for (const OpCase& oc : op_cases()) {
        SCOPED_TRACE(name + ": " + oc.name);
        CaseBuilder b(seed_for(oc.name));
        oc.build(b);
        ASSERT_TRUE(b.dst.defined()) << "case did not create an output";
        Tensor ref2, ref3;
        Tensor ref = reference(b, &ref2, &ref3);
        OpCall call = b.call;
        ASSERT_TRUE(be->supports_op(call)) << name << " does not support " << oc.name;
        OpContext ctx = ops::current_context();
        ctx.workspace = nullptr;  // kernels then allocate their scratch with malloc
        be->compute(ctx, call);
        expect_close(b.dst, ref, oc.max_err, oc.name);
        if (b.dst2.defined()) expect_close(b.dst2, ref2, oc.max_err, oc.name + " (second output)");
        if (b.dst3.defined()) expect_close(b.dst3, ref3, oc.max_err, oc.name + " (third output)");
        std::string where;
        EXPECT_TRUE(guards_intact(b, &where)) << "wrote outside the output view at " << where;
    }
}

INSTANTIATE_TEST_SUITE_P(CpuVariants, OpConsistencyVariant, testing::Values("avx512bf16", "avx512", "avx2", "base"),
                         [](const testing::TestParamInfo<const char*>& i) { return std::string(i.param); });

// Ops without reductions or exp give the same bits at every ISA level: the build does not
// contract a * b + c into FMAs (-ffp-contract=off), and these ops do the same IEEE operations
// per element whatever the vector width (exp's polynomial asks for FMA where the variant has
// it: kv_fmaf in element_math.h). Quantization is where contraction showed first: a
// contracted x / d + 8.5 moved Q4_0 codes at ties in ~4.5% of random rows. 16 seeds per case.
TEST(CpuVariants, ElementwiseAndQuantizationAreBitwiseIdentical) {
    KernelBackend* base = cpu_variant_backend("base");
    ASSERT_NE(base, nullptr);
    std::vector<std::pair<std::string, KernelBackend*>> others;
    for (const CpuVariant& v : cpu_variants())
        if (v.name != "base" && v.cpu_supports && v.built) others.push_back({v.name, cpu_variant_backend(v.name)});
    if (others.empty()) GTEST_SKIP() << "no kernel variant besides base runs here";
    const std::set<OpKind> exact = {OpKind::QUANTIZE, OpKind::DEQUANTIZE, OpKind::ADD,  OpKind::MUL,
                                    OpKind::SCALE,    OpKind::ROPE,       OpKind::COPY, OpKind::ROPE_BACKWARD};
    OpContext ctx = ops::current_context();
    ctx.workspace = nullptr;
    int compared = 0;
    for (const OpCase& oc : op_cases())
        for (uint64_t seed = 1; seed <= 16; ++seed) {
            CaseBuilder probe(seed);
            oc.build(probe);
            if (!exact.count(probe.call.op) || probe.dst.dtype() == DType::F64) continue;
            auto run = [&](KernelBackend* be) {
                CaseBuilder b(seed);
                oc.build(b);
                OpCall call = b.call;
                be->compute(ctx, call);
                std::vector<Tensor> outs = {b.dst.contiguous()};
                if (b.dst2.defined()) outs.push_back(b.dst2.contiguous());
                return outs;
            };
            const std::vector<Tensor> want = run(base);
            for (const auto& [name, be] : others) {
                const std::vector<Tensor> got = run(be);
                for (size_t i = 0; i < want.size(); ++i) {
                    ASSERT_EQ(got[i].nbytes(), want[i].nbytes());
                    EXPECT_EQ(std::memcmp(got[i].data_ptr(), want[i].data_ptr(), want[i].nbytes()), 0)
                        << oc.name << " seed " << seed << ": output " << i << " of the " << name << " variant differs from base";
                }
                ++compared;
            }
        }
    EXPECT_GT(compared, 100) << "too few cases compared";
}

// The variant chosen at start-up is the best one this CPU runs (without KVLAB_CPU_VARIANT):
// no variant ahead of it in the list is runnable and built.
TEST(CpuVariants, ChosenIsTheBestRunnable) {
    if (std::getenv("KVLAB_CPU_VARIANT")) GTEST_SKIP() << "KVLAB_CPU_VARIANT is set: the choice is forced";
    const std::vector<CpuVariant> vs = cpu_variants();
    ASSERT_FALSE(vs.empty());
    const std::string chosen = cpu_backend().kernel_variant();
    if (chosen == "native") GTEST_SKIP() << "KVLAB_NATIVE=ON build: no variants to choose from";
    bool seen = false;
    for (const CpuVariant& v : vs) {
        if (v.name == chosen) {
            seen = true;
            EXPECT_TRUE(v.cpu_supports && v.built);
            break;
        }
        EXPECT_FALSE(v.cpu_supports && v.built) << v.name << " is runnable here and better than the chosen " << chosen;
    }
    EXPECT_TRUE(seen) << "chosen variant " << chosen << " is not in the list";
    EXPECT_NE(cpu_variant_status().find(chosen), std::string::npos) << cpu_variant_status();
}

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
