// SDPA_KIVI cases: random packed bytes (every byte is a valid run of codes), random f16
// scales and minima, some groups full precision (residual blocks) and the rest packed; 2 and
// 4 bits, prefill-like causal chunks, decode over scattered slot positions (eviction), GQA,
// a partial last group (T not a multiple of S), a window, and the weight sums. The reference
// decodes the bytes to f64 from op.h's layout and runs the dense f64 SDPA.
#include <cmath>

#include "op_cases.h"

namespace kv::test {
namespace {

struct Kc {
    std::string tag;
    int64_t B, NH, G, n, T, L, HS, S;
    int bits;
    bool weights, scattered, per_row;
    int window;
    DType qdt;
};

RegisterOpCases reg([](std::vector<OpCase>& cases) {
    const std::vector<Kc> kcs = {
        {"chunk_n9_T64_S16", 1, 4, 2, 9, 64, 64, 16, 16, 2, true, false, false, 0, DType::F32},
        {"decode_n1_T200_S32_scattered", 2, 6, 3, 1, 200, 256, 32, 32, 2, true, true, true, 0, DType::F32},
        {"decode_n1_T1000_S32_split", 1, 9, 3, 1, 1000, 1024, 64, 32, 4, false, true, false, 0, DType::F32},
        {"chunk_n5_T77_partial_group", 1, 2, 1, 5, 77, 80, 16, 8, 4, true, true, true, 0, DType::F32},
        {"chunk_window_7_n6_T40", 1, 2, 2, 6, 40, 48, 32, 16, 2, true, false, false, 7, DType::F32},
        {"chunk_n4_T50_f64", 1, 4, 2, 4, 50, 64, 16, 16, 2, true, true, true, 0, DType::F64},
        {"decode_n2_T96_bf16_q", 1, 4, 1, 2, 96, 96, 64, 32, 4, true, false, false, 0, DType::BF16},
    };
    for (const Kc& k : kcs) {
        const double tol = tol_for(k.qdt == DType::F64 ? DType::F64 : DType::F32) * 3;
        cases.push_back({std::string("sdpa_kivi/") + std::to_string(k.bits) + "bit/" + k.tag, tol, [k](CaseBuilder& b) {
                             b.call.op = OpKind::SDPA_KIVI;
                             b.call.p.alpha = 1.0f / std::sqrt(float(k.HS));
                             b.call.p.window = k.window;
                             b.call.p.kivi_bits = k.bits;
                             b.call.p.kivi_group = int(k.S);
                             const int64_t NG = (k.L + k.S - 1) / k.S, VG = std::min(k.S, k.HS), P = 3;
                             std::uniform_int_distribution<int> byte(0, 255);
                             auto bytes = [&](const Shape& s) {
                                 Tensor t = Tensor::empty(s, DType::U8);
                                 for (int64_t i = 0; i < t.numel(); ++i) t.data<uint8_t>()[i] = uint8_t(byte(b.rng));
                                 return t;
                             };
                             // scales in [0.01, 0.3], minima in [-2, 0]: values in about [-2, 2.5]
                             auto scales = [&](const Shape& s) {
                                 std::vector<float> v(size_t(s.numel()));
                                 std::uniform_real_distribution<float> sc(0.01f, 0.3f), mn(-2.0f, 0.0f);
                                 for (size_t i = 0; i < v.size(); ++i) v[i] = i % 2 == 0 ? sc(b.rng) : mn(b.rng);
                                 return Tensor::from_f32(s, v).to(DType::F16);
                             };
                             b.src(b.input({k.B, k.n, k.NH, k.HS}, k.qdt, Layout::CONTIG, -2.0, 2.0).permute({0, 2, 1, 3}));
                             b.src(bytes({k.B, k.G, NG, k.HS, k.S * k.bits / 8}));
                             b.src(scales({k.B, k.G, NG, k.HS, 2}));
                             b.src(bytes({k.B, k.G, k.L, k.HS * k.bits / 8}));
                             b.src(scales({k.B, k.G, k.L, k.HS / VG, 2}));
                             b.src(b.input({P, 2, k.S, k.HS}, k.qdt == DType::F64 ? DType::F64 : DType::F32, Layout::CONTIG, -2.0, 2.0));
                             std::vector<int32_t> map(size_t(k.B * k.G * NG));
                             for (size_t i = 0; i < map.size(); ++i) map[i] = i % 3 == 1 ? int32_t(i % P) : -1;
                             b.src(Tensor::from_i32({k.B, k.G, NG}, map));
                             sdpa_positions(b, k.B, k.G, k.n, k.T, k.scattered, k.per_row);
                             const DType out = k.qdt == DType::F64 ? DType::F64 : DType::F32;
                             b.output({k.B, k.NH, k.n, k.HS}, out, Layout::STRIDED);
                             if (k.weights) b.output2({k.B, k.G, k.T}, out);
                         }});
    }
});

}  // namespace
}  // namespace kv::test
