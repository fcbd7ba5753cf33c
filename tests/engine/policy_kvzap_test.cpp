// kvzap against its definition in f64: the calibration's rows are the ridge least-squares
// solution written here as naive normal equations (X^T X + lambda D) w = X^T y solved by Gaussian
// elimination; on `tiny` they are that solution over each layer's attention inputs and the logs
// of the KVzip scores a kvzip cache gives the same text; an interrupted calibration resumed from
// its resume file writes the same rows; the policy's score of a slot is w_g . h + b_g of its
// token's hidden state, and it evicts the lowest; bad surrogate files are refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "engine/core/error.h"
#include "engine/kv/context_reconstruction.h"
#include "engine/kv/kv_cache.h"
#include "engine/kv/kvzap_calibration.h"
#include "engine/kv/policies/kvzap_weights.h"
#include "tests/engine/data_test_util.h"
#include "tests/engine/kv_test_util.h"
#include "tests/engine/policy_reference_util.h"
#include "tests/engine/tiny_model_util.h"
#include "tests/support/test_support.h"

namespace kv::test {
namespace {

using data_test::error_of;

std::string temp_path(const std::string& tag) { return ::testing::TempDir() + "kvlab_kvzap_" + tag + ".txt"; }

// argmin_w |X w - y|^2 + lambda |w[:E]|^2 for X = [h 1] (N x (E + 1)), by the normal equations
// formed naively and Gaussian elimination with partial pivoting.
std::vector<double> naive_ridge(const std::vector<std::vector<double>>& H, const std::vector<double>& y, double ridge) {
    const size_t N = H.size(), E = H[0].size(), C = E + 1;
    std::vector<std::vector<double>> M(C, std::vector<double>(C + 1, 0.0));
    for (size_t t = 0; t < N; ++t) {
        std::vector<double> x = H[t];
        x.push_back(1.0);
        for (size_t a = 0; a < C; ++a) {
            for (size_t b = 0; b < C; ++b) M[a][b] += x[a] * x[b];
            M[a][C] += x[a] * y[t];
        }
    }
    double tr = 0;
    for (size_t e = 0; e < E; ++e) tr += M[e][e];
    for (size_t e = 0; e < E; ++e) M[e][e] += ridge * tr / double(E);
    for (size_t c = 0; c < C; ++c) {
        size_t p = c;
        for (size_t r = c + 1; r < C; ++r)
            if (std::fabs(M[r][c]) > std::fabs(M[p][c])) p = r;
        std::swap(M[c], M[p]);
        for (size_t r = 0; r < C; ++r) {
            if (r == c) continue;
            const double f = M[r][c] / M[c][c];
            for (size_t k = c; k <= C; ++k) M[r][k] -= f * M[c][k];
        }
    }
    std::vector<double> w(C);
    for (size_t c = 0; c < C; ++c) w[c] = M[c][C] / M[c][c];
    return w;
}

void expect_rows_near(const double* got, const std::vector<double>& want, double tol, const std::string& what) {
    for (size_t i = 0; i < want.size(); ++i)
        EXPECT_NEAR(got[i], want[i], tol * std::max(1.0, std::fabs(want[i]))) << what << " entry " << i;
}

TEST(KVzap, TheFitIsTheNaiveRidgeSolution) {
    const int64_t N = 40, E = 6, G = 2;
    std::mt19937_64 rng(5);
    std::normal_distribution<double> nd;
    std::vector<double> h((size_t)(N * E)), y((size_t)(N * G));
    for (double& x : h) x = nd(rng);
    for (double& x : y) x = nd(rng) - 4;
    KVzapNormalEquations ne(E, G);
    ne.add(std::vector<double>(h.begin(), h.begin() + 17 * E), std::vector<double>(y.begin(), y.begin() + 17 * G), 17);
    ne.add(std::vector<double>(h.begin() + 17 * E, h.end()), std::vector<double>(y.begin() + 17 * G, y.end()), N - 17);
    EXPECT_EQ(ne.tokens, N);
    std::vector<std::vector<double>> H;
    for (int64_t t = 0; t < N; ++t) H.emplace_back(h.begin() + t * E, h.begin() + (t + 1) * E);
    for (double ridge : {0.0, 0.05, 2.0}) {
        const std::vector<double> w = solve_kvzap_layer(ne, ridge);
        ASSERT_EQ(int64_t(w.size()), G * (E + 1));
        for (int64_t g = 0; g < G; ++g) {
            std::vector<double> yg;
            for (int64_t t = 0; t < N; ++t) yg.push_back(y[size_t(t * G + g)]);
            expect_rows_near(w.data() + g * (E + 1), naive_ridge(H, yg, ridge), 1e-10, str("ridge ", ridge, " head ", g));
            if (ridge == 0.0) {  // least squares: the residual is orthogonal to every column of X
                for (int64_t c = 0; c <= E; ++c) {
                    double dot = 0;
                    for (int64_t t = 0; t < N; ++t) {
                        double pred = w[size_t(g * (E + 1) + E)];
                        for (int64_t e = 0; e < E; ++e) pred += w[size_t(g * (E + 1) + e)] * h[size_t(t * E + e)];
                        dot += (pred - yg[size_t(t)]) * (c < E ? h[size_t(t * E + c)] : 1.0);
                    }
                    EXPECT_NEAR(dot, 0.0, 1e-9) << "column " << c;
                }
            }
        }
    }
    // Fewer tokens than unknowns without a ridge: refused by name.
    KVzapNormalEquations few(E, 1);
    few.add(std::vector<double>(h.begin(), h.begin() + 3 * E), std::vector<double>(y.begin(), y.begin() + 3), 3);
    EXPECT_NE(error_of([&] { (void)solve_kvzap_layer(few, 0.0); }).find("singular"), std::string::npos);
}

// Every layer's attention input (1, n, E) and KVzip's scores (G, n) of one window, from a kvzip
// cache that keeps every token and its reconstruction pass, run here as generation runs it.
struct LayerTargets {
    std::vector<std::vector<double>> h;  // [layer] (n, E)
    std::vector<std::vector<float>> s;   // [layer] (G, n)
};
LayerTargets kvzip_targets(TinyModel& tm, const std::vector<int32_t>& ids) {
    const int64_t n = int64_t(ids.size());
    KVCacheConfig kc;
    kc.name = "kvzip-default";
    kc.cache_length = n;
    kc.grace_period = 0;
    kc.policy_options["kvzip_n_sink"] = 0;
    KVCache cache(kc, tm.cfg, Device{}, DType::F32, n, &byte_codec());
    std::unique_ptr<ContextReconstruction> rec = make_context_reconstruction(tm.model, cache);
    tm.model.set_context_width(n + rec->max_piece_tokens(n));
    const Tensor t = Tensor::from_i32({1, n}, ids);
    ReconstructionChunk chunk = rec->prepare(t, 0);
    Tensor x = tm.model.embed(t);
    LayerTargets out;
    for (int l = 0; l < tm.cfg.num_layers; ++l) {
        BlockActivations act;
        x = tm.model.block(l, x, 0, cache, &act);
        rec->run_layer(l, chunk);
        out.h.push_back(act.h1.to_f64_vector());
        out.s.push_back(cache.layer(l).policy().slot_scores());
    }
    return out;
}

CalibrationRun tiny_run(TinyModel& tm, const std::vector<std::vector<int32_t>>& samples, const std::string& out,
                        std::function<void(int64_t, int64_t, const std::string&)> progress) {
    static const std::string name = "tiny";  // the run keeps a reference
    return CalibrationRun{tm.model,
                          name,
                          tm.cfg.num_layers,
                          tm.cfg.num_kv_heads,
                          samples,
                          [](std::string_view name) { return name == "ridge" ? 1e-3 : 1e-10; },
                          std::move(progress),
                          out,
                          &byte_codec()};
}

TEST(KVzap, CalibrationOnTinyFitsTheLogOfKVzipsScoresAndResumes) {
    TinyModel& tm = tiny_model<43>();
    const std::vector<std::vector<int32_t>> samples = {random_tokens(48, 1), random_tokens(48, 2)};
    const std::string path = temp_path("tiny");
    std::filesystem::remove(path + ".resume");
    const std::string line = run_kvzap_calibration(tiny_run(tm, samples, path, {}));
    EXPECT_NE(line.find("from 96 tokens"), std::string::npos) << line;
    const KVzapWeights w = read_kvzap_weights(path);
    const int64_t E = tm.cfg.hidden_size, G = tm.cfg.num_kv_heads;
    ASSERT_EQ(w.layers, tm.cfg.num_layers);
    ASSERT_EQ(w.kv_heads, G);
    ASSERT_EQ(w.hidden_size, E);
    EXPECT_EQ(w.tokens, 96);
    EXPECT_FALSE(std::filesystem::exists(path + ".resume"));

    std::vector<LayerTargets> tg;
    for (const auto& s : samples) tg.push_back(kvzip_targets(tm, s));
    for (int l = 0; l < w.layers; ++l)
        for (int64_t g = 0; g < G; ++g) {
            std::vector<std::vector<double>> H;
            std::vector<double> y;
            for (const LayerTargets& t : tg)
                for (int64_t i = 0; i < 48; ++i) {
                    H.emplace_back(t.h[size_t(l)].begin() + i * E, t.h[size_t(l)].begin() + (i + 1) * E);
                    y.push_back(std::log(std::max(double(t.s[size_t(l)][size_t(g * 48 + i)]), 1e-10)));
                }
            expect_rows_near(w.row(l, g), naive_ridge(H, y, 1e-3), 1e-7, str("layer ", l, " head ", g));
        }

    // Interrupted after layer 0: the rerun starts at layer 1 and writes the same rows.
    const std::string cut = temp_path("cut");
    std::filesystem::remove(cut + ".resume");
    const int64_t S = int64_t(samples.size());
    EXPECT_NE(error_of([&] {
                  (void)run_kvzap_calibration(tiny_run(tm, samples, cut, [&](int64_t step, int64_t, const std::string&) {
                      if (step > S) throw Error("interrupted");
                  }));
              }).find("interrupted"),
              std::string::npos);
    ASSERT_TRUE(std::filesystem::exists(cut + ".resume"));
    EXPECT_FALSE(std::filesystem::exists(cut));
    int64_t first_step = -1;
    (void)run_kvzap_calibration(tiny_run(tm, samples, cut, [&](int64_t step, int64_t, const std::string&) {
        if (first_step < 0) first_step = step;
    }));
    EXPECT_EQ(first_step, S);  // "resumed after layer 0": nothing of layer 0 ran again
    EXPECT_EQ(read_kvzap_weights(cut).w, w.w);
    EXPECT_FALSE(std::filesystem::exists(cut + ".resume"));

    // A resume file of other windows is refused, naming it.
    std::filesystem::remove(cut);
    (void)error_of([&] {
        (void)run_kvzap_calibration(tiny_run(tm, samples, cut, [&](int64_t step, int64_t, const std::string&) {
            if (step > S) throw Error("interrupted");
        }));
    });
    const std::vector<std::vector<int32_t>> other = {random_tokens(48, 3), random_tokens(48, 2)};
    const std::string e = error_of([&] { (void)run_kvzap_calibration(tiny_run(tm, other, cut, {})); });
    EXPECT_NE(e.find(cut + ".resume' was written for another model, text or options"), std::string::npos) << e;
    std::filesystem::remove(cut + ".resume");
    std::remove(cut.c_str());
    std::remove(path.c_str());
}

// A surrogate file of one layer: G random rows of E weights and a bias.
KVzapWeights random_weights_file(int64_t layers, int64_t G, int64_t E, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> nd;
    KVzapWeights w;
    w.model = "test", w.layers = layers, w.kv_heads = G, w.hidden_size = E, w.tokens = 0;
    for (int64_t i = 0; i < layers * G * (E + 1); ++i) w.w.push_back(nd(rng) * 0.2);
    return w;
}

TEST(KVzap, ScoresAndChoicesEqualTheF64Reference) {
    // The harness's layer: 4 query heads of 16, so hidden states of E = 64.
    const KVzapWeights w = random_weights_file(1, 2, 64, 9);
    const std::string path = temp_path("formula");
    write_kvzap_weights(path, w);
    check_policy_against_reference("kvzap-default", [&](KVCacheConfig& c) { c.kvzap = path; },
                                   [&](const LayerHarness& h, int64_t, int64_t) {
                                       const KVPolicy& pol = h.cache->layer(0).policy();
                                       const auto& pos = pol.token_positions();
                                       std::vector<double> out((size_t)(h.B * h.G * h.L), 0.0);
                                       for (int64_t r = 0; r < h.B * h.G; ++r)
                                           for (int64_t j = 0; j < pol.current_length(); ++j) {
                                               const std::vector<float>& x = h.hidden_history[size_t(r / h.G)].at(pos[size_t(r * h.L + j)]);
                                               const double* row = w.row(0, r % h.G);
                                               double s = row[64];
                                               for (int64_t e = 0; e < 64; ++e) s += row[e] * double(x[size_t(e)]);
                                               out[size_t(r * h.L + j)] = s;
                                           }
                                       return out;
                                   });
    // The file keeps every digit.
    EXPECT_EQ(read_kvzap_weights(path).w, w.w);
    std::remove(path.c_str());
}

TEST(KVzap, BadSurrogatesAreRefusedByName) {
    KVCacheConfig kc;
    kc.name = "kvzap-default";
    kc.cache_length = 16;
    ModelConfig mc = preset_config("tiny");
    auto make = [&] { KVCache c(kc, mc, Device{}, DType::F32, 64); };
    std::string e = error_of(make);
    EXPECT_NE(e.find("--kv_cache.kvzap is required for policy 'kvzap'"), std::string::npos) << e;
    EXPECT_NE(e.find("kvlab calibrate kvzap MODEL --data FILE -o FILE"), std::string::npos) << e;
    kc.kvzap = temp_path("no_such_file");
    e = error_of(make);
    EXPECT_NE(e.find("--kv_cache.kvzap: cannot read '" + kc.kvzap + "'; expected a surrogate file written by `kvlab calibrate kvzap`"),
              std::string::npos)
        << e;
    kc.kvzap = "seed:x";
    EXPECT_NE(error_of(make).find("expected seed: followed by a whole number"), std::string::npos);
    // A surrogate of another shape names both shapes and the command that makes the right one.
    const std::string path = temp_path("shape");
    write_kvzap_weights(path, random_weights_file(mc.num_layers + 1, mc.num_kv_heads, mc.hidden_size, 1));
    kc.kvzap = path;
    e = error_of(make);
    EXPECT_NE(e.find(str("has a surrogate for ", mc.num_layers + 1, " layers x ", mc.num_kv_heads, " KV heads")), std::string::npos) << e;
    EXPECT_NE(e.find("kvlab calibrate kvzap"), std::string::npos) << e;
    // Another hidden size: refused when the first hidden states arrive.
    write_kvzap_weights(path, random_weights_file(mc.num_layers, mc.num_kv_heads, mc.hidden_size + 2, 1));
    {
        TinyModel& tm = tiny_model<43>();
        KVCache cache(kc, tm.cfg, Device{}, DType::F32, 64);
        tm.model.set_context_width(64);
        e = error_of([&] { (void)tm.model.forward(Tensor::from_i32({1, 8}, random_tokens(8, 1)), 0, &cache); });
        EXPECT_NE(e.find(str("surrogate for hidden size ", mc.hidden_size + 2, "; this model's layers have ", mc.hidden_size)),
                  std::string::npos)
            << e;
    }
    // A truncated file: the row count.
    std::ofstream(path) << "kvlab-kvzap 1\nlayers 2\nkv_heads 1\nhidden_size 2\nweights\n1 2 3\n";
    e = error_of([&] { (void)read_kvzap_weights(path); });
    EXPECT_NE(e.find("has 1 rows; expected 2"), std::string::npos) << e;
    std::remove(path.c_str());
    // A cache call without hidden states: refused by name.
    LayerHarness h("kvzap-default", 12, 1);
    Tensor q = Tensor::zeros({2, 4, 3, 16}, DType::F32), k = Tensor::zeros({2, 2, 3, 16}, DType::F32), y = Tensor::empty({2, 4, 3, 16}, DType::F32);
    e = error_of([&] { h.cache->attend(0, q, k, k, 0, 0.25f, 0, y); });
    EXPECT_NE(e.find("scores tokens from the layer's input hidden states, which this call was not given"), std::string::npos) << e;
}

}  // namespace
}  // namespace kv::test
