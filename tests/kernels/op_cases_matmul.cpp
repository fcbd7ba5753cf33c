// MATMUL cases: odd sizes, transposed operands (PyTorch Linear weights), broadcast batches,
// alpha/beta accumulation, every input dtype; the small-M (decode) path for M = 1..4 with
// weights in both layouts, K and N tails, and shapes large enough to split across threads.
#include "op_cases.h"

namespace kv::test {
namespace {

struct MM {
    std::string tag;
    Shape a, b, d;
    DType in, out;
    Layout la, lb, ld;
    float alpha, beta;
};

const char* dn(DType t) {
    static const char* n[] = {"f32", "f64", "f16", "bf16", "i32", "i64", "u8"};
    return n[int(t)];
}

RegisterOpCases reg([](std::vector<OpCase>& cases) {
    const Layout C = Layout::CONTIG, T = Layout::TRANSPOSED, S = Layout::STRIDED;
    std::vector<MM> mms = {
        {"7x33@33x13", {7, 33}, {33, 13}, {7, 13}, DType::F32, DType::F32, C, C, C, 1.f, 0.f},
        {"7x33@33x13_bT", {7, 33}, {33, 13}, {7, 13}, DType::F32, DType::F32, C, T, C, 1.f, 0.f},
        {"7x33@33x13_aT", {7, 33}, {33, 13}, {7, 13}, DType::F32, DType::F32, T, C, C, 1.f, 0.f},
        {"7x33@33x13_strided", {7, 33}, {33, 13}, {7, 13}, DType::F32, DType::F32, S, S, S, 1.f, 0.f},
        {"1x64@64x31_decode", {1, 64}, {64, 31}, {1, 31}, DType::F32, DType::F32, C, T, C, 1.f, 0.f},
        {"65x96@96x257", {65, 96}, {96, 257}, {65, 257}, DType::F32, DType::F32, C, T, C, 1.f, 0.f},
        {"alpha_beta", {9, 17}, {17, 11}, {9, 11}, DType::F32, DType::F32, C, C, C, 0.5f, 0.25f},
        {"batched_3x5x9@3x9x7", {3, 5, 9}, {3, 9, 7}, {3, 5, 7}, DType::F32, DType::F32, C, C, C, 1.f, 0.f},
        {"bcast_2x3x5x9@1x1x9x7", {2, 3, 5, 9}, {1, 1, 9, 7}, {2, 3, 5, 7}, DType::F32, DType::F32, C, T, C, 1.f, 0.f},
        {"bcast_a_1x5x9@4x9x7", {1, 5, 9}, {4, 9, 7}, {4, 5, 7}, DType::F32, DType::F32, C, C, C, 1.f, 0.f},
        {"7x33@33x13", {7, 33}, {33, 13}, {7, 13}, DType::F64, DType::F64, C, T, C, 1.f, 0.f},
        {"alpha_beta", {9, 17}, {17, 11}, {9, 11}, DType::F64, DType::F64, T, C, S, 2.f, -1.f},
        {"19x40@40x23", {19, 40}, {40, 23}, {19, 23}, DType::BF16, DType::F32, C, T, C, 1.f, 0.f},
        {"19x40@40x23", {19, 40}, {40, 23}, {19, 23}, DType::BF16, DType::BF16, C, C, C, 1.f, 0.f},
        {"batched_2x6x40@2x40x10", {2, 6, 40}, {2, 40, 10}, {2, 6, 10}, DType::BF16, DType::F32, C, T, C, 1.f, 0.f},
        {"19x40@40x23", {19, 40}, {40, 23}, {19, 23}, DType::F16, DType::F32, C, T, C, 1.f, 0.f},
        {"19x40@40x23", {19, 40}, {40, 23}, {19, 23}, DType::F16, DType::F16, C, C, C, 1.f, 0.f},
        {"5x8@8x6_to_f16", {5, 8}, {8, 6}, {5, 6}, DType::F32, DType::F16, C, C, C, 1.f, 0.f},
    };
    // Small-M path (kernels/cpu/matmul.cpp, gemv_tile.h): M = 1..4, "dot" weights (b = W^T, a
    // Linear weight) and "axpy" weights (b row-major), f32 and bf16; K = 45 and N = 131 leave
    // vector tails; 300x600 / 520x700 exceed the threading threshold.
    for (int64_t M = 1; M <= 4; ++M)
        for (DType dt : {DType::F32, DType::BF16})
            for (Layout lb : {T, C}) {
                const std::string t = std::to_string(M) + "x45@45x131" + (lb == T ? "_bT" : "") + "_small_m";
                mms.push_back({t, {M, 45}, {45, 131}, {M, 131}, dt, DType::F32, C, lb, C, 1.f, 0.f});
            }
    mms.push_back({"1x300@300x600_bT_small_m_threads", {1, 300}, {300, 600}, {1, 600}, DType::F32, DType::F32, C, T, C, 1.f, 0.f});
    mms.push_back({"3x520@520x700_bT_small_m_threads", {3, 520}, {520, 700}, {3, 700}, DType::BF16, DType::F32, C, T, C, 1.f, 0.f});
    mms.push_back({"2x300@300x600_small_m_threads", {2, 300}, {300, 600}, {2, 600}, DType::F32, DType::F32, C, C, C, 1.f, 0.f});
    mms.push_back({"2x33@33x70_bT_small_m_alpha_beta", {2, 33}, {33, 70}, {2, 70}, DType::F32, DType::F32, C, T, S, 0.5f, -0.75f});
    mms.push_back({"3x40@40x19_bT_small_m_to_bf16", {3, 40}, {40, 19}, {3, 19}, DType::BF16, DType::BF16, C, T, C, 1.f, 0.f});
    mms.push_back({"4x40@40x19_small_m_aT", {4, 40}, {40, 19}, {4, 19}, DType::F32, DType::F32, T, T, C, 1.f, 0.f});
    mms.push_back({"batched_3x1x40@3x40x21_small_m", {3, 1, 40}, {3, 40, 21}, {3, 1, 21}, DType::F32, DType::F32, C, T, C, 1.f, 0.f});
    mms.push_back({"bcast_2x3x2x40@1x1x40x19_small_m", {2, 3, 2, 40}, {1, 1, 40, 19}, {2, 3, 2, 19}, DType::BF16, DType::F32, C, T, C, 1.f, 0.f});
    mms.push_back({"1x16@16x5_small_m_strided", {1, 16}, {16, 5}, {1, 5}, DType::F32, DType::F32, S, S, S, 1.f, 0.f});
    for (const MM& m : mms) {
        cases.push_back({std::string("matmul/") + dn(m.in) + "->" + dn(m.out) + "/" + m.tag, tol_for(m.out) * 2, [m](CaseBuilder& b) {
                             b.call.op = OpKind::MATMUL;
                             b.call.p.alpha = m.alpha;
                             b.call.p.beta = m.beta;
                             b.src(b.input(m.a, m.in, m.la));
                             b.src(b.input(m.b, m.in, m.lb));
                             b.output(m.d, m.out, m.ld, m.beta != 0.f);
                         }});
    }
});

}  // namespace
}  // namespace kv::test
