// qfilter against Q-Filters' definition in f64: the filter of a head is the top right singular
// vector of its query heads' post-RoPE queries (here: power iteration on the query matrix
// itself, q -> Q^T Q v, independent of the engine's squared second-moment matrix), signed by the
// mean query; a slot's score is <k, f>; the kept sets follow on the `tiny` model.
#include <cstdio>
#include <fstream>
#include <map>
#include <set>

#include "engine/kv/kv_cache.h"
#include "engine/kv/policies/qfilter_calibration.h"
#include "engine/model/attention.h"
#include "policy_references.h"
#include "tiny_model_util.h"

namespace kv::test {
namespace {

std::string temp_path(const std::string& tag) { return ::testing::TempDir() + "kvlab_qfilter_" + tag + ".txt"; }

// Every layer's post-RoPE queries as rows, per (layer, KV head): what attention multiplies the
// rotated keys with.
class QueryRows final : public LayerAttention {
   public:
    explicit QueryRows(int64_t G) : G_(G) {}
    void attend(int layer, const Tensor& q, const Tensor& k, const Tensor& v, int64_t input_pos, float scale, int window,
                Tensor& y) override {
        const std::vector<double> qv = q.contiguous().to_f64_vector();
        const int64_t NH = q.size(1), n = q.size(2), D = q.size(3), R = NH / G_;
        for (int64_t h = 0; h < NH; ++h)
            for (int64_t t = 0; t < n; ++t)
                rows[{layer, h / R}].push_back(std::vector<double>(qv.begin() + (h * n + t) * D, qv.begin() + (h * n + t + 1) * D));
        PlainAttention().attend(layer, q, k, v, input_pos, scale, window, y);
    }
    std::map<std::pair<int, int64_t>, std::vector<std::vector<double>>> rows;

   private:
    int64_t G_;
};

// Top right singular vector of the rows by power iteration v <- Q^T (Q v) / |.|, signed so that
// the mean row projects positively.
std::vector<double> power_iteration(const std::vector<std::vector<double>>& Q) {
    const size_t D = Q[0].size();
    std::vector<double> v(D, 1.0 / std::sqrt(double(D))), w(D);
    for (int it = 0; it < 200000; ++it) {
        std::fill(w.begin(), w.end(), 0.0);
        for (const auto& q : Q) {
            double u = 0;
            for (size_t d = 0; d < D; ++d) u += q[d] * v[d];
            for (size_t d = 0; d < D; ++d) w[d] += u * q[d];
        }
        double n = 0, dot = 0;
        for (double x : w) n += x * x;
        for (size_t d = 0; d < D; ++d) dot += (w[d] /= std::sqrt(n)) * v[d];
        v = w;
        if (1 - std::fabs(dot) < 1e-16) break;
    }
    double m = 0;
    for (const auto& q : Q)
        for (size_t d = 0; d < D; ++d) m += q[d] * v[d];
    if (m < 0)
        for (double& x : v) x = -x;
    return v;
}

TEST(QFilter, TheCalibratedFilterIsTheTopSingularVectorOfTheHeadsPostRopeQueries) {
    TinyModel& tm = tiny_model<41>();
    const std::vector<std::vector<int32_t>> windows = {random_tokens(96, 1), random_tokens(64, 2)};
    const QFilters f = qfilters_from_moments(collect_query_moments(tm.model, windows));
    ASSERT_EQ(f.layers, tm.cfg.num_layers);
    ASSERT_EQ(f.kv_heads, tm.cfg.num_kv_heads);
    ASSERT_EQ(f.head_dim, tm.cfg.head_dim);
    EXPECT_EQ(f.tokens, 160);
    QueryRows rec(tm.cfg.num_kv_heads);
    for (const auto& w : windows) (void)tm.model.forward(Tensor::from_i32({1, int64_t(w.size())}, w), 0, &rec);
    for (int l = 0; l < f.layers; ++l)
        for (int64_t g = 0; g < f.kv_heads; ++g) {
            const auto& Q = rec.rows.at({l, g});
            ASSERT_EQ(int64_t(Q.size()), 160 * tm.cfg.num_heads / tm.cfg.num_kv_heads);
            const std::vector<double> ref = power_iteration(Q);
            double dot = 0;
            for (int64_t d = 0; d < f.head_dim; ++d) dot += ref[size_t(d)] * f.filter(l, g)[d];
            EXPECT_GE(dot, 1 - 1e-9) << "layer " << l << " head " << g;  // same direction and sign (both unit)
        }
    // The file keeps every digit.
    const std::string path = temp_path("roundtrip");
    write_qfilters(path, f);
    const QFilters back = read_qfilters(path);
    EXPECT_EQ(back.filters, f.filters);
    EXPECT_EQ(back.tokens, 160);
    std::remove(path.c_str());
}

TEST(QFilter, TheDirectionIsSignedByTheMeanQuery) {
    // Queries along -e1 mostly: the filter is -e1 (|C| alone cannot tell the sign).
    const int64_t D = 3;
    std::vector<double> C((size_t)(D * D), 0.0), s((size_t)D, 0.0);
    for (const std::vector<double>& q : {std::vector<double>{0.1, -2, 0}, {0, -3, 0.2}, {-0.1, 1, 0}}) {
        for (int64_t a = 0; a < D; ++a) {
            s[size_t(a)] += q[size_t(a)];
            for (int64_t b = 0; b < D; ++b) C[size_t(a * D + b)] += q[size_t(a)] * q[size_t(b)];
        }
    }
    const std::vector<double> f = qfilter_direction(C, s, D);
    EXPECT_LT(f[1], -0.99);
}

// A filter file of one layer with G random unit filters of D channels.
QFilters random_filters(int64_t layers, int64_t G, int64_t D, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> nd;
    QFilters f;
    f.model = "test", f.layers = layers, f.kv_heads = G, f.head_dim = D, f.tokens = 0;
    for (int64_t r = 0; r < layers * G; ++r) {
        std::vector<double> v((size_t)D);
        double n = 0;
        for (double& x : v) {
            x = nd(rng);
            n += x * x;
        }
        for (double& x : v) f.filters.push_back(x / std::sqrt(n));
    }
    return f;
}

TEST(QFilter, ScoresAndChoicesEqualTheF64Reference) {
    const QFilters f = random_filters(1, 2, 16, 7);
    const std::string path = temp_path("formula");
    write_qfilters(path, f);
    check_policy_against_reference("qfilter-default", [&](KVCacheConfig& c) { c.qfilter = path; },
                                   [&](const LayerHarness& h, int64_t, int64_t) { return qfilter_reference(h, f, 0); });
    std::remove(path.c_str());
}

// The tiny model with a qfilter cache: each layer's keys recorded on their way in.
class KeySpy final : public LayerAttention {
   public:
    explicit KeySpy(KVCache& c) : cache_(c) {}
    void set_rope_frequencies(const std::vector<double>* inv_freq) override { cache_.set_rope_frequencies(inv_freq); }
    void attend(int layer, const Tensor& q, const Tensor& k, const Tensor& v, int64_t input_pos, float scale, int window,
                Tensor& y) override {
        const std::vector<double> kv = k.contiguous().to_f64_vector();  // (1, G, n, D)
        const int64_t G = k.size(1), n = k.size(2), D = k.size(3);
        for (int64_t g = 0; g < G; ++g)
            for (int64_t t = 0; t < n; ++t)
                keys[{layer, g}][input_pos + t] = std::vector<double>(kv.begin() + (g * n + t) * D, kv.begin() + (g * n + t + 1) * D);
        cache_.attend(layer, q, k, v, input_pos, scale, window, y);
    }
    std::map<std::pair<int, int64_t>, std::map<int64_t, std::vector<double>>> keys;

   private:
    KVCache& cache_;
};

TEST(QFilter, KeptSetsOnTinyEqualTheDefinition) {
    TinyModel& tm = tiny_model<41>();
    const QFilters f = qfilters_from_moments(collect_query_moments(tm.model, {random_tokens(128, 3)}));
    const std::string path = temp_path("tiny");
    write_qfilters(path, f);
    constexpr int64_t L = 16, T = 64;
    KVCacheConfig kc;
    kc.name = "qfilter-default";
    kc.cache_length = L;
    kc.grace_period = 0;
    kc.keep_initial_fraction = 0;
    kc.qfilter = path;
    KVCache cache(kc, tm.cfg, Device{}, DType::F32, T);
    KeySpy spy(cache);
    const std::vector<int32_t> ids = random_tokens(T, 4);
    const Tensor all = Tensor::from_i32({1, T}, ids);
    // a prefill of 8, a chunk of 8 fills the cache, then chunks of 4 evict 4 each
    std::vector<std::pair<int64_t, int64_t>> chunks = {{0, 8}, {8, 8}};
    for (int64_t s = 16; s < T; s += 4) chunks.push_back({s, 4});
    for (const auto& [s, n] : chunks) (void)tm.model.forward(all.slice(1, s, s + n).contiguous(), s, &spy);
    for (int l = 0; l < tm.cfg.num_layers; ++l)
        for (int64_t g = 0; g < tm.cfg.num_kv_heads; ++g) {
            // The definition: before each chunk past the full cache, the n lowest <k, f> go.
            const auto& K = spy.keys.at({l, g});
            auto score = [&](int64_t p) {
                double d = 0;
                for (int64_t c = 0; c < f.head_dim; ++c) d += K.at(p)[size_t(c)] * f.filter(l, g)[c];
                return d;
            };
            std::set<int64_t> kept;
            for (const auto& [s, n] : chunks) {
                if (s >= L) {
                    std::vector<int64_t> v(kept.begin(), kept.end());
                    std::stable_sort(v.begin(), v.end(), [&](int64_t a, int64_t b) { return score(a) < score(b); });
                    for (int64_t i = 0; i < n; ++i) kept.erase(v[size_t(i)]);
                }
                for (int64_t t = s; t < s + n; ++t) kept.insert(t);
            }
            const auto& pos = cache.layer(l).policy().token_positions();
            std::set<int64_t> got;
            for (int64_t j = 0; j < L; ++j) got.insert(pos[size_t(g * L + j)]);
            EXPECT_EQ(got, kept) << "layer " << l << " KV head " << g;
        }
    std::remove(path.c_str());
}

TEST(QFilter, AMissingFileOrAHeadCountMismatchIsOneClearMessage) {
    KVCacheConfig kc;
    kc.name = "qfilter-default";
    kc.cache_length = 8;
    kc.qfilter = temp_path("does_not_exist");
    const ModelConfig cfg = preset_config("tiny");
    auto error_of = [&] {
        try {
            KVCache c(kc, cfg, Device{}, DType::F32, 16);
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string();
    };
    std::string e = error_of();
    EXPECT_NE(e.find("--kv_cache.qfilter: cannot read '" + kc.qfilter + "'"), std::string::npos) << e;
    EXPECT_NE(e.find("kvlab calibrate qfilter"), std::string::npos) << e;
    const std::string path = temp_path("three_heads");
    write_qfilters(path, random_filters(2, 3, 16, 9));
    kc.qfilter = path;
    e = error_of();
    EXPECT_NE(e.find("has filters for 2 layers x 3 KV heads (model test); this model has 2 layers x 2 KV heads"), std::string::npos) << e;
    write_qfilters(path, random_filters(2, 2, 8, 9));  // the right heads, the wrong head size: found when keys arrive
    {
        TinyModel& tm = tiny_model<41>();
        KVCache c(kc, tm.cfg, Device{}, DType::F32, 16);
        KeySpy spy(c);
        const std::vector<int32_t> ids = random_tokens(4, 5);
        try {
            (void)tm.model.forward(Tensor::from_i32({1, 4}, ids), 0, &spy);
            ADD_FAILURE() << "a filter of 8 channels for heads of 16 was accepted";
        } catch (const Error& x) {
            EXPECT_NE(std::string(x.what()).find("has filters of 8 channels; this model's heads have 16"), std::string::npos) << x.what();
        }
    }
    kc.qfilter = "";
    e = error_of();
    EXPECT_NE(e.find("--kv_cache.qfilter is required for policy 'qfilter'"), std::string::npos) << e;
    std::remove(path.c_str());
}

}  // namespace
}  // namespace kv::test
