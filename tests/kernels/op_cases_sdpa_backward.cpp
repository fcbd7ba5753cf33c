// SDPA_BACKWARD cases: the shapes of the forward cases (prefill, a chunk over a cache with
// scattered slot positions, GQA, decode, windows, several key/query blocks), f32/f64/bf16,
// accumulation into existing dk/dv, and a tiny temporary budget that forces one query per
// block. The gradients are compared with the naive f64 reference (and checked against finite
// differences in backward_fd_test.cpp).
#include <cmath>

#include "op_cases.h"

namespace kv::test {
namespace {

const char* dn(DType t) {
    static const char* n[] = {"f32", "f64", "f16", "bf16", "i32", "i64", "u8"};
    return n[int(t)];
}

struct Sb {
    std::string tag;
    int64_t B, NH, G, n, T, HS;
    DType dt;
    int window;
    bool scattered, per_row;
    int accumulate;
    int64_t max_temp_bytes;
};

RegisterOpCases reg([](std::vector<OpCase>& cases) {
    std::vector<Sb> sbs = {
        {"prefill_1x4x2_n9", 1, 4, 2, 9, 9, 16, DType::F32, 0, false, false, 0, 0},
        {"chunk_over_cache_n5_T40_scattered", 2, 4, 2, 5, 40, 16, DType::F32, 0, true, true, 0, 0},
        {"chunk_n7_T300_multi_block", 1, 6, 2, 7, 300, 32, DType::F32, 0, true, false, 0, 0},
        {"decode_n1_T257", 2, 8, 2, 1, 257, 64, DType::F32, 0, true, true, 0, 0},
        {"window_9_n12", 1, 2, 1, 12, 12, 8, DType::F32, 9, false, false, 0, 0},
        {"prefill_n150_window_60_HS20", 1, 4, 2, 150, 150, 20, DType::F32, 60, false, false, 0, 0},
        {"prefill_n300_causal_skip", 1, 2, 1, 300, 300, 16, DType::F32, 0, false, false, 0, 0},
        {"chunk_n6_T50", 1, 4, 2, 6, 50, 16, DType::F64, 0, true, true, 0, 0},
        {"chunk_n6_T50_accumulate", 1, 4, 2, 6, 50, 16, DType::F64, 0, true, true, KV_ACC_DST | KV_ACC_DST2 | KV_ACC_DST3, 0},
        {"chunk_n6_T50", 1, 4, 2, 6, 50, 16, DType::BF16, 0, true, true, 0, 0},
        {"chunk_n20_T90_tiny_budget", 1, 6, 3, 20, 90, 16, DType::F32, 0, true, false, KV_ACC_DST2 | KV_ACC_DST3, 1},
        {"mha_no_gqa_n4_T4", 1, 3, 3, 4, 4, 12, DType::F32, 0, false, false, 0, 0},
    };
    for (const Sb& sb : sbs) {
        const DType out = sb.dt == DType::F64 ? DType::F64 : DType::F32;
        // Five chained products in f32, each summing up to T * R terms: a few times f32's bound.
        const double tol = sb.dt == DType::F64 ? 1e-11 : 1e-4;
        cases.push_back({std::string("sdpa_backward/") + dn(sb.dt) + "/" + sb.tag, tol, [sb, out](CaseBuilder& b) {
                             b.call.op = OpKind::SDPA_BACKWARD;
                             b.call.p.alpha = 1.0f / std::sqrt(float(sb.HS));
                             b.call.p.window = sb.window;
                             b.call.p.accumulate = sb.accumulate;
                             b.call.p.max_temp_bytes = sb.max_temp_bytes;
                             b.src(b.input({sb.B, sb.n, sb.NH, sb.HS}, sb.dt, Layout::CONTIG, -2.0, 2.0).permute({0, 2, 1, 3}));
                             b.src(b.input({sb.B, sb.G, sb.T, sb.HS}, sb.dt, Layout::CONTIG, -2.0, 2.0));
                             b.src(b.input({sb.B, sb.G, sb.T, sb.HS}, sb.dt, Layout::STRIDED));
                             sdpa_positions(b, sb.B, sb.G, sb.n, sb.T, sb.scattered, sb.per_row);
                             b.src(b.input({sb.B, sb.NH, sb.n, sb.HS}, sb.dt));
                             const bool acc = sb.accumulate != 0;
                             b.output({sb.B, sb.NH, sb.n, sb.HS}, out, Layout::STRIDED, acc);
                             b.output2({sb.B, sb.G, sb.T, sb.HS}, out, acc);
                             b.output3({sb.B, sb.G, sb.T, sb.HS}, out, acc);
                         }});
    }
    // Soft-capping (Gemma 2): dS through c tanh(s / c), scores large enough to saturate a cap of 3.
    for (DType dt : {DType::F32, DType::F64}) {
        const DType out = dt == DType::F64 ? DType::F64 : DType::F32;
        cases.push_back({std::string("sdpa_backward/") + dn(dt) + "/softcap_3_chunk_n7_T150_window_60", dt == DType::F64 ? 1e-11 : 1e-4,
                         [dt, out](CaseBuilder& b) {
                             b.call.op = OpKind::SDPA_BACKWARD;
                             b.call.p.alpha = 4.0f / std::sqrt(16.0f);
                             b.call.p.window = 60;
                             b.call.p.softcap = 3.0f;
                             b.src(b.input({1, 4, 7, 16}, dt, Layout::CONTIG, -2.0, 2.0));
                             b.src(b.input({1, 2, 150, 16}, dt, Layout::CONTIG, -2.0, 2.0));
                             b.src(b.input({1, 2, 150, 16}, dt));
                             sdpa_positions(b, 1, 2, 7, 150, true, false);
                             b.src(b.input({1, 4, 7, 16}, dt));
                             b.output({1, 4, 7, 16}, out);
                             b.output2({1, 2, 150, 16}, out);
                             b.output3({1, 2, 150, 16}, out);
                         }});
    }
});

}  // namespace
}  // namespace kv::test
