// Naive f64 reference for every forward op (see ref_ops.h for the contract); the gradient and
// optimizer references are in ref_backward.cpp.
#include "ref_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/common/quant_formats.h"  // the QuantFormat enum only
#include "ref_common.h"

namespace kv::ref {

namespace {

using namespace detail;

double silu(double x) { return x / (1.0 + std::exp(-x)); }
// transformers' gelu_pytorch_tanh, literally
double gelu_tanh(double x) { return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }

void matmul(const OpCall& c) {
    const TensorView& d = c.dst;
    const TensorView& a = c.src[0];
    const TensorView& b = c.src[1];
    const int nd = d.ndim;
    const int64_t K = a.ne[nd - 1];
    for_each_index(nd, d.ne, [&](const Index& idx) {
        double s = 0;
        Index ia = idx, ib = idx;
        for (int64_t k = 0; k < K; ++k) {
            ia[size_t(nd - 1)] = k;
            ib[size_t(nd - 2)] = k;
            s += get(a, ia) * get(b, ib);
        }
        double prev = c.p.beta != 0.0f ? get(d, idx) : 0.0;
        set(d, idx, double(c.p.alpha) * s + double(c.p.beta) * prev);
    });
}

void elementwise(const OpCall& c) {
    const TensorView& d = c.dst;
    for_each_index(d.ndim, d.ne, [&](const Index& idx) {
        double x = get(c.src[0], idx);
        double y = c.nsrc > 1 ? get(c.src[1], idx) : 0.0;
        double r = 0;
        switch (c.op) {
            case OpKind::ADD: r = x + y; break;
            case OpKind::MUL: r = x * y; break;
            case OpKind::SCALE: r = double(c.p.alpha) * x; break;
            case OpKind::SILU: r = silu(x); break;
            case OpKind::SWIGLU: r = (c.p.act == int(GateAct::GELU_TANH) ? gelu_tanh(x) : silu(x)) * y; break;
            case OpKind::COPY: r = x; break;
            default: break;
        }
        set(d, idx, r);
    });
}

void rmsnorm(const OpCall& c) {
    const TensorView& x = c.src[0];
    const int64_t n = x.ne[x.ndim - 1];
    for_each_row(x, [&](Index idx) {
        double ss = 0;
        for (int64_t i = 0; i < n; ++i) {
            idx.back() = i;
            double v = get(x, idx);
            ss += v * v;
        }
        double inv = 1.0 / std::sqrt(ss / double(n) + double(c.p.eps));
        for (int64_t i = 0; i < n; ++i) {
            idx.back() = i;
            double w = c.nsrc > 1 ? get(c.src[1], Index{i}) : 0.0;
            double scale = c.nsrc > 1 ? double(c.p.weight_offset) + w : 1.0;
            set(c.dst, idx, get(x, idx) * inv * scale);
        }
    });
}

void softmax(const OpCall& c) {
    const TensorView& x = c.src[0];
    const int64_t n = x.ne[x.ndim - 1];
    for_each_row(x, [&](Index idx) {
        std::vector<double> v((size_t)n);
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t i = 0; i < n; ++i) {
            idx.back() = i;
            v[size_t(i)] = double(c.p.alpha) * get(x, idx);
            m = std::max(m, v[size_t(i)]);
        }
        double s = 0;
        for (auto& e : v) s += (e = (m == -std::numeric_limits<double>::infinity()) ? 0.0 : std::exp(e - m));
        for (int64_t i = 0; i < n; ++i) {
            idx.back() = i;
            set(c.dst, idx, s > 0 ? v[size_t(i)] / s : 0.0);
        }
    });
}

void rope(const OpCall& c) {
    const TensorView& x = c.src[0];
    const int64_t half = c.p.n_rot / 2, HS = x.ne[3];
    for_each_index(3, x.ne, [&](const Index& bht) {
        int64_t b = bht[0], t = bht[2];
        int64_t p = int64_t(get(c.src[1], Index{c.src[1].ne[0] == 1 ? 0 : b, t}));
        for (int64_t i = 0; i < HS; ++i) {
            Index idx{bht[0], bht[1], bht[2], i};
            double y;
            if (i < 2 * half) {
                int64_t j = i % half;
                double cs = get(c.src[2], Index{p, j}), sn = get(c.src[3], Index{p, j});
                double x1 = get(x, Index{bht[0], bht[1], bht[2], j});
                double x2 = get(x, Index{bht[0], bht[1], bht[2], j + half});
                y = i < half ? x1 * cs - x2 * sn : x2 * cs + x1 * sn;
            } else {
                y = get(x, idx);
            }
            set(c.dst, idx, y);
        }
    });
}

void embedding(const OpCall& c) {
    const TensorView& ids = c.src[1];
    const int64_t C = c.src[0].ne[1];
    for_each_index(ids.ndim, ids.ne, [&](const Index& idx) {
        int64_t id = int64_t(get(ids, idx));
        Index o = idx;
        o.push_back(0);
        for (int64_t k = 0; k < C; ++k) {
            o.back() = k;
            set(c.dst, o, get(c.src[0], Index{id, k}));
        }
    });
}

void gather(const OpCall& c) {
    const int ax = c.p.axis;
    for_each_index(c.dst.ndim, c.dst.ne, [&](const Index& idx) {
        Index s = idx;
        s[size_t(ax)] = int64_t(get(c.src[1], idx));
        set(c.dst, idx, get(c.src[0], s));
    });
}

void scatter(const OpCall& c) {
    const int ax = c.p.axis;
    const TensorView& vals = c.src[0];
    for_each_index(vals.ndim, vals.ne, [&](const Index& idx) {
        Index t = idx;
        t[size_t(ax)] = int64_t(get(c.src[1], idx));
        set(c.dst, t, get(vals, idx));
    });
}

void reduce(const OpCall& c) {
    const TensorView& x = c.src[0];
    const int64_t n = x.ne[x.ndim - 1];
    int64_t r = 0;
    for_each_row(x, [&](Index idx) {
        double acc = c.op == OpKind::MAX ? -std::numeric_limits<double>::infinity() : 0.0;
        for (int64_t i = 0; i < n; ++i) {
            idx.back() = i;
            double v = get(x, idx);
            if (c.op == OpKind::SUM) acc += v;
            else if (c.op == OpKind::MAX) acc = std::max(acc, v);
            else acc += v * v;
        }
        if (c.op == OpKind::NORM) acc = std::sqrt(acc);
        // dst: rows in row-major order of its own shape
        Index o(size_t(c.dst.ndim), 0);
        int64_t rem = r++;
        for (int i = c.dst.ndim - 1; i >= 0; --i) {
            o[size_t(i)] = rem % c.dst.ne[i];
            rem /= c.dst.ne[i];
        }
        set(c.dst, o, acc);
    });
}

void sdpa(const OpCall& c) {
    const TensorView &q = c.src[0], &k = c.src[1], &v = c.src[2], &kpos = c.src[3], &qpos = c.src[4];
    const int64_t B = q.ne[0], NH = q.ne[1], n = q.ne[2], HS = q.ne[3], G = k.ne[1], T = k.ne[2], R = NH / G;
    const bool weights = c.dst2.data != nullptr;
    std::vector<double> w((size_t)(B * G * T), 0.0);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < NH; ++h) {
            const int64_t g = h / R;
            for (int64_t i = 0; i < n; ++i) {
                const double qp = get(qpos, Index{b, i});
                std::vector<double> s((size_t)T);
                double mx = -std::numeric_limits<double>::infinity();
                for (int64_t j = 0; j < T; ++j) {
                    const double kp = get(kpos, Index{b, g, j});
                    bool ok = kp <= qp && (c.p.window <= 0 || kp > qp - c.p.window);
                    double dot = 0;
                    for (int64_t d = 0; d < HS; ++d) dot += get(q, Index{b, h, i, d}) * get(k, Index{b, g, j, d});
                    double sc = double(c.p.alpha) * dot;
                    if (c.p.softcap > 0) sc = double(c.p.softcap) * std::tanh(sc / double(c.p.softcap));
                    s[size_t(j)] = ok ? sc : -std::numeric_limits<double>::infinity();
                    mx = std::max(mx, s[size_t(j)]);
                }
                double sum = 0;
                for (auto& e : s) sum += (e = (mx == -std::numeric_limits<double>::infinity()) ? 0.0 : std::exp(e - mx));
                if (has_src(c, 5) && sum > 0) {  // the sink: one more term of the denominator, with no value
                    const double sink = get(c.src[5], Index{h});
                    const double m2 = std::max(mx, sink), f = std::exp(mx - m2);
                    for (auto& e : s) e *= f;
                    sum = sum * f + std::exp(sink - m2);
                }
                for (int64_t d = 0; d < HS; ++d) {
                    double acc = 0;
                    for (int64_t j = 0; j < T; ++j) acc += (sum > 0 ? s[size_t(j)] / sum : 0.0) * get(v, Index{b, g, j, d});
                    set(c.dst, Index{b, h, i, d}, acc);
                }
                if (weights && sum > 0)
                    for (int64_t j = 0; j < T; ++j) w[size_t((b * G + g) * T + j)] += s[size_t(j)] / sum / double(R);
            }
        }
    if (weights)
        for (int64_t b = 0; b < B; ++b)
            for (int64_t g = 0; g < G; ++g)
                for (int64_t j = 0; j < T; ++j) set(c.dst2, Index{b, g, j}, w[size_t((b * G + g) * T + j)]);
}

// SDPA_QUEST from op.h alone: per query row, page bounds sum_d max(q_d kmin_d, q_d kmax_d) in
// f64 over the pages whose first slot it may see, a full sort (larger bound first, lower page
// on ties), the first `pages` plus the last visible page, then the dense f64 softmax over the
// visible slots of those pages (the others get probability 0).
void sdpa_quest(const OpCall& c) {
    const TensorView &q = c.src[0], &k = c.src[1], &v = c.src[2], &kpos = c.src[3], &qpos = c.src[4], &mn = c.src[5], &mx = c.src[6];
    const int64_t B = q.ne[0], NH = q.ne[1], n = q.ne[2], HS = q.ne[3], G = k.ne[1], T = k.ne[2], R = NH / G, P = c.p.quest_page;
    const int64_t NP = (T + P - 1) / P;
    std::vector<double> w((size_t)(B * G * T), 0.0);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < NH; ++h) {
            const int64_t g = h / R;
            for (int64_t i = 0; i < n; ++i) {
                const double qp = get(qpos, Index{b, i});
                std::vector<std::pair<double, int64_t>> pages;
                for (int64_t j = 0; j < NP; ++j) {
                    if (get(kpos, Index{b, g, j * P}) > qp) continue;
                    double u = 0;
                    for (int64_t d = 0; d < HS; ++d) {
                        const double x = get(q, Index{b, h, i, d});
                        u += std::max(x * get(mn, Index{b, g, j, d}), x * get(mx, Index{b, g, j, d}));
                    }
                    pages.push_back({-u, j});
                }
                std::sort(pages.begin(), pages.end());
                std::vector<bool> chosen((size_t)NP, false);
                for (size_t e = 0; e < pages.size(); ++e)
                    if (int64_t(e) < c.p.quest_pages) chosen[size_t(pages[e].second)] = true;
                int64_t last = -1;
                for (const auto& pg : pages) last = std::max(last, pg.second);
                if (last >= 0) chosen[size_t(last)] = true;
                std::vector<double> s((size_t)T, -std::numeric_limits<double>::infinity());
                double m = -std::numeric_limits<double>::infinity();
                for (int64_t j = 0; j < T; ++j) {
                    if (!chosen[size_t(j / P)] || get(kpos, Index{b, g, j}) > qp) continue;
                    double dot = 0;
                    for (int64_t d = 0; d < HS; ++d) dot += get(q, Index{b, h, i, d}) * get(k, Index{b, g, j, d});
                    s[size_t(j)] = double(c.p.alpha) * dot;
                    m = std::max(m, s[size_t(j)]);
                }
                double sum = 0;
                for (auto& e : s) sum += (e = (m == -std::numeric_limits<double>::infinity()) ? 0.0 : std::exp(e - m));
                if (has_src(c, 7) && sum > 0) {  // the sink (as SDPA's src5): one more term of the denominator
                    const double sink = get(c.src[7], Index{h});
                    const double m2 = std::max(m, sink), f = std::exp(m - m2);
                    for (auto& e : s) e *= f;
                    sum = sum * f + std::exp(sink - m2);
                }
                for (int64_t d = 0; d < HS; ++d) {
                    double acc = 0;
                    for (int64_t j = 0; j < T; ++j) acc += (sum > 0 ? s[size_t(j)] / sum : 0.0) * get(v, Index{b, g, j, d});
                    set(c.dst, Index{b, h, i, d}, acc);
                }
                if (sum > 0)
                    for (int64_t j = 0; j < T; ++j) w[size_t((b * G + g) * T + j)] += s[size_t(j)] / sum / double(R);
            }
        }
    if (c.dst2.data)
        for (int64_t b = 0; b < B; ++b)
            for (int64_t g = 0; g < G; ++g)
                for (int64_t j = 0; j < T; ++j) set(c.dst2, Index{b, g, j}, w[size_t((b * G + g) * T + j)]);
}

// SDPA_KIVI: every slot of [0, T) decoded to f64 from its bytes (written from op.h's layout
// alone: explicit bit fields, no shared helper), then the dense reference above.
void sdpa_kivi(const OpCall& c) {
    const TensorView &q = c.src[0], &kc = c.src[1], &ks = c.src[2], &vc = c.src[3], &vs = c.src[4], &res = c.src[5],
                     &map = c.src[6];
    const int64_t B = q.ne[0], D = q.ne[3], G = kc.ne[1], T = c.src[7].ne[2], S = c.p.kivi_group, VG = D / vs.ne[3];
    const int bits = c.p.kivi_bits;
    auto code = [&](const TensorView& v, Index idx, int64_t i) {  // code i of the byte run at idx (last index = byte)
        idx.back() = i * bits / 8;
        const int byte = int(get(v, idx));
        return (byte >> int((i * bits) % 8)) & ((1 << bits) - 1);
    };
    std::vector<double> K(size_t(B * G * T * D)), V(K.size());
    for (int64_t b = 0; b < B; ++b)
        for (int64_t g = 0; g < G; ++g)
            for (int64_t t = 0; t < T; ++t) {
                const int64_t j = t / S, tt = t % S;
                const int64_t blk = int64_t(get(map, Index{b, g, j}));
                for (int64_t d = 0; d < D; ++d) {
                    double k, v;
                    if (blk >= 0) {
                        k = get(res, Index{blk, 0, tt, d});
                        v = get(res, Index{blk, 1, tt, d});
                    } else {
                        k = get(ks, Index{b, g, j, d, 1}) + get(ks, Index{b, g, j, d, 0}) * code(kc, Index{b, g, j, d, 0}, tt);
                        v = get(vs, Index{b, g, t, d / VG, 1}) + get(vs, Index{b, g, t, d / VG, 0}) * code(vc, Index{b, g, t, 0}, d);
                    }
                    K[size_t(((b * G + g) * T + t) * D + d)] = k;
                    V[size_t(((b * G + g) * T + t) * D + d)] = v;
                }
            }
    auto view = [&](std::vector<double>& x) {
        TensorView v;
        v.data = x.data();
        v.dtype = DType::F64;
        v.ndim = 4;
        const int64_t ne[4] = {B, G, T, D};
        int64_t st = 8;
        for (int i = 3; i >= 0; --i) v.ne[i] = ne[i], v.nb[i] = st, st *= ne[i];
        return v;
    };
    OpCall d = c;
    d.op = OpKind::SDPA;
    d.nsrc = 5;
    d.src[1] = view(K);
    d.src[2] = view(V);
    d.src[3] = c.src[7];
    d.src[4] = c.src[8];
    sdpa(d);
}

// Quantization written independently of kernels/common/quant_formats.h: nearbyint (the FPU's
// round-half-even) instead of hand-made rounding, argmin over the NF4 levels instead of
// midpoint thresholds, explicit per-nibble packing. Arithmetic is f32 as the formats define.
const float kNf4[16] = {-1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
                        -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
                        0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,
                        0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f};

// Minifloats from their definition: the value of every magnitude code in f64, and the encoder
// as the nearest of them (ties to the even code, beyond the largest: the largest), instead of
// the kernels' bit arithmetic.
struct RefMini {
    int M, bias, max_code;  // mantissa bits, exponent bias, largest finite magnitude code
    double value(int c) const {
        const int field = c >> M, mant = c & ((1 << M) - 1);
        return field == 0 ? std::ldexp(double(mant), 1 - bias - M) : std::ldexp(1.0 + std::ldexp(double(mant), -M), field - bias);
    }
    int encode(double x) const {  // magnitude code of |x| (finite x)
        const double a = std::fabs(x);
        if (a >= value(max_code)) return max_code;
        int best = 0;
        double bd = a;
        for (int c = 1; c <= max_code; ++c) {
            const double d = std::fabs(a - value(c));
            if (d < bd || (d == bd && c % 2 == 0)) best = c, bd = d;
        }
        return best;
    }
};
const RefMini kRefE4M3{3, 7, 0x7e}, kRefE5M2{2, 15, 0x7b}, kRefE2M1{1, 1, 7};
uint8_t ref_fp8(const RefMini& m, float x) {
    if (std::isnan(x)) return 0x7f;
    return uint8_t((std::signbit(x) ? 0x80 : 0) | m.encode(x));
}
uint8_t ref_fp4(float x) { return std::isnan(x) ? 0 : uint8_t((std::signbit(x) ? 8 : 0) | kRefE2M1.encode(x)); }
float ref_fp8_value(const RefMini& m, uint8_t c) { return float((c & 0x80 ? -1.0 : 1.0) * m.value(c & 0x7f)); }
float ref_fp4_value(uint8_t c) { return float((c & 8 ? -1.0 : 1.0) * kRefE2M1.value(c & 7)); }

// TurboQuant (quant_formats.h, TQK/TQV) from its definition: y = H S x / sqrt(n) with Sylvester's
// H[i][j] = (-1)^popcount(i & j) and S's signs the low bits of splitmix64, all in f64.
double ref_tq_sign(size_t i) {
    uint64_t z = kTurboQuantSeed + 0x9e3779b97f4a7c15ull * uint64_t(i + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (z & 1) ? -1.0 : 1.0;
}
std::vector<double> ref_hadamard(const std::vector<double>& x) {
    const size_t n = x.size();
    std::vector<double> y(n, 0.0);
    for (size_t i = 0; i < n; ++i) {
        for (size_t j = 0; j < n; ++j) y[i] += (__builtin_popcountll(i & j) % 2 ? -1.0 : 1.0) * x[j];
        y[i] /= std::sqrt(double(n));
    }
    return y;
}
int ref_tq_bits(int fmt) {
    switch (QuantFormat(fmt)) {
        case QuantFormat::TQK2: case QuantFormat::TQV2: return 2;
        case QuantFormat::TQK3: case QuantFormat::TQV3: return 3;
        case QuantFormat::TQK4: case QuantFormat::TQV4: return 4;
        case QuantFormat::TQV8: return 8;
        default: return 0;
    }
}
bool ref_tq_keys(int fmt) { return fmt == int(QuantFormat::TQK2) || fmt == int(QuantFormat::TQK3) || fmt == int(QuantFormat::TQK4); }

void ref_tq_quantize(int fmt, const float* levels, const std::vector<float>& x, std::vector<uint8_t>& out) {
    const size_t n = x.size();
    const int b = ref_tq_bits(fmt);
    std::vector<double> sx(n);
    for (size_t i = 0; i < n; ++i) sx[i] = ref_tq_sign(i) * double(x[i]);
    const std::vector<double> y = ref_hadamard(sx);
    const size_t payload = (n * size_t(b) + 7) / 8;
    out.assign(payload + (ref_tq_keys(fmt) ? 4 : 8), 0);
    auto put_code = [&](size_t i, uint32_t q) {
        for (int k = 0; k < b; ++k)
            if ((q >> k) & 1) out[(i * size_t(b) + size_t(k)) / 8] |= uint8_t(1u << ((i * size_t(b) + size_t(k)) % 8));
    };
    auto putf = [&](size_t at, float f) {
        uint32_t u;
        std::memcpy(&u, &f, 4);
        for (int k = 0; k < 4; ++k) out[at + size_t(k)] = uint8_t(u >> (8 * k));
    };
    if (ref_tq_keys(fmt)) {
        double ss = 0;
        for (double v : y) ss += v * v;
        const double norm = std::sqrt(ss);
        double cs = 0;  // |Q(u)|^2: the stored factor keeps the decoded row's norm
        for (size_t i = 0; i < n; ++i) {
            const double u = norm > 0 ? y[i] / norm : 0.0;
            uint32_t q = 0;  // the nearest level, ties to the lower
            for (int k = 1; k < (1 << b); ++k) q += u > 0.5 * (double(levels[k - 1]) + double(levels[k])) ? 1 : 0;
            put_code(i, q);
            cs += double(levels[q]) * double(levels[q]);
        }
        putf(payload, cs > 0 ? float(norm / std::sqrt(cs)) : 0.0f);
        return;
    }
    const double lo = *std::min_element(y.begin(), y.end()), hi = *std::max_element(y.begin(), y.end());
    const double qmax = double((1 << b) - 1), s = double(float(float(hi - lo) / float(qmax)));
    for (size_t i = 0; i < n; ++i) put_code(i, s > 0 ? uint32_t(std::clamp(std::nearbyint((y[i] - lo) / s), 0.0, qmax)) : 0u);
    putf(payload, float(lo));
    putf(payload + 4, float(s));
}

void ref_tq_dequantize(int fmt, const float* levels, const uint8_t* in, size_t n, std::vector<float>& out) {
    const int b = ref_tq_bits(fmt);
    const size_t payload = (n * size_t(b) + 7) / 8;
    auto getf = [&](size_t at) {
        uint32_t u = uint32_t(in[at]) | uint32_t(in[at + 1]) << 8 | uint32_t(in[at + 2]) << 16 | uint32_t(in[at + 3]) << 24;
        float f;
        std::memcpy(&f, &u, 4);
        return double(f);
    };
    std::vector<double> y(n);
    for (size_t i = 0; i < n; ++i) {
        uint32_t q = 0;
        for (int k = 0; k < b; ++k) q |= uint32_t((in[(i * size_t(b) + size_t(k)) / 8] >> ((i * size_t(b) + size_t(k)) % 8)) & 1) << k;
        y[i] = ref_tq_keys(fmt) ? double(levels[q]) * getf(payload) : getf(payload) + double(q) * getf(payload + 4);
    }
    const std::vector<double> x = ref_hadamard(y);
    out.assign(n, 0.0f);
    for (size_t i = 0; i < n; ++i) out[i] = float(ref_tq_sign(i) * x[i]);
}

void ref_quantize_row(int fmt, const std::vector<float>& x, std::vector<uint8_t>& out) {
    const size_t n = x.size();
    auto put32 = [&](size_t at, uint32_t v) {
        for (int b = 0; b < 4; ++b) out[at + size_t(b)] = uint8_t(v >> (8 * b));
    };
    auto put16 = [&](size_t at, float v) {
        uint16_t h = f32_to_f16(v);
        out[at] = uint8_t(h & 0xff);
        out[at + 1] = uint8_t(h >> 8);
    };
    if (fmt == int(QuantFormat::Q8) || fmt == int(QuantFormat::Q4)) {
        const int bits = fmt == int(QuantFormat::Q8) ? 8 : 4;
        const float qmax = float((1 << bits) - 1);
        const float lo = *std::min_element(x.begin(), x.end()), hi = *std::max_element(x.begin(), x.end());
        const float scale = std::max((hi - lo) / qmax, 1.1920928955078125e-07f);
        const int32_t zp = int32_t(-std::nearbyint(lo / scale));
        const float inv = 1.0f / scale;
        std::vector<int> q(n);
        for (size_t i = 0; i < n; ++i) q[i] = int(std::clamp(std::nearbyint(x[i] * inv) + float(zp), 0.0f, qmax));
        const size_t payload = bits == 8 ? n : n / 2;
        out.assign(payload + 8, 0);
        for (size_t i = 0; i < n; ++i) {
            if (bits == 8) out[i] = uint8_t(q[i]);
            else if (i < n / 2) out[i] = uint8_t(out[i] + q[i] * 16);
            else out[i - n / 2] = uint8_t(out[i - n / 2] + q[i]);
        }
        uint32_t sb;
        std::memcpy(&sb, &scale, 4);
        put32(payload, sb);
        put32(payload + 4, uint32_t(zp));
    } else if (fmt == int(QuantFormat::NF4)) {
        out.assign(n / 64 * 36, 0);
        for (size_t b = 0; b < n / 64; ++b) {
            float amax = 0;
            for (size_t i = 0; i < 64; ++i) amax = std::max(amax, std::fabs(x[b * 64 + i]));
            const float inv = amax > 0 ? 1.0f / amax : 0.0f;
            for (size_t i = 0; i < 64; ++i) {
                const float v = x[b * 64 + i] * inv;
                int best = 0;
                for (int k = 1; k < 16; ++k)
                    if (std::fabs(kNf4[k] - v) < std::fabs(kNf4[best] - v)) best = k;
                out[b * 36 + i / 2] = uint8_t(out[b * 36 + i / 2] + (i % 2 == 0 ? best * 16 : best));
            }
            uint32_t ab;
            std::memcpy(&ab, &amax, 4);
            put32(b * 36 + 32, ab);
        }
    } else if (fmt == int(QuantFormat::Q8_0)) {
        out.assign(n / 32 * 34, 0);
        for (size_t b = 0; b < n / 32; ++b) {
            float amax = 0;
            for (size_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
            const float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
            put16(b * 34, d);
            for (size_t i = 0; i < 32; ++i) out[b * 34 + 2 + i] = uint8_t(int8_t(std::round(x[b * 32 + i] * id)));
        }
    } else if (fmt == int(QuantFormat::Q4_0)) {
        out.assign(n / 32 * 18, 0);
        for (size_t b = 0; b < n / 32; ++b) {
            float m = 0;
            for (size_t i = 0; i < 32; ++i)
                if (std::fabs(x[b * 32 + i]) > std::fabs(m)) m = x[b * 32 + i];
            const float d = m / -8.0f, id = d != 0 ? 1.0f / d : 0.0f;
            put16(b * 18, d);
            for (size_t j = 0; j < 16; ++j) {
                const int q0 = std::min(15, int(std::trunc(x[b * 32 + j] * id + 8.5f)));
                const int q1 = std::min(15, int(std::trunc(x[b * 32 + j + 16] * id + 8.5f)));
                out[b * 18 + 2 + j] = uint8_t(q0 + 16 * q1);
            }
        }
    } else if (fmt == int(QuantFormat::FP8_E4M3) || fmt == int(QuantFormat::FP8_E5M2)) {
        const bool e5 = fmt == int(QuantFormat::FP8_E5M2);
        out.assign(n + 4, 0);
        float amax = 0;
        for (float v : x) amax = std::max(amax, std::fabs(v));
        const float s = amax / float((e5 ? kRefE5M2 : kRefE4M3).value((e5 ? kRefE5M2 : kRefE4M3).max_code));
        for (size_t i = 0; i < n; ++i) out[i] = s > 0 ? ref_fp8(e5 ? kRefE5M2 : kRefE4M3, x[i] / s) : 0;
        uint32_t u;
        std::memcpy(&u, &s, 4);
        put32(n, u);
    } else if (fmt == int(QuantFormat::NVFP4)) {
        out.assign(n / 2 + n / 16 + 4, 0);
        float amax = 0;
        for (float v : x) amax = std::max(amax, std::fabs(v));
        const float sg = amax / (448.0f * 6.0f);
        for (size_t b = 0; b < n / 16; ++b) {
            float bamax = 0;
            for (size_t i = 0; i < 16; ++i) bamax = std::max(bamax, std::fabs(x[b * 16 + i]));
            const uint8_t sc = sg > 0 ? ref_fp8(kRefE4M3, (bamax / 6.0f) / sg) : 0;
            const float d = ref_fp8_value(kRefE4M3, sc) * sg;
            out[n / 2 + b] = sc;
            for (size_t i = 0; i < 16; ++i) {
                const uint8_t q = d > 0 ? ref_fp4(x[b * 16 + i] / d) : 0;
                out[(b * 16 + i) / 2] |= uint8_t(i % 2 == 0 ? q : q << 4);
            }
        }
        uint32_t u;
        std::memcpy(&u, &sg, 4);
        put32(n / 2 + n / 16, u);
    } else if (fmt == int(QuantFormat::MXFP4)) {
        out.assign(n / 32 * 17, 0);
        for (size_t b = 0; b < n / 32; ++b) {
            double amax = 0;
            for (size_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(double(x[b * 32 + i])));
            const int se = amax > 0 ? std::clamp(int(std::floor(std::log2(amax))) - 2, -127, 127) : -127;
            out[b * 17] = uint8_t(se + 127);
            const float X = float(std::ldexp(1.0, se));
            for (size_t i = 0; i < 32; ++i) {
                const uint8_t q = ref_fp4(x[b * 32 + i] / X);
                out[b * 17 + 1 + i % 16] |= uint8_t(i < 16 ? q : q << 4);
            }
        }
    }
}

void ref_dequantize_row(int fmt, const uint8_t* in, size_t n, std::vector<float>& y) {
    y.assign(n, 0.0f);
    auto get32 = [&](size_t at) { return uint32_t(in[at]) | uint32_t(in[at + 1]) << 8 | uint32_t(in[at + 2]) << 16 | uint32_t(in[at + 3]) << 24; };
    auto getf = [&](size_t at) {
        uint32_t u = get32(at);
        float f;
        std::memcpy(&f, &u, 4);
        return f;
    };
    if (fmt == int(QuantFormat::Q8) || fmt == int(QuantFormat::Q4)) {
        const size_t payload = fmt == int(QuantFormat::Q8) ? n : n / 2;
        const float scale = getf(payload);
        const int32_t zp = int32_t(get32(payload + 4));
        for (size_t i = 0; i < n; ++i) {
            int q = fmt == int(QuantFormat::Q8) ? in[i] : (i < n / 2 ? in[i] / 16 : in[i - n / 2] % 16);
            y[i] = float(q - zp) * scale;
        }
    } else if (fmt == int(QuantFormat::NF4)) {
        for (size_t b = 0; b < n / 64; ++b) {
            const float amax = getf(b * 36 + 32);
            for (size_t i = 0; i < 64; ++i) {
                const uint8_t byte = in[b * 36 + i / 2];
                y[b * 64 + i] = kNf4[i % 2 == 0 ? byte / 16 : byte % 16] * amax;
            }
        }
    } else if (fmt == int(QuantFormat::Q8_0)) {
        for (size_t b = 0; b < n / 32; ++b) {
            const float d = f16_to_f32(uint16_t(in[b * 34] | in[b * 34 + 1] << 8));
            for (size_t i = 0; i < 32; ++i) y[b * 32 + i] = d * float(int8_t(in[b * 34 + 2 + i]));
        }
    } else if (fmt == int(QuantFormat::Q4_0)) {
        for (size_t b = 0; b < n / 32; ++b) {
            const float d = f16_to_f32(uint16_t(in[b * 18] | in[b * 18 + 1] << 8));
            for (size_t j = 0; j < 16; ++j) {
                y[b * 32 + j] = float(in[b * 18 + 2 + j] % 16 - 8) * d;
                y[b * 32 + j + 16] = float(in[b * 18 + 2 + j] / 16 - 8) * d;
            }
        }
    } else if (fmt == int(QuantFormat::FP8_E4M3) || fmt == int(QuantFormat::FP8_E5M2)) {
        const RefMini& m = fmt == int(QuantFormat::FP8_E5M2) ? kRefE5M2 : kRefE4M3;
        const float s = getf(n);
        for (size_t i = 0; i < n; ++i) y[i] = ref_fp8_value(m, in[i]) * s;
    } else if (fmt == int(QuantFormat::NVFP4)) {
        const float sg = getf(n / 2 + n / 16);
        for (size_t i = 0; i < n; ++i) {
            const float d = ref_fp8_value(kRefE4M3, in[n / 2 + i / 16]) * sg;
            y[i] = ref_fp4_value(uint8_t(i % 2 == 0 ? in[i / 2] % 16 : in[i / 2] / 16)) * d;
        }
    } else if (fmt == int(QuantFormat::MXFP4)) {
        for (size_t i = 0; i < n; ++i) {
            const size_t b = i / 32, j = i % 32;
            const uint8_t byte = in[b * 17 + 1 + j % 16];
            y[i] = ref_fp4_value(uint8_t(j < 16 ? byte % 16 : byte / 16)) * float(std::ldexp(1.0, int(in[b * 17]) - 127));
        }
    }
}

void quantize(const OpCall& c) {
    const TensorView& x = c.src[0];
    const size_t n = size_t(x.ne[x.ndim - 1]);
    for_each_row(x, [&](Index idx) {
        std::vector<float> row(n);
        for (size_t i = 0; i < n; ++i) {
            idx.back() = int64_t(i);
            row[i] = float(get(x, idx));
        }
        std::vector<uint8_t> bytes;
        if (ref_tq_bits(c.p.qformat)) ref_tq_quantize(c.p.qformat, c.p.qlevels, row, bytes);
        else ref_quantize_row(c.p.qformat, row, bytes);
        for (size_t i = 0; i < bytes.size(); ++i) {
            idx.back() = int64_t(i);
            set(c.dst, idx, double(bytes[i]));
        }
    });
}

void dequantize(const OpCall& c) {
    const TensorView& q = c.src[0];
    const size_t n = size_t(c.dst.ne[c.dst.ndim - 1]), nb = size_t(q.ne[q.ndim - 1]);
    for_each_row(q, [&](Index idx) {
        std::vector<uint8_t> bytes(nb);
        for (size_t i = 0; i < nb; ++i) {
            idx.back() = int64_t(i);
            bytes[i] = uint8_t(get(q, idx));
        }
        std::vector<float> y;
        if (ref_tq_bits(c.p.qformat)) ref_tq_dequantize(c.p.qformat, c.p.qlevels, bytes.data(), n, y);
        else ref_dequantize_row(c.p.qformat, bytes.data(), n, y);
        for (size_t i = 0; i < n; ++i) {
            idx.back() = int64_t(i);
            set(c.dst, idx, double(y[i]));
        }
    });
}

// SDPA_QROWS: every key and value row of [0, T) decoded from its bytes by the reference
// decoders above (TurboQuant rows back to the unrotated frame), then the dense f64 SDPA of
// sdpa() over them.
void sdpa_qrows(const OpCall& c) {
    const TensorView &q = c.src[0], &k = c.src[1], &v = c.src[2], &kpos = c.src[3], &qpos = c.src[4];
    const int64_t B = q.ne[0], NH = q.ne[1], n = q.ne[2], HS = q.ne[3], G = k.ne[1], T = kpos.ne[2], R = NH / G;
    auto decode = [&](const TensorView& t, int fmt) {
        std::vector<double> out(size_t(B * G * T * HS));
        std::vector<uint8_t> bytes(size_t(t.ne[3]));
        std::vector<float> y;
        for (int64_t b = 0; b < B; ++b)
            for (int64_t g = 0; g < G; ++g)
                for (int64_t j = 0; j < T; ++j) {
                    for (int64_t i = 0; i < t.ne[3]; ++i) bytes[size_t(i)] = uint8_t(get(t, Index{b, g, j, i}));
                    if (ref_tq_bits(fmt)) ref_tq_dequantize(fmt, c.p.qlevels, bytes.data(), size_t(HS), y);
                    else ref_dequantize_row(fmt, bytes.data(), size_t(HS), y);
                    for (int64_t d = 0; d < HS; ++d) out[size_t(((b * G + g) * T + j) * HS + d)] = double(y[size_t(d)]);
                }
        return out;
    };
    const std::vector<double> K = decode(k, c.p.qformat), V = decode(v, c.p.qformat_v);
    std::vector<double> w(size_t(B * G * T), 0.0);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < NH; ++h) {
            const int64_t g = h / R;
            for (int64_t i = 0; i < n; ++i) {
                const double qp = get(qpos, Index{qpos.ne[0] == 1 ? 0 : b, i});
                std::vector<double> s(size_t(T), -std::numeric_limits<double>::infinity());
                double mx = -std::numeric_limits<double>::infinity();
                for (int64_t j = 0; j < T; ++j) {
                    const double kp = get(kpos, Index{kpos.ne[0] == 1 ? 0 : b, kpos.ne[1] == 1 ? 0 : g, j});
                    if (!(kp <= qp && (c.p.window <= 0 || kp > qp - c.p.window))) continue;
                    double dot = 0;
                    for (int64_t d = 0; d < HS; ++d) dot += get(q, Index{b, h, i, d}) * K[size_t(((b * G + g) * T + j) * HS + d)];
                    s[size_t(j)] = double(c.p.alpha) * dot;
                    mx = std::max(mx, s[size_t(j)]);
                }
                double sum = 0;
                for (auto& e : s) sum += (e = (mx == -std::numeric_limits<double>::infinity()) ? 0.0 : std::exp(e - mx));
                for (int64_t d = 0; d < HS; ++d) {
                    double acc = 0;
                    for (int64_t j = 0; j < T; ++j) acc += (sum > 0 ? s[size_t(j)] / sum : 0.0) * V[size_t(((b * G + g) * T + j) * HS + d)];
                    set(c.dst, Index{b, h, i, d}, acc);
                }
                if (c.dst2.data && sum > 0)
                    for (int64_t j = 0; j < T; ++j) w[size_t((b * G + g) * T + j)] += s[size_t(j)] / sum / double(R);
            }
        }
    if (c.dst2.data)
        for (int64_t b = 0; b < B; ++b)
            for (int64_t g = 0; g < G; ++g)
                for (int64_t j = 0; j < T; ++j) set(c.dst2, Index{b, g, j}, w[size_t((b * G + g) * T + j)]);
}

}  // namespace

void compute(const OpCall& c) {
    switch (c.op) {
        case OpKind::MATMUL: matmul(c); break;
        case OpKind::ADD:
        case OpKind::MUL:
        case OpKind::SCALE:
        case OpKind::SILU:
        case OpKind::SWIGLU:
        case OpKind::COPY: elementwise(c); break;
        case OpKind::RMSNORM: rmsnorm(c); break;
        case OpKind::SOFTMAX: softmax(c); break;
        case OpKind::ROPE: rope(c); break;
        case OpKind::EMBEDDING: embedding(c); break;
        case OpKind::GATHER: gather(c); break;
        case OpKind::SCATTER: scatter(c); break;
        case OpKind::SUM:
        case OpKind::MAX:
        case OpKind::NORM: reduce(c); break;
        case OpKind::SDPA: sdpa(c); break;
        case OpKind::SDPA_KIVI: sdpa_kivi(c); break;
        case OpKind::SDPA_QUEST: sdpa_quest(c); break;
        case OpKind::SDPA_QROWS: sdpa_qrows(c); break;
        case OpKind::QUANTIZE: quantize(c); break;
        case OpKind::DEQUANTIZE: dequantize(c); break;
        default:
            if (!detail::compute_backward(c)) throw KernelError(std::string("reference: op ") + op_kind_name(c.op) + " has no reference");
    }
}

}  // namespace kv::ref
