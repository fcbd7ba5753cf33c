// compress-then-ask (kvpress's protocol): a context compressed once keeps exactly
// floor((1 - r) T) slots per row for every policy that can compress (registry loop); a policy
// that scores keeps its highest-scoring slots; questions appended after it are all kept and see
// the kept context exactly as full attention would (r = 0 against a plain forward); several
// questions of one compressed context each answer bit-identically to asking it alone; the run
// configuration refuses mixed protocols with one message.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <iostream>
#include <optional>
#include <set>

#include "engine/core/error.h"
#include "engine/data/ruler.h"
#include "engine/kv/compressed_cache.h"
#include "engine/kv/policies/policy_registry.h"
#include "engine/model/model_loader.h"
#include "engine/model/presets.h"
#include "engine/model/transformer.h"
#include "engine/run/compress_then_ask.h"
#include "engine/run/evaluate.h"
#include "engine/run/protocol.h"
#include "tests/engine/kv_test_util.h"
#include "tests/engine/tiny_model_util.h"
#include "tests/support/test_support.h"

namespace kv::test {
namespace {

TinyModel& tiny() { return tiny_model<3>(); }

// The context pass of compress_context, kept so one context can be compressed to several sizes.
struct ContextRun {
    KVCacheConfig kc;
    std::unique_ptr<KVCache> cache;
};

ContextRun run_context(const std::string& name, const std::vector<int32_t>& ctx, int64_t chunk = 8) {
    TinyModel& m = tiny();
    const int64_t T = int64_t(ctx.size());
    ContextRun r;
    KVCacheConfig base;
    base.name = name;
    apply_required_options(base);
    r.kc = context_cache_config(base, T);
    r.cache = std::make_unique<KVCache>(r.kc, m.cfg, Device{}, DType::F32, T, &byte_codec());
    RunConfig cfg;
    cfg.driver.chunk_size = chunk;
    const ChunkPlan plan = context_chunk_plan(cfg, r.kc, m.cfg, T);
    HeadSpec hs;
    hs.kind = HeadKind::NEXT_TOKEN;
    hs.B = 1;
    hs.T = T;
    hs.token_targets.assign(size_t(T), -100);
    HeadResult res;
    m.model.set_context_width(T + 256);  // room for kvzip's reconstruction pieces past the context
    long_context_forward(m.model, *r.cache, Tensor::from_i32({1, T}, ctx), plan, hs, res, {}, true);
    return r;
}

TEST(CompressThenAsk, KeepsFloorOfOneMinusRatioSlotsForEveryPolicyThatCompresses) {
    const int64_t T = 50;
    // floor((1 - r) * 50), worked by hand: 37.5, 25, 12.5, 6.25.
    const std::vector<std::pair<double, int64_t>> ratios = {{0.25, 37}, {0.5, 25}, {0.75, 12}, {0.875, 6}};
    const std::vector<int32_t> ctx = random_tokens(T, 7);
    std::vector<std::string> compressed, refused;
    for (const PolicyInfo& info : policy_registry()) {
        const std::string buffer = !info.buffers.empty() ? info.buffers.front() : info.needs_quantized_buffer ? "q8" : "default";
        const std::string name = CacheName{info.name, buffer}.text();
        ContextRun run;
        try {
            run = run_context(name, ctx);
        } catch (const Error& e) {
            ADD_FAILURE() << name << ": the context pass (no eviction) failed: " << e.what();
            continue;
        }
        bool ok = true;
        for (const auto& [r, expect] : ratios) {
            ProtocolConfig pc;
            pc.compression_ratio = r;
            ASSERT_EQ(compress_keep(pc, T), expect) << "r=" << r;
            std::optional<CompressedCache> cc;
            try {
                cc.emplace(compress_cache(*run.cache, run.kc, compress_keep(pc, T)));
            } catch (const Error& e) {
                std::cout << name << " refused: " << e.what() << "\n";
                // A refusal names the protocol and the policy, and comes at the first ratio.
                EXPECT_NE(std::string(e.what()).find("compress-then-ask"), std::string::npos) << name << ": " << e.what();
                EXPECT_NE(std::string(e.what()).find(info.name), std::string::npos) << name << ": " << e.what();
                EXPECT_EQ(r, ratios.front().first) << name;
                ok = false;
                break;
            }
            ASSERT_EQ(cc->num_layers(), int(tiny().cfg.num_layers));
            EXPECT_EQ(cc->context_length(), T);
            for (int l = 0; l < cc->num_layers(); ++l) {
                const CompressedLayer& L = cc->layer(l);
                const int64_t B = L.K.size(0), G = L.K.size(1);
                EXPECT_EQ(cc->kept(l), expect) << name << " layer " << l << " r=" << r;
                ASSERT_EQ(int64_t(L.positions.size()), B * G * expect);
                const KVPolicy& p = run.cache->layer(l).policy();
                for (int64_t row = 0; row < B * G; ++row) {
                    const int32_t* pos = L.positions.data() + row * expect;
                    for (int64_t i = 0; i < expect; ++i) {
                        EXPECT_GE(pos[i], 0);
                        EXPECT_LT(pos[i], T);
                        if (i > 0) {
                            EXPECT_LT(pos[i - 1], pos[i]) << name << ": kept positions distinct and ascending";
                        }
                    }
                    // A policy with one set per layer keeps the same positions in every head.
                    if (!p.per_row_positions()) {
                        EXPECT_TRUE(std::equal(pos, pos + expect, L.positions.data())) << name << " row " << row;
                    }
                }
                // Scoring policies: every kept slot scores at least as high as every dropped one
                // (per row, or summed over heads for one set per layer), from the policy's own
                // scores before compressing.
                const std::vector<float> s = p.slot_scores();
                if (s.empty()) continue;
                const int64_t Lc = p.cache_length();
                const int64_t rows = p.per_row_positions() ? B * G : 1;
                for (int64_t row = 0; row < rows; ++row) {
                    std::vector<double> sc((size_t)T, 0.0);
                    for (int64_t j = 0; j < T; ++j) {
                        if (p.per_row_positions()) sc[size_t(j)] = s[size_t(row * Lc + j)];
                        else
                            for (int64_t rr = 0; rr < B * G; ++rr) sc[size_t(j)] += s[size_t(rr * Lc + j)];
                    }
                    std::set<int32_t> kept(L.positions.begin() + row * expect, L.positions.begin() + (row + 1) * expect);
                    double min_kept = INFINITY, max_dropped = -INFINITY;
                    for (int64_t j = 0; j < T; ++j) {
                        if (kept.count(int32_t(j))) min_kept = std::min(min_kept, sc[size_t(j)]);
                        else max_dropped = std::max(max_dropped, sc[size_t(j)]);
                    }
                    if (expect < T) {
                        const double tol = std::isfinite(max_dropped) ? 1e-4 * std::abs(max_dropped) : 0.0;
                        EXPECT_GE(min_kept, max_dropped - tol) << name << " layer " << l << " row " << row;
                    }
                }
            }
        }
        (ok ? compressed : refused).push_back(info.name);
    }
    // The families kvpress compares: attention scorers, norms, random and position-only.
    for (const char* must : {"h2o", "tova", "snapkv", "knorm", "random", "lastrec", "streaming", "keydiff", "observed-attention", "expected-attention"})
        EXPECT_NE(std::find(compressed.begin(), compressed.end(), std::string(must)), compressed.end())
            << must << " must compress; refused: " << testing::PrintToString(refused);
    std::cout << "compressed: " << testing::PrintToString(compressed) << "\nrefused: " << testing::PrintToString(refused) << "\n";
}

// With nothing dropped (r = 0), a question answered from the compressed cache sees the whole
// context and itself: its logits equal the plain forward of context + question.
TEST(CompressThenAsk, RatioZeroAnswersAsTheFullForward) {
    TinyModel& m = tiny();
    const int64_t T = 40, Q = 12;
    const std::vector<int32_t> all = random_tokens(T + Q, 11);
    const std::vector<int32_t> ctx(all.begin(), all.begin() + T), q(all.begin() + T, all.end());
    ContextRun run = run_context("h2o-default", ctx);
    CompressedCache cc = compress_cache(*run.cache, run.kc, T);
    std::vector<int32_t> tg(q.begin() + 1, q.end());
    tg.push_back(-100);
    const AskResult a = ask_compressed(m.model, cc, q, tg, true);
    for (int l = 0; l < cc.num_layers(); ++l) {
        EXPECT_EQ(cc.kept(l), T);
        EXPECT_EQ(cc.appended(l), Q) << "every question token stays";
    }
    const Tensor full = m.model.forward(Tensor::from_i32({1, T + Q}, all), 0, nullptr);  // (1, T+Q, V)
    const int64_t V = full.size(2);
    const std::vector<float> z = full.slice(1, T, T + Q).contiguous().to_f32_vector();
    ASSERT_EQ(a.logits.size(), z.size());
    double worst = 0;
    for (size_t i = 0; i < z.size(); ++i) worst = std::max(worst, std::abs(double(a.logits[i]) - double(z[i])));
    EXPECT_LT(worst, 1e-4) << "V=" << V;
}

// Several questions of one compressed context: each is answered from the compressed state, so
// asking q2 after q1 (and q1 again after q2) gives bit for bit what asking it alone gives.
TEST(CompressThenAsk, SeveralQuestionsEachAnswerAsIfAlone) {
    TinyModel& m = tiny();
    const int64_t T = 64;
    const std::vector<int32_t> ctx = random_tokens(T, 21), q1 = random_tokens(9, 22), q2 = random_tokens(14, 23);
    auto targets = [](const std::vector<int32_t>& q) {
        std::vector<int32_t> t(q.begin() + 1, q.end());
        t.push_back(-100);
        return t;
    };
    for (const char* name : {"h2o-default", "snapkv-default", "lastrec-default"}) {
        ContextRun run = run_context(name, ctx);
        CompressedCache shared = compress_cache(*run.cache, run.kc, 24);
        const AskResult a1 = ask_compressed(m.model, shared, q1, targets(q1), true);
        const AskResult a2 = ask_compressed(m.model, shared, q2, targets(q2), true);
        const AskResult a1b = ask_compressed(m.model, shared, q1, targets(q1), true);
        for (int l = 0; l < shared.num_layers(); ++l) EXPECT_EQ(shared.kept(l), 24) << name << ": the kept context is untouched";
        CompressedCache alone = compress_cache(*run_context(name, ctx).cache, run.kc, 24);
        const AskResult a2alone = ask_compressed(m.model, alone, q2, targets(q2), true);
        EXPECT_EQ(a2.logits, a2alone.logits) << name << ": q2 after q1 == q2 alone, bit for bit";
        EXPECT_EQ(a1.logits, a1b.logits) << name << ": q1 again after q2 == q1 first";
        EXPECT_EQ(a2.argmax, a2alone.argmax);
        EXPECT_EQ(a2.loss_sum, a2alone.loss_sum);
    }
}

// eval_long end to end on a RULER task: the kept slots are floor((1 - r) T_context) per layer
// with the question outside the context; with query_aware the context runs to the last prompt
// token, so the question is compressed too.
TEST(CompressThenAsk, EvalLongRulerKeepsTheRatioOfTheContext) {
    LoadedModel lm = load_model("tiny", ModelOptions{}, 0);
    RunConfig cfg;
    cfg.mode = "eval_long";
    cfg.model = "tiny";
    cfg.data.name = "niah_single";
    cfg.data.seq_length = 640;
    cfg.data.num_samples = 1;
    cfg.driver.chunk_size = 32;
    cfg.kv_cache.name = "h2o-default";
    cfg.protocol.name = "compress-then-ask";
    cfg.protocol.compression_ratio = 0.75;
    RulerSpec spec;
    spec.task = "niah_single";
    spec.seq_length = 640;
    spec.seed = cfg.data.seed;
    const RulerSample s = make_ruler_sample(spec, 0, *lm.tokenizer);
    ASSERT_GT(s.question_start, 0);
    ASSERT_LT(s.question_start, s.answer_start);
    EvalSummary sum = run_eval(cfg, lm);
    EXPECT_EQ(sum.context_tokens, s.question_start);
    ASSERT_EQ(int64_t(sum.kept_slots.size()), lm.config.num_layers);
    for (int64_t k : sum.kept_slots) EXPECT_EQ(k, int64_t(double(s.question_start) * 0.25));
    ASSERT_EQ(sum.samples.size(), 1u);
    EXPECT_EQ(sum.samples[0].tokens, int64_t(s.ids.size()));
    EXPECT_GE(sum.samples[0].copy_token_accuracy, 0.0);
    EXPECT_GT(sum.scored_tokens, 0);
    cfg.protocol.query_aware = true;
    sum = run_eval(cfg, lm);
    EXPECT_EQ(sum.context_tokens, s.answer_start - 1);
    for (int64_t k : sum.kept_slots) EXPECT_EQ(k, int64_t(double(s.answer_start - 1) * 0.25));
}

TEST(CompressThenAsk, ConfigurationRefusesMixedProtocols) {
    RunConfig c;
    c.data.name = "niah_single";
    c.kv_cache.name = "h2o-default";
    set_run_option(c, "protocol", "compress-then-ask");
    set_run_option(c, "kv_cache.compression_ratio", "0.5");
    EXPECT_TRUE(run_config_problems(c).empty()) << testing::PrintToString(run_config_problems(c));
    RunConfig c2 = c;
    c2.kv_cache.cache_length = 64;
    ASSERT_FALSE(run_config_problems(c2).empty());
    EXPECT_NE(run_config_problems(c2)[0].find("compression_ratio"), std::string::npos);
    RunConfig c3 = c;
    c3.data.name = "passkey";
    EXPECT_THROW(validate_run_config(c3), Error);
    RunConfig c4;
    c4.kv_cache.name = "h2o-default";
    c4.kv_cache.cache_length = 64;
    set_run_option(c4, "kv_cache.compression_ratio", "0.5");
    ASSERT_FALSE(run_config_problems(c4).empty());
    EXPECT_NE(run_config_problems(c4)[0].find("--protocol compress-then-ask"), std::string::npos);
    EXPECT_THROW(set_run_option(c, "protocol", "compress"), Error);
    // Both protocols are recorded with the run (and read back).
    const RunConfig back = run_config_from_json(run_config_to_json(c), "test");
    EXPECT_EQ(back.protocol.name, "compress-then-ask");
    EXPECT_EQ(back.protocol.compression_ratio, 0.5);
    EXPECT_EQ(run_config_from_json(run_config_to_json(RunConfig{}), "test").protocol.name, "chunked");
    ProtocolConfig pc;
    pc.keep_tokens = 100;
    EXPECT_EQ(compress_keep(pc, 60), 60);
    pc.keep_tokens = 0;
    pc.compression_ratio = 0.99;
    EXPECT_THROW(compress_keep(pc, 50), Error);
}

}  // namespace
}  // namespace kv::test
