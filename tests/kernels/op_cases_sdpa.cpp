// SDPA cases: prefill (causal by position), chunk over a cache with scattered slot positions
// (as after evictions), GQA groups, decode (n = 1), windows, strided q/y views, bf16/f16 K/V,
// and the attention-weight sums (second output).
#include <cmath>

#include "op_cases.h"

namespace kv::test {
namespace {

const char* dn(DType t) {
    static const char* n[] = {"f32", "f64", "f16", "bf16", "i32", "i64", "u8"};
    return n[int(t)];
}

struct Sd {
    std::string tag;
    int64_t B, NH, G, n, T, HS;
    DType dt;
    bool weights;
    int window;
    bool scattered;  // slot positions a random permutation (cache after evictions)
    bool per_row;    // positions differ per (b, g)
};

RegisterOpCases reg([](std::vector<OpCase>& cases) {
    std::vector<Sd> sds = {
        {"prefill_1x4x2_n9", 1, 4, 2, 9, 9, 16, DType::F32, false, 0, false, false},
        {"prefill_weights_2x6x3_n13", 2, 6, 3, 13, 13, 8, DType::F32, true, 0, false, false},
        {"chunk_over_cache_n5_T40_scattered", 2, 4, 2, 5, 40, 16, DType::F32, true, 0, true, true},
        {"chunk_n7_T300_multi_block", 1, 6, 2, 7, 300, 32, DType::F32, true, 0, true, false},
        {"decode_n1_T257", 2, 8, 2, 1, 257, 64, DType::F32, true, 0, true, true},
        {"window_9_n12", 1, 2, 1, 12, 12, 8, DType::F32, true, 9, false, false},
        {"chunk_weights_n40_T600_small_q_block", 1, 14, 2, 40, 600, 8, DType::F32, true, 0, true, false},
        {"chunk_n6_T50", 1, 4, 2, 6, 50, 16, DType::F64, true, 0, true, true},
        {"chunk_n6_T50", 1, 4, 2, 6, 50, 16, DType::BF16, true, 0, true, true},
        {"chunk_n6_T50", 1, 4, 2, 6, 50, 16, DType::F16, false, 0, true, false},
        {"mha_no_gqa_n4_T4", 1, 3, 3, 4, 4, 12, DType::F32, true, 0, false, false},
        // Several key and query blocks: causal block skipping, padded head sizes, windows.
        {"prefill_n300_causal_skip_HS72", 1, 2, 1, 300, 300, 72, DType::F32, true, 0, false, false},
        {"prefill_window_150_n400", 1, 2, 1, 400, 400, 16, DType::F32, true, 150, false, false},
        {"chunk_n40_T700_HS128_per_row", 1, 2, 2, 40, 700, 128, DType::F32, true, 0, true, true},
        {"prefill_n200_no_weights", 1, 3, 1, 200, 200, 32, DType::BF16, false, 0, false, false},
        // Decode path (n <= 4, HS % 16 == 0, f32/bf16 K/V): several key ranges (up to 512 keys, equal lengths) merged,
        // ranges split across threads, windows, per-row positions, up to 4 query rows per pass.
        {"decode_n1_T1500_R7_split", 1, 14, 2, 1, 1500, 64, DType::BF16, true, 0, true, true},
        {"decode_n1_T1500_R7_split", 1, 14, 2, 1, 1500, 64, DType::F32, false, 0, true, false},
        {"decode_n3_T700_window_300_HS128", 2, 4, 2, 3, 700, 128, DType::F32, true, 300, false, false},
        {"decode_n4_T520_R3", 1, 9, 3, 4, 520, 64, DType::F32, false, 0, true, true},
        {"decode_n2_T37_HS16", 1, 2, 1, 2, 37, 16, DType::BF16, true, 0, false, false},
    };
    for (const Sd& sd : sds) {
        double tol = tol_for(sd.dt == DType::F64 ? DType::F64 : sd.dt) * 3;
        cases.push_back({std::string("sdpa/") + dn(sd.dt) + "/" + sd.tag, tol, [sd](CaseBuilder& b) {
                             b.call.op = OpKind::SDPA;
                             b.call.p.alpha = 1.0f / std::sqrt(float(sd.HS));
                             b.call.p.window = sd.window;
                             // q laid out (B, n, NH, HS) as the model produces it, viewed (B, NH, n, HS).
                             b.src(b.input({sd.B, sd.n, sd.NH, sd.HS}, sd.dt, Layout::CONTIG, -2.0, 2.0).permute({0, 2, 1, 3}));
                             b.src(b.input({sd.B, sd.G, sd.T, sd.HS}, sd.dt, Layout::CONTIG, -2.0, 2.0));
                             b.src(b.input({sd.B, sd.G, sd.T, sd.HS}, sd.dt, Layout::STRIDED));
                             sdpa_positions(b, sd.B, sd.G, sd.n, sd.T, sd.scattered, sd.per_row);
                             b.output({sd.B, sd.NH, sd.n, sd.HS}, sd.dt == DType::F64 ? DType::F64 : DType::F32, Layout::STRIDED);
                             if (sd.weights) b.output2({sd.B, sd.G, sd.T}, sd.dt == DType::F64 ? DType::F64 : DType::F32);
                         }});
    }
    // Soft-capping (Gemma 2): scores c tanh(s / c) before the mask; scores up to ~|8| against a
    // cap of 3 so tanh saturates; tiled, decode and windowed paths, weights and log-sum-exp.
    struct Cap { std::string tag; int64_t B, NH, G, n, T, HS; int window; };
    for (const Cap& k : std::vector<Cap>{{"prefill_n40", 1, 4, 2, 40, 40, 16, 0},
                                         {"prefill_n150_key_blocks", 1, 4, 1, 150, 150, 16, 0},
                                         {"chunk_n7_T300_window_100", 1, 6, 2, 7, 300, 32, 100},
                                         {"decode_n1_T257", 2, 8, 2, 1, 257, 64, 0}}) {
        cases.push_back({"sdpa/f32/softcap_3_" + k.tag, tol_for(DType::F32) * 3, [k](CaseBuilder& b) {
                             b.call.op = OpKind::SDPA;
                             b.call.p.alpha = 4.0f / std::sqrt(float(k.HS));
                             b.call.p.window = k.window;
                             b.call.p.softcap = 3.0f;
                             b.src(b.input({k.B, k.NH, k.n, k.HS}, DType::F32, Layout::CONTIG, -2.0, 2.0));
                             b.src(b.input({k.B, k.G, k.T, k.HS}, DType::F32, Layout::CONTIG, -2.0, 2.0));
                             b.src(b.input({k.B, k.G, k.T, k.HS}, DType::F32));
                             sdpa_positions(b, k.B, k.G, k.n, k.T, false, false);
                             b.output({k.B, k.NH, k.n, k.HS}, DType::F32);
                             b.output2({k.B, k.G, k.T}, DType::F32);
                         }});
    }
    // Queries older than every slot see nothing: zero output rows and no weight.
    cases.push_back({"sdpa/f32/queries_that_see_nothing", tol_for(DType::F32) * 3, [](CaseBuilder& b) {
                         b.call.op = OpKind::SDPA;
                         b.call.p.alpha = 0.3f;
                         b.src(b.input({1, 2, 3, 16}, DType::F32));
                         b.src(b.input({1, 1, 20, 16}, DType::F32));
                         b.src(b.input({1, 1, 20, 16}, DType::F32));
                         std::vector<int32_t> kp(20);
                         for (int j = 0; j < 20; ++j) kp[size_t(j)] = 10 + j;
                         b.src(Tensor::from_i32({1, 1, 20}, kp));
                         b.src(Tensor::from_i32({1, 3}, {5, 12, 40}));
                         b.output({1, 2, 3, 16}, DType::F32);
                         b.output2({1, 1, 20}, DType::F32);
                     }});
});

}  // namespace
}  // namespace kv::test
