// The policy registry and the loop over it. The table agrees with the run option table (CLI
// help, JSON, GUI form), the docs and the factories; validation speaks from it; every
// registered policy x {default, q8} replays bit for bit on the tiny model and its buffers hold
// exactly the bytes of the slots each layer keeps. The other registry loops: kv_invariants_test
// (positions and contents), grad_fd_test PolicyGradient (FD gradients in f64), kv_scores_test
// (top-k = argsort). Also: per-layer lengths (--kv_cache.layer_cache_lengths) and the formula
// tests of random, pyramidkv, rkv and expected-attention against independent references.
//
// Index
//   [SECTION] the table
//   [SECTION] the loop: every policy x {default, q8} on the tiny model
//   [SECTION] per-layer lengths
//   [SECTION] formula tests: random, pyramidkv (snapkv's scores), rkv, expected-attention
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <functional>
#include <numeric>
#include <set>
#include <sstream>

#include "engine/backend/backend_registry.h"
#include "engine/core/error.h"
#include "engine/driver/chunk_plan.h"
#include "engine/kv/kv_cache.h"
#include "engine/kv/policies/policy_registry.h"
#include "engine/model/presets.h"
#include "engine/model/transformer.h"
#include "engine/run/run_config.h"
#include "policy_references.h"
#include "tests/support/test_support.h"

namespace kv::test {
namespace {

bool contains(const std::vector<std::string>& v, const std::string& x) { return std::find(v.begin(), v.end(), x) != v.end(); }

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "<no error>";
}

// =========================================================================================
// [SECTION] the table
// =========================================================================================

TEST(PolicyRegistry, NamesAreTheTableInOrderAndSplitBack) {
    std::vector<std::string> want;
    for (const PolicyInfo& p : policy_registry()) want.push_back(p.name);
    EXPECT_EQ(kv_policy_names(), want);
    EXPECT_EQ(std::set<std::string>(want.begin(), want.end()).size(), want.size()) << "a policy name is repeated";
    for (const std::string& p : want)
        for (const std::string& b : kv_buffer_names()) {
            KVCacheConfig c;
            c.name = p + "-" + b;
            EXPECT_EQ(c.policy(), p) << c.name;  // longest prefix: h2o-orig-q8 is h2o-orig, not h2o
            EXPECT_EQ(c.buffer(), b) << c.name;
            EXPECT_NO_THROW(check_kv_cache_name(c.name));
        }
}

TEST(PolicyRegistry, FactoriesBuildWhatTheDescriptorsSay) {
    for (const PolicyInfo& p : policy_registry()) {
        auto pol = make_test_policy(p.name + (p.needs_quantized_buffer ? "-q8" : "-default"), 24);
        ASSERT_TRUE(pol) << p.name;
        EXPECT_EQ(std::string(pol->name()), p.name);
        EXPECT_EQ(pol->needs_attention_weights(), p.needs_attention_weights) << p.name;
        EXPECT_EQ(policy_needs_attention_weights(p.name), p.needs_attention_weights) << p.name;
        EXPECT_EQ(pol->needs_features().has(Feature::QuantError), p.needs_quantized_buffer) << p.name;
        EXPECT_EQ(pol->cache_length(), 24) << p.name;
    }
}

TEST(PolicyRegistry, EveryOptionHasARunOptionRow) {
    RunConfig defaults;
    for (const PolicyInfo& p : policy_registry()) {
        for (const std::string& u : p.uses) EXPECT_NE(find_run_option("kv_cache." + u), nullptr) << p.name << " uses " << u;
        for (const auto& [name, value] : p.required) EXPECT_NE(find_run_option(name), nullptr) << p.name << " requires " << name;
        for (const PolicyOption& o : p.options) {
            const OptionDef* row = find_run_option("kv_cache." + o.name);
            ASSERT_NE(row, nullptr) << p.name << "'s option " << o.name << " has no generated row";
            EXPECT_EQ(row->help, o.help);
            EXPECT_EQ(std::stod(row->get(defaults)), o.def) << o.name;
            RunConfig c;
            const std::string hi = o.integer ? std::to_string(int64_t(o.hi)) : std::to_string(o.hi);
            set_run_option(c, row->name, hi);
            EXPECT_EQ(c.kv_cache.policy_option(o.name), o.integer ? double(int64_t(o.hi)) : std::stod(hi));
            // JSON round trip keeps it
            RunConfig back = run_config_from_json(run_config_to_json(c), "test");
            EXPECT_EQ(back.kv_cache.policy_option(o.name), c.kv_cache.policy_option(o.name)) << o.name;
            const std::string msg = error_of([&] { set_run_option(c, row->name, "-1e300"); });
            EXPECT_NE(msg.find("--kv_cache." + o.name), std::string::npos) << msg;
            EXPECT_NE(msg.find("expected"), std::string::npos) << msg;
        }
    }
}

// GitHub's heading anchors: lower case, spaces to '-', other punctuation dropped.
std::set<std::string> doc_anchors(const std::string& path) {
    std::ifstream in(path);
    std::set<std::string> out;
    std::string line;
    while (std::getline(in, line)) {
        if (line.empty() || line[0] != '#') continue;
        std::string h = line.substr(line.find_first_not_of('#'));
        std::string a;
        for (char ch : h.substr(h.find_first_not_of(' '))) {
            if (std::isalnum((unsigned char)ch) || ch == '-' || ch == '_') a += char(std::tolower((unsigned char)ch));
            else if (ch == ' ') a += '-';
        }
        out.insert(a);
    }
    return out;
}

TEST(PolicyRegistry, EveryDocAnchorIsASectionOfPoliciesMd) {
    const std::set<std::string> anchors = doc_anchors(std::string(KVLAB_SOURCE_DIR) + "/docs/POLICIES.md");
    ASSERT_GT(anchors.size(), 5u);
    for (const PolicyInfo& p : policy_registry()) {
        const std::string prefix = "docs/POLICIES.md#";
        ASSERT_EQ(p.doc_anchor.rfind(prefix, 0), 0u) << p.name << ": " << p.doc_anchor;
        EXPECT_TRUE(anchors.count(p.doc_anchor.substr(prefix.size()))) << p.name << ": no section " << p.doc_anchor;
    }
}

TEST(PolicyRegistry, CliHelpAndGuiFormListEveryPolicy) {
    const OptionDef* name = find_run_option("kv_cache.name");
    ASSERT_NE(name, nullptr);
    for (const PolicyInfo& p : policy_registry()) {
        EXPECT_NE(name->help.find(p.summary), std::string::npos) << p.name << " is missing from the help";
        for (const std::string& b : kv_buffer_names()) EXPECT_TRUE(contains(name->choices, p.name + "-" + b)) << p.name << "-" << b;
    }
    EXPECT_EQ(name->choices.size(), policy_registry().size() * kv_buffer_names().size());
}

TEST(PolicyRegistry, ValidationReadsTheDescriptors) {
    const ModelConfig m = preset_config("tiny");
    auto check = [&](KVCacheConfig c) { validate_kv_config(c, m.num_layers, m.head_dim, m.num_kv_heads); };
    for (const PolicyInfo& p : policy_registry()) {
        KVCacheConfig c;
        c.name = p.name + "-default";
        c.cache_length = 0;
        apply_required_options(c);
        const std::string msg = error_of([&] { check(c); });
        if (p.needs_quantized_buffer) {
            EXPECT_NE(msg.find("policy '" + p.name + "' needs a quantized buffer"), std::string::npos) << msg;
            continue;
        }
        if (p.needs_cache_length) {
            EXPECT_NE(msg.find("cache_length is required for policy '" + p.name + "'"), std::string::npos) << msg;
        } else {
            EXPECT_EQ(msg, "<no error>");
        }
        c.cache_length = 64;
        EXPECT_EQ(error_of([&] { check(c); }), "<no error>") << p.name;
    }
    KVCacheConfig c;
    c.name = "random-default";
    c.cache_length = 32;
    c.policy_options["no_such_option"] = 1;
    EXPECT_NE(error_of([&] { check(c); }).find("--kv_cache.no_such_option: no policy has this option"), std::string::npos);
    c.policy_options = {{"random_seed", 0.5}};
    EXPECT_NE(error_of([&] { check(c); }).find("--kv_cache.random_seed: 0.5 is out of range; expected a whole number"), std::string::npos);
}

// =========================================================================================
// [SECTION] the loop: every policy x {default, q8, kivi2} on the tiny model
// =========================================================================================

struct TinyModel {
    ModelConfig cfg = preset_config("tiny");
    Transformer model{cfg, random_weights(cfg, 5, DType::F32), ModelOptions{}};
};

TinyModel& tiny() {
    static TinyModel m;
    return m;
}

struct LoopCase {
    std::string policy, buffer;
};

std::vector<LoopCase> loop_cases() {
    std::vector<LoopCase> out;
    for (const PolicyInfo& p : policy_registry())
        for (const char* b : {"default", "q8", "kivi2"})
            // a policy that names its buffers runs on those alone (quest reads K/V itself, so not kivi2)
            if (!(p.needs_quantized_buffer && std::string(b) == "default") && (p.buffers.empty() || contains(p.buffers, b)))
                out.push_back({p.name, b});
    return out;
}

class PolicyLoop : public testing::TestWithParam<LoopCase> {};

// Every layer's output for every chunk (layer-major within a chunk).
// replay: per layer, the plans to commit instead of the policy's (ChunkInput::replay).
std::vector<std::vector<float>> run_chunks(Transformer& m, KVCache& cache, const Tensor& ids, const std::vector<int64_t>& chunks,
                                           const std::vector<std::vector<SlotPlan>>* replay = nullptr) {
    std::vector<std::vector<float>> outs;
    int64_t P = 0;
    for (int64_t n : chunks) {
        Tensor x = m.embed(ids.slice(1, P, P + n));
        const std::vector<int32_t> tok = chunk_ids(ids.slice(1, P, P + n).contiguous());
        ChunkCall call(cache, ChunkInput{.ids = &tok, .replay = replay});
        for (int l = 0; l < int(m.config().num_layers); ++l) {
            x = m.block(l, x, P, call);
            outs.push_back(x.to_f32_vector());
        }
        P += n;
    }
    return outs;
}

TEST_P(PolicyLoop, ReplaysBitForBitAndKeepsTheBytesOfItsSlots) {
    const LoopCase lc = GetParam();
    TinyModel& t = tiny();
    const int64_t B = 2, T = 136, nl = t.cfg.num_layers, G = t.cfg.num_kv_heads, D = t.cfg.head_dim;
    KVCacheConfig kc;
    kc.name = lc.policy + "-" + lc.buffer;
    kc.cache_length = find_policy(lc.policy)->needs_cache_length ? 40 : 0;  // dense: the whole sequence
    kc.snapkv_window = 8;
    kc.kivi_group_size = 8;  // kivi2: groups really pack (and unpack under eviction) in 136 tokens
    kc.kivi_residual = 8;
    if (lc.policy == "quest") kc.policy_options = {{"quest_page_size", 8}, {"quest_pages", 2}};  // really select pages
    apply_required_options(kc);
    std::vector<int64_t> Ls;
    for (int64_t l = 0; l < nl; ++l) Ls.push_back(kc.length_for_layer(l, T, nl));
    ChunkPlanOptions po;
    po.chunk_size = 8;
    const std::vector<int64_t> chunks = plan_chunks(T, Ls, po).chunks;
    std::mt19937_64 rng(seed_for("policy loop " + kc.name));
    std::vector<int32_t> idv((size_t)(B * T));
    for (auto& x : idv) x = int32_t(rng() % 200 + 32);
    idv[5] = idv[size_t(T + 9)] = '\n';  // smart-lastrec's regex finds a prompt end in each row
    Tensor ids = Tensor::from_i32({B, T}, idv);

    KVCache live(kc, t.cfg, Device{}, DType::F32, T, &byte_codec());
    live.set_replay_logging(true);
    auto a = run_chunks(t.model, live, ids, chunks);
    if (find_policy(lc.policy)->initial_layer_length) {  // cake: layer lengths decided in the run, summing to nl x L
        int64_t sum = 0;
        for (int l = 0; l < nl; ++l) {
            ASSERT_GE(live.layer(l).policy().cache_length(), Ls[size_t(l)]) << kc.name << " layer " << l << " below its prefill";
            sum += Ls[size_t(l)] = live.layer(l).policy().cache_length();
        }
        EXPECT_EQ(sum, nl * kc.cache_length) << kc.name;
    }
    for (int l = 0; l < nl; ++l) ASSERT_EQ(live.layer(l).policy().cache_length(), Ls[size_t(l)]) << kc.name << " layer " << l;
    for (int l = 0; l < nl; ++l)  // every layer filled up (and, but for dense, evicted)
        ASSERT_EQ(live.layer(l).policy().current_length(), Ls[size_t(l)]) << kc.name;

    // Replay: the logged plans rebuild every layer output exactly.
    KVCache replay(kc, t.cfg, Device{}, DType::F32, T, &byte_codec());
    std::vector<std::vector<SlotPlan>> plans;
    for (int l = 0; l < nl; ++l) plans.push_back(live.layer(l).replay_log().plans());
    auto b = run_chunks(t.model, replay, ids, chunks, &plans);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << kc.name << ": output " << i << " differs in the replay";

    // Memory: each layer stores K and V for exactly its L slots per (b, g) — f32 rows of D
    // values, or q8 rows of D bytes + an f32 scale + an i32 zero point (docs/POLICIES.md) —
    // plus, for q8, one shared f32 working buffer as long as the longest layer.
    const size_t row = lc.buffer == "q8" ? size_t(D) + 8 : size_t(D) * 4;
    size_t want = 0;
    for (int64_t L : Ls) want += 2 * size_t(B * G * L) * row;
    if (lc.buffer == "kivi2") {
        // kivi2 (kernels/common/kivi_math.h), S = VG = 8: per slot and head 2 D / 4 bytes of
        // codes, f16 scale + minimum per 8 keys of a channel and per 8 channels of a value; a
        // group map (int32 per group) and a residual pool of ceil(R/S) + 2 = 3 f32 blocks of S
        // slots of K and V per (b, g).
        want = 0;
        for (int64_t L : Ls) {
            const size_t NG = size_t((L + 7) / 8);
            want += size_t(B * G) * (NG * size_t(D) * (2 + 4) + size_t(L) * (size_t(D) / 4 + size_t(D) / 8 * 4) + NG * 4 +
                                     3 * 2 * 8 * size_t(D) * 4);
        }
    }
    EXPECT_EQ(live.buffer_bytes() - live.working_bytes(), want) << kc.name;
    const int64_t maxL = *std::max_element(Ls.begin(), Ls.end());
    EXPECT_EQ(live.working_bytes(), lc.buffer == "q8" ? 2 * size_t(B * G * maxL * D) * 4 : 0) << kc.name;
}

INSTANTIATE_TEST_SUITE_P(Registry, PolicyLoop, testing::ValuesIn(loop_cases()), [](const testing::TestParamInfo<LoopCase>& i) {
    std::string s = i.param.policy + "_" + i.param.buffer;
    for (char& c : s)
        if (!isalnum((unsigned char)c)) c = '_';
    return s;
});

// =========================================================================================
// [SECTION] per-layer lengths
// =========================================================================================

std::vector<int64_t> lengths_of(const std::string& text, int64_t L, int64_t nl, int64_t window = 32) {
    RunConfig c;
    c.kv_cache.name = "h2o-default";
    c.kv_cache.cache_length = L;
    c.kv_cache.snapkv_window = window;
    set_run_option(c, "kv_cache.layer_cache_lengths", text);
    EXPECT_EQ(find_run_option("kv_cache.layer_cache_lengths")->get(c), text);  // the text form round-trips
    std::vector<int64_t> out;
    for (int64_t l = 0; l < nl; ++l) out.push_back(c.kv_cache.length_for_layer(l, 1000, nl));
    return out;
}

TEST(LayerCacheLengths, ListsAndRulesGiveTheHandComputedLengths) {
    EXPECT_EQ(lengths_of("48,40,32", 0, 3), (std::vector<int64_t>{48, 40, 32}));
    EXPECT_EQ(lengths_of("linear:64:32", 0, 5), (std::vector<int64_t>{64, 56, 48, 40, 32}));
    EXPECT_EQ(lengths_of("linear:10:13", 0, 3), (std::vector<int64_t>{10, 12, 13}));  // 11.5 rounds up
    // pyramid:20 around L = 72 with window 32: k = 40, top 40 / 20 = 2, bottom 2 * 40 - 2 = 78,
    // step (78 - 2) / 2 = 38; each layer adds the window.
    EXPECT_EQ(lengths_of("pyramid:20", 72, 3), (std::vector<int64_t>{110, 72, 34}));
    // pyramid:4 around 40 with window 8 over 4 layers: k = 32, top 8, bottom 56, step 16.
    EXPECT_EQ(lengths_of("pyramid:4", 40, 4, 8), (std::vector<int64_t>{64, 48, 32, 16}));
    // pyramid-kvpress (kvpress' PyramidKVPress, the window inside the length): around L = 1000,
    // beta 4, 3 layers: top 250, bottom 1750, step 750.
    EXPECT_EQ(lengths_of("pyramid-kvpress:4", 1000, 3), (std::vector<int64_t>{1750, 1000, 250}));
    // L = 100, beta 3, 4 layers, window 8: 166.67, 122.22, 77.78, 33.33 rounded (sum 400 = 4 L).
    EXPECT_EQ(lengths_of("pyramid-kvpress:3", 100, 4, 8), (std::vector<int64_t>{167, 122, 78, 33}));
    // Halves round to even as Python's round: L = 10, beta 4, window 0: 17.5, 10, 2.5 -> 18, 10, 2.
    EXPECT_EQ(lengths_of("pyramid-kvpress:4", 10, 3, 0), (std::vector<int64_t>{18, 10, 2}));
    // A top under the window (72 / 20 = 3.6 < 32): the press falls back to one length.
    EXPECT_EQ(lengths_of("pyramid-kvpress:20", 72, 3), (std::vector<int64_t>{72, 72, 72}));
    // pyramidkv's own default rule is pyramid:20 (paper's beta)
    KVCacheConfig p;
    p.name = "pyramidkv-default";
    p.cache_length = 72;
    EXPECT_EQ(p.length_for_layer(0, 1000, 3), 110);
    EXPECT_EQ(p.length_for_layer(2, 1000, 3), 34);
}

TEST(LayerCacheLengths, BadValuesGiveOneClearMessage) {
    RunConfig c;
    for (const char* bad : {"0,4", "12,x", "linear:5", "pyramid:0", "pyramid-kvpress:0", "pyramid-kvpress", "cubic:3"}) {
        const std::string msg = error_of([&] { set_run_option(c, "kv_cache.layer_cache_lengths", bad); });
        EXPECT_NE(msg.find("--kv_cache.layer_cache_lengths: '"), std::string::npos) << bad << ": " << msg;
        EXPECT_NE(msg.find("expected one slot count >= 1 per layer"), std::string::npos) << bad << ": " << msg;
    }
    const ModelConfig m = preset_config("tiny");
    KVCacheConfig k;
    k.name = "h2o-default";
    k.layer_cache_lengths = {32, 32, 32};
    EXPECT_NE(error_of([&] { validate_kv_config(k, m.num_layers, m.head_dim, m.num_kv_heads); })
                  .find("3 values for 2 layers; expected one per layer"),
              std::string::npos);
    k.layer_cache_lengths.clear();
    k.layer_cache_rule = "pyramid:20";
    k.cache_length = 24;  // not larger than the window 32
    EXPECT_NE(error_of([&] { validate_kv_config(k, m.num_layers, m.head_dim, m.num_kv_heads); })
                  .find("needs cache_length 24 larger than the observation window snapkv_window 32"),
              std::string::npos);
}

// =========================================================================================
// [SECTION] formula tests: random, pyramidkv (snapkv's scores), rkv
// =========================================================================================

// The documented draw (docs/POLICIES.md#random), written out independently of the policy.
double random_draw(uint64_t seed, uint64_t layer, uint64_t row, uint64_t P, uint64_t pos) {
    auto sm = [](uint64_t z) {
        z += 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    };
    return std::ldexp(double(sm(sm(sm(sm(seed ^ layer) ^ row) ^ P) ^ pos) >> 40), -24);
}

// Plans of one harness run of random-default with a seed; checks each choice against the draw.
std::vector<SlotPlan> run_random(uint64_t seed, bool check) {
    LayerHarness h("random-default", 16, 99);
    h.cfg.policy_options["random_seed"] = double(seed);
    h.cache = std::make_unique<KVCache>(h.cfg, h.model, Device{}, DType::F32, 0);
    h.cache->set_replay_logging(true);
    h.step(16);
    h.step(4);  // keep-initial rule
    for (int s = 0; s < 40; ++s) {
        const int64_t n = 1 + s % 4, P = h.P;
        const std::vector<int32_t> before = h.layer().policy().token_positions();
        h.step(n);
        if (!check) continue;
        const SlotPlan& plan = h.layer().replay_log().plans().back();
        for (int64_t r = 0; r < h.B * h.G; ++r) {
            std::vector<int32_t> idx(16);
            std::iota(idx.begin(), idx.end(), 0);
            std::vector<double> u(16);
            for (int j = 0; j < 16; ++j) u[size_t(j)] = random_draw(seed, 0, uint64_t(r), uint64_t(P), uint64_t(before[size_t(r * 16 + j)]));
            std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return u[size_t(a)] < u[size_t(b)]; });
            for (int64_t t = 0; t < n; ++t) EXPECT_EQ(plan.targets[size_t(r * n + t)], idx[size_t(t)]) << "seed " << seed << " row " << r << " at " << P;
        }
    }
    return h.layer().replay_log().plans();
}

TEST(RandomPolicy, EvictsTheLowestDocumentedDrawsReproducibly) {
    const auto a = run_random(7, true), b = run_random(7, false), c = run_random(8, false);
    ASSERT_EQ(a.size(), b.size());
    bool differs = false;
    for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_EQ(a[i].targets, b[i].targets) << "the same seed chose differently at plan " << i;
        differs = differs || a[i].targets != c[i].targets;
    }
    EXPECT_TRUE(differs) << "seeds 7 and 8 chose identical slots everywhere";
}

TEST(RandomPolicy, EverySlotIsEvictedAboutEquallyOften) {
    // 4 rows x 600 single-token evictions over 16 slots: each slot expects 150 per row-set;
    // a fixed seed makes this deterministic, the bound (+-5 sigma) only guards the draw's spread.
    LayerHarness h("random-default", 16, 5);
    h.step(16);
    h.step(1);
    std::vector<int64_t> count(16, 0);
    for (int s = 0; s < 600; ++s) {
        h.step(1);
        for (int32_t slot : h.layer().replay_log().plans().back().targets) ++count[size_t(slot)];
    }
    const double e = 4.0 * 600 / 16, sd = std::sqrt(e * (1 - 1.0 / 16));
    for (int j = 0; j < 16; ++j) EXPECT_NEAR(double(count[size_t(j)]), e, 5 * sd) << "slot " << j;
}
TEST(PyramidKV, ScoresAndChoicesEqualTheF64SnapKVReference) {
    // window 3 of each chunk's queries, pooling width 3; the reference pools the window's own
    // tokens too (kvlab's earlier rule, snapkv_pool_window 1; the published rule: SnapKV.*)
    check_policy_against_reference(
        "pyramidkv-default", [](KVCacheConfig& c) { c.snapkv_window = 3, c.snapkv_kernel = 3, c.policy_options = {{"snapkv_pool_window", 1}}; },
        [](const LayerHarness& h, int64_t P, int64_t n) { return snapkv_pool_window_reference(h, h.last_q[0], P, n, 3, 3); },
        {4, 3, 4, 2, 4, 1});
}

TEST(RKV, ScoresAndChoicesEqualTheF64Reference) {
    // window 3, pooling width 3, lambda 0.3, threshold 0.2 (random keys in 16 dimensions:
    // some pairs are similar, so the exemption is exercised)
    check_policy_against_reference(
        "rkv-default",
        [](KVCacheConfig& c) {
            c.policy_options = {{"rkv_window", 3}, {"rkv_kernel", 3}, {"rkv_lambda", 0.3}, {"rkv_threshold", 0.2}};
        },
        [](const LayerHarness& h, int64_t P, int64_t n) { return rkv_reference(h, P, n, 3, 3, 0.3, 0.2); }, {4, 3, 4, 2, 4, 1});
}

TEST(RKV, RowsScoredOnFourThreadsEqualTheF64Reference) {
    // the harness's 4 (b, g) rows are scored side by side, each thread with its own scratch
    const int saved = num_threads();
    set_num_threads(4);
    check_policy_against_reference(
        "rkv-default",
        [](KVCacheConfig& c) {
            c.policy_options = {{"rkv_window", 3}, {"rkv_kernel", 3}, {"rkv_lambda", 0.3}, {"rkv_threshold", 0.2}};
        },
        [](const LayerHarness& h, int64_t P, int64_t n) { return rkv_reference(h, P, n, 3, 3, 0.3, 0.2); }, {4, 3, 4, 2, 4, 1});
    set_num_threads(saved);
}

TEST(RKV, PastTwoThousandSlotsScoresAndChoicesEqualTheF64Reference) {
    // 2100 slots: the exemption search's full blocks of 32 (a vector test, then the scan) and
    // the oldest, partial one. At threshold 0.2 most slots find a similar key in the newest
    // block. At 0.6 (random 16-dim keys: about one pair in 100) they look through several
    // blocks and the slots still looking are compacted after each; with rkv_lambda 0 the score
    // is -R alone, where one wrong exemption moves a slot's score by ~1e-7 (R ~ 1 / T, the
    // exempt cosine / T in its exponent) and f32 rounding by ~1e-11, so the bound is 1e-9.
    struct Case {
        double thr, lambda, tol;
    };
    for (const Case c : {Case{0.2, 0.3, 2e-6}, Case{0.6, 0.0, 1e-9}}) {
        SCOPED_TRACE(str("threshold ", c.thr));
        LayerHarness h("rkv-default", 2100, seed_for("rkv-default long"));
        compare_policy_with_reference(
            h, "rkv-default",
            [c](KVCacheConfig& k) {
                k.policy_options = {{"rkv_window", 3}, {"rkv_kernel", 3}, {"rkv_lambda", c.lambda}, {"rkv_threshold", c.thr}};
            },
            [c](const LayerHarness& h, int64_t P, int64_t n) { return rkv_reference(h, P, n, 3, 3, c.lambda, c.thr); }, {4, 3}, c.tol);
    }
}


TEST(ExpectedAttention, ScoresAndChoicesEqualTheF64Reference) {
    // 12 slots, D = 16 fully rotated with base 10000, 6 future positions, 2 sinks
    std::vector<double> theta(8);
    for (int i = 0; i < 8; ++i) theta[size_t(i)] = std::pow(10000.0, -2.0 * i / 16.0);
    check_policy_against_reference(
        "expected-attention-default",
        [](KVCacheConfig& c) { c.policy_options = {{"ea_n_future_positions", 6}, {"ea_n_sink", 2}}; },
        [&theta](const LayerHarness& h, int64_t, int64_t) { return expected_attention_reference(h, theta, 6, 2); },
        {4, 3, 4, 2, 4, 1}, 2e-6, [&theta](LayerHarness& h) { h.cache->set_rope_frequencies(&theta); });
}

TEST(ExpectedAttention, RowsScoredOnFourThreadsEqualTheF64Reference) {
    // the harness's 4 (b, g) rows side by side, each thread with its own scratch; the sinks take
    // the maximum over every row (a reduction across the threads)
    std::vector<double> theta(8);
    for (int i = 0; i < 8; ++i) theta[size_t(i)] = std::pow(10000.0, -2.0 * i / 16.0);
    const int saved = num_threads();
    set_num_threads(4);
    check_policy_against_reference(
        "expected-attention-default",
        [](KVCacheConfig& c) { c.policy_options = {{"ea_n_future_positions", 6}, {"ea_n_sink", 2}}; },
        [&theta](const LayerHarness& h, int64_t, int64_t) { return expected_attention_reference(h, theta, 6, 2); },
        {4, 3, 4, 2, 4, 1}, 2e-6, [&theta](LayerHarness& h) { h.cache->set_rope_frequencies(&theta); });
    set_num_threads(saved);
}

TEST(ExpectedAttention, ReducedFormulasEqualTheF64Reference) {
    // ea_use_covariance 0 (the exponent is s k.mu' alone) and ea_use_vnorm 0 (the expected
    // attention itself), no sinks, 3 future positions
    std::vector<double> theta(8);
    for (int i = 0; i < 8; ++i) theta[size_t(i)] = std::pow(10000.0, -2.0 * i / 16.0);
    check_policy_against_reference(
        "expected-attention-default",
        [](KVCacheConfig& c) {
            c.policy_options = {{"ea_n_future_positions", 3}, {"ea_n_sink", 0}, {"ea_use_covariance", 0}, {"ea_use_vnorm", 0}};
        },
        [&theta](const LayerHarness& h, int64_t, int64_t) { return expected_attention_reference(h, theta, 3, 0, false, false); },
        {4, 3, 4, 2, 4, 1}, 2e-6, [&theta](LayerHarness& h) { h.cache->set_rope_frequencies(&theta); });
}

}  // namespace
}  // namespace kv::test
