// SDPA_QROWS cases: keys and values quantized from random f32 rows into each deployed format
// (fp8 E4M3/E5M2, NVFP4, MXFP4, fp8 keys with NVFP4 values, TurboQuant at 4/4, 2/8 and 3/2
// bits), head sizes 64 and 128, contexts that are not a multiple of the kernel's key block or
// of a range, decode over scattered slot positions (eviction) with GQA, multi-query chunks with
// a window and the weight sums. The reference decodes every row with the reference decoders
// (kernels/cpu/ref) and runs the dense f64 SDPA over them.
#include <algorithm>
#include <cmath>
#include <iterator>

#include "engine/ops/ops.h"
#include "kernels/common/quant_formats.h"
#include "op_cases.h"

namespace kv::test {
namespace {

struct Qc {
    std::string tag;
    int64_t B, NH, G, n, T, HS;
    bool weights, scattered, per_row;
    int window;
};

struct Fmt {
    const char* name;
    QuantFormat k, v;
};

RegisterOpCases reg([](std::vector<OpCase>& cases) {
    const std::vector<Fmt> fmts = {{"fp8_e4m3", QuantFormat::FP8_E4M3, QuantFormat::FP8_E4M3},
                                   {"fp8_e5m2", QuantFormat::FP8_E5M2, QuantFormat::FP8_E5M2},
                                   {"nvfp4", QuantFormat::NVFP4, QuantFormat::NVFP4},
                                   {"mxfp4", QuantFormat::MXFP4, QuantFormat::MXFP4},
                                   {"kfp8vfp4", QuantFormat::FP8_E4M3, QuantFormat::NVFP4},
                                   {"tq_k4v4", QuantFormat::TQK4, QuantFormat::TQV4},
                                   {"tq_k2v8", QuantFormat::TQK2, QuantFormat::TQV8},
                                   {"tq_k3v2", QuantFormat::TQK3, QuantFormat::TQV2}};
    const std::vector<Qc> qcs = {
        {"decode_n1_T1000_HS64_scattered", 2, 6, 3, 1, 1000, 64, false, true, true, 0},
        {"decode_n1_T2999_HS128", 1, 8, 2, 1, 2999, 128, true, false, false, 0},
        {"chunk_n3_T333_HS128_window100", 1, 4, 2, 3, 333, 128, true, true, true, 100},
        {"chunk_n6_T77_HS64", 1, 2, 1, 6, 77, 64, true, false, false, 0},
    };
    for (const Fmt& f : fmts)
        for (const Qc& k : qcs)
            cases.push_back({std::string("sdpa_qrows/") + f.name + "/" + k.tag, 1e-5, [f, k](CaseBuilder& b) {
                                 b.call.op = OpKind::SDPA_QROWS;
                                 b.call.p.alpha = 1.0f / std::sqrt(float(k.HS));
                                 b.call.p.window = k.window;
                                 b.call.p.qformat = int(f.k);
                                 b.call.p.qformat_v = int(f.v);
                                 const QuantLevels lv = ops::quant_levels(f.k, k.HS);
                                 std::copy(std::begin(lv.v), std::end(lv.v), std::begin(b.call.p.qlevels));
                                 const int64_t L = k.T + 7;  // rows beyond T are never read
                                 b.src(b.input({k.B, k.n, k.NH, k.HS}, DType::F32, Layout::CONTIG, -2.0, 2.0).permute({0, 2, 1, 3}));
                                 b.src(ops::quantize(b.input({k.B, k.G, L, k.HS}, DType::F32, Layout::CONTIG, -3.0, 3.0), f.k));
                                 b.src(ops::quantize(b.input({k.B, k.G, L, k.HS}, DType::F32, Layout::CONTIG, -3.0, 3.0), f.v));
                                 sdpa_positions(b, k.B, k.G, k.n, k.T, k.scattered, k.per_row);
                                 b.output({k.B, k.NH, k.n, k.HS}, DType::F32, Layout::STRIDED);
                                 if (k.weights) b.output2({k.B, k.G, k.T}, DType::F32);
                             }});
});

}  // namespace
}  // namespace kv::test
