// The sink softmax's definition in f64, for the sink tests of the CPU SDPA ops (full-precision
// and KIVI caches): gpt-oss's learned per-head logit joins each row's softmax denominator and
// carries no value. y (B, NH, n, HS) and the weight sums per KV head (B, G, T), averaged over
// the group's query heads; a window > 0 keeps keys with pq - window < pk <= pq.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace kv::test {

struct SinkAttentionShape {
    int64_t B, NH, G, n, T, HS;
    int window;
};

struct SinkAttentionRef {
    std::vector<double> y, w;
};

// q (B, NH, n, HS); k, v (B, G, T, HS); kpos (B, G, T); qpos (n); sinks (NH) or null (none).
inline SinkAttentionRef sink_attention_f64(const SinkAttentionShape& s, const std::vector<double>& q, const std::vector<double>& k,
                                           const std::vector<double>& v, const std::vector<int64_t>& kpos, const std::vector<int64_t>& qpos,
                                           double scale, const std::vector<double>* sinks) {
    const int64_t R = s.NH / s.G;
    SinkAttentionRef r;
    r.y.assign(size_t(s.B * s.NH * s.n * s.HS), 0.0);
    r.w.assign(size_t(s.B * s.G * s.T), 0.0);
    for (int64_t b = 0; b < s.B; ++b)
        for (int64_t h = 0; h < s.NH; ++h) {
            const int64_t g = h / R;
            for (int64_t i = 0; i < s.n; ++i) {
                const double pq = double(qpos[size_t(i)]);
                std::vector<double> logit;  // visible scores, then the sink
                std::vector<int64_t> slot;
                for (int64_t j = 0; j < s.T; ++j) {
                    const double pk = double(kpos[size_t((b * s.G + g) * s.T + j)]);
                    if (!(pk <= pq && (s.window <= 0 || pk > pq - s.window))) continue;
                    double dot = 0;
                    for (int64_t d = 0; d < s.HS; ++d)
                        dot += q[size_t(((b * s.NH + h) * s.n + i) * s.HS + d)] * k[size_t(((b * s.G + g) * s.T + j) * s.HS + d)];
                    logit.push_back(scale * dot);
                    slot.push_back(j);
                }
                if (slot.empty()) continue;  // sees nothing: y = 0 (the sink has no value)
                if (sinks) logit.push_back((*sinks)[size_t(h)]);
                const double mx = *std::max_element(logit.begin(), logit.end());
                double z = 0;
                for (double x : logit) z += std::exp(x - mx);
                for (size_t e = 0; e < slot.size(); ++e) {
                    const double a = std::exp(logit[e] - mx) / z;
                    const int64_t j = slot[e];
                    r.w[size_t((b * s.G + g) * s.T + j)] += a / double(R);
                    for (int64_t d = 0; d < s.HS; ++d)
                        r.y[size_t(((b * s.NH + h) * s.n + i) * s.HS + d)] += a * v[size_t(((b * s.G + g) * s.T + j) * s.HS + d)];
                }
            }
        }
    return r;
}

// max |got - want| / max |want|.
inline double max_rel(const std::vector<double>& got, const std::vector<double>& want) {
    double err = 0, scale = 1e-300;
    for (size_t i = 0; i < got.size(); ++i) err = std::max(err, std::abs(got[i] - want[i])), scale = std::max(scale, std::abs(want[i]));
    return err / scale;
}

}  // namespace kv::test
