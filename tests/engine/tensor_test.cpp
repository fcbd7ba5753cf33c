// Tensor views and copies: views share storage and index correctly; copies convert dtypes;
// shape errors name the shapes.
#include <gtest/gtest.h>

#include "engine/core/error.h"
#include "engine/core/tensor.h"

namespace kv {
namespace {

Tensor iota(const Shape& s, DType dt = DType::F32) {
    std::vector<double> v((size_t)s.numel());
    for (size_t i = 0; i < v.size(); ++i) v[i] = double(i);
    return Tensor::from_f64(s, v, dt);
}

TEST(Tensor, SliceSelectTransposePermuteShareStorage) {
    Tensor t = iota({2, 3, 4});
    Tensor s = t.slice(2, 1, 3);  // (2,3,2)
    EXPECT_EQ(s.shape(), Shape({2, 3, 2}));
    EXPECT_FALSE(s.is_contiguous());
    std::vector<float> v = s.to_f32_vector();
    // element (i,j,k) of s = t(i,j,k+1) = i*12 + j*4 + k + 1
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 3; ++j)
            for (int k = 0; k < 2; ++k) EXPECT_EQ(v[size_t(i * 6 + j * 2 + k)], float(i * 12 + j * 4 + k + 1));
    Tensor r = t.select(1, 2);  // (2,4) = t(i,2,k)
    EXPECT_EQ(r.to_f32_vector()[5], float(1 * 12 + 2 * 4 + 1));
    Tensor tr = t.transpose(0, 2);  // (4,3,2)
    EXPECT_EQ(tr.to_f32_vector()[1], float(12));  // (0,0,1) -> t(1,0,0)
    Tensor p = t.permute({1, 2, 0});  // (3,4,2)
    EXPECT_EQ(p.shape(), Shape({3, 4, 2}));
    EXPECT_EQ(p.to_f32_vector()[1], float(12));  // (0,0,1) -> t(1,0,0)
    EXPECT_EQ(s.storage().get(), t.storage().get());
    // Writing through a view is visible in the base.
    Tensor col = t.slice(2, 3, 4);
    col.fill(-1.0);
    EXPECT_EQ(t.to_f32_vector()[3], -1.0f);
    EXPECT_EQ(t.to_f32_vector()[4], 4.0f);
}

TEST(Tensor, ReshapeExpandUnsqueeze) {
    Tensor t = iota({6, 4});
    Tensor r = t.reshape({2, -1, 4});
    EXPECT_EQ(r.shape(), Shape({2, 3, 4}));
    EXPECT_THROW(t.transpose(0, 1).reshape({24}), Error);
    EXPECT_THROW(t.reshape({5, 5}), Error);
    Tensor e = iota({1, 4}).expand({3, 4});
    EXPECT_EQ(e.stride(0), 0);
    std::vector<float> v = e.contiguous().to_f32_vector();
    EXPECT_EQ(v[8], 0.0f);
    EXPECT_EQ(v[11], 3.0f);
    Tensor u = t.unsqueeze(1);
    EXPECT_EQ(u.shape(), Shape({6, 1, 4}));
    EXPECT_EQ(u.squeeze(1).shape(), Shape({6, 4}));
}

TEST(Tensor, ASizeOneLastDimWithStrideZeroReadsItsOwnElements) {
    // (3, 1) over elements 0, 2, 4 with a stride-0 last dim: the copy walks the rows, not the
    // first element three times (the flat path once took the last dim's stride as the step).
    Tensor t = iota({6});
    Tensor v = t.as_strided({3, 1}, {2, 0}, 0);
    EXPECT_EQ(v.to_f32_vector(), (std::vector<float>{0, 2, 4}));
    EXPECT_EQ(t.as_strided({2, 1}, {1, 0}, 3).to_i64_vector(), (std::vector<int64_t>{3, 4}));
}

TEST(Tensor, OutOfRangeViewsAreErrors) {
    Tensor t = iota({3, 4});
    EXPECT_THROW(t.slice(1, 2, 5), Error);
    EXPECT_THROW(t.select(0, 3), Error);
    EXPECT_THROW(t.transpose(0, 2), Error);
    EXPECT_THROW(t.as_strided({3, 5}, {4, 1}, 0), Error);
    try {
        t.slice(1, 3, 9);
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("size 4"), std::string::npos) << e.what();
    }
}

TEST(Tensor, CopyConvertsAndKeepsIntegers) {
    Tensor t = iota({5, 3}, DType::F32);
    Tensor b = t.to(DType::BF16).to(DType::F64);
    EXPECT_EQ(b.to_f64_vector()[14], 14.0);
    Tensor big = Tensor::from_i64({2}, {(int64_t(1) << 40) + 3, -7});
    std::vector<int64_t> back = big.to(DType::I32).to(DType::I64).to_i64_vector();
    EXPECT_EQ(back[1], -7);
    EXPECT_EQ(big.to_i64_vector()[0], (int64_t(1) << 40) + 3);
    Tensor c = t.transpose(0, 1).contiguous();
    EXPECT_TRUE(c.is_contiguous());
    EXPECT_EQ(c.to_f32_vector()[1], 3.0f);
}

TEST(Tensor, ZeroSizedTensorsAreFine) {
    Tensor z = Tensor::empty({0, 4}, DType::F32);
    EXPECT_EQ(z.numel(), 0);
    Tensor c = z.clone();
    EXPECT_EQ(c.numel(), 0);
    EXPECT_TRUE(c.to_f32_vector().empty());
}

}  // namespace
}  // namespace kv
