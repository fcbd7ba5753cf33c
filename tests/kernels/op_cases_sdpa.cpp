// SDPA cases: prefill (causal by position), chunk over a cache with scattered slot positions
// (as after evictions), GQA groups, decode (n = 1), windows, strided q/y views, bf16/f16 K/V,
// and the attention-weight sums (second output).
#include <algorithm>
#include <cmath>
#include <numeric>

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
                             // Slot positions: the cache holds T distinct positions < P = T - n + ...
                             const int64_t P = sd.scattered ? 2 * sd.T : sd.T - sd.n;  // first query position
                             const int64_t rows = sd.per_row ? sd.B * sd.G : 1;
                             std::vector<int32_t> kp((size_t)(rows * sd.T));
                             for (int64_t r = 0; r < rows; ++r) {
                                 std::vector<int32_t> pool;
                                 if (sd.scattered) {
                                     // T - n old tokens drawn from [0, P) plus the n new ones, shuffled.
                                     std::vector<int32_t> old((size_t)P);
                                     std::iota(old.begin(), old.end(), 0);
                                     std::shuffle(old.begin(), old.end(), b.rng);
                                     pool.assign(old.begin(), old.begin() + (sd.T - sd.n));
                                     for (int64_t i = 0; i < sd.n; ++i) pool.push_back(int32_t(P + i));
                                     std::shuffle(pool.begin(), pool.end(), b.rng);
                                 } else {
                                     for (int64_t j = 0; j < sd.T; ++j) pool.push_back(int32_t(j));
                                 }
                                 std::copy(pool.begin(), pool.end(), kp.begin() + r * sd.T);
                             }
                             Tensor kpos = Tensor::from_i32({sd.per_row ? sd.B : 1, sd.per_row ? sd.G : 1, sd.T}, kp);
                             b.src(kpos);
                             std::vector<int32_t> qp((size_t)sd.n);
                             for (int64_t i = 0; i < sd.n; ++i) qp[size_t(i)] = int32_t(P + i);
                             b.src(Tensor::from_i32({1, sd.n}, qp));
                             b.output({sd.B, sd.NH, sd.n, sd.HS}, sd.dt == DType::F64 ? DType::F64 : DType::F32, Layout::STRIDED);
                             if (sd.weights) b.output2({sd.B, sd.G, sd.T}, sd.dt == DType::F64 ? DType::F64 : DType::F32);
                         }});
    }
});

}  // namespace
}  // namespace kv::test
