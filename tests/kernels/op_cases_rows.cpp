// Row-wise cases: RMSNORM (with/without weight, Gemma offset), SOFTMAX (scaled), and the
// reductions SUM, MAX, NORM — odd widths, strided rows, long rows, every float dtype.
#include "op_cases.h"

namespace kv::test {
namespace {

const char* dn(DType t) {
    static const char* n[] = {"f32", "f64", "f16", "bf16", "i32", "i64", "u8"};
    return n[int(t)];
}

RegisterOpCases reg([](std::vector<OpCase>& cases) {
    const Layout S = Layout::STRIDED, T = Layout::TRANSPOSED;
    for (DType dt : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
        std::string d = dn(dt);
        cases.push_back({"rmsnorm/" + d + "/5x37_weight", tol_for(dt), [dt](CaseBuilder& b) {
                             b.call.op = OpKind::RMSNORM;
                             b.call.p.eps = 1e-5f;
                             b.src(b.input({5, 37}, dt, Layout::CONTIG, -3.0, 3.0));
                             b.src(b.input({37}, DType::F32, Layout::CONTIG, 0.5, 1.5));
                             b.output({5, 37}, dt);
                         }});
        cases.push_back({"rmsnorm/" + d + "/2x3x64_gemma_offset_strided", tol_for(dt), [dt, S](CaseBuilder& b) {
                             b.call.op = OpKind::RMSNORM;
                             b.call.p.eps = 1e-6f;
                             b.call.p.weight_offset = 1.0f;
                             b.src(b.input({2, 3, 64}, dt, S));
                             b.src(b.input({64}, dt));
                             b.output({2, 3, 64}, dt, S);
                         }});
        cases.push_back({"rmsnorm/" + d + "/4x20_no_weight", tol_for(dt), [dt](CaseBuilder& b) {
                             b.call.op = OpKind::RMSNORM;
                             b.call.p.eps = 1e-6f;
                             b.src(b.input({4, 20}, dt));
                             b.output({4, 20}, dt);
                         }});
        cases.push_back({"softmax/" + d + "/6x45_scaled", tol_for(dt), [dt](CaseBuilder& b) {
                             b.call.op = OpKind::SOFTMAX;
                             b.call.p.alpha = 0.125f;
                             b.src(b.input({6, 45}, dt, Layout::CONTIG, -40.0, 40.0));
                             b.output({6, 45}, dt);
                         }});
        for (OpKind k : {OpKind::SUM, OpKind::MAX, OpKind::NORM}) {
            DType out = dt == DType::F64 ? DType::F64 : DType::F32;
            cases.push_back({std::string(op_kind_name(k)) + "/" + d + "/5x33_strided", tol_for(out), [k, dt, out, S](CaseBuilder& b) {
                                 b.call.op = k;
                                 b.src(b.input({5, 33}, dt, S));
                                 b.output({5}, out);
                             }});
        }
    }
    cases.push_back({"rmsnorm/f32/512x4096_large", tol_for(DType::F32), [](CaseBuilder& b) {
                         b.call.op = OpKind::RMSNORM;
                         b.call.p.eps = 1e-6f;
                         b.src(b.input({512, 4096}, DType::F32));
                         b.src(b.input({4096}, DType::F32));
                         b.output({512, 4096}, DType::F32);
                     }});
    cases.push_back({"softmax/f32/transposed_9x17", tol_for(DType::F32), [T](CaseBuilder& b) {
                         b.call.op = OpKind::SOFTMAX;
                         b.src(b.input({9, 17}, DType::F32, T, -5.0, 5.0));
                         b.output({9, 17}, DType::F32, Layout::STRIDED);
                     }});
    for (OpKind k : {OpKind::SUM, OpKind::MAX, OpKind::NORM})
        cases.push_back({std::string(op_kind_name(k)) + "/f32/3x10000_long_rows", tol_for(DType::F32), [k](CaseBuilder& b) {
                             b.call.op = k;
                             b.src(b.input({3, 10000}, DType::F32));
                             b.output({3}, DType::F32);
                         }});
    cases.push_back({"sum/f32/2x3x4_to_2x3", tol_for(DType::F32), [](CaseBuilder& b) {
                         b.call.op = OpKind::SUM;
                         b.src(b.input({2, 3, 4}, DType::F32, Layout::TRANSPOSED));
                         b.output({2, 3}, DType::F32);
                     }});
});

}  // namespace
}  // namespace kv::test
