// QUANTIZE / DEQUANTIZE cases for every format: bytes must equal the independent reference
// exactly; dequantized values likewise (they are exact functions of the bytes).
#include "kernels/common/quant_formats.h"
#include "engine/ops/ops.h"
#include "op_cases.h"

#include <algorithm>
#include <iterator>

namespace kv::test {
namespace {

RegisterOpCases reg([](std::vector<OpCase>& cases) {
    for (int f = 0; f < int(QuantFormat::COUNT); ++f) {
        const std::string name = ops::quant_format_name(QuantFormat(f));
        const int64_t n = f >= int(QuantFormat::NF4) ? 128 : 24;
        const int64_t rb = quant_row_bytes(QuantFormat(f), n);
        const QuantLevels lv = ops::quant_levels(QuantFormat(f), n);
        if (tq_bits(QuantFormat(f))) {
            // TurboQuant rotates in f32 (kernels) or f64 (reference): a coordinate near a code
            // boundary may take either code, so bytes are not compared; decoding is compared
            // within rounding (tests/kernels/turboquant_test.cpp checks the codes themselves).
            cases.push_back({std::string("dequantize/") + name + "->f32/4xrow", 2e-6, [f, n, rb, lv](CaseBuilder& b) {
                                 b.call.op = OpKind::DEQUANTIZE;
                                 b.call.p.qformat = f;
                                 std::copy(std::begin(lv.v), std::end(lv.v), std::begin(b.call.p.qlevels));
                                 Tensor x = b.input({4, n}, DType::F32, Layout::CONTIG, -5.0, 5.0);
                                 b.src(ops::quantize(x, QuantFormat(f)));
                                 b.output({4, n}, DType::F32, Layout::STRIDED);
                             }});
            continue;
        }
        cases.push_back({std::string("quantize/f32->") + name + "/3x5xrow", 0.0, [f, n, rb](CaseBuilder& b) {
                             b.call.op = OpKind::QUANTIZE;
                             b.call.p.qformat = f;
                             b.src(b.input({3, 5, n}, DType::F32, Layout::STRIDED, -3.0, 2.0));
                             b.output({3, 5, rb}, DType::U8);
                         }});
        cases.push_back({std::string("quantize/bf16->") + name + "/7xrow", 0.0, [f, n, rb](CaseBuilder& b) {
                             b.call.op = OpKind::QUANTIZE;
                             b.call.p.qformat = f;
                             b.src(b.input({7, n}, DType::BF16));
                             b.output({7, rb}, DType::U8);
                         }});
        cases.push_back({std::string("dequantize/") + name + "->f32/4xrow", 0.0, [f, n, rb](CaseBuilder& b) {
                             b.call.op = OpKind::DEQUANTIZE;
                             b.call.p.qformat = f;
                             // Bytes from quantizing random values (any byte pattern would do for
                             // q8/q4/nf4 payloads, but scales must be finite).
                             Tensor x = b.input({4, n}, DType::F32, Layout::CONTIG, -5.0, 5.0);
                             b.src(ops::quantize(x, QuantFormat(f)));
                             b.output({4, n}, DType::F32, Layout::STRIDED);
                         }});
    }
});

}  // namespace
}  // namespace kv::test
