// SDPA_QROWS reads every E2M1 (FP4) code (both zeros, subnormal 0.5, both signs, the largest
// value 6) as its OCP value, in NVFP4 and MXFP4 rows, on every CPU kernel variant this CPU
// runs. One batch row per code: key 0 and value 0 hold the code in every element, key 1 and
// value 1 are zero codes (the same scales); the query is chosen from the code's value so that
// key 0 scores 1 and key 1 scores 0, so the output is sigmoid(1) * value in every element. A
// misread key moves the weight, a misread value the output. NVFP4 at D = 48 runs pairs of
// 16-element blocks and a lone block; its block scale is E4M3 1.0 times a per-row f32 scale
// (0.75 keys, 1.25 values); MXFP4's E8M0 block scale is 2^-1 (keys) or 2^1 (values). The
// expected values are the format definitions, in f64, here.
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

// OCP E2M1: sign, exponent field E (bias 1), one mantissa bit m; E = 0 is subnormal (m / 2).
double ocp_e2m1(int c) {
    const int E = (c >> 1) & 3, m = c & 1;
    const double mag = E == 0 ? 0.5 * m : std::ldexp(1.0 + 0.5 * m, E - 1);
    return (c & 8) ? -mag : mag;
}

// One row of D elements, every element code c, with the block scale making each value
// ocp_e2m1(c) * scale.
void fill_row(QuantFormat f, int64_t D, int c, double scale, uint8_t* row) {
    const uint8_t both = uint8_t(c | (c << 4));
    if (f == QuantFormat::NVFP4) {  // D / 2 code bytes (low nibble first), D / 16 E4M3 scales, f32 scale
        std::memset(row, both, size_t(D / 2));
        std::memset(row + D / 2, 0x38, size_t(D / 16));  // E4M3 1.0: exponent field 7 = bias
        const float s = float(scale);
        std::memcpy(row + D / 2 + D / 16, &s, 4);
        return;
    }
    for (int64_t b = 0; b < D / 32; ++b) {  // MXFP4 blocks: an E8M0 scale 2^(e - 127), 16 code bytes
        row[b * 17] = uint8_t(127 + std::lround(std::log2(scale)));
        std::memset(row + b * 17 + 1, both, 16);
    }
}

void run_codes(KernelBackend* be, const std::string& variant, QuantFormat f, int64_t D, double sk, double sv) {
    const std::string fname = f == QuantFormat::NVFP4 ? "nvfp4" : "mxfp4";
    constexpr int64_t T = 2, B = 16;
    const int64_t rb = quant_row_bytes(f, D);
    Tensor k = Tensor::zeros({B, 1, T, rb}, DType::U8), v = Tensor::zeros({B, 1, T, rb}, DType::U8);
    std::vector<float> qv(size_t(B * D), 0.0f);
    for (int64_t b = 0; b < B; ++b) {
        fill_row(f, D, int(b), sk, k.data<uint8_t>() + b * T * rb);
        fill_row(f, D, 0, sk, k.data<uint8_t>() + b * T * rb + rb);
        fill_row(f, D, int(b), sv, v.data<uint8_t>() + b * T * rb);
        fill_row(f, D, 0, sv, v.data<uint8_t>() + b * T * rb + rb);
        const double x = ocp_e2m1(int(b)) * sk;
        for (int64_t d = 0; d < D; ++d) qv[size_t(b * D + d)] = x == 0.0 ? 0.0f : float(1.0 / (double(D) * x));
    }
    Tensor q = Tensor::from_f32({B, 1, 1, D}, qv), y = Tensor::zeros({B, 1, 1, D}, DType::F32);
    ASSERT_TRUE(qrows_decode(be, f, q, k, v, y)) << variant << " " << fname;
    int bad = 0;
    for (int64_t b = 0; b < B; ++b) {
        const double x = ocp_e2m1(int(b));
        const double w0 = x == 0.0 ? 0.5 : 1.0 / (1.0 + std::exp(-1.0));  // key 0's softmax weight
        const double want = w0 * x * sv;
        for (int64_t d = 0; d < D; ++d) {
            const double got = y.data<float>()[b * D + d];
            if (std::fabs(got - want) > 2e-6 * std::fabs(want) + 1e-30 && bad++ < 8)
                ADD_FAILURE() << variant << " " << fname << " code " << b << " element " << d << ": " << got << ", expected " << want;
        }
    }
    EXPECT_EQ(bad, 0) << variant << " " << fname << ": elements off";
}

TEST(QrowsFp4Codes, EveryCodeOnEveryVariant) {
    int ran = 0;
    for (const CpuVariant& var : cpu_variants()) {
        KernelBackend* be = cpu_variant_backend(var.name);
        if (!be) continue;  // not built, or this CPU cannot run it (op_consistency_test reports which)
        ++ran;
        run_codes(be, var.name, QuantFormat::NVFP4, 48, 0.75, 1.25);
        run_codes(be, var.name, QuantFormat::MXFP4, 64, 0.5, 2.0);
    }
    EXPECT_GE(ran, 1) << "no CPU kernel variant loaded";
}

}  // namespace
}  // namespace kv::test
