// Attention over a per-head slot pool (engine/kv/layer_cache.h pooled_attention, used by the
// ada-* and duo policies and their gradient replay): each head group attends over exactly the
// slots it keeps, causally by position, against an f64 reference written from the definition
// (softmax over the group's visible slots); the weight sums are those slots' weights summed over
// queries and averaged over the group's heads, and exactly 0 on every slot the group does not
// keep. Batch rows keep different numbers of slots per group (the padded case).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "engine/kv/layer_cache.h"
#include "tests/support/test_support.h"

namespace kv::test {
namespace {

TEST(PooledAttention, EachGroupAttendsOverExactlyItsOwnSlotsAsTheF64Reference) {
    const int64_t B = 2, G = 3, R = 2, NH = G * R, S = 13, D = 5, n = 3, P = 20;
    const float scale = 0.6f;
    std::mt19937_64 rng(seed_for("pooled attention"));
    std::uniform_real_distribution<double> U(-1, 1);
    auto rnd = [&](int64_t m) {
        std::vector<double> x((size_t)m);
        for (double& e : x) e = U(rng);
        return x;
    };
    // Every slot of a row belongs to one group (or none, -1); its token's position is below
    // the chunk, inside it (seen by later queries only) or absent.
    std::vector<int32_t> pos((size_t)(B * G * S), -1);
    std::uniform_int_distribution<int> owner(-1, int(G) - 1), where(0, P + int(n) - 1);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t s = 0; s < S; ++s) {
            const int o = owner(rng);
            if (o >= 0) pos[size_t((b * G + o) * S + s)] = where(rng);
        }
    // Every group sees a slot in each row, at different slots per row, so counts differ.
    for (int64_t g = 0; g < G; ++g)
        for (int64_t o = 0; o < G; ++o) pos[size_t((0 * G + o) * S + g)] = pos[size_t((1 * G + o) * S + S - 1 - g)] = -1;
    for (int64_t g = 0; g < G; ++g) pos[size_t((0 * G + g) * S + g)] = pos[size_t((1 * G + g) * S + S - 1 - g)] = int32_t(g);
    for (int64_t b = 0; b < B; ++b)  // one owner per slot
        for (int64_t s = 0; s < S; ++s) {
            int owners = 0;
            for (int64_t g = 0; g < G; ++g) owners += pos[size_t((b * G + g) * S + s)] >= 0;
            ASSERT_LE(owners, 1);
        }
    const std::vector<double> qv = rnd(B * NH * n * D), kv_ = rnd(B * S * D), vv = rnd(B * S * D);
    Tensor q = Tensor::from_f64({B, NH, n, D}, qv), K = Tensor::from_f64({B, 1, S, D}, kv_), V = Tensor::from_f64({B, 1, S, D}, vv);
    std::vector<int32_t> qp((size_t)n);
    for (int64_t i = 0; i < n; ++i) qp[size_t(i)] = int32_t(P + i);
    Tensor qpos = Tensor::from_i32({1, n}, qp);
    Tensor y = Tensor::empty({B, NH, n, D}, DType::F64), w = Tensor::empty({B, G, S}, DType::F32);
    pooled_attention(y, q, K, V, pos, G, qpos, scale, &w);
    const std::vector<double> got = y.to_f64_vector();
    const std::vector<float> gw = w.to_f32_vector();

    std::vector<double> ref_w((size_t)(B * G * S), 0.0);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < NH; ++h)
            for (int64_t i = 0; i < n; ++i) {
                const int64_t g = h / R;
                const int32_t* p = pos.data() + (b * G + g) * S;
                std::vector<double> e((size_t)S, 0.0);
                double mx = -INFINITY, z = 0;
                for (int64_t s = 0; s < S; ++s)
                    if (p[s] >= 0 && p[s] <= qp[size_t(i)]) {
                        double dot = 0;
                        for (int64_t d = 0; d < D; ++d) dot += qv[size_t(((b * NH + h) * n + i) * D + d)] * kv_[size_t((b * S + s) * D + d)];
                        e[size_t(s)] = double(scale) * dot;
                        mx = std::max(mx, e[size_t(s)]);
                    }
                for (int64_t s = 0; s < S; ++s)
                    if (p[s] >= 0 && p[s] <= qp[size_t(i)]) z += std::exp(e[size_t(s)] - mx);
                for (int64_t d = 0; d < D; ++d) {
                    double acc = 0;
                    for (int64_t s = 0; s < S; ++s)
                        if (p[s] >= 0 && p[s] <= qp[size_t(i)]) acc += std::exp(e[size_t(s)] - mx) / z * vv[size_t((b * S + s) * D + d)];
                    EXPECT_NEAR(got[size_t(((b * NH + h) * n + i) * D + d)], acc, 1e-12) << "b " << b << " head " << h << " query " << i;
                }
                for (int64_t s = 0; s < S; ++s)
                    if (p[s] >= 0 && p[s] <= qp[size_t(i)]) ref_w[size_t((b * G + g) * S + s)] += std::exp(e[size_t(s)] - mx) / z / double(R);
            }
    for (int64_t b = 0; b < B; ++b)
        for (int64_t g = 0; g < G; ++g)
            for (int64_t s = 0; s < S; ++s) {
                const size_t i = size_t((b * G + g) * S + s);
                if (pos[i] < 0) EXPECT_EQ(gw[i], 0.0f) << "group " << g << " got weight on slot " << s << " it does not keep";
                else EXPECT_NEAR(gw[i], ref_w[i], 1e-6) << "b " << b << " group " << g << " slot " << s;
            }
}

}  // namespace
}  // namespace kv::test
