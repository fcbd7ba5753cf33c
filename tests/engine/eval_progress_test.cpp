// eval_long's live progress (trace::progress, what the GUI and `kvlab runs` show) counts the
// whole run: every event carries the total tokens of all samples, done only grows, and it
// reaches the total only at the end (a cancel mid-run reads done < total).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/data/repeat_task.h"
#include "engine/model/model_loader.h"
#include "engine/run/evaluate.h"
#include "engine/telemetry/recorder.h"
#include "engine/telemetry/trace.h"

namespace kv::test {
namespace {

struct ProgressSink : trace::EventSink {
    std::vector<std::pair<int64_t, int64_t>> tokens;  // (done, total) per PROGRESS event
    void on_event(trace::Event& ev) override {
        if (ev.type() == trace::EventType::PROGRESS) tokens.push_back({ev.progress.tokens_done, ev.progress.tokens_total});
    }
};

TEST(EvalProgress, TokensCountTheWholeRunAcrossSamples) {
    LoadedModel lm = load_model("tiny", ModelOptions{}, 0);
    RunConfig cfg;
    cfg.mode = "eval_long";
    cfg.model = "tiny";
    cfg.data.name = "repeat";
    cfg.data.seq_length = 256;
    cfg.data.num_samples = 3;
    cfg.data.repeat_length = 24;
    cfg.data.repeat_distance = 100;
    cfg.driver.chunk_size = 32;
    // The run's tokens, from the task generator itself (not from the evaluation).
    int64_t total = 0, first = 0;
    for (int64_t i = 0; i < 3; ++i) {
        RepeatSpec spec;
        spec.seq_length = 256;
        spec.passage_length = 24;
        spec.distance = 100;
        spec.seed = cfg.data.seed;
        const int64_t T = int64_t(make_repeat_sample(spec, i, *lm.tokenizer).ids.size());
        total += T;
        if (i == 0) first = T;
    }
    trace::Recorder rec;
    {
        trace::RecorderScope scope(rec);
        run_eval(cfg, lm);
    }
    ProgressSink sink;
    rec.drain(sink);
    ASSERT_FALSE(sink.tokens.empty());
    int64_t prev = 0;
    bool past_first = false;
    for (size_t i = 0; i < sink.tokens.size(); ++i) {
        const auto [done, tot] = sink.tokens[i];
        EXPECT_EQ(tot, total) << "every event carries the whole run's total";
        EXPECT_GE(done, prev) << "done never goes back (a new sample continues the count)";
        prev = done;
        past_first = past_first || done > first;
        if (i + 1 < sink.tokens.size()) {
            EXPECT_LT(done, total) << "event " << i;
        }
    }
    EXPECT_TRUE(past_first) << "the later samples count on from the first one's " << first << " tokens";
    EXPECT_EQ(sink.tokens.back().first, total);
}

// With --fidelity the dense reference and the KL heads run after each sample's policy pass;
// the progress counts them (issue 37: it reached 100% with 40% of a run still to go). The
// callback's units and the stored token progress both stay below their totals until the work
// after the policy pass is done, and both move during it.
TEST(EvalProgress, FidelityWorkIsCountedBeforeTheEnd) {
    LoadedModel lm = load_model("tiny", ModelOptions{}, 0);
    RunConfig cfg;
    cfg.mode = "eval_long";
    cfg.model = "tiny";
    cfg.data.name = "passkey";
    cfg.data.seq_length = 512;
    cfg.data.num_samples = 2;
    cfg.kv_cache.name = "h2o-default";
    cfg.kv_cache.cache_length = 128;
    cfg.driver.chunk_size = 32;
    cfg.fidelity = true;
    struct Unit {
        int64_t done, total;
        std::string what;
    };
    std::vector<Unit> units;
    EvalCallbacks cb;
    cb.progress = [&](int64_t d, int64_t t, const std::string& w) { units.push_back({d, t, w}); };
    trace::Recorder rec;
    {
        trace::RecorderScope scope(rec);
        run_eval(cfg, lm, cb);
    }
    ASSERT_FALSE(units.empty());
    const int64_t total = units.back().total;
    // Per sample: (layer, chunk) steps of the policy, then as many of the dense stream and one KL
    // per chunk; the chunks from the plan the run reports (prefill of 128, then chunks of 32).
    const int64_t L = lm.config.num_layers, chunks = 1 + (512 - 128) / 32;
    EXPECT_EQ(total, 2 * chunks * (2 * L + 1));
    EXPECT_EQ(units.back().done, total);
    int64_t prev = 0, during_fidelity = 0;
    for (size_t i = 0; i < units.size(); ++i) {
        EXPECT_GE(units[i].done, prev);
        prev = units[i].done;
        if (i + 1 < units.size()) {
            EXPECT_LT(units[i].done, total) << "event " << i << " of " << units.size();
        }
        if (units[i].what.find("(fidelity reference)") != std::string::npos || units[i].what.find("(KL heads)") != std::string::npos)
            ++during_fidelity;
    }
    EXPECT_GT(during_fidelity, 2) << "the measuring phases report as they go";
    ProgressSink sink;
    rec.drain(sink);
    ASSERT_FALSE(sink.tokens.empty());
    const int64_t tokens = sink.tokens.back().second;
    EXPECT_EQ(sink.tokens.back().first, tokens);
    for (size_t i = 0; i + 1 < sink.tokens.size(); ++i) {
        EXPECT_LT(sink.tokens[i].first, tokens) << "token event " << i;
    }
}

}  // namespace
}  // namespace kv::test
