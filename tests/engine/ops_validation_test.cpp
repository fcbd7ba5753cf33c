// Misuse of the engine ops gives one clear message naming the op and what was expected.
#include <gtest/gtest.h>

#include <functional>

#include "engine/core/error.h"
#include "engine/ops/ops.h"

namespace kv {
namespace {

std::string message_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "<no error>";
}

TEST(OpsValidation, MatmulShapesAndDtypes) {
    Tensor a = Tensor::zeros({3, 4}, DType::F32), b = Tensor::zeros({5, 6}, DType::F32);
    EXPECT_NE(message_of([&] { ops::matmul(a, b); }).find("matmul: inner dimensions differ: (3, 4) @ (5, 6)"), std::string::npos);
    Tensor c = Tensor::zeros({4, 6}, DType::BF16);
    EXPECT_NE(message_of([&] { ops::matmul(a, c); }).find("input dtypes differ"), std::string::npos);
    Tensor out = Tensor::zeros({3, 7}, DType::F32), d = Tensor::zeros({4, 6}, DType::F32);
    EXPECT_NE(message_of([&] { ops::matmul_(out, a, d); }).find("output (3, 7) does not match"), std::string::npos);
}

// SDPA over quantized rows names the formats and the layout it expects: a row width that does
// not match the key format, and a format it does not read (q8 keeps the working buffer).
TEST(OpsValidation, QuantizedRowAttentionLayout) {
    const int64_t D = 64, T = 10;
    Tensor q = Tensor::zeros({1, 2, 1, D}, DType::F32), y = Tensor::zeros({1, 2, 1, D}, DType::F32);
    Tensor k = Tensor::zeros({1, 1, T, quant_row_bytes(QuantFormat::FP8_E4M3, D)}, DType::U8);
    Tensor v_bad = Tensor::zeros({1, 1, T, quant_row_bytes(QuantFormat::NVFP4, D) + 1}, DType::U8);
    Tensor kpos = Tensor::zeros({1, 1, T}, DType::I32), qpos = Tensor::zeros({1, 1}, DType::I32);
    std::string m = message_of([&] {
        ops::sdpa_qrows_(y, q, k, v_bad, QuantFormat::FP8_E4M3, QuantFormat::NVFP4, QuantLevels{}, kpos, qpos, 0.125f);
    });
    EXPECT_NE(m.find("sdpa_qrows: inconsistent quantized rows"), std::string::npos) << m;
    EXPECT_NE(m.find("nvfp4"), std::string::npos) << m;
    Tensor kq8 = Tensor::zeros({1, 1, T, quant_row_bytes(QuantFormat::Q8, D)}, DType::U8);
    m = message_of([&] { ops::sdpa_qrows_(y, q, kq8, kq8, QuantFormat::Q8, QuantFormat::Q8, QuantLevels{}, kpos, qpos, 0.125f); });
    EXPECT_NE(m.find("an fp8, fp4 or TurboQuant format"), std::string::npos) << m;
}

TEST(OpsValidation, IndexRangesAreChecked) {
    Tensor table = Tensor::zeros({10, 4}, DType::F32);
    Tensor ids = Tensor::from_i32({3}, {1, 10, 2});
    std::string m = message_of([&] { ops::embedding(table, ids); });
    EXPECT_NE(m.find("token id 10 at element 1 is out of range [0, 10)"), std::string::npos) << m;
    Tensor src = Tensor::zeros({2, 5}, DType::F32);
    Tensor idx = Tensor::from_i64({2, 1}, {0, -1});
    m = message_of([&] { ops::gather(src, 1, idx); });
    EXPECT_NE(m.find("index -1"), std::string::npos) << m;
    // An expanded index (stride 0 along the head dim, as the pooled attention gathers slots) is
    // checked once per distinct value, and a bad one is still named at its element of the whole.
    Tensor kv = Tensor::zeros({1, 1, 6, 3}, DType::F32);
    Tensor slots = Tensor::from_i32({1, 1, 2, 1}, {4, 6}).expand({1, 1, 2, 3});
    m = message_of([&] { ops::gather(kv, 2, slots); });
    EXPECT_NE(m.find("index 6 at element 3 is out of range [0, 6)"), std::string::npos) << m;
    Tensor good = Tensor::from_i32({1, 1, 2, 1}, {5, 0}).expand({1, 1, 2, 3});
    EXPECT_EQ(message_of([&] { ops::gather(kv, 2, good); }), "<no error>");
}

TEST(OpsValidation, BroadcastAndRopeTables) {
    Tensor a = Tensor::zeros({2, 3}, DType::F32), b = Tensor::zeros({3, 2}, DType::F32);
    EXPECT_NE(message_of([&] { ops::add(a, b); }).find("do not broadcast"), std::string::npos);
    Tensor x = Tensor::zeros({1, 2, 3, 8}, DType::F32);
    Tensor pos = Tensor::from_i32({1, 3}, {0, 1, 99});
    Tensor cs = Tensor::zeros({16, 4}, DType::F32), sn = Tensor::zeros({16, 4}, DType::F32);
    std::string m = message_of([&] { ops::rope(x, pos, cs, sn); });
    EXPECT_NE(m.find("position 99 is outside the RoPE table of 16 positions"), std::string::npos) << m;
    EXPECT_NE(message_of([&] { ops::rope(x, pos, cs, sn, 3); }).find("n_rot 3 must be even"), std::string::npos);
}

TEST(OpsValidation, RmsnormWeight) {
    Tensor x = Tensor::zeros({2, 8}, DType::F32), w = Tensor::zeros({7}, DType::F32);
    EXPECT_NE(message_of([&] { ops::rmsnorm(x, w, 1e-6f); }).find("weight (7,) must be 1-D of the input's last size 8"),
              std::string::npos);
}

}  // namespace
}  // namespace kv
