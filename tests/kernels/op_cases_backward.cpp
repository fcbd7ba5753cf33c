// Gradient and loss cases: RMSNORM_BACKWARD, ROPE_BACKWARD, SILU_BACKWARD, SWIGLU_BACKWARD,
// EMBEDDING_BACKWARD, CROSS_ENTROPY(_BACKWARD) and AXPY — every float dtype, strided views,
// accumulation into existing gradients (KV_ACC_* bits), duplicate ids, ignored targets and
// class subsets. (SDPA_BACKWARD: op_cases_sdpa_backward.cpp; finite differences:
// backward_fd_test.cpp.)
#include "op_cases.h"

namespace kv::test {
namespace {

const char* dn(DType t) {
    static const char* n[] = {"f32", "f64", "f16", "bf16", "i32", "i64", "u8"};
    return n[int(t)];
}

// Compute dtype of an output for storage dtype dt: f64 stays f64, the rest compute in f32.
DType wide(DType dt) { return dt == DType::F64 ? DType::F64 : DType::F32; }

// Targets in [0, k) with every `ignore_every`-th one set to -100.
Tensor targets(CaseBuilder& b, const Shape& shape, int64_t k, int ignore_every, DType dt = DType::I32) {
    std::vector<int64_t> v = b.index(shape, k, DType::I64).to_i64_vector();
    for (size_t i = 0; i < v.size(); ++i)
        if (ignore_every > 0 && i % size_t(ignore_every) == 1) v[i] = -100;
    Tensor t = Tensor::from_i64(shape, v);
    return dt == DType::I64 ? t : t.to(DType::I32);
}

RegisterOpCases reg([](std::vector<OpCase>& cases) {
    const Layout S = Layout::STRIDED;
    for (DType dt : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
        const std::string d = dn(dt);
        const double tol = tol_for(dt);
        cases.push_back({"rmsnorm_backward/" + d + "/6x40_weight_dweight", tol, [dt](CaseBuilder& b) {
                             b.call.op = OpKind::RMSNORM_BACKWARD;
                             b.call.p.eps = 1e-5f;
                             b.src(b.input({6, 40}, dt, Layout::CONTIG, -3.0, 3.0));
                             b.src(b.input({6, 40}, dt));
                             b.src(b.input({40}, DType::F32, Layout::CONTIG, 0.5, 1.5));
                             b.output({6, 40}, dt);
                             b.output2({40}, wide(dt));
                         }});
        cases.push_back({"rope_backward/" + d + "/partial_8_of_12_per_row_pos_permuted", tol, [dt](CaseBuilder& b) {
                             b.call.op = OpKind::ROPE_BACKWARD;
                             b.call.p.n_rot = 8;
                             b.src(b.input({2, 7, 3, 12}, dt).permute({0, 2, 1, 3}));
                             b.src(b.index({2, 7}, 100));
                             b.src(b.input({100, 4}, DType::F32));
                             b.src(b.input({100, 4}, DType::F32));
                             b.output({2, 3, 7, 12}, dt, Layout::STRIDED);
                         }});
        cases.push_back({"silu_backward/" + d + "/5x31_wide_range", tol, [dt](CaseBuilder& b) {
                             b.call.op = OpKind::SILU_BACKWARD;
                             b.src(b.input({5, 31}, dt, Layout::CONTIG, -12.0, 12.0));
                             b.src(b.input({5, 31}, dt));
                             b.output({5, 31}, dt);
                         }});
        cases.push_back({"swiglu_backward/" + d + "/fused_projection_slices", tol, [dt](CaseBuilder& b) {
                             b.call.op = OpKind::SWIGLU_BACKWARD;
                             Tensor gu = b.input({7, 2 * 19}, dt, Layout::CONTIG, -6.0, 6.0);
                             b.src(gu.slice(1, 0, 19));
                             b.src(gu.slice(1, 19, 38));
                             b.src(b.input({7, 19}, dt));
                             b.output({7, 19}, dt);
                             b.output2({7, 19}, dt);
                         }});
        cases.push_back({"swiglu_backward/gelu_tanh/" + d + "/fused_projection_slices", tol, [dt](CaseBuilder& b) {
                             b.call.op = OpKind::SWIGLU_BACKWARD;
                             b.call.p.act = int(GateAct::GELU_TANH);
                             Tensor gu = b.input({7, 2 * 19}, dt, Layout::CONTIG, -6.0, 6.0);
                             b.src(gu.slice(1, 0, 19));
                             b.src(gu.slice(1, 19, 38));
                             b.src(b.input({7, 19}, dt));
                             b.output({7, 19}, dt);
                             b.output2({7, 19}, dt);
                         }});
        cases.push_back({"embedding_backward/" + d + "->" + dn(wide(dt)) + "/dup_ids_3x9_V12", tol_for(wide(dt)), [dt](CaseBuilder& b) {
                             b.call.op = OpKind::EMBEDDING_BACKWARD;
                             b.src(b.input({3, 9, 16}, dt));
                             b.src(b.index({3, 9}, 12));  // 27 ids over 12 rows: duplicates
                             b.output({12, 16}, wide(dt));
                         }});
        cases.push_back({"cross_entropy/" + d + "/5x3x37_ignore", tol_for(wide(dt)), [dt](CaseBuilder& b) {
                             b.call.op = OpKind::CROSS_ENTROPY;
                             b.src(b.input({5, 3, 37}, dt, Layout::CONTIG, -8.0, 8.0));
                             b.src(targets(b, {5, 3}, 37, 4));
                             b.output({5, 3}, wide(dt));
                         }});
        cases.push_back({"cross_entropy_backward/" + d + "/6x41_ignore_dloss", tol_for(dt), [dt](CaseBuilder& b) {
                             b.call.op = OpKind::CROSS_ENTROPY_BACKWARD;
                             b.call.p.alpha = 0.25f;
                             b.src(b.input({6, 41}, dt, Layout::CONTIG, -8.0, 8.0));
                             b.src(targets(b, {6}, 41, 3));
                             b.no_src();
                             b.src(b.input({6}, DType::F32, Layout::CONTIG, 0.5, 2.0));
                             b.output({6, 41}, dt);
                         }});
    }
    // Accumulation into existing gradients, strided rows, no weight.
    cases.push_back({"rmsnorm_backward/f32/accumulate_dx_dweight_strided", tol_for(DType::F32), [S](CaseBuilder& b) {
                         b.call.op = OpKind::RMSNORM_BACKWARD;
                         b.call.p.eps = 1e-6f;
                         b.call.p.weight_offset = 1.0f;
                         b.call.p.accumulate = KV_ACC_DST | KV_ACC_DST2;
                         b.src(b.input({2, 5, 300}, DType::F32, S));
                         b.src(b.input({2, 5, 300}, DType::BF16, S));
                         b.src(b.input({300}, DType::F32));
                         b.output({2, 5, 300}, DType::F32, S, true);
                         b.output2({300}, DType::F32, true);
                     }});
    cases.push_back({"rmsnorm_backward/f32/no_weight", tol_for(DType::F32), [](CaseBuilder& b) {
                         b.call.op = OpKind::RMSNORM_BACKWARD;
                         b.src(b.input({4, 20}, DType::F32));
                         b.src(b.input({4, 20}, DType::F32));
                         b.output({4, 20}, DType::F32);
                     }});
    cases.push_back({"rmsnorm_backward/f32/512x576_large", tol_for(DType::F32), [](CaseBuilder& b) {
                         b.call.op = OpKind::RMSNORM_BACKWARD;
                         b.src(b.input({512, 576}, DType::F32));
                         b.src(b.input({512, 576}, DType::F32));
                         b.src(b.input({576}, DType::F32));
                         b.output({512, 576}, DType::F32);
                         b.output2({576}, DType::F32);
                     }});
    cases.push_back({"rope_backward/f32/accumulate_full_rotation", tol_for(DType::F32), [](CaseBuilder& b) {
                         b.call.op = OpKind::ROPE_BACKWARD;
                         b.call.p.n_rot = 16;
                         b.call.p.accumulate = KV_ACC_DST;
                         b.src(b.input({2, 3, 5, 16}, DType::F32));
                         b.src(b.index({1, 5}, 40));
                         b.src(b.input({40, 8}, DType::F32));
                         b.src(b.input({40, 8}, DType::F32));
                         b.output({2, 3, 5, 16}, DType::F32, Layout::CONTIG, true);
                     }});
    cases.push_back({"swiglu_backward/f32/accumulate_large_4096x40", tol_for(DType::F32), [](CaseBuilder& b) {
                         b.call.op = OpKind::SWIGLU_BACKWARD;
                         b.call.p.accumulate = KV_ACC_DST | KV_ACC_DST2;
                         b.src(b.input({4096, 40}, DType::F32, Layout::CONTIG, -20.0, 20.0));
                         b.src(b.input({4096, 40}, DType::F32));
                         b.src(b.input({4096, 40}, DType::F32));
                         b.output({4096, 40}, DType::F32, Layout::CONTIG, true);
                         b.output2({4096, 40}, DType::F32, true);
                     }});
    cases.push_back({"silu_backward/mixed_bf16_x_f32_dy/transposed", tol_for(DType::F32), [](CaseBuilder& b) {
                         b.call.op = OpKind::SILU_BACKWARD;
                         b.call.p.accumulate = KV_ACC_DST;
                         b.src(b.input({6, 9}, DType::BF16, Layout::TRANSPOSED, -5.0, 5.0));
                         b.src(b.input({6, 9}, DType::F32, Layout::STRIDED));
                         b.output({6, 9}, DType::F32, Layout::CONTIG, true);
                     }});
    cases.push_back({"embedding_backward/f32/accumulate_i64_ids_many_threads", tol_for(DType::F32), [](CaseBuilder& b) {
                         b.call.op = OpKind::EMBEDDING_BACKWARD;
                         b.call.p.accumulate = KV_ACC_DST;
                         b.src(b.input({2000, 64}, DType::F32, Layout::STRIDED));
                         b.src(b.index({2000}, 300, DType::I64));
                         b.output({300, 64}, DType::F32, Layout::CONTIG, true);
                     }});
    cases.push_back({"cross_entropy/f32/class_subset_4_of_50_i64", tol_for(DType::F32), [](CaseBuilder& b) {
                         b.call.op = OpKind::CROSS_ENTROPY;
                         b.src(b.input({3, 50}, DType::F32, Layout::STRIDED, -6.0, 6.0));
                         b.src(targets(b, {3}, 4, 0, DType::I64));
                         b.src(b.unique_index({4}, 0, 50));
                         b.output({3}, DType::F32);
                     }});
    cases.push_back({"cross_entropy_backward/f32/class_subset_accumulate", tol_for(DType::F32), [](CaseBuilder& b) {
                         b.call.op = OpKind::CROSS_ENTROPY_BACKWARD;
                         b.call.p.alpha = 0.5f;
                         b.call.p.accumulate = KV_ACC_DST;
                         b.src(b.input({3, 50}, DType::F32, Layout::CONTIG, -6.0, 6.0));
                         b.src(targets(b, {3}, 4, 0));
                         b.src(b.unique_index({4}, 0, 50));
                         b.output({3, 50}, DType::F32, Layout::STRIDED, true);
                     }});
    cases.push_back({"cross_entropy/f32/vocab_151936_extreme_logits", tol_for(DType::F32), [](CaseBuilder& b) {
                         b.call.op = OpKind::CROSS_ENTROPY;
                         b.src(b.input({2, 151936}, DType::F32, Layout::CONTIG, -60.0, 60.0));
                         b.src(targets(b, {2}, 151936, 0));
                         b.output({2}, DType::F32);
                     }});
    cases.push_back({"cross_entropy_backward/bf16/vocab_151936", tol_for(DType::F32), [](CaseBuilder& b) {
                         b.call.op = OpKind::CROSS_ENTROPY_BACKWARD;
                         b.call.p.alpha = 1.0f / 3.0f;
                         b.src(b.input({3, 151936}, DType::BF16, Layout::CONTIG, -20.0, 20.0));
                         b.src(targets(b, {3}, 151936, 0));
                         b.output({3, 151936}, DType::F32);
                     }});
    for (DType dt : {DType::F32, DType::F64, DType::BF16}) {
        cases.push_back({std::string("axpy/") + dn(dt) + "/bcast_3x1x7_into_3x5x7", tol_for(dt), [dt](CaseBuilder& b) {
                             b.call.op = OpKind::AXPY;
                             b.call.p.alpha = -0.75f;
                             b.src(b.input({3, 1, 7}, dt));
                             b.output({3, 5, 7}, dt, Layout::STRIDED, true);
                         }});
    }
    cases.push_back({"axpy/f32/large_flat_70001", tol_for(DType::F32), [](CaseBuilder& b) {
                         b.call.op = OpKind::AXPY;
                         b.call.p.alpha = 3.0f;
                         b.src(b.input({70001}, DType::BF16));
                         b.output({70001}, DType::F32, Layout::CONTIG, true);
                     }});
});

}  // namespace
}  // namespace kv::test
