// Position and index cases: ROPE (partial rotation, per-row positions, permuted views),
// EMBEDDING, GATHER and SCATTER along every axis, including the KV-cache slot pattern.
#include "op_cases.h"

namespace kv::test {
namespace {

const char* dn(DType t) {
    static const char* n[] = {"f32", "f64", "f16", "bf16", "i32", "i64", "u8"};
    return n[int(t)];
}

// cos/sin tables of P positions for n_rot channels from random angles (any numbers exercise
// the rotation formula).
void rope_tables(CaseBuilder& b, int64_t P, int n_rot) {
    b.src(b.input({P, n_rot / 2}, DType::F32));
    b.src(b.input({P, n_rot / 2}, DType::F32));
}

RegisterOpCases reg([](std::vector<OpCase>& cases) {
    for (DType dt : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
        std::string d = dn(dt);
        cases.push_back({"rope/" + d + "/2x3x5x16_full", tol_for(dt), [dt](CaseBuilder& b) {
                             b.call.op = OpKind::ROPE;
                             b.call.p.n_rot = 16;
                             b.src(b.input({2, 3, 5, 16}, dt));
                             b.src(b.index({1, 5}, 40));
                             rope_tables(b, 40, 16);
                             b.output({2, 3, 5, 16}, dt);
                         }});
        cases.push_back({"rope/" + d + "/partial_8_of_12_per_row_pos_permuted", tol_for(dt), [dt](CaseBuilder& b) {
                             // x laid out (B, T, NH, HS) in memory and viewed as (B, NH, T, HS).
                             b.call.op = OpKind::ROPE;
                             b.call.p.n_rot = 8;
                             b.src(b.input({2, 7, 3, 12}, dt).permute({0, 2, 1, 3}));
                             b.src(b.index({2, 7}, 100));
                             rope_tables(b, 100, 8);
                             b.output({2, 3, 7, 12}, dt, Layout::STRIDED);
                         }});
        cases.push_back({"embedding/" + d + "->f32/50x24_ids_3x7", tol_for(DType::F32), [dt](CaseBuilder& b) {
                             b.call.op = OpKind::EMBEDDING;
                             b.src(b.input({50, 24}, dt));
                             b.src(b.index({3, 7}, 50));
                             b.output({3, 7, 24}, DType::F32);
                         }});
    }
    cases.push_back({"embedding/bf16->bf16/i64_ids", tol_for(DType::BF16), [](CaseBuilder& b) {
                         b.call.op = OpKind::EMBEDDING;
                         b.src(b.input({30, 16}, DType::BF16));
                         b.src(b.index({11}, 30, DType::I64));
                         b.output({11, 16}, DType::BF16);
                     }});
    for (int axis : {0, 1, 2})
        for (DType it : {DType::I32, DType::I64}) {
            std::string tag = std::string("axis") + char('0' + axis) + "_" + dn(it);
            cases.push_back({"gather/f32/4x11x6_" + tag, tol_for(DType::F32), [axis, it](CaseBuilder& b) {
                                 b.call.op = OpKind::GATHER;
                                 b.call.p.axis = axis;
                                 Shape src{4, 11, 6}, idx{4, 11, 6};
                                 idx.d[axis] = 5;
                                 b.src(b.input(src, DType::F32));
                                 b.src(b.index(idx, src.d[axis], it));
                                 b.output(idx, DType::F32);
                             }});
            cases.push_back({"scatter/f32/4x11x6_" + tag, tol_for(DType::F32), [axis, it](CaseBuilder& b) {
                                 b.call.op = OpKind::SCATTER;
                                 b.call.p.axis = axis;
                                 Shape dst{4, 11, 6}, vals{4, 11, 6};
                                 vals.d[axis] = dst.d[axis] - 1;  // distinct targets need room
                                 b.src(b.input(vals, DType::F32));
                                 b.src(b.unique_index(vals, axis, dst.d[axis], it));
                                 b.output(dst, DType::F32, Layout::CONTIG, /*init_random=*/true);
                             }});
        }
    // The KV-cache pattern: slots along axis 2 of (B, G, L, D), one index per (b, g, j)
    // broadcast over D; bf16 buffers; gather back into f32.
    cases.push_back({"scatter/bf16/kv_slots_2x3x10x8_bcast_index", tol_for(DType::BF16), [](CaseBuilder& b) {
                         b.call.op = OpKind::SCATTER;
                         b.call.p.axis = 2;
                         b.src(b.input({2, 3, 4, 8}, DType::F32));
                         b.src(b.unique_index({2, 3, 4, 1}, 2, 10).expand({2, 3, 4, 8}));
                         b.output({2, 3, 10, 8}, DType::BF16, Layout::CONTIG, true);
                     }});
    cases.push_back({"gather/bf16->f32/kv_slots_2x3x10x8_bcast_index", tol_for(DType::F32), [](CaseBuilder& b) {
                         b.call.op = OpKind::GATHER;
                         b.call.p.axis = 2;
                         b.src(b.input({2, 3, 10, 8}, DType::BF16));
                         b.src(b.index({2, 3, 4, 1}, 10).expand({2, 3, 4, 8}));
                         b.output({2, 3, 4, 8}, DType::F32, Layout::STRIDED);
                     }});
    cases.push_back({"gather/i64/int_payload_axis1", 0.0, [](CaseBuilder& b) {
                         b.call.op = OpKind::GATHER;
                         b.call.p.axis = 1;
                         b.src(b.index({3, 9}, 1000, DType::I64));
                         b.src(b.index({3, 4}, 9));
                         b.output({3, 4}, DType::I64);
                     }});
});

}  // namespace
}  // namespace kv::test
