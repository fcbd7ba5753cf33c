// Evaluation runs (see evaluate.h).
#include "evaluate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>

#include "engine/core/layer_kind.h"
#include "engine/kv/window_layer.h"
#include "engine/core/error.h"
#include "engine/data/repeat_task.h"
#include "engine/core/join.h"
#include "engine/data/ruler.h"
#include "engine/data/synthetic.h"
#include "engine/data/text_windows.h"
#include "engine/driver/long_context.h"
#include "engine/telemetry/run_phase.h"
#include "engine/telemetry/trace.h"
#include "compress_then_ask.h"
#include "protocol.h"
#include "run_plan.h"

namespace kv {

namespace {
// A loaded compressed cache must be what this run would have compressed: the same policy, the
// model's layers and heads, the run's kept slots.
void check_loaded_cache(const CompressedCache& c, const std::string& path, const std::string& cache_name, const ModelConfig& mc, int64_t keep) {
    auto bad = [&](const std::string& what) {
        throw Error(str("--kv_cache.load '", path, "': ", what), "expected a file saved by a run of the same model, cache and budget");
    };
    if (c.cache_name() != cache_name) bad(str("compressed by '", c.cache_name(), "', this run's cache is '", cache_name, "'"));
    if (c.num_layers() != int(mc.num_layers)) bad(str(c.num_layers(), " layers, the model has ", mc.num_layers));
    for (int l = 0; l < c.num_layers(); ++l) {
        const Tensor& K = c.layer(l).K;
        if (K.size(1) != mc.cache_kv_heads() || K.size(3) != mc.cache_head_dim())
            bad(str("layer ", l, " has ", K.size(1), " KV heads of ", K.size(3), "; the model's cache ", mc.cache_kv_heads(), " of ",
                    mc.cache_head_dim()));
        if (keep >= 0 && c.kept(l) != keep) bad(str("layer ", l, " keeps ", c.kept(l), " slots; this run's budget keeps ", keep));
    }
}

// Tokens a greedy answer may run past the expected answer's length before it is cut.
constexpr int64_t kGenerationSlack = 8;

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// A copy answer's score: the sample's targets (positions < 0 are not scored) against the argmax
// predicted at the scored positions, in order.
void score_answer(EvalSampleResult& r, const std::vector<int32_t>& targets, const std::vector<int32_t>& argmax) {
    std::vector<int32_t> expected;
    for (int32_t y : targets)
        if (y >= 0) expected.push_back(y);
    const CopyScore cs = score_copy(expected, argmax);
    r.correct = cs.exact;
    r.copy_token_accuracy = cs.token_accuracy();
    r.copy_prefix = cs.prefix_fraction();
}

}  // namespace

EvalSummary run_eval(const RunConfig& cfg, LoadedModel& lm, const EvalCallbacks& cb) {
    validate_run_config(cfg);
    Transformer& model = *lm.model;
    const Tokenizer& tok = *lm.tokenizer;
    const ModelConfig& mc = lm.config;
    MemoryTracker& tracker = current_memory_tracker();
    tracker.reset_peaks();

    // ---- data ----
    std::optional<PhaseScope> data_phase(std::in_place, RunPhase::DATA);
    struct Item {
        std::vector<int32_t> ids;
        int32_t label = -1;
        std::string description;
        std::vector<int32_t> targets;  // NEXT_TOKEN targets when only a span is scored (repeat)
        int64_t question_start = -1;   // RULER: where the question starts (compress-then-ask splits there)
        std::vector<Question> more_questions = {};  // --data.questions: questions 2.. of the context (after question_start)
    };
    std::vector<Item> items;
    // An item whose next-token loss covers only [first, first + count) of its inputs (the
    // repeat task's copy, a RULER answer): one teacher-forced pass scores the greedy answer.
    auto scored_span = [](std::vector<int32_t> ids, const std::string& description, int64_t first, int64_t count) {
        Item it{std::move(ids), -1, description, {}};
        it.targets.assign(it.ids.size(), -100);
        for (int64_t t = first; t < first + count; ++t) it.targets[size_t(t)] = it.ids[size_t(t + 1)];
        return it;
    };
    int text_bos = -1;
    HeadKind head = HeadKind::CLASS_ON_LOGITS;
    std::vector<int32_t> class_ids;
    if (cfg.data.name == "passkey" || cfg.data.name == "recall" || cfg.data.name == "needle") {
        class_ids = class_tokens(tok).ids;
        SyntheticSpec spec;
        spec.task = cfg.data.name;
        spec.seq_length = cfg.data.seq_length;
        spec.seed = cfg.data.seed;
        spec.num_keys = cfg.data.num_keys;
        for (int64_t i = 0; i < cfg.data.num_samples; ++i) {
            if (!cfg.data.depths.empty()) spec.depth = cfg.data.depths[size_t(i) % cfg.data.depths.size()];
            ClassSample s = make_synthetic_sample(spec, i, tok);
            items.push_back({std::move(s.ids), s.label, s.description, {}});
        }
    } else if (cfg.data.name == "repeat") {
        // Loss and argmax on the second copy after its cue. A greedy decode from the cue
        // reproduces the passage exactly iff every argmax on the span is the passage token, so
        // one teacher-forced pass scores the greedy continuation (in the run's chunks).
        head = HeadKind::NEXT_TOKEN;
        RepeatSpec spec;
        spec.seq_length = cfg.data.seq_length;
        spec.passage_length = cfg.data.repeat_length;
        spec.distance = cfg.data.repeat_distance;
        spec.seed = cfg.data.seed;
        for (int64_t i = 0; i < cfg.data.num_samples; ++i) {
            RepeatSample s = make_repeat_sample(spec, i, tok);
            items.push_back(scored_span(std::move(s.ids), s.description, s.first_scored_input(), s.scored_tokens()));
        }
    } else if (is_ruler_task(cfg.data.name)) {
        // Exact match of the answer, scored teacher-forced like the repeat task's copy.
        head = HeadKind::NEXT_TOKEN;
        RulerSpec spec;
        spec.task = cfg.data.name;
        spec.seq_length = cfg.data.seq_length;
        spec.seed = cfg.data.seed;
        spec.num_keys = cfg.data.ruler_keys;
        spec.chat = cb.chat_frame;
        spec.chat_turn_end = cb.chat_turn_end;
        const bool conversation = parse_question_turns(cfg.data.turns) == QuestionTurns::MULTI_TURN;
        spec.questions = cfg.data.questions;
        for (int64_t i = 0; i < cfg.data.num_samples; ++i) {
            if (!cfg.data.depths.empty()) spec.depth = cfg.data.depths[size_t(i) % cfg.data.depths.size()];  // the needle grid's depth
            RulerSample s = make_ruler_sample(spec, i, tok);
            items.push_back(scored_span(std::move(s.ids), s.description, s.first_scored_input(), s.answer_length));
            items.back().question_start = s.question_start;
            for (RulerQuestion& q : s.more_questions) {
                // In a conversation the question opens a user turn after the model's answer.
                if (conversation) q.ids.insert(q.ids.begin(), q.turn_open.begin(), q.turn_open.end());
                // The answer's tokens scored as the first question's are.
                const int64_t n = int64_t(q.ids.size());
                std::vector<int32_t> tg(size_t(n), -100);
                for (int64_t t = n - q.answer_length - 1; t + 1 < n; ++t) tg[size_t(t)] = q.ids[size_t(t + 1)];
                items.back().more_questions.push_back({std::move(q.ids), std::move(tg)});
            }
        }
    } else if (cfg.data.name == "text") {
        head = HeadKind::NEXT_TOKEN;
        TextWindows w = make_text_windows(cfg.data.files, tok, cfg.data.seq_length, cfg.data.num_samples);
        text_bos = w.bos ? 1 : 0;
        int64_t i = 0;
        for (auto& win : w.windows) items.push_back({std::move(win), -1, str("text window ", i++), {}});
    } else {
        throw Error(str("--data ", cfg.data.name, " is not available for evaluation yet; use passkey, recall, needle, repeat, ",
                        join(ruler_task_names(), ", "), " or text"));
    }
    for (const auto& it : items)
        if (int64_t(it.ids.size()) > mc.max_position_embeddings * 64)
            throw Error(str("sample of ", it.ids.size(), " tokens is far beyond the model's context"));

    EvalSummary sum;
    sum.cache_name = cfg.kv_cache.name;
    sum.text_bos = text_bos;
    const KVCacheConfig kc = run_cache_config(cfg, mc, lm.model->act_dtype());
    // compress-then-ask (protocol.h): the context [0, split) is compressed, [split, T) asked;
    // query_aware moves the question into the context, all but the last prompt token.
    const bool ask = parse_protocol(cfg.protocol.name) == Protocol::COMPRESS_THEN_ASK;
    auto split_of = [&](const Item& it) {
        if (it.question_start < 0) throw Error(str("--protocol compress-then-ask: sample '", it.description, "' has no question apart from its context"));
        int64_t first_scored = 0;
        while (first_scored < int64_t(it.targets.size()) && it.targets[size_t(first_scored)] < 0) ++first_scored;
        return cfg.protocol.query_aware ? first_scored : it.question_start;
    };
    int64_t total_units = 0, total_tokens = 0, done_tokens = 0;
    std::vector<ChunkPlan> plans;
    std::vector<KVCacheConfig> context_caches;
    for (const auto& it : items) {
        const int64_t T = int64_t(it.ids.size());
        if (ask) {
            const int64_t split = split_of(it);
            context_caches.push_back(context_cache_config(kc, split));
            plans.push_back(context_chunk_plan(cfg, context_caches.back(), mc, split));
        } else {
            plans.push_back(run_chunk_plan(cfg, kc, mc, T, cfg.data.seed));
        }
        // Progress counts every phase: the policy's (layer, chunk) steps, and with fidelity the
        // dense reference's and one KL per chunk after them (DenseReference::progress_units).
        total_units += int64_t(plans.back().chunks.size()) * (mc.num_layers + (cfg.fidelity ? mc.num_layers + 1 : 0));
        total_tokens += T;
        for (const Question& q : it.more_questions) total_tokens += int64_t(q.ids.size());
    }
    sum.chunks_per_sample = plans.empty() ? 0 : int64_t(plans[0].chunks.size());
    data_phase.reset();

    // The tokenizer for policies that encode text (kvzip's reconstruction prompt).
    const TextCodec codec{[&tok](const std::vector<int32_t>& v) { return tok.decode(v, true); },
                          [&tok](const std::string& s) { return tok.encode(s, false); }};
    int64_t done_units = 0;
    std::vector<FidelityStep> fidelity_steps;
    std::vector<FidelityKLStep> fidelity_kl;
    double loss_tokens = 0, loss_total = 0;
    double gen_tokens = 0, gen_score = 0;  // compress-then-ask: sums over questions of the greedy answers
    int64_t correct = 0;
    const double t_start = now_s();
    const PhaseSeconds phases_start = PhaseScope::thread_seconds();
    for (size_t i = 0; i < items.size(); ++i) {
        const Item& it = items[i];
        const int64_t T = int64_t(it.ids.size());
        std::optional<PhaseScope> policy_phase(std::in_place, RunPhase::POLICY_PASS);
        if (ask) {
            const int64_t split = split_of(it);
            DriverCallbacks dcb;
            dcb.cancel = cb.cancel;
            const int64_t policy_units = int64_t(plans[i].chunks.size()) * mc.num_layers;
            dcb.progress = [&](int64_t d, int64_t) {
                if (cb.progress) cb.progress(done_units + d, total_units, it.description);
            };
            dcb.run_tokens_before = done_tokens;
            dcb.run_tokens_total = total_tokens;
            const double t0 = now_s();
            const std::vector<int32_t> context(it.ids.begin(), it.ids.begin() + split);
            const std::optional<double> threshold = score_threshold(cfg.protocol);
            const int64_t keep = threshold ? -1 : compress_keep(cfg.protocol, split);  // -1: the threshold decides
            std::optional<CompressedCache> loaded;
            if (!cfg.protocol.load_path.empty()) {
                const std::string path = compressed_cache_path(cfg.protocol.load_path, int64_t(i));
                loaded.emplace(load_compressed_cache(path, model.options().device, &context));
                check_loaded_cache(*loaded, path, cfg.kv_cache.name, mc, keep);
            }
            std::vector<Question> questions = {{std::vector<int32_t>(it.ids.begin() + split, it.ids.end()),
                                                std::vector<int32_t>(it.targets.begin() + split, it.targets.end())}};
            questions.insert(questions.end(), it.more_questions.begin(), it.more_questions.end());
            // RoPE width: the context and its longest question (multi-turn: the whole conversation),
            // with room for a greedy answer running past the expected one.
            const QuestionTurns turns = parse_question_turns(cfg.data.turns);
            const int64_t width = questions_width(split, questions, turns, kGenerationSlack);
            if (loaded && loaded->rope_width() > 0 && loaded->rope_width() < width)
                throw Error(str("--kv_cache.load '", compressed_cache_path(cfg.protocol.load_path, int64_t(i)), "': saved for positions up to ",
                                loaded->rope_width(), ", these questions (", cfg.data.turns, ") reach ", width),
                            "expected a file saved by a run asking the same questions the same way");
            CompressedCache cc = loaded ? std::move(*loaded)
                                        : compress_context(model, context_caches[i], plans[i], context, keep, width, &codec, dcb, threshold,
                                                           cfg.protocol.threshold_window);
            if (!cfg.protocol.save_path.empty()) save_compressed_cache(cc, context, compressed_cache_path(cfg.protocol.save_path, int64_t(i)));
            if (!loaded) ++sum.contexts_compressed;  // once per context, whatever the questions
            cc.set_decode_ratio(cfg.protocol.decode_ratio);
            if (cfg.protocol.threshold_decode) cc.set_decode_threshold(*score_threshold(cfg.protocol), cfg.protocol.threshold_window);
            cc.set_decode_rescore(cfg.protocol.decode_rescore_every);
            const int64_t nq = int64_t(questions.size());
            sum.questions_per_context = nq;
            sum.question_accuracy.resize(size_t(nq), 0.0);
            sum.question_score.resize(size_t(nq), 0.0);
            done_units += policy_units;
            done_tokens += T;
            for (const Question& q : it.more_questions) done_tokens += int64_t(q.ids.size());
            sum.kv_bytes = cc.kept_bytes();
            // The compressed context's own bytes (a dense block per layer, whatever buffer held
            // the context before compression): kept tokens (logical) and the block (physical).
            sum.kv_logical_bytes = cc.logical_bytes();
            sum.kv_physical_bytes = cc.kept_bytes();
            sum.kv_bits_per_element = 8.0 * double(dtype_size(model.act_dtype()));
            sum.context_tokens = split;
            sum.kept_slots.clear();
            sum.kept_total_slots.clear();
            sum.kept_row_slots.clear();
            for (int l = 0; l < cc.num_layers(); ++l) {
                sum.kept_slots.push_back(cc.kept(l)), sum.kept_total_slots.push_back(cc.kept_total(l));
                sum.kept_row_slots.push_back(cc.kept_rows(l));
            }
            policy_phase.reset();
            // Every question of the context, as --data.turns asks them, a result of its own.
            std::optional<PhaseScope> ask_phase(std::in_place, RunPhase::POLICY_PASS);
            const std::vector<TurnAnswer> answers = ask_questions(model, cc, questions, turns, kGenerationSlack, tok.eos_ids());
            ask_phase.reset();
            for (int64_t j = 0; j < nq; ++j) {
                const Question& q = questions[size_t(j)];
                const TurnAnswer& ta = answers[size_t(j)];
                const AskResult& a = ta.asked;
                const int64_t fed = int64_t(ta.transcript.size() + q.ids.size());  // tokens fed after the context
                if (cfg.protocol.decode_ratio > 0.0 || cfg.protocol.threshold_decode) {
                    // The decoding budget's outcome: the tokens decoded under it (a turn's transcript
                    // again) and the slots held after the last question's teacher-forced pass.
                    sum.decoded_tokens += fed;
                    sum.decode_final_slots = ta.slots;
                }
                std::vector<int32_t> expected_ids;
                for (int32_t y : q.targets)
                    if (y >= 0) expected_ids.push_back(y);
                std::string answer_text = tok.decode(expected_ids, true);
                answer_text.erase(0, answer_text.find_first_not_of(' '));
                EvalSampleResult r;
                r.index = int64_t(sum.samples.size());
                if (nq > 1) r.context = int64_t(i), r.question = j;
                r.seconds = now_s() - t0;  // the first question's includes the compression
                r.tokens = split + fed;
                r.description = nq > 1 ? str(it.description, ", ", turns == QuestionTurns::MULTI_TURN ? "turn " : "question ", j + 1, " of ", nq)
                                       : it.description;
                r.prediction = a.argmax.empty() ? -1 : a.argmax.back();
                score_answer(r, q.targets, a.argmax);
                r.loss = a.count > 0 ? a.loss_sum / double(a.count) : 0.0;
                r.generated_tokens = int64_t(ta.answer.size());
                r.generated_score = ruler_text_score(cfg.data.name, tok.decode(ta.answer, true), answer_text);
                gen_tokens += double(r.generated_tokens);
                gen_score += r.generated_score;
                loss_total += a.loss_sum;
                loss_tokens += double(a.count);
                sum.scored_tokens += a.count;
                correct += r.correct ? 1 : 0;
                sum.question_accuracy[size_t(j)] += r.correct ? 1.0 : 0.0;
                sum.question_score[size_t(j)] += r.generated_score;
                sum.samples.push_back(r);
                sum.tokens += j == 0 ? r.tokens : fed;
                if (cb.on_sample_tokens) {
                    std::vector<int32_t> ids(it.ids.begin(), it.ids.begin() + split);
                    ids.insert(ids.end(), ta.transcript.begin(), ta.transcript.end());
                    ids.insert(ids.end(), q.ids.begin(), q.ids.end());
                    std::vector<float> token_loss(size_t(split), std::numeric_limits<float>::quiet_NaN());
                    token_loss.insert(token_loss.end(), a.token_loss.begin(), a.token_loss.end());
                    cb.on_sample_tokens(r, ids, token_loss);
                }
                if (cb.on_sample) cb.on_sample(r);
            }
            continue;
        }
        // One cache per sample (dense caches are sized to the sample).
        KVCache cache(kc, mc, model.options().device, model.act_dtype(), T, &codec);
        if (cb.on_layer_step) cache.set_step_hook(cb.on_layer_step);
        HeadSpec hs;
        hs.kind = head;
        hs.B = 1;
        hs.T = T;
        hs.record_token_loss = bool(cb.on_sample_tokens);
        if (head == HeadKind::NEXT_TOKEN && !it.targets.empty()) {
            hs.token_targets = it.targets;
            hs.record_argmax = true;
        } else if (head == HeadKind::NEXT_TOKEN) {
            hs.token_targets.assign(size_t(T), -100);
            for (int64_t t = 0; t + 1 < T; ++t) hs.token_targets[size_t(t)] = it.ids[size_t(t + 1)];
        } else {
            hs.class_tokens = class_ids;
            hs.labels = {it.label};
        }
        Tensor ids = Tensor::from_i32({1, T}, it.ids, {model.options().device, MemCategory::ACTIVATIONS, "input ids"});
        HeadResult res;
        DriverCallbacks dcb;
        dcb.cancel = cb.cancel;
        std::unique_ptr<FidelityAttention> fid;
        std::unique_ptr<DenseReference> dense_ref;
        if (cfg.fidelity) {
            InstrumentationScope instrumentation;  // the shadow caches and their setup
            {
                PhaseScope phase(RunPhase::FIDELITY_ATTENTION);
                fid = std::make_unique<FidelityAttention>(cache, mc, 1, T, model.options().device, model.act_dtype());
                fid->set_oracle(cfg.fidelity_oracle);
            }
            dcb.attention = fid.get();
            PhaseScope phase(RunPhase::FIDELITY_REFERENCE);
            dense_ref = std::make_unique<DenseReference>(model, 1, T, fid.get(), cfg.fidelity_kl_positions);
            dcb.final_output = [&](size_t cell, const std::vector<Tensor>& xs) {
                InstrumentationScope instrumentation;  // the dense reference and KL heads measure the run
                PhaseScope phase(RunPhase::FIDELITY_REFERENCE);  // KL heads inside (DenseReference)
                dense_ref->run_cell(ids, plans[i], cell, xs);
            };
        }
        const std::string what = it.description;
        const int64_t policy_units = int64_t(plans[i].chunks.size()) * mc.num_layers;
        dcb.progress = [&](int64_t d, int64_t) {
            if (cb.progress) cb.progress(done_units + d, total_units, what);
        };
        int64_t fidelity_units = 0;
        if (dense_ref) {
            dcb.units_after = dense_ref->progress_units(plans[i]);
            dense_ref->set_progress([&](int64_t units, const char* phase) {
                fidelity_units += units;
                if (cb.progress) cb.progress(done_units + policy_units + fidelity_units, total_units, str(what, " (", phase, ")"));
                if (trace::active()) {  // the token progress moves on through the measuring too
                    trace::ProgressInfo pi;
                    pi.chunks_done = pi.chunks_total = int32_t(policy_units);
                    pi.tokens_done = done_tokens + T * (policy_units + fidelity_units) / (policy_units + dcb.units_after);
                    pi.tokens_total = total_tokens;
                    trace::progress(pi);
                }
            });
        }
        // The live progress counts the whole run (all samples), not this sample alone.
        dcb.run_tokens_before = done_tokens;
        dcb.run_tokens_total = total_tokens;
        const double t0 = now_s();
        long_context_forward(model, cache, ids, plans[i], hs, res, dcb);
        done_units += policy_units + (dense_ref ? dense_ref->progress_units(plans[i]) : 0);
        done_tokens += T;
        EvalSampleResult r;
        r.index = int64_t(i);
        r.seconds = now_s() - t0;
        r.tokens = T;
        r.description = it.description;
        r.prediction = res.prediction[0];
        r.label = it.label;
        r.correct = head != HeadKind::NEXT_TOKEN && r.prediction == it.label;
        if (!it.targets.empty()) score_answer(r, it.targets, res.target_argmax);
        r.loss = res.count[0] > 0 ? res.loss_sum[0] / res.count[0] : 0.0;
        loss_total += res.loss_sum[0];
        loss_tokens += res.count[0];
        sum.scored_tokens += int64_t(res.count[0]);
        correct += r.correct ? 1 : 0;
        sum.samples.push_back(r);
        sum.kv_bytes = cache.buffer_bytes();
        sum.kv_logical_bytes = cache.logical_bytes();
        sum.kv_physical_bytes = cache.physical_bytes();
        sum.windowed_layers.clear(), sum.windowed_slots.clear(), sum.kv_bytes_windowed = 0;
        for (int l = 0; l < cache.num_layers(); ++l)
            if (is_window_policy(cache.layer(l).policy())) {
                sum.windowed_layers.push_back(l);
                sum.windowed_slots.push_back(cache.layer(l).policy().cache_length());
                sum.kv_bytes_windowed += cache.layer(l).buffer().bytes();
            }
        sum.layer_kinds.clear();
        for (int64_t l = 0; l < mc.num_layers; ++l) sum.layer_kinds.push_back(layer_kind(mc, l));
        sum.kv_bits_per_element = cache.bits_per_element();
        sum.tokens += T;
        policy_phase.reset();
        // Handing the measurements on (the sample's log line alone is too small to count).
        std::optional<PhaseScope> telemetry_phase;
        if (fid || cb.on_sample_tokens) telemetry_phase.emplace(RunPhase::TELEMETRY);
        if (fid) {
            InstrumentationScope instrumentation;  // handing the measurements on (telemetry) is measuring too
            std::vector<FidelityStep> st = fid->take_steps();
            if (cb.on_fidelity) cb.on_fidelity(int64_t(i), st);
            fidelity_steps.insert(fidelity_steps.end(), st.begin(), st.end());
            std::vector<FidelityKLStep> kl = dense_ref->take_steps();
            if (cb.on_fidelity_kl) cb.on_fidelity_kl(int64_t(i), kl);
            fidelity_kl.insert(fidelity_kl.end(), kl.begin(), kl.end());
        }
        if (cb.on_sample_tokens) cb.on_sample_tokens(r, it.ids, res.token_loss);
        // The sample's log line and metrics: telemetry's when that is recorded; alone (no
        // session, no fidelity) it is the run's output, too small to count apart.
        if (cb.on_sample) cb.on_sample(r);
        telemetry_phase.reset();
    }
    sum.seconds = now_s() - t_start;
    // The run's own time is its policy passes (reconstruction included); what measured it, the
    // instrumentation phases, is reported apart (issue 37).
    sum.phase_seconds = phase_seconds_since(phases_start, PhaseScope::thread_seconds());
    sum.instrumentation_seconds = 0;
    for (size_t p = 0; p < kNumRunPhases; ++p)
        if (run_phase_is_instrumentation(RunPhase(p))) sum.instrumentation_seconds += sum.phase_seconds[p];
    const double own = sum.phase_seconds[size_t(RunPhase::POLICY_PASS)] + sum.phase_seconds[size_t(RunPhase::RECONSTRUCTION)];
    sum.tokens_per_s = own > 0 ? double(sum.tokens) / own : 0;
    sum.tokens_per_s_with_instrumentation = sum.seconds > 0 ? double(sum.tokens) / sum.seconds : 0;
    double ml = 0;
    for (const auto& s : sum.samples) ml += s.loss;
    sum.mean_loss = sum.samples.empty() ? 0 : ml / double(sum.samples.size());
    const bool copy_task = cfg.data.name == "repeat";
    const bool answer_task = is_ruler_task(cfg.data.name);  // accuracy = exact answers
    if (head == HeadKind::NEXT_TOKEN && !copy_task && !answer_task) sum.perplexity = loss_tokens > 0 ? std::exp(loss_total / loss_tokens) : 0;
    else sum.accuracy = sum.samples.empty() ? 0 : double(correct) / double(sum.samples.size());
    for (double& a : sum.question_accuracy) a /= double(std::max<size_t>(items.size(), 1));
    for (double& a : sum.question_score) a /= double(std::max<size_t>(items.size(), 1));
    if (ask && !sum.samples.empty()) {
        sum.generated_tokens = gen_tokens / double(sum.samples.size());
        sum.generated_score = gen_score / double(sum.samples.size());
    }
    if ((copy_task || answer_task) && !sum.samples.empty()) {
        sum.copy_token_accuracy = sum.copy_prefix = 0;
        for (const auto& s : sum.samples) {
            sum.copy_token_accuracy += s.copy_token_accuracy / double(sum.samples.size());
            sum.copy_prefix += s.copy_prefix / double(sum.samples.size());
        }
    }
    if (cfg.fidelity && !fidelity_steps.empty()) {
        sum.fidelity_layers = summarize_fidelity(fidelity_steps);
        sum.fidelity_attn_rel_error = sum.fidelity_kept_mass = 0;
        if (cfg.fidelity_oracle) sum.fidelity_oracle_mass = sum.fidelity_efficiency = 0;
        for (const FidelityStep& f : fidelity_steps) {
            sum.fidelity_attn_rel_error += f.attn_rel_error / double(fidelity_steps.size());
            sum.fidelity_kept_mass += f.kept_mass / double(fidelity_steps.size());
            if (cfg.fidelity_oracle) {
                sum.fidelity_oracle_mass += f.oracle_mass / double(fidelity_steps.size());
                sum.fidelity_efficiency += f.efficiency / double(fidelity_steps.size());
            }
        }
        sum.fidelity_next_token_kl = mean_next_token_kl(fidelity_kl);
    }
    sum.memory = tracker.all_stats();
    return sum;
}

}  // namespace kv
