// Phi-3 LongRoPE against its definition (transformers' _compute_longrope_parameters and the
// rotary embedding that scales cos and sin by the attention factor), written here in f64:
//   inv_freq_d = 1 / (factor_d * base^(2d / m)),  factor = short while the context <= original,
//   long beyond it;  a = sqrt(1 + ln(max / original) / ln(original)) (1 if max <= original),
//   cos/sin tables = a * cos(p inv_freq_d), a * sin(p inv_freq_d); the scores' scale untouched.
// (Logits of whole models: ModelFixture/phi3_longrope_{short,long}.)
#include <gtest/gtest.h>

#include <cmath>

#include "engine/model/rope.h"

namespace kv {
namespace {

ModelConfig phi3_longrope() {
    ModelConfig c;
    c.arch = Arch::PHI3;
    c.vocab_size = 97, c.hidden_size = 64, c.intermediate_size = 48, c.num_layers = 2;
    c.num_heads = 4, c.num_kv_heads = 2, c.head_dim = 16;
    c.partial_rotary_factor = 0.5;  // 8 rotated channels: 4 pairs
    c.max_position_embeddings = 256;
    c.rope_theta = 10000.0;
    c.rope_scaling.type = "longrope";
    c.rope_scaling.original_max_position_embeddings = 32;
    c.rope_scaling.short_factor = {1.0, 1.3, 2.1, 3.0};
    c.rope_scaling.long_factor = {1.5, 4.0, 9.0, 17.0};
    c.validate("test");
    return c;
}

TEST(LongRope, FrequenciesAndTablesFollowTheDefinition) {
    const ModelConfig c = phi3_longrope();
    const double a = std::sqrt(1.0 + std::log(256.0 / 32.0) / std::log(32.0));
    for (RopeMode mode : {RopeMode::YARN, RopeMode::HF}) {
        for (int64_t width : {int64_t(32), int64_t(33), int64_t(200)}) {
            SCOPED_TRACE(std::string(rope_mode_name(mode)) + " width " + std::to_string(width));
            const std::vector<double>& fac = width > 32 ? c.rope_scaling.long_factor : c.rope_scaling.short_factor;
            const RopeTables t = build_rope_tables(c, width, mode, Device{});
            ASSERT_EQ(t.n_rot, 8);
            EXPECT_FLOAT_EQ(t.attn_scale, float(1.0 / std::sqrt(16.0)));  // the factor is in the tables, not the scale
            const std::vector<float> cs = t.cos.to_f32_vector(), sn = t.sin.to_f32_vector();
            for (int64_t d = 0; d < 4; ++d) {
                const double inv = 1.0 / (fac[size_t(d)] * std::pow(10000.0, 2.0 * double(d) / 8.0));
                EXPECT_NEAR(t.inv_freq[size_t(d)], inv, 1e-15 * inv) << d;
                for (int64_t p : {int64_t(0), int64_t(1), width - 1}) {
                    EXPECT_NEAR(cs[size_t(p * 4 + d)], a * std::cos(double(p) * inv), 2e-7) << p << "," << d;
                    EXPECT_NEAR(sn[size_t(p * 4 + d)], a * std::sin(double(p) * inv), 2e-7) << p << "," << d;
                }
            }
        }
    }
    // PLAIN mode: the base frequencies, no factor.
    const RopeTables plain = build_rope_tables(c, 200, RopeMode::PLAIN, Device{});
    EXPECT_NEAR(plain.cos.to_f32_vector()[0], 1.0, 1e-7);
    EXPECT_DOUBLE_EQ(plain.inv_freq[1], std::pow(10000.0, -2.0 / 8.0));
}

TEST(LongRope, ExplicitAttentionFactorAndNoExtension) {
    ModelConfig c = phi3_longrope();
    c.rope_scaling.attention_factor = 1.7;
    EXPECT_NEAR(build_rope_tables(c, 8, RopeMode::HF, Device{}).cos.to_f32_vector()[0], 1.7, 1e-6);
    c.rope_scaling.attention_factor = 0.0;
    c.max_position_embeddings = 32;  // max <= original: factor 1
    EXPECT_NEAR(build_rope_tables(c, 8, RopeMode::HF, Device{}).cos.to_f32_vector()[0], 1.0, 1e-7);
}

TEST(LongRope, WrongFactorCountIsRefused) {
    ModelConfig c = phi3_longrope();
    c.rope_scaling.long_factor.pop_back();
    try {
        c.validate("config.json");
        FAIL() << "expected a refusal";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("expected one per rotated channel pair: 4"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace kv
