// Compress-then-ask for one sample (see compress_then_ask.h).
#include "compress_then_ask.h"

#include <algorithm>
#include <limits>

#include "engine/core/error.h"
#include "engine/kv/context_reconstruction.h"
#include "engine/ops/ops.h"
#include "protocol.h"
#include "run_plan.h"

namespace kv {

KVCacheConfig context_cache_config(const KVCacheConfig& run_cache, int64_t T) {
    KVCacheConfig c = run_cache;
    c.cache_length = T;
    c.layer_cache_lengths.clear();
    c.layer_cache_rule.clear();
    c.budget_bytes = 0;
    c.budget_ratio = 0.0;
    c.max_chunk_size = 0;  // a top-k size bounds evicting chunks; this cache never evicts, so any chunk fits
    return c;
}

ChunkPlan context_chunk_plan(const RunConfig& cfg, const KVCacheConfig& context_cache, const ModelConfig& mc, int64_t T) {
    RunConfig c = cfg;
    c.kv_cache = context_cache;
    if (c.driver.prefill_length <= 0) c.driver.prefill_length = std::min(cfg.driver.chunk_size, T);
    return run_chunk_plan(c, context_cache, mc, T, cfg.data.seed);
}

CompressedCache compress_context(Transformer& model, const KVCacheConfig& context_cache, const ChunkPlan& plan,
                                 const std::vector<int32_t>& context, int64_t keep, int64_t width, const TextCodec* codec,
                                 const DriverCallbacks& cb, std::optional<double> threshold, int64_t threshold_window) {
    const int64_t T = int64_t(context.size());
    KVCache cache(context_cache, model.config(), model.options().device, model.act_dtype(), T, codec);
    HeadSpec hs;
    hs.kind = HeadKind::NEXT_TOKEN;
    hs.B = 1;
    hs.T = T;
    hs.token_targets.assign(size_t(T), -100);  // the context is not scored
    HeadResult res;
    // Wide enough for the questions after the context and for reconstruction pieces (kvzip),
    // which sit past the chunk they re-read.
    const std::unique_ptr<ContextReconstruction> rec = make_context_reconstruction(model, cache);
    const int64_t rec_tokens = rec ? rec->max_piece_tokens(*std::max_element(plan.chunks.begin(), plan.chunks.end())) : 0;
    const int64_t rope_width = std::max(width, T + rec_tokens);
    model.set_context_width(rope_width);
    const Tensor ids = Tensor::from_i32({1, T}, context, {model.options().device, MemCategory::ACTIVATIONS, "context ids"});
    long_context_forward(model, cache, ids, plan, hs, res, cb, /*keep_context_width=*/true);
    return threshold ? compress_cache_threshold(cache, context_cache, *threshold, rope_width, threshold_window)
                     : compress_cache(cache, context_cache, keep, rope_width);
}

AskResult ask_compressed(Transformer& model, CompressedCache& cache, const std::vector<int32_t>& ids, const std::vector<int32_t>& targets,
                         bool keep_logits) {
    if (ids.empty() || targets.size() != ids.size())
        throw Error(str("compress-then-ask: a question of ", ids.size(), " tokens with ", targets.size(), " targets; expected one per token"));
    cache.rewind();
    if (cache.rope_width() > 0) model.set_context_width(cache.rope_width());  // the keys' rotation
    const int64_t n = int64_t(ids.size()), P = cache.context_length();
    const Device dev = model.options().device;
    auto forward = [&](int64_t first, int64_t count) {  // (1, count, V) f32 logits of ids[first, first + count)
        const std::vector<int32_t> piece(ids.begin() + first, ids.begin() + first + count);
        Tensor x = model.embed(Tensor::from_i32({1, count}, piece, {dev, MemCategory::ACTIVATIONS, "question ids"}));
        for (int l = 0; l < int(model.config().num_layers); ++l) x = model.block(l, x, P + first, cache);
        return model.lm_head(model.final_norm(x), P + first);
    };
    Tensor logits;
    std::vector<float> z;
    if (cache.decodes_per_token()) {
        for (int64_t t = 0; t < n; ++t) {
            const std::vector<float> zt = forward(t, 1).to_f32_vector();
            z.insert(z.end(), zt.begin(), zt.end());
        }
        logits = Tensor::from_f32({1, n, int64_t(z.size()) / n}, z, DType::F32, {dev, MemCategory::ACTIVATIONS, "question logits"});
    } else {
        logits = forward(0, n);  // (1, n, V) f32
        z = logits.to_f32_vector();
    }
    const int64_t V = logits.size(2);
    AskResult r;
    r.token_loss.assign(size_t(n), std::numeric_limits<float>::quiet_NaN());
    std::vector<int32_t> tg(targets);
    for (int32_t& y : tg)
        if (y < 0) y = -100;
    const std::vector<double> ce =
        ops::cross_entropy(logits, Tensor::from_i32({1, n}, tg, {logits.device(), MemCategory::WORKSPACE, "targets"})).to_f64_vector();
    for (int64_t t = 0; t < n; ++t) {
        if (targets[size_t(t)] < 0) continue;
        const float* zr = z.data() + t * V;
        r.argmax.push_back(int32_t(std::max_element(zr, zr + V) - zr));
        r.loss_sum += ce[size_t(t)];
        r.token_loss[size_t(t)] = float(ce[size_t(t)]);
        ++r.count;
    }
    if (keep_logits) r.logits = z;
    return r;
}

std::vector<int32_t> generate_compressed(Transformer& model, CompressedCache& cache, const std::vector<int32_t>& prompt, int64_t max_new,
                                         const std::vector<int32_t>& stop_ids) {
    if (prompt.empty()) throw Error("compress-then-ask: generation from an empty prompt; expected the question's tokens");
    cache.rewind();
    if (cache.rope_width() > 0) model.set_context_width(cache.rope_width());
    const Device dev = model.options().device;
    int64_t pos = cache.context_length();
    // The argmax of the last position's logits after feeding `ids`.
    auto feed = [&](const std::vector<int32_t>& ids) {
        const int64_t n = int64_t(ids.size());
        Tensor x = model.embed(Tensor::from_i32({1, n}, ids, {dev, MemCategory::ACTIVATIONS, "generation ids"}));
        for (int l = 0; l < int(model.config().num_layers); ++l) x = model.block(l, x, pos, cache);
        const Tensor logits = model.lm_head(model.final_norm(x.slice(1, n - 1, n).contiguous()), pos + n - 1);
        pos += n;
        const std::vector<float> z = logits.to_f32_vector();
        return int32_t(std::max_element(z.begin(), z.end()) - z.begin());
    };
    int32_t next = -1;
    if (cache.decodes_per_token())
        for (int32_t id : prompt) next = feed({id});
    else
        next = feed(prompt);
    std::vector<int32_t> out;
    while (int64_t(out.size()) < max_new && std::find(stop_ids.begin(), stop_ids.end(), next) == stop_ids.end()) {
        out.push_back(next);
        if (int64_t(out.size()) < max_new) next = feed({next});
    }
    return out;
}

std::vector<AskResult> ask_in_turn(Transformer& model, CompressedCache& cache, const std::vector<Question>& questions, bool keep_logits) {
    std::vector<AskResult> out;
    for (const Question& q : questions) out.push_back(ask_compressed(model, cache, q.ids, q.targets, keep_logits));
    return out;
}

namespace {
// Index of the first scored target (the answer's first token is predicted there), and the count.
std::pair<int64_t, int64_t> answer_span(const Question& q) {
    int64_t first = 0, n = 0;
    while (first < int64_t(q.targets.size()) && q.targets[size_t(first)] < 0) ++first;
    for (int32_t y : q.targets) n += y >= 0 ? 1 : 0;
    if (n == 0) throw Error("compress-then-ask: a question with no scored answer token; expected targets after its prompt");
    return {first, n};
}
}  // namespace

std::vector<TurnAnswer> ask_questions(Transformer& model, CompressedCache& cache, const std::vector<Question>& questions, QuestionTurns turns,
                                      int64_t slack, const std::vector<int32_t>& stop_ids, bool keep_logits) {
    std::vector<TurnAnswer> out;
    std::vector<int32_t> transcript;
    for (const Question& q : questions) {
        const auto [first, expected] = answer_span(q);
        TurnAnswer t;
        t.transcript = transcript;
        t.prompt.assign(q.ids.begin(), q.ids.begin() + first + 1);
        std::vector<int32_t> ids = transcript, targets(transcript.size(), -100);
        ids.insert(ids.end(), q.ids.begin(), q.ids.end());
        targets.insert(targets.end(), q.targets.begin(), q.targets.end());
        t.asked = ask_compressed(model, cache, ids, targets, keep_logits);
        for (int l = 0; l < cache.num_layers(); ++l) t.slots.push_back(cache.slots(l));
        std::vector<int32_t> prompt = transcript;
        prompt.insert(prompt.end(), t.prompt.begin(), t.prompt.end());
        t.answer = generate_compressed(model, cache, prompt, expected + slack, stop_ids);
        if (turns == QuestionTurns::MULTI_TURN) {
            transcript = std::move(prompt);
            transcript.insert(transcript.end(), t.answer.begin(), t.answer.end());
        }
        out.push_back(std::move(t));
    }
    return out;
}

std::string compression_refusal(const RunConfig& cfg, LoadedModel& lm) {
    const std::vector<std::string> problems = run_config_problems(cfg);
    if (!problems.empty()) return problems.front();
    try {
        const Tokenizer& tok = *lm.tokenizer;
        const TextCodec codec{[&tok](const std::vector<int32_t>& v) { return tok.decode(v, true); },
                              [&tok](const std::string& s) { return tok.encode(s, false); }};
        // As long as the run's samples (refusals such as a per-layer length rule depend on it).
        const int64_t T = std::max<int64_t>(96, cfg.data.seq_length);
        std::vector<int32_t> context(static_cast<size_t>(T), 0);
        for (int64_t t = 0; t < T; ++t) context[size_t(t)] = int32_t((t * 37 + 11) % 200 + 32);  // printable bytes, any vocabulary
        RunConfig c = cfg;
        c.driver.prefill_length = 0;
        if (c.protocol.score_threshold.empty()) {  // the budget's kind, not its size: half of the trial context
            c.protocol.keep_tokens = 0;
            if (c.protocol.decode_ratio == 0.0) c.protocol.compression_ratio = 0.5;
        }
        const KVCacheConfig kc = context_cache_config(run_cache_config(c, lm.config, lm.model->act_dtype()), T);
        const std::optional<double> threshold = score_threshold(c.protocol);
        const int64_t keep = threshold ? -1 : compress_keep(c.protocol, T);
        compress_context(*lm.model, kc, context_chunk_plan(c, kc, lm.config, T), context, keep, T + 16, &codec, {}, threshold,
                         c.protocol.threshold_window);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

int64_t questions_width(int64_t context_tokens, const std::vector<Question>& questions, QuestionTurns turns, int64_t slack) {
    int64_t width = context_tokens + slack, conversation = context_tokens;
    for (const Question& q : questions) {
        const auto [first, expected] = answer_span(q);
        width = std::max(width, context_tokens + int64_t(q.ids.size()) + slack);
        // A turn's transcript: the earlier prompts and answers (each at most expected + slack).
        const int64_t asked = conversation + std::max(int64_t(q.ids.size()), first + 1 + expected + slack);
        if (turns == QuestionTurns::MULTI_TURN) width = std::max(width, asked), conversation += first + 1 + expected + slack;
    }
    return width;
}

}  // namespace kv
