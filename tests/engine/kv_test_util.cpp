// KV-cache test harness (see kv_test_util.h).
#include "kv_test_util.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include "engine/core/error.h"
#include "engine/run/run_config.h"

namespace kv::test {

const TextCodec& byte_codec() {
    static const TextCodec c{[](const std::vector<int32_t>& ids) {
                                 std::string s;
                                 for (int32_t i : ids) s += char(uint8_t(i));
                                 return s;
                             },
                             [](const std::string& s) {
                                 std::vector<int32_t> ids;
                                 for (char ch : s) ids.push_back(int32_t(uint8_t(ch)));
                                 return ids;
                             }};
    return c;
}

void apply_required_options(KVCacheConfig& cfg) {
    const PolicyInfo* info = find_policy(cfg.policy());
    if (!info) return;
    RunConfig rc;
    rc.kv_cache = cfg;
    for (const auto& [name, value] : info->required) set_run_option(rc, name, value);
    cfg = rc.kv_cache;
}

std::unique_ptr<KVPolicy> make_test_policy(const std::string& name, int64_t L) {
    KVCacheConfig cfg;
    cfg.name = name;
    cfg.cache_length = L;
    apply_required_options(cfg);
    return make_policy(cfg, L, 2, &byte_codec());
}

LayerHarness::LayerHarness(const std::string& name, int64_t L_, uint64_t seed, int64_t grace, int64_t D_) : L(L_), rng(seed) {
    D = D_;
    build(name, grace);
}

LayerHarness::LayerHarness(const std::string& name, int64_t L_, const LayerActivations& acts) : L(L_), given(&acts) {
    B = acts.B, G = acts.G, NH = acts.NH, D = acts.D;
    build(name, 0);
}

void LayerHarness::build(const std::string& name, int64_t grace) {
    cfg.name = name;
    cfg.cache_length = L;
    cfg.grace_period = grace;
    apply_required_options(cfg);
    model.vocab_size = 16;
    model.hidden_size = NH * D;
    model.intermediate_size = 8;
    model.num_layers = 1;
    model.num_heads = NH;
    model.num_kv_heads = G;
    model.head_dim = D;
    model.max_position_embeddings = 4096;
    cache = std::make_unique<KVCache>(cfg, model, Device{}, DType::F32, 0, &byte_codec());
    cache->set_replay_logging(true);
    history.resize(size_t(B * G));
}

// Positions [P, P + n) of one (B, H, T, D) activation of `a` as a (B, H, n, D) tensor.
static Tensor given_slice(const std::vector<float>& all, int64_t B, int64_t H, int64_t T, int64_t D, int64_t P, int64_t n) {
    if (P + n > T) throw Error(str("the given activations hold ", T, " positions; position ", P + n - 1, " was asked for"));
    std::vector<float> out;
    out.reserve(size_t(B * H * n * D));
    for (int64_t bh = 0; bh < B * H; ++bh) out.insert(out.end(), all.begin() + (bh * T + P) * D, all.begin() + (bh * T + P + n) * D);
    return Tensor::from_f32({B, H, n, D}, out);
}

Tensor LayerHarness::step(int64_t n) {
    Tensor q, k, v;
    if (given) {
        q = given_slice(given->q, B, NH, given->T, D, P, n);
        k = given_slice(given->k, B, G, given->T, D, P, n);
        v = given_slice(given->v, B, G, given->T, D, P, n);
    } else {
        q = random_tensor({B, NH, n, D}, DType::F32, rng, -2.0, 2.0);
        k = random_tensor({B, G, n, D}, DType::F32, rng, -2.0, 2.0);
        v = random_tensor({B, G, n, D}, DType::F32, rng, -2.0, 2.0);
    }
    std::vector<float> kv_ = k.to_f32_vector(), vv = v.to_f32_vector();
    for (int64_t r = 0; r < B * G; ++r)
        for (int64_t t = 0; t < n; ++t) {
            std::vector<float> kr(kv_.begin() + (r * n + t) * D, kv_.begin() + (r * n + t + 1) * D);
            std::vector<float> vr(vv.begin() + (r * n + t) * D, vv.begin() + (r * n + t + 1) * D);
            history[size_t(r)][P + t] = {kr, vr};
        }
    Tensor y = Tensor::empty({B, NH, n, D}, DType::F32);
    last_h = random_tensor({B, n, NH * D}, DType::F32, hidden_rng, -2.0, 2.0);
    cache->set_layer_input(0, last_h);
    {
        const std::vector<float> hv = last_h.to_f32_vector();
        const int64_t E = NH * D;
        hidden_history.resize(size_t(B));
        for (int64_t b = 0; b < B; ++b)
            for (int64_t t = 0; t < n; ++t)
                hidden_history[size_t(b)][P + t] = std::vector<float>(hv.begin() + (b * n + t) * E, hv.begin() + (b * n + t + 1) * E);
    }
    cache->attend(0, q, k, v, P, 1.0f / std::sqrt(float(D)), 0, y);
    last_q = {q};
    all_q.push_back({P, q});
    last_k = {k};
    last_v = {v};
    P += n;
    return y;
}

double buffer_tolerance(const std::string& buffer, const std::vector<float>& all, const std::vector<float>& head) {
    auto range = [](const std::vector<float>& v) {
        float lo = v[0], hi = v[0];
        for (float x : v) lo = std::min(lo, x), hi = std::max(hi, x);
        return double(hi) - double(lo);
    };
    auto amax = [](const std::vector<float>& v) {
        double m = 0;
        for (float x : v) m = std::max(m, std::fabs(double(x)));
        return m;
    };
    // Rows may span all heads (blocks over heads), so bound with the wider row.
    const double r = std::max(range(all), range(head)), a = std::max(amax(all), amax(head));
    // q8 / q4 (torch's affine quantization): the zero point is rounded, which shifts the grid by
    // up to half a step, so the row's maximum can round one level past the top and be clamped:
    // the worst error is one step, not half of one (seen at the top of a row, e.g. seed 2822855345).
    if (buffer == "q8") return r / 255.0 + 1e-5;
    if (buffer == "q4") return r / 15.0 + 1e-5;
    if (buffer == "nf4") return a * 0.16 + 1e-5;
    if (buffer == "q8_0") return a / 127.0 * 0.57 + 1e-5;
    if (buffer == "q4_0") return a / 8.0 * 1.01 + 1e-5;
    // FP8: half a code step, relative 2^-4 (E4M3) / 2^-3 (E5M2) of the row's largest value.
    // NVFP4: at most the block scale bamax / 6 (+ 1/16 for its E4M3 rounding); MXFP4: 2 X <= amax / 2.
    if (buffer == "fp8_e4m3") return a / 16.0 + 1e-5;
    if (buffer == "fp8_e5m2") return a / 8.0 + 1e-5;
    if (buffer == "nvfp4") return a / 6.0 * 1.07 + 1e-5;
    if (buffer == "mxfp4") return a / 2.0 + 1e-5;
    // TurboQuant (kernels/turboquant_test.cpp has the tight checks): keys decode to a row of the
    // same norm (|e| <= 2 |x|); values are within half a step s <= 2 |x| / (2^b - 1) per rotated
    // coordinate, so |e| <= sqrt(n) |x| / (2^b - 1). Bounded with the wider row.
    if (buffer.rfind("tqk", 0) == 0 || buffer.rfind("tqv", 0) == 0) {
        double nrm = 0;
        for (float x : all) nrm += double(x) * double(x);
        nrm = std::sqrt(nrm);
        if (buffer[2] == 'k') return 2.0 * nrm * 1.0001 + 1e-5;
        const int b = buffer[3] - '0';
        return std::sqrt(double(all.size())) * nrm / double((1 << b) - 1) * 1.0001 + 1e-5;
    }
    if (buffer == "bf16") return a * 0.004 + 1e-6;
    if (buffer == "f16") return a * 0.0005 + 1e-6;
    return 0.0;  // f32 / default: exact
}

// kvpress AdaKVPress, in f64: every head keeps its n new tokens and its recent tokens
// (position >= P - grace); of its other slots the floor(alpha L) - recent best are lifted
// to +inf (the new tokens, not scored yet, do not count); the G n lowest of all heads' slots
// together are evicted (ties: head, then slot).
std::vector<int32_t> ada_reference(int64_t G, int64_t S, int64_t L, const std::vector<double>& sc, const std::vector<int32_t>& pos,
                                   int64_t n, int64_t P, int64_t grace, double alpha) {
    const double inf = std::numeric_limits<double>::infinity();
    const int64_t k_safe = int64_t(std::floor(alpha * double(L)));
    std::vector<std::tuple<double, int64_t, int64_t>> all;  // (score, head, slot)
    for (int64_t g = 0; g < G; ++g) {
        std::vector<std::pair<double, int64_t>> own;
        int64_t recent = 0;
        for (int64_t s = 0; s < S; ++s) {
            const int32_t p = pos[size_t(g * S + s)];
            if (p < 0) continue;
            if (p >= P - grace) ++recent;
            else own.push_back({sc[size_t(g * S + s)], s});
        }
        std::sort(own.begin(), own.end(), [](auto& a, auto& b) { return a.first > b.first || (a.first == b.first && a.second > b.second); });
        const int64_t lift = std::max<int64_t>(0, std::min<int64_t>(k_safe - recent, int64_t(own.size())));
        for (int64_t i = 0; i < int64_t(own.size()); ++i) all.push_back({i < lift ? inf : own[size_t(i)].first, g, own[size_t(i)].second});
    }
    std::sort(all.begin(), all.end());
    std::vector<int32_t> out;
    for (int64_t i = 0; i < G * n; ++i) out.push_back(int32_t(std::get<2>(all[size_t(i)])));
    std::sort(out.begin(), out.end());
    return out;
}

std::vector<std::vector<std::vector<double>>> prerope_queries(const LayerHarness& h, const std::vector<double>& theta, int64_t sink) {
    const int64_t D = h.D, half = D / 2;
    std::vector<std::vector<std::vector<double>>> qs((size_t)(h.B * h.NH));
    for (const auto& [P0, q] : h.all_q) {
        const int64_t n = q.size(2);
        const std::vector<double> qv = q.to_f64_vector();
        for (int64_t b = 0; b < h.B; ++b)
            for (int64_t hh = 0; hh < h.NH; ++hh)
                for (int64_t t = 0; t < n; ++t) {
                    if (P0 + t < sink) continue;
                    const double* x = qv.data() + ((b * h.NH + hh) * n + t) * D;
                    std::vector<double> u(x, x + D);
                    for (int64_t i = 0; i < half; ++i) {
                        const double a = -double(P0 + t) * theta[size_t(i)];
                        u[size_t(i)] = x[i] * std::cos(a) - x[i + half] * std::sin(a);
                        u[size_t(i + half)] = x[i + half] * std::cos(a) + x[i] * std::sin(a);
                    }
                    qs[size_t(b * h.NH + hh)].push_back(u);
                }
    }
    return qs;
}

FutureQueryMoments future_query_moments(const std::vector<std::vector<double>>& Q, const std::vector<double>& theta, int64_t Pa, int64_t F,
                                        int64_t D) {
    const int64_t half = D / 2;
    std::vector<double> mu((size_t)D, 0.0), C((size_t)(D * D), 0.0);
    for (const auto& u : Q)
        for (int64_t d = 0; d < D; ++d) mu[size_t(d)] += u[size_t(d)] / double(Q.size());
    for (const auto& u : Q)
        for (int64_t d = 0; d < D; ++d)
            for (int64_t e = 0; e < D; ++e) C[size_t(d * D + e)] += (u[size_t(d)] - mu[size_t(d)]) * (u[size_t(e)] - mu[size_t(e)]) / double(Q.size());
    // future query of position p: R(p) u; averaged over p, applied to the moments
    std::vector<double> Rb((size_t)(D * D), 0.0);
    for (int64_t p = Pa; p < Pa + F; ++p)
        for (int64_t i = 0; i < half; ++i) {
            const double an = double(p) * theta[size_t(i)];
            Rb[size_t(i * D + i)] += std::cos(an) / double(F);
            Rb[size_t(i * D + i + half)] -= std::sin(an) / double(F);
            Rb[size_t((i + half) * D + i)] += std::sin(an) / double(F);
            Rb[size_t((i + half) * D + i + half)] += std::cos(an) / double(F);
        }
    FutureQueryMoments m{std::vector<double>((size_t)D, 0.0), std::vector<double>((size_t)(D * D), 0.0)};
    std::vector<double> RC((size_t)(D * D), 0.0);
    for (int64_t d = 0; d < D; ++d)
        for (int64_t e = 0; e < D; ++e) m.mean[size_t(d)] += Rb[size_t(d * D + e)] * mu[size_t(e)];
    for (int64_t d = 0; d < D; ++d)
        for (int64_t e = 0; e < D; ++e)
            for (int64_t f = 0; f < D; ++f) RC[size_t(d * D + e)] += Rb[size_t(d * D + f)] * C[size_t(f * D + e)];
    for (int64_t d = 0; d < D; ++d)
        for (int64_t e = 0; e < D; ++e)
            for (int64_t f = 0; f < D; ++f) m.cov[size_t(d * D + e)] += RC[size_t(d * D + f)] * Rb[size_t(e * D + f)];
    return m;
}

std::vector<double> sdpa_f64(const std::vector<float>& q, const std::vector<double>& k, const std::vector<double>& v, int64_t B, int64_t NH,
                             int64_t G, int64_t n, int64_t T, int64_t D, double scale) {
    std::vector<double> y(size_t(B * NH * n * D)), s(static_cast<size_t>(T));
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < NH; ++h)
            for (int64_t i = 0; i < n; ++i) {
                const int64_t g = h / (NH / G);
                const float* qi = &q[size_t(((b * NH + h) * n + i) * D)];
                double mx = -1e300, z = 0;
                for (int64_t t = 0; t < T; ++t) {
                    double dot = 0;
                    for (int64_t d = 0; d < D; ++d) dot += double(qi[d]) * k[size_t(((b * G + g) * T + t) * D + d)];
                    s[size_t(t)] = dot * scale;
                    mx = std::max(mx, s[size_t(t)]);
                }
                for (double& x : s) z += (x = std::exp(x - mx));
                for (int64_t d = 0; d < D; ++d) {
                    double o = 0;
                    for (int64_t t = 0; t < T; ++t) o += s[size_t(t)] / z * v[size_t(((b * G + g) * T + t) * D + d)];
                    y[size_t(((b * NH + h) * n + i) * D + d)] = o;
                }
            }
    return y;
}

}  // namespace kv::test
