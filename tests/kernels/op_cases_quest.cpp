// SDPA_QUEST cases: random q, k, v and random page minima / maxima (any values select some
// pages), pages of 4-16 slots, 1-3 pages per query plus its own, decode and chunks, GQA, f32
// and f64, with weight sums. The reference (kernels/cpu/ref) ranks the pages by a full sort in
// f64 and runs the dense f64 softmax over the chosen pages' visible slots.
#include <cmath>

#include "op_cases.h"

namespace kv::test {
namespace {

struct Qc {
    std::string tag;
    int64_t B, NH, G, n, T, HS, P, pages;
    DType dt;
};

RegisterOpCases reg([](std::vector<OpCase>& cases) {
    const std::vector<Qc> qcs = {
        {"decode_T100_P8_k2", 1, 4, 2, 1, 100, 16, 8, 2, DType::F32},
        {"chunk_n5_T64_P4_k3", 2, 6, 3, 5, 64, 32, 4, 3, DType::F32},
        {"decode_T37_P16_k1_f64", 1, 2, 1, 1, 37, 16, 16, 1, DType::F64},
    };
    for (const Qc& k : qcs) {
        const double tol = tol_for(k.dt) * 3;
        cases.push_back({std::string("sdpa_quest/") + k.tag, tol, [k](CaseBuilder& b) {
                             b.call.op = OpKind::SDPA_QUEST;
                             b.call.p.alpha = 1.0f / std::sqrt(float(k.HS));
                             b.call.p.quest_page = int(k.P);
                             b.call.p.quest_pages = int(k.pages);
                             const int64_t NP = (k.T + k.P - 1) / k.P;
                             b.src(b.input({k.B, k.NH, k.n, k.HS}, k.dt, Layout::CONTIG, -2.0, 2.0));
                             b.src(b.input({k.B, k.G, k.T, k.HS}, k.dt, Layout::CONTIG, -2.0, 2.0));
                             b.src(b.input({k.B, k.G, k.T, k.HS}, k.dt, Layout::CONTIG, -1.0, 1.0));
                             sdpa_positions(b, k.B, k.G, k.n, k.T, false, false);
                             b.src(b.input({k.B, k.G, NP, k.HS}, DType::F32, Layout::CONTIG, -2.0, 0.0));
                             b.src(b.input({k.B, k.G, NP, k.HS}, DType::F32, Layout::CONTIG, 0.0, 2.0));
                             b.output({k.B, k.NH, k.n, k.HS}, k.dt, Layout::STRIDED);
                             b.output2({k.B, k.G, k.T}, k.dt);
                         }});
    }
});

}  // namespace
}  // namespace kv::test
