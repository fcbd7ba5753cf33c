// Gemma's scaled embeddings: transformers multiplies the looked-up rows by sqrt(hidden) cast to
// the weights' dtype, so a bf16 model scales by the bf16 value (sqrt(1152) = 33.94 -> 34).
#include <gtest/gtest.h>

#include <cmath>

#include "engine/model/presets.h"
#include "engine/model/transformer.h"
#include "kernels/common/dtype.h"

namespace kv {
namespace {

ModelConfig gemma_like(int64_t hidden) {
    ModelConfig c = preset_config("tiny-gemma3");
    c.hidden_size = hidden;
    c.intermediate_size = 2 * hidden;
    c.embedding_scale = std::sqrt(double(hidden));
    return c;
}

TEST(EmbeddingScale, Bf16ModelsScaleByTheBf16Value) {
    const ModelConfig c = gemma_like(1152);
    TensorMap w = random_weights(c, 7, DType::F32);
    const std::vector<int32_t> ids = {3, 70, 250};
    const Tensor idt = Tensor::from_i32({1, 3}, ids);
    const std::vector<double> table = w.at("model.embed_tokens.weight").to_f64_vector();
    for (DType dt : {DType::F32, DType::BF16}) {
        ModelOptions o;
        o.dtype = dt;
        Transformer m(c, w, o);
        const std::vector<double> got = m.embed(idt).to_f64_vector();
        // the scale as torch holds it in each dtype: 33.941125... in f32, 34 in bf16
        const double scale = dt == DType::BF16 ? 34.0 : double(float(std::sqrt(1152.0)));
        for (size_t t = 0; t < ids.size(); ++t)
            for (int64_t e = 0; e < 1152; e += 97) {
                double row = table[size_t(ids[t]) * 1152 + size_t(e)];
                double want = double(float(row) * float(scale));
                if (dt == DType::BF16) want = bf16_to_f32(f32_to_bf16(float(bf16_to_f32(f32_to_bf16(float(row))) * float(scale))));
                EXPECT_EQ(got[t * 1152 + size_t(e)], want) << (dt == DType::BF16 ? "bf16" : "f32") << " token " << ids[t] << " channel " << e;
            }
    }
}

}  // namespace
}  // namespace kv
