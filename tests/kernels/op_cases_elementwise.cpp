// Elementwise cases: ADD, MUL, SCALE, SILU, SWIGLU, COPY — broadcasting, strided views,
// fused-projection slices, every float dtype and the integer copies.
#include "op_cases.h"

namespace kv::test {
namespace {

const char* dn(DType t) {
    static const char* n[] = {"f32", "f64", "f16", "bf16", "i32", "i64", "u8"};
    return n[int(t)];
}

RegisterOpCases reg([](std::vector<OpCase>& cases) {
    const Layout C = Layout::CONTIG, T = Layout::TRANSPOSED, S = Layout::STRIDED;
    for (OpKind k : {OpKind::ADD, OpKind::MUL}) {
        std::string op = op_kind_name(k);
        for (DType dt : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
            cases.push_back({op + "/" + dn(dt) + "/3x5x7", tol_for(dt), [k, dt, C](CaseBuilder& b) {
                                 b.call.op = k;
                                 b.src(b.input({3, 5, 7}, dt, C));
                                 b.src(b.input({3, 5, 7}, dt, C));
                                 b.output({3, 5, 7}, dt);
                             }});
        }
        cases.push_back({op + "/f32/bcast_b_3x1x7", tol_for(DType::F32), [k](CaseBuilder& b) {
                             b.call.op = k;
                             b.src(b.input({3, 5, 7}, DType::F32));
                             b.src(b.input({3, 1, 7}, DType::F32));
                             b.output({3, 5, 7}, DType::F32);
                         }});
        cases.push_back({op + "/f32/bcast_both_1x5x1+3x1x7", tol_for(DType::F32), [k](CaseBuilder& b) {
                             b.call.op = k;
                             b.src(b.input({1, 5, 1}, DType::F32));
                             b.src(b.input({3, 1, 7}, DType::F32));
                             b.output({3, 5, 7}, DType::F32, Layout::STRIDED);
                         }});
        cases.push_back({op + "/mixed_bf16+f32->f32/transposed", tol_for(DType::F32), [k, T, S](CaseBuilder& b) {
                             b.call.op = k;
                             b.src(b.input({6, 9}, DType::BF16, T));
                             b.src(b.input({6, 9}, DType::F32, S));
                             b.output({6, 9}, DType::F32);
                         }});
        cases.push_back({op + "/f32/large_flat_70001", tol_for(DType::F32), [k](CaseBuilder& b) {
                             b.call.op = k;
                             b.src(b.input({70001}, DType::F32));
                             b.src(b.input({70001}, DType::F32));
                             b.output({70001}, DType::F32);
                         }});
    }
    for (DType dt : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
        cases.push_back({std::string("scale/") + dn(dt) + "/strided_4x13", tol_for(dt), [dt, S](CaseBuilder& b) {
                             b.call.op = OpKind::SCALE;
                             b.call.p.alpha = -1.75f;
                             b.src(b.input({4, 13}, dt, S));
                             b.output({4, 13}, dt, S);
                         }});
        cases.push_back({std::string("silu/") + dn(dt) + "/5x31_wide_range", tol_for(dt), [dt](CaseBuilder& b) {
                             b.call.op = OpKind::SILU;
                             b.src(b.input({5, 31}, dt, Layout::CONTIG, -12.0, 12.0));
                             b.output({5, 31}, dt);
                         }});
        cases.push_back({std::string("swiglu/") + dn(dt) + "/fused_projection_slices", tol_for(dt), [dt](CaseBuilder& b) {
                             // gate and up as halves of one (T, 2I) projection output.
                             b.call.op = OpKind::SWIGLU;
                             Tensor gu = b.input({7, 2 * 19}, dt, Layout::CONTIG, -6.0, 6.0);
                             b.src(gu.slice(1, 0, 19));
                             b.src(gu.slice(1, 19, 38));
                             b.output({7, 19}, dt);
                         }});
        // Gemma's GEGLU: the reference is transformers' tanh formula, the kernels a sigmoid form.
        cases.push_back({std::string("swiglu/gelu_tanh/") + dn(dt) + "/fused_projection_slices_wide_range", tol_for(dt), [dt](CaseBuilder& b) {
                             b.call.op = OpKind::SWIGLU;
                             b.call.p.act = int(GateAct::GELU_TANH);
                             Tensor gu = b.input({7, 2 * 19}, dt, Layout::CONTIG, -12.0, 12.0);
                             b.src(gu.slice(1, 0, 19));
                             b.src(gu.slice(1, 19, 38));
                             b.output({7, 19}, dt);
                         }});
    }
    cases.push_back({"swiglu/f32/large_4096x40", tol_for(DType::F32), [](CaseBuilder& b) {
                         b.call.op = OpKind::SWIGLU;
                         b.src(b.input({4096, 40}, DType::F32, Layout::CONTIG, -20.0, 20.0));
                         b.src(b.input({4096, 40}, DType::F32));
                         b.output({4096, 40}, DType::F32);
                     }});
    // Gemma's GEGLU on long rows: the vector loop of every variant, not only its tail.
    cases.push_back({"swiglu/gelu_tanh/f32/large_4096x40", tol_for(DType::F32), [](CaseBuilder& b) {
                         b.call.op = OpKind::SWIGLU;
                         b.call.p.act = int(GateAct::GELU_TANH);
                         b.src(b.input({4096, 40}, DType::F32, Layout::CONTIG, -20.0, 20.0));
                         b.src(b.input({4096, 40}, DType::F32));
                         b.output({4096, 40}, DType::F32);
                     }});
    struct Cp {
        DType from, to;
        Layout li, lo;
    };
    for (Cp c : std::vector<Cp>{{DType::F32, DType::BF16, C, C},
                                {DType::BF16, DType::F32, T, C},
                                {DType::F16, DType::F32, C, S},
                                {DType::F32, DType::F16, S, C},
                                {DType::F32, DType::F64, T, T},
                                {DType::F64, DType::F32, C, C},
                                {DType::BF16, DType::BF16, T, S},
                                {DType::F32, DType::F32, S, T}}) {
        cases.push_back({std::string("copy/") + dn(c.from) + "->" + dn(c.to) + "/9x14", tol_for(c.to), [c](CaseBuilder& b) {
                             b.call.op = OpKind::COPY;
                             b.src(b.input({9, 14}, c.from, c.li, -300.0, 300.0));
                             b.output({9, 14}, c.to, c.lo);
                         }});
    }
    cases.push_back({"copy/i32->i64/6x7", 0.0, [](CaseBuilder& b) {
                         b.call.op = OpKind::COPY;
                         b.src(b.index({6, 7}, 1 << 30, DType::I32));
                         b.output({6, 7}, DType::I64);
                     }});
    cases.push_back({"copy/i64->i32/transposed", 0.0, [](CaseBuilder& b) {
                         b.call.op = OpKind::COPY;
                         b.src(b.index({7, 6}, 1 << 30, DType::I64).transpose(0, 1));
                         b.output({6, 7}, DType::I32);
                     }});
});

}  // namespace
}  // namespace kv::test
