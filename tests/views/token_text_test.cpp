// Token text and per-token loss (issue 16): the search marks exactly the positions an
// independent scan finds (hand-worked strings, a brute-force check on random pieces, token ids
// of a recorded run); pieces print on one line; the loss curve's mean per position and its
// smoothing against direct loops; and on real tiny eval_long runs of every data kind, the stored
// per-token losses average to the run's reported mean loss.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <random>

#include "views/canvas_impl.h"
#include "views/metrics_view.h"
#include "views/token_text.h"
#include "views_test_util.h"

namespace kv::views {
namespace {

storage::SampleTokensRow sample_of(const std::vector<std::string>& pieces) {
    storage::SampleTokensRow r;
    for (size_t i = 0; i < pieces.size(); ++i) r.ids.push_back(int32_t(100 + pieces[i].size() * 7 + (pieces[i] == " cat" ? 1 : 0)));
    r.pieces = pieces;
    return r;
}

TEST(TokenSearch, StringsMarkEveryTokenTheyOverlap) {
    const auto s = sample_of({"The", " cat", " sat", " on", " the", " mat", ".", " The", " cat"});
    struct Case {
        const char* q;
        int64_t matches;
        std::vector<int64_t> positions;
    };
    const Case cases[] = {
        {" cat", 2, {1, 8}},            // one token, twice
        {"at on", 1, {2, 3}},           // the end of " sat" and all of " on"
        {"e c", 2, {0, 1, 7, 8}},       // across "The" + " cat", twice
        {"at", 4, {1, 2, 5, 8}},        // inside tokens
        {"the", 1, {4}},                // case-sensitive
        {"dog", 0, {}},
        {"The cat sat on the mat. The cat", 1, {0, 1, 2, 3, 4, 5, 6, 7, 8}},
    };
    for (const auto& c : cases) {
        const TokenMatches m = find_token_matches(s, c.q);
        EXPECT_EQ(m.matches, c.matches) << c.q;
        EXPECT_EQ(m.positions, c.positions) << c.q;
    }
    // #id: exactly the positions holding that id.
    const TokenMatches id = find_token_matches(s, "#" + std::to_string(s.ids[1]));
    EXPECT_EQ(id.positions, (std::vector<int64_t>{1, 8}));
    EXPECT_EQ(id.matches, 2);
    // "#" followed by text is searched as text.
    EXPECT_EQ(find_token_matches(sample_of({"a", "#1x", "b"}), "#1x").positions, (std::vector<int64_t>{1}));
}

TEST(TokenSearch, AgreesWithABruteForceScanOnRandomPieces) {
    std::mt19937 rng(7);
    for (int trial = 0; trial < 200; ++trial) {
        std::vector<std::string> pieces(size_t(1 + rng() % 40));
        for (auto& p : pieces) {
            p.resize(rng() % 4);  // empty pieces too
            for (auto& ch : p) ch = "ab "[rng() % 3];
        }
        std::string q(size_t(1 + rng() % 4), 'a');
        for (auto& ch : q) ch = "ab "[rng() % 3];
        const auto s = sample_of(pieces);
        // Token p is marked iff some occurrence starting at byte a overlaps its bytes [b, e) (an
        // empty piece has none).
        std::string text;
        for (const auto& p : pieces) text += p;
        std::vector<int64_t> want;
        int64_t occurrences = 0;
        for (size_t a = 0; a + q.size() <= text.size(); ++a) occurrences += text.compare(a, q.size(), q) == 0;
        size_t b = 0;
        for (size_t p = 0; p < pieces.size(); ++p) {
            const size_t e = b + pieces[p].size();
            bool hit = false;
            for (size_t a = 0; a + q.size() <= text.size() && !hit; ++a)
                hit = e > b && text.compare(a, q.size(), q) == 0 && a < e && a + q.size() > b;
            if (hit) want.push_back(int64_t(p));
            b = e;
        }
        const TokenMatches m = find_token_matches(s, q);
        EXPECT_EQ(m.positions, want) << "trial " << trial << " query '" << q << "'";
        EXPECT_EQ(m.matches, occurrences) << "trial " << trial;
    }
}

TEST(TokenSearch, PiecesPrintOnOneLine) {
    EXPECT_EQ(printable_piece(" hello"), "' hello'");
    EXPECT_EQ(printable_piece("a\nb\tc\r\\"), "'a\\nb\\tc\\r\\\\'");
    EXPECT_EQ(printable_piece(std::string("\x00\x1f", 2)), "'\\x00\\x1f'");
    EXPECT_EQ(printable_piece("\xe2\x80\x94"), "'\xe2\x80\x94'");  // valid UTF-8 stays
    EXPECT_EQ(printable_piece("\xe2\x80"), "'\\xe2\\x80'");          // a cut sequence does not
    EXPECT_EQ(printable_piece("\xff"), "'\\xff'");
    storage::SampleTokensRow r = sample_of({"x", " y"});
    EXPECT_EQ(token_label(&r, 1), "' y' (id " + std::to_string(r.ids[1]) + ")");
    EXPECT_EQ(token_label(&r, 2), "");
    EXPECT_EQ(token_label(nullptr, 0), "");
}

TEST(TokenLoss, PositionMeanAndSmoothingMatchDirectLoops) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    storage::SampleTokensRow a, b;
    a.sample = 0, b.sample = 1;
    a.loss = {1, 2, nan, 4, nan};
    b.loss = {3, nan, nan, 2, 5, 6};
    const std::vector<double> m = position_mean_loss({a, b}, -1);
    ASSERT_EQ(m.size(), 6u);
    EXPECT_EQ(m[0], 2.0);
    EXPECT_EQ(m[1], 2.0);
    EXPECT_TRUE(std::isnan(m[2]));
    EXPECT_EQ(m[3], 3.0);
    EXPECT_EQ(m[4], 5.0);
    EXPECT_EQ(m[5], 6.0);
    const std::vector<double> one = position_mean_loss({a, b}, 1);
    EXPECT_EQ(one[0], 3.0);
    EXPECT_TRUE(std::isnan(one[1]));
    // Smoothing: the mean of the finite values within window/2, by a direct double loop.
    std::mt19937 rng(3);
    std::vector<double> y(500);
    for (auto& v : y) v = rng() % 5 == 0 ? std::nan("") : double(rng() % 1000) / 100.0;
    for (int w : {1, 2, 3, 8, 33, 1000}) {
        const std::vector<double> got = smooth_finite(y, w);
        ASSERT_EQ(got.size(), y.size());
        for (size_t i = 0; i < y.size(); ++i) {
            if (w <= 1) {
                EXPECT_TRUE(got[i] == y[i] || (std::isnan(got[i]) && std::isnan(y[i])));
                continue;
            }
            double s = 0, n = 0;
            for (int64_t j = int64_t(i) - w / 2; j <= int64_t(i) + w / 2; ++j)
                if (j >= 0 && j < int64_t(y.size()) && std::isfinite(y[size_t(j)])) s += y[size_t(j)], n += 1;
            if (n == 0) EXPECT_TRUE(std::isnan(got[i])) << i;
            else EXPECT_NEAR(got[i], s / n, 1e-9) << "w " << w << " i " << i;
        }
    }
}

// Real runs of the tiny model through the run manager: the session's per-token losses.
class RecordedTokenLoss : public ::testing::Test {
   protected:
    static void SetUpTestSuite() {
        dir_ = new test::ViewsScratchDir;
        path_ = dir_->file("tokens.kvlab");
        const std::string text = dir_->file("text.txt");
        std::ofstream(text) << "The quick brown fox jumps over the lazy dog. It was the best of times, it was the worst of "
                               "times; the cat sat on the mat while the dog slept by the door, and the fox ran away.\n";
        std::vector<RunConfig> cfgs;
        cfgs.push_back(test::tiny_eval_config("h2o-default", 64, 256, 2));  // passkey
        RunConfig rep = test::tiny_eval_config("lastrec-default", 64, 256, 2);
        set_run_option(rep, "data", "repeat");
        set_run_option(rep, "data.repeat_length", "24");
        cfgs.push_back(rep);
        RunConfig txt = test::tiny_eval_config("h2o-default", 64, 128, 2);
        set_run_option(txt, "data", "text");
        set_run_option(txt, "data.files", text);
        cfgs.push_back(txt);
        RunConfig ruler = test::tiny_eval_config("dense-default", 0, 512, 2);
        set_run_option(ruler, "data", "niah_single");
        cfgs.push_back(ruler);
        runs_ = test::record_tiny_runs(path_, cfgs);
    }
    static void TearDownTestSuite() { delete dir_; }
    static test::ViewsScratchDir* dir_;
    static std::string path_;
    static std::vector<int64_t> runs_;
};
test::ViewsScratchDir* RecordedTokenLoss::dir_ = nullptr;
std::string RecordedTokenLoss::path_;
std::vector<int64_t> RecordedTokenLoss::runs_;

TEST_F(RecordedTokenLoss, StoredLossesAverageToTheReportedMeanLoss) {
    ASSERT_EQ(runs_.size(), 4u);
    storage::SessionReader reader(path_);
    for (int64_t run : runs_) {
        const storage::RunInfo info = reader.run(run);
        const nlohmann::json summary = nlohmann::json::parse(info.summary);
        const std::vector<storage::SampleTokensRow> samples = reader.sample_tokens(run);
        ASSERT_EQ(int64_t(samples.size()), summary["samples"].get<int64_t>()) << info.config;
        const std::vector<storage::MetricRow> sample_loss = reader.metrics(run, "sample_loss");
        ASSERT_EQ(sample_loss.size(), samples.size());
        double mean_of_means = 0, token_sum = 0;
        int64_t tokens = 0, scored = 0;
        for (size_t i = 0; i < samples.size(); ++i) {
            const auto& r = samples[i];
            EXPECT_EQ(r.sample, int64_t(i));
            ASSERT_EQ(r.loss.size(), r.ids.size());
            ASSERT_EQ(r.pieces.size(), r.ids.size());
            double s = 0;
            int64_t n = 0;
            for (float l : r.loss)
                if (std::isfinite(l)) s += l, ++n;
            ASSERT_GT(n, 0);
            EXPECT_EQ(n, r.scored);
            // Each sample: the mean of its stored losses is the loss the run reported for it.
            EXPECT_NEAR(s / double(n), sample_loss[i].value, 1e-5 * std::max(1.0, sample_loss[i].value)) << info.config;
            EXPECT_NEAR(r.mean_loss, sample_loss[i].value, 1e-12);
            mean_of_means += s / double(n) / double(samples.size());
            token_sum += s;
            tokens += int64_t(r.ids.size());
            scored += n;
        }
        // The run: eval_long's mean loss is the mean over samples; scored and fed token counts agree.
        const double reported = summary["mean_loss"].get<double>();
        EXPECT_NEAR(mean_of_means, reported, 1e-5 * std::max(1.0, reported)) << info.config;
        EXPECT_EQ(tokens, summary["tokens"].get<int64_t>());
        EXPECT_EQ(scored, summary["scored_tokens"].get<int64_t>());
        if (summary.contains("perplexity")) {  // text: every position scored; perplexity = exp(token mean)
            EXPECT_NEAR(std::exp(token_sum / double(scored)), summary["perplexity"].get<double>(),
                        1e-4 * summary["perplexity"].get<double>());
        }
    }
}

TEST_F(RecordedTokenLoss, SearchByIdFindsExactlyTheScannedPositions) {
    storage::SessionReader reader(path_);
    const auto samples = reader.sample_tokens(runs_[2]);  // text
    ASSERT_FALSE(samples.empty());
    const auto& r = samples[0];
    for (size_t probe : {size_t(0), size_t(5), r.ids.size() / 2, r.ids.size() - 1}) {
        const int32_t id = r.ids[probe];
        std::vector<int64_t> want;
        for (size_t p = 0; p < r.ids.size(); ++p)
            if (r.ids[p] == id) want.push_back(int64_t(p));
        const TokenMatches m = find_token_matches(r, "#" + std::to_string(id));
        EXPECT_EQ(m.positions, want);
        // The same token as text marks at least those positions (its piece may also occur inside others).
        const TokenMatches t = find_token_matches(r, r.pieces[probe]);
        for (int64_t p : want) EXPECT_TRUE(std::binary_search(t.positions.begin(), t.positions.end(), p)) << p;
    }
    // The text a tokenizer gave back is the pieces' concatenation: a word found in it marks its tokens.
    std::string text;
    for (const auto& p : r.pieces) text += p;
    ASSERT_NE(text.find("the"), std::string::npos) << text;
    EXPECT_GT(find_token_matches(r, "the").matches, 1);
}

TEST_F(RecordedTokenLoss, TheMetricsViewOverlaysRunsAndTheDenseReference) {
    storage::SessionReader reader(path_);
    MetricsViewState s;
    s.run = runs_[0];
    s.overlay_runs = {runs_[2]};
    ASSERT_TRUE(refresh_metrics(s, reader));
    ASSERT_EQ(s.loss_runs.size(), 2u);  // no dense run on passkey 256 in this session
    EXPECT_EQ(s.loss_runs[0].run, runs_[0]);
    EXPECT_EQ(s.loss_runs[1].run, runs_[2]);
    EXPECT_EQ(s.loss_runs[0].tokens.samples.size(), 2u);
    test::ImGuiHarness h;
    int vtx = 0;
    for (int f = 0; f < 3; ++f) vtx = h.window_frame([&] { DrawMetricsView(s); }, ImVec2(900, 600));
    EXPECT_GT(vtx, 0);
}

}  // namespace
}  // namespace kv::views
