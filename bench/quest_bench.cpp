// Quest decode SDPA vs full attention (see quest_bench.h).
#include "quest_bench.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "ceilings.h"
#include "engine/core/error.h"
#include "engine/kv/buffers/kv_buffer.h"
#include "engine/ops/ops.h"

namespace kv::bench {

namespace {

// Keys with structure along the sequence (a slow drift per channel plus noise), as real keys
// have: uniform noise alone gives every page the same bound range.
Tensor keys_like(const Shape& s, uint32_t seed) {
    Tensor t = Tensor::empty(s, DType::F32, {Device{}, MemCategory::WORKSPACE, "bench input"});
    float* p = t.data<float>();
    uint32_t x = seed * 2654435761u + 1;
    const int64_t T = s[2], D = s[3];
    for (int64_t r = 0; r < s[0] * s[1]; ++r)
        for (int64_t j = 0; j < T; ++j)
            for (int64_t d = 0; d < D; ++d) {
                x ^= x << 13, x ^= x >> 17, x ^= x << 5;
                const float noise = float(x & 0xffff) / 32768.0f - 1.0f;
                p[(r * T + j) * D + d] = 0.5f * noise + std::sin(0.001f * float(j) * float(1 + d % 7) + float(d + r));
            }
    return t;
}

}  // namespace

std::vector<CacheBenchRow> run_quest_bench(const QuestBenchOptions& o, const std::function<void(int, int, const std::string&)>& progress) {
    std::vector<CacheBenchRow> rows;
    const int64_t NH = o.heads, G = o.kv_heads, D = o.head_dim, P = o.page;
    const float scale = 1.0f / std::sqrt(float(D));
    int done = 0;
    const int total = int(o.contexts.size());
    for (int64_t T : o.contexts) {
        progress(done++, total, str("context ", T));
        const int64_t NP = (T + P - 1) / P, pages = std::max<int64_t>(1, NP / o.fraction - 1);  // + the query's own page = 1/fraction
        Tensor q = keys_like({1, NH, 1, D}, 1);
        // One layer of a paged cache (blocks of the Quest page size), filled by its prefill;
        // both kernels read the same gathered K, V (the paged buffer's read()).
        KVCacheConfig kc;
        kc.name = "dense-default";
        kc.paged_block_size = P;
        BufferParams bp;
        bp.L = T, bp.G = G, bp.D = D;
        std::unique_ptr<KVBuffer> buf = make_buffer(kc, bp, nullptr);
        buf->allocate(1);
        buf->prefill(keys_like({1, G, T, D}, 2), keys_like({1, G, T, D}, 3));
        auto [k, v] = buf->read(T);
        std::vector<int32_t> kp((size_t)T);
        for (int64_t j = 0; j < T; ++j) kp[size_t(j)] = int32_t(j);
        Tensor kpos = Tensor::from_i32({1, 1, T}, kp), qpos = Tensor::from_i32({1, 1}, {int32_t(T - 1)});
        // Page minima and maxima, as the quest policy keeps them.
        const std::vector<float> kf = k.to_f32_vector();
        std::vector<float> mn((size_t)(G * NP * D), std::numeric_limits<float>::infinity()), mx(mn.size(), -std::numeric_limits<float>::infinity());
        for (int64_t g = 0; g < G; ++g)
            for (int64_t j = 0; j < T; ++j)
                for (int64_t d = 0; d < D; ++d) {
                    const size_t at = size_t((g * NP + j / P) * D + d);
                    mn[at] = std::min(mn[at], kf[size_t((g * T + j) * D + d)]);
                    mx[at] = std::max(mx[at], kf[size_t((g * T + j) * D + d)]);
                }
        Tensor kmin = Tensor::from_f32({1, G, NP, D}, mn), kmax = Tensor::from_f32({1, G, NP, D}, mx);
        Tensor y = Tensor::empty(q.shape(), DType::F32);
        double t_full = 1e30, t_quest = 1e30;
        for (int r = 0; r < 2; ++r) {  // interleaved, best of each: the machine is shared
            t_full = std::min(t_full, time_best([&] { ops::sdpa_(y, q, k, v, kpos, qpos, scale); }, o.min_seconds));
            t_quest = std::min(t_quest, time_best([&] { ops::sdpa_quest_(y, q, k, v, kpos, qpos, kmin, kmax, scale, P, pages); }, o.min_seconds));
        }
        const double t_read = time_best([&] { (void)buf->read(T); }, o.min_seconds);
        // Bytes a decode step reads: all of K and V, or per head its pages' K and V plus the
        // page minima and maxima of its group.
        const double b_full = double(2 * G * T * D * 4), b_quest = double(NH * (pages + 1) * P * D * 4 * 2 + 2 * G * NP * D * 4);
        rows.push_back({str("decode sdpa quest 1/", o.fraction, " pages / full at ", T, ": bytes read"), b_quest, b_full, "bytes",
                        b_quest / b_full, 0, true});
        rows.push_back({str("decode sdpa quest 1/", o.fraction, " pages / full at ", T, ": time"), t_quest * 1e3, t_full * 1e3, "ms",
                        t_quest / t_full, T == o.contexts.back() ? 1.0 / 3.0 : 0.0, true});
        rows.push_back({str("  paged gather read(T) / full sdpa at ", T, " (both paths pay it)"), t_read * 1e3, t_full * 1e3, "ms",
                        t_read / t_full, 0, true});
    }
    progress(total, total, "");
    return rows;
}

}  // namespace kv::bench
