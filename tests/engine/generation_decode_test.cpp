// Decode-time eviction: every registered policy evicts while `generate` decodes, one token per
// step, when its cache is shorter than prompt + new tokens. For each policy on the tiny model:
// every layer ends with exactly its cache_length slots filled; each decode step on a full layer
// evicts what the policy's rule says from the state before the step (score policies: the
// lowest slot score, ties by the lower slot; position policies: the oldest token outside the
// protected prefix); and the eval driver fed the same token stream (the prompt in generate's
// chunks, then one token per chunk) makes the same plans in every layer and predicts the same
// greedy tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>

#include "engine/driver/long_context.h"
#include "engine/generate/generator.h"
#include "engine/kv/kv_cache.h"
#include "engine/kv/policies/policy_registry.h"
#include "engine/model/byte_tokenizer.h"
#include "engine/model/presets.h"
#include "kv_test_util.h"
#include "tests/support/test_support.h"

namespace kv::test {
namespace {

struct Tiny {
    ModelConfig cfg = preset_config("tiny");
    Transformer model{cfg, random_weights(cfg, 23, DType::F32), ModelOptions{}};
    std::unique_ptr<Tokenizer> tok = make_byte_tokenizer();
};

Tiny& tiny() {
    static Tiny t;
    return t;
}

// One layer step as generate made it, with the policy state it was planned from.
struct Step {
    SlotPlan plan;
    std::vector<float> scores_before;   // slot_scores() after the previous step
    std::vector<int32_t> pos_before;    // token_positions() after the previous step
    int64_t T_before = 0, L = 0;
    bool per_row = false;
    int64_t pool = 0, G = 0;  // per-head lengths (ada-*): pool slots per batch row, heads
};

struct Recorder {
    std::vector<std::vector<Step>> steps;  // per layer
    std::vector<std::vector<float>> last_scores;
    std::vector<std::vector<int32_t>> last_pos;
    std::vector<int64_t> last_T, final_T, final_filled_min, final_filled_max;
    explicit Recorder(int nl)
        : steps(size_t(nl)), last_scores(size_t(nl)), last_pos(size_t(nl)), last_T(size_t(nl), 0), final_T(size_t(nl), 0),
          final_filled_min(size_t(nl), 0), final_filled_max(size_t(nl), 0) {}
    void operator()(const LayerStep& s) {
        const size_t l = size_t(s.layer);
        if (s.chunk == 0) last_T[l] = 0, last_scores[l].clear(), last_pos[l].clear();
        steps[l].push_back({*s.plan, last_scores[l], last_pos[l], last_T[l], s.policy->cache_length(), s.policy->per_row_positions(),
                            pool_slots(*s.policy), s.policy->groups()});
        last_scores[l] = s.policy->slot_scores();
        last_pos[l] = s.policy->token_positions();
        last_T[l] = final_T[l] = s.policy->current_length();
        // slots holding a token, per row (a row is L consecutive entries when per row)
        const int64_t L = s.policy->cache_length(), rows = s.policy->per_row_positions() ? s.policy->batch() * s.policy->groups() : 1;
        int64_t lo = std::numeric_limits<int64_t>::max(), hi = 0;
        if (const int64_t S = pool_slots(*s.policy); S > 0) {  // a batch row's pool: its G heads' mean
            const int64_t G = s.policy->groups();
            for (int64_t b = 0; b < s.policy->batch(); ++b) {
                const int64_t filled = std::count_if(last_pos[l].begin() + b * G * S, last_pos[l].begin() + (b + 1) * G * S, [](int32_t p) { return p >= 0; });
                lo = std::min(lo, filled / G), hi = std::max(hi, (filled + G - 1) / G);
            }
            final_filled_min[l] = lo, final_filled_max[l] = hi;
            return;
        }
        for (int64_t r = 0; r < rows; ++r) {
            const int64_t filled = std::count_if(last_pos[l].begin() + r * L, last_pos[l].begin() + (r + 1) * L, [](int32_t p) { return p >= 0; });
            lo = std::min(lo, filled), hi = std::max(hi, filled);
        }
        final_filled_min[l] = lo, final_filled_max[l] = hi;
    }
};

// Position policies: how many of the first tokens stay forever (the rest is a ring evicted
// oldest first). lastrec: init_grace_tokens (-1: min(16, max(L / 8, 1))); streaming: sinks;
// smart-lastrec: the prompt through the regex's first match, capped at max_initial_fraction.
int64_t protected_prefix(const KVCacheConfig& kc, int64_t L, const std::vector<int32_t>& prompt) {
    std::string p = kc.policy();
    // key-rerotation-<scorer> keeps what its scorer keeps (only the RoPE angles change).
    if (p.rfind("key-rerotation-", 0) == 0) p = p.substr(15);
    if (p == "lastrec") return kc.init_grace_tokens >= 0 ? kc.init_grace_tokens : std::min<int64_t>(16, std::max<int64_t>(L / 8, 1));
    if (p == "streaming") return kc.sinks;
    if (p == "smart-lastrec") {  // the test's regex is "\n"
        const auto nl = std::find(prompt.begin(), prompt.end(), int32_t('\n'));
        const int64_t len = int64_t(nl - prompt.begin()) + 1;
        return std::min(len, std::max<int64_t>(int64_t(double(L) * kc.max_initial_fraction), 1));
    }
    ADD_FAILURE() << "policy '" << p << "' exposes no slot scores and has no position rule in this test: add its rule here";
    return 0;
}

// One decode step of a pool whose heads are all full at fixed budgets: per head, the slot of
// lowest score among its tokens at positions < P - grace (ties: the lower slot); sorted.
std::vector<int32_t> per_head_reference(int64_t G, int64_t S, const std::vector<double>& sc, const std::vector<int32_t>& pos, int64_t P,
                                        int64_t grace) {
    std::vector<int32_t> out;
    for (int64_t g = 0; g < G; ++g) {
        int64_t best = -1;
        for (int64_t s = 0; s < S; ++s) {
            const int32_t x = pos[size_t(g * S + s)];
            if (x < 0 || x >= P - grace) continue;
            if (best < 0 || sc[size_t(g * S + s)] < sc[size_t(g * S + best)]) best = s;
        }
        out.push_back(int32_t(best));
    }
    std::sort(out.begin(), out.end());
    return out;
}

std::string cache_name(const PolicyInfo& p) {
    std::string buffer = p.needs_quantized_buffer ? "q8" : "default";
    if (!p.buffers.empty() && std::find(p.buffers.begin(), p.buffers.end(), buffer) == p.buffers.end()) buffer = p.buffers.front();
    return p.name + "-" + buffer;
}

class DecodeEviction : public testing::TestWithParam<std::string> {};

TEST_P(DecodeEviction, KeepsCacheLengthSlotsFollowsTheRuleAndEqualsAnEvalFedOneTokenPerChunk) {
    const PolicyInfo& info = *find_policy(GetParam());
    Tiny& t = tiny();
    const int nl = int(t.cfg.num_layers);
    KVCacheConfig kc;
    kc.name = cache_name(info);
    kc.cache_length = info.needs_cache_length ? 16 : 0;  // dense: prompt + new tokens
    kc.snapkv_window = 4;                               // pyramidkv's rule needs L > window
    apply_required_options(kc);
    const std::vector<int32_t> prompt = t.tok->encode("Q\nthe cache keeps sixteen of these forty bytes", false);
    const int64_t P = int64_t(prompt.size());
    GenerateConfig g;
    g.max_new_tokens = 24;
    g.temperature = 0;
    Recorder rec(nl);
    GenerationCallbacks cb;
    cb.on_layer_step = [&rec](const LayerStep& s) { rec(s); };
    const GenerationResult r = generate(t.model, *t.tok, prompt, g, kc, cb);
    const int64_t N = int64_t(r.tokens.size());
    ASSERT_GE(N, 8) << kc.name << ": generation stopped early (" << r.stop_reason << ")";
    const int64_t fed = P + N - (r.stop_reason == "max_new_tokens" ? 1 : 0);  // the last token is not fed

    // 1. Slots kept: exactly each layer's cache length (all tokens for dense).
    std::vector<int64_t> Ls;
    for (int l = 0; l < nl; ++l) {
        const int64_t L = rec.steps[size_t(l)].back().L;
        Ls.push_back(L);
        const int64_t want = info.needs_cache_length ? L : fed;
        EXPECT_EQ(rec.final_T[size_t(l)], want) << kc.name << " layer " << l;
        EXPECT_EQ(rec.final_filled_min[size_t(l)], want) << kc.name << " layer " << l;
        EXPECT_EQ(rec.final_filled_max[size_t(l)], want) << kc.name << " layer " << l;
        if (info.needs_cache_length) {
            EXPECT_LT(L, fed) << kc.name << ": the test needs a cache shorter than the stream";
        }
    }

    // 2. Each decode step on a full layer evicts by the policy's rule.
    int64_t checked = 0, evicting_forwards = 0;
    for (size_t c = 0; c < rec.steps[0].size(); ++c) {
        bool any_full = false;
        for (int l = 0; l < nl; ++l) {
            const Step& s = rec.steps[size_t(l)][c];
            if (s.plan.input_pos < P || s.T_before < s.L) continue;  // prompt chunks, or still filling
            any_full = true;
            ASSERT_EQ(s.plan.n, 1);
            if (s.pool > 0) {  // Ada-KV: the pool slots the f64 rule evicts over all heads
                const int64_t S = s.pool, G = s.G;
                ASSERT_EQ(s.scores_before.size(), s.pos_before.size()) << kc.name << " layer " << l << " step " << c;
                ASSERT_EQ(s.pos_before.size() % size_t(G * S), 0u) << kc.name;
                for (int64_t b = 0; b < int64_t(s.pos_before.size()) / (G * S); ++b) {
                    std::vector<int32_t> pos(s.pos_before.begin() + b * G * S, s.pos_before.begin() + (b + 1) * G * S);
                    std::vector<double> sc(s.scores_before.begin() + b * G * S, s.scores_before.begin() + (b + 1) * G * S);
                    std::vector<int32_t> got(s.plan.targets.begin() + b * G, s.plan.targets.begin() + (b + 1) * G);
                    std::sort(got.begin(), got.end());
                    // lukv-*: budgets fixed per head by a table (here every head's the layer's length, so
                    // all are full): each head drops its own lowest score before P - grace, ties by the lower slot
                    const bool fixed_budgets = std::find(info.uses.begin(), info.uses.end(), "head_ratios") != info.uses.end();
                    ASSERT_EQ(got, fixed_budgets ? per_head_reference(G, S, sc, pos, s.plan.input_pos, kc.grace_period)
                                                 : ada_reference(G, S, s.L, sc, pos, 1, s.plan.input_pos, kc.grace_period, 0.2))
                        << kc.name << " layer " << l << " batch row " << b << " at position " << s.plan.input_pos;
                    ++checked;
                }
                continue;
            }
            const int64_t L = s.L, rows = s.per_row ? int64_t(s.pos_before.size()) / L : 1;
            for (int64_t row = 0; row < rows; ++row) {
                const int64_t pr = s.plan.rows == 1 ? 0 : row;
                const int32_t evicted = s.plan.moves > 0 ? s.plan.move_to[size_t(pr * s.plan.moves)] : s.plan.targets[size_t(pr)];
                const int32_t* pos = s.pos_before.data() + row * L;
                int32_t want = -1;
                if (!s.scores_before.empty()) {  // the lowest score, ties by the lower slot
                    const float* sc = s.scores_before.data() + row * L;
                    want = int32_t(std::min_element(sc, sc + L) - sc);
                } else {  // the oldest token outside the protected prefix
                    const int64_t keep = protected_prefix(kc, L, prompt);
                    for (int64_t j = 0; j < L; ++j)
                        if (pos[j] >= keep && (want < 0 || pos[j] < pos[want])) want = int32_t(j);
                }
                ASSERT_EQ(evicted, want) << kc.name << " layer " << l << " row " << row << " at position " << s.plan.input_pos
                                         << " (evicted token " << pos[evicted] << ")";
                ++checked;
            }
        }
        evicting_forwards += any_full ? 1 : 0;
    }
    if (info.needs_cache_length) {
        EXPECT_GE(checked, N - 1) << kc.name << ": fewer checked evictions than decode steps";
        EXPECT_EQ(r.evicting_forwards, evicting_forwards) << kc.name;
        EXPECT_EQ(r.evicting_forwards, r.decode_forwards) << kc.name << ": every decode step should evict (L < prompt)";
    } else {
        EXPECT_EQ(checked, 0) << kc.name;
        EXPECT_EQ(r.evicting_forwards, 0) << kc.name;
    }

    // 3. The eval driver on the same stream, chunked as generate fed it, plans alike in every
    // layer and predicts the generated tokens.
    std::vector<int32_t> stream = prompt;
    stream.insert(stream.end(), r.tokens.begin(), r.tokens.begin() + (fed - P));
    ChunkPlan plan;
    plan.chunks = r.prompt_chunks;
    plan.chunks.resize(plan.chunks.size() + size_t(fed - P), 1);
    int64_t start = 0;
    for (size_t c = 0; c < plan.chunks.size(); ++c) {
        plan.starts.push_back(start);
        plan.cells.push_back({c, c + 1});
        start += plan.chunks[c];
    }
    ASSERT_EQ(start, fed);
    KVCacheConfig ek = kc;
    ek.dtype = t.model.act_dtype();
    const TextCodec& codec = byte_codec();
    KVCache eval(ek, t.cfg, Device{}, t.model.act_dtype(), P + g.max_new_tokens, &codec);
    eval.set_replay_logging(true);
    // predictions at positions P - 1 .. fed - 1 (the one after an EOS stop is the EOS itself)
    const int64_t K = std::min(fed - P + 1, N);
    HeadSpec hs;
    hs.T = fed;
    hs.token_targets.assign(size_t(fed), -100);
    for (int64_t i = 0; i < K; ++i) hs.token_targets[size_t(P - 1 + i)] = r.tokens[size_t(i)];
    hs.record_argmax = true;
    HeadResult res;
    long_context_forward(t.model, eval, Tensor::from_i32({1, fed}, stream), plan, hs, res, {}, /*keep_context_width=*/true);
    for (int l = 0; l < nl; ++l) {
        const auto& got = eval.layer(l).replay_log().plans();
        ASSERT_EQ(got.size(), rec.steps[size_t(l)].size()) << kc.name << " layer " << l;
        for (size_t c = 0; c < got.size(); ++c) {
            const SlotPlan &a = rec.steps[size_t(l)][c].plan, &b = got[c];
            ASSERT_TRUE(a.input_pos == b.input_pos && a.n == b.n && a.targets == b.targets && a.moves == b.moves &&
                        a.move_from == b.move_from && a.move_to == b.move_to && a.length_after == b.length_after)
                << kc.name << " layer " << l << " chunk " << c << ": generate and the eval planned differently";
        }
    }
    const std::vector<int32_t> gen_fed(r.tokens.begin(), r.tokens.begin() + K);
    EXPECT_EQ(res.target_argmax, gen_fed) << kc.name << ": the eval's argmax differs from the greedy tokens";
}

std::vector<std::string> all_policies() { return kv_policy_names(); }

INSTANTIATE_TEST_SUITE_P(Registry, DecodeEviction, testing::ValuesIn(all_policies()), [](const testing::TestParamInfo<std::string>& i) {
    std::string s = i.param;
    for (char& c : s)
        if (!isalnum((unsigned char)c)) c = '_';
    return s;
});

// A grace ring during decode: the newest tokens stay, the token leaving the ring takes the
// lowest-scored slot (checked on h2o with a 3-token ring).
TEST(DecodeEviction, GraceRingMovesTheOldestRingTokenIntoTheLowestSlot) {
    Tiny& t = tiny();
    KVCacheConfig kc;
    kc.name = "h2o-default";
    kc.cache_length = 16;
    kc.grace_period = 3;
    const std::vector<int32_t> prompt = t.tok->encode("a grace ring of three keeps the newest tokens", false);
    const int64_t P = int64_t(prompt.size());
    GenerateConfig g;
    g.max_new_tokens = 16;
    g.temperature = 0;
    Recorder rec(int(t.cfg.num_layers));
    GenerationCallbacks cb;
    cb.on_layer_step = [&rec](const LayerStep& s) { rec(s); };
    const GenerationResult r = generate(t.model, *t.tok, prompt, g, kc, cb);
    ASSERT_GE(r.tokens.size(), 8u) << r.stop_reason;
    int64_t checked = 0;
    for (const auto& layer : rec.steps)
        for (const Step& s : layer) {
            if (s.plan.input_pos < P || s.T_before < s.L) continue;
            ASSERT_EQ(s.plan.moves, 1);
            for (int64_t row = 0; row < int64_t(s.pos_before.size()) / s.L; ++row) {
                const int32_t* pos = s.pos_before.data() + row * s.L;
                const float* sc = s.scores_before.data() + row * s.L;
                const int32_t from = s.plan.move_from[size_t(row)], to = s.plan.move_to[size_t(row)];
                // the ring [L-3, L) holds the 3 newest tokens; the oldest of them leaves it
                EXPECT_GE(from, s.L - 3);
                EXPECT_EQ(pos[from], s.plan.input_pos - 3);
                EXPECT_EQ(to, int32_t(std::min_element(sc, sc + s.L - 3) - sc));
                EXPECT_EQ(s.plan.targets[size_t(row)], from);  // the new token enters the ring
                ++checked;
            }
        }
    EXPECT_GT(checked, 0);
}

}  // namespace
}  // namespace kv::test
