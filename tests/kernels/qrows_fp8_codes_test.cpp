// SDPA_QROWS reads every finite fp8 code (E4M3, E5M2: subnormals, both signs, the largest
// values) as its OCP value, on every CPU kernel variant this CPU runs. One batch row per code:
// key 0 and value 0 hold the code in every element (row scales 0.75 and 1.25), key 1 and
// value 1 are zero rows; the query is chosen from the code's value so that key 0 scores 1 and
// key 1 scores 0. So the output is sigmoid(1) * value * 1.25 in every element; a misread key
// moves the weight, a misread value the output. D = 24 runs the vector body and the scalar
// tail of a row. The expected values are the format definitions, in f64, here.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "engine/backend/backend_registry.h"
#include "engine/ops/ops.h"
#include "kernels/common/quant_formats.h"
#include "tests/kernels/qrows_decode_call.h"

namespace kv::test {
namespace {

// OCP FP8 from its definition: sign, exponent field E (bias), mantissa m of M bits;
// E = 0 is subnormal (m / 2^M * 2^(1 - bias)). Only finite codes are asked for.
double ocp_fp8(uint8_t c, bool e5m2) {
    const int M = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7;
    const int E = (c & 0x7f) >> M, m = c & ((1 << M) - 1);
    const double mag = E == 0 ? std::ldexp(double(m), 1 - bias - M) : std::ldexp(double((1 << M) + m), E - bias - M);
    return (c & 0x80) ? -mag : mag;
}

bool finite_code(uint8_t c, bool e5m2) { return e5m2 ? (c & 0x7c) != 0x7c : (c & 0x7f) != 0x7f; }

void run_codes(KernelBackend* be, const std::string& variant, bool e5m2) {
    const QuantFormat f = e5m2 ? QuantFormat::FP8_E5M2 : QuantFormat::FP8_E4M3;
    constexpr int64_t D = 24, T = 2;
    const int64_t rb = quant_row_bytes(f, D);
    ASSERT_EQ(rb, D + 4) << "an fp8 row: D codes, then its f32 scale";
    std::vector<uint8_t> codes;
    for (int c = 0; c < 256; ++c)
        if (finite_code(uint8_t(c), e5m2)) codes.push_back(uint8_t(c));
    const int64_t B = int64_t(codes.size());
    const float sk = 0.75f, sv = 1.25f;
    Tensor k = Tensor::zeros({B, 1, T, rb}, DType::U8), v = Tensor::zeros({B, 1, T, rb}, DType::U8);
    std::vector<float> qv(size_t(B * D), 0.0f);
    for (int64_t b = 0; b < B; ++b) {
        for (Tensor* t : {&k, &v}) {
            uint8_t* row = t->data<uint8_t>() + b * T * rb;
            std::memset(row, codes[size_t(b)], size_t(D));
            const float s = t == &k ? sk : sv;
            std::memcpy(row + D, &s, 4);
            std::memcpy(row + rb + D, &s, 4);  // key/value 1: zero codes, the same scale
        }
        const double x = ocp_fp8(codes[size_t(b)], e5m2) * sk;
        for (int64_t d = 0; d < D; ++d) qv[size_t(b * D + d)] = x == 0.0 ? 0.0f : float(1.0 / (double(D) * x));
    }
    Tensor q = Tensor::from_f32({B, 1, 1, D}, qv), y = Tensor::zeros({B, 1, 1, D}, DType::F32);
    ASSERT_TRUE(qrows_decode(be, f, q, k, v, y)) << variant;
    int bad = 0;
    for (int64_t b = 0; b < B; ++b) {
        const uint8_t code = codes[size_t(b)];
        const double x = ocp_fp8(code, e5m2);
        const double w0 = x == 0.0 ? 0.5 : 1.0 / (1.0 + std::exp(-1.0));  // key 0's softmax weight
        const double want = w0 * x * double(sv);
        for (int64_t d = 0; d < D; ++d) {
            const double got = y.data<float>()[b * D + d];
            if (std::fabs(got - want) > 2e-6 * std::fabs(want) + 1e-30 && bad++ < 8)
                ADD_FAILURE() << variant << (e5m2 ? " e5m2" : " e4m3") << " code 0x" << std::hex << int(code) << std::dec << " element "
                              << d << ": " << got << ", expected " << want;
        }
    }
    EXPECT_EQ(bad, 0) << variant << ": elements off";
}

TEST(QrowsFp8Codes, EveryFiniteCodeOnEveryVariant) {
    int ran = 0;
    for (const CpuVariant& var : cpu_variants()) {
        KernelBackend* be = cpu_variant_backend(var.name);
        if (!be) continue;  // not built, or this CPU cannot run it (op_consistency_test reports which)
        ++ran;
        run_codes(be, var.name, false);
        run_codes(be, var.name, true);
    }
    EXPECT_GE(ran, 1) << "no CPU kernel variant loaded";
}

}  // namespace
}  // namespace kv::test
