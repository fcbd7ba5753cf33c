// Mode dispatch for one run (see run_execution.h).
#include "run_execution.h"

#include <nlohmann/json.hpp>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <sstream>

#include "engine/core/device.h"
#include "engine/core/error.h"
#include "engine/core/run_mode.h"
#include "engine/data/ruler.h"
#include "engine/driver/long_context.h"
#include "engine/generate/chat_format.h"
#include "engine/generate/generator.h"
#include "engine/memory/memory_tracker.h"
#include "engine/model/model_loader.h"
#include "engine/run/evaluate.h"
#include "engine/run/run_memory.h"
#include "engine/telemetry/run_phase.h"
#include "engine/telemetry/trace.h"
#include "engine/train/trainer.h"
#include "run_train.h"

namespace kv::sessions {

namespace {

ModelOptions model_options(const RunConfig& cfg) {
    ModelOptions opt;
    opt.dtype = cfg.dtype == "bf16" ? DType::BF16 : DType::F32;
    opt.rope = rope_mode_from_name(cfg.rope);
    opt.mla_cache = mla_cache_choice(cfg);
    opt.verify_checksum = cfg.model_verify;
    // Packed weights are frozen: runs that rewrite the base (full fine-tuning, QLoRA's NF4) dequantize at load.
    opt.weights = cfg.model_weights;
    if (opt.weights == "packed" && ((is_train_mode(cfg.mode) && !is_lora_mode(cfg.mode)) || cfg.train.qlora)) opt.weights = "f32";
    opt.device = parse_device(cfg.device);
    return opt;
}

}  // namespace

std::string fidelity_metric_name(const std::string& quantity, int layer) {
    return str("fidelity.", quantity, ".layer", layer);
}

nlohmann::json memory_json(const std::vector<DeviceMemoryStats>& stats) {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& s : stats) {
        nlohmann::json d;
        d["peak_total"] = s.peak_total;
        // The run's own peak, apart from instrumentation (fidelity's shadow cache and passes).
        d["peak_total_without_instrumentation"] = s.peak_without_instrumentation;
        if (s.peak_instrumentation > 0) d["peak_instrumentation"] = s.peak_instrumentation;
        for (size_t c = 0; c < kNumMemCategories; ++c)
            if (s.peak[c]) {
                d["peak"][mem_category_name(MemCategory(c))] = s.peak[c];
                // The category's own peak, apart from what instrumentation allocated in it.
                d["peak_without_instrumentation"][mem_category_name(MemCategory(c))] = s.peak_without_instrumentation_by_category[c];
            }
        // Next to the tracked peak, what the OS counted (libraries, mapped files, heap slack):
        // the process's peak resident set so far (ru_maxrss, KiB on Linux).
        rusage ru{};
        if (s.device.is_cpu() && getrusage(RUSAGE_SELF, &ru) == 0) d["process_peak_rss"] = int64_t(ru.ru_maxrss) * 1024;
        j[s.device.is_cpu() ? "cpu" : str("cuda:", s.device.index)] = d;
    }
    return j;
}

namespace {

RunOutcome run_eval_mode(const RunConfig& cfg, LoadedModel& lm, const RunHooks& hooks) {
    EvalCallbacks cb;
    cb.cancel = hooks.cancel;
    cb.progress = hooks.progress;
    std::ostringstream text;
    cb.on_sample = [&](const EvalSampleResult& r) {
        std::ostringstream line;
        line.precision(4);
        line << "sample " << r.index << ": " << r.description << " | loss " << r.loss;
        if (r.label >= 0) line << " | predicted " << r.prediction << ", answer " << r.label << (r.correct ? " (correct)" : "");
        if (r.copy_token_accuracy >= 0)
            line << " | copied " << r.copy_token_accuracy << " of the tokens" << (r.correct ? " (exact copy)" : "");
        line << " | " << r.seconds << " s";
        if (hooks.output) hooks.output(line.str());
        trace::metric("sample_loss", r.index, r.loss);
        // exact answers of classification and of scored answers (RULER, repeat): the needle heat map reads them per sample
        if (r.label >= 0 || r.copy_token_accuracy >= 0) trace::metric("sample_correct", r.index, r.correct ? 1.0 : 0.0);
    };
    // Fidelity per (layer, chunk) as metrics named per quantity and layer, step = the chunk's
    // index over the run (sample * chunks per sample + chunk): the session's metric table holds
    // them without a table of their own, and exports and the metrics view read them as they are.
    cb.on_fidelity = [&](int64_t sample, const std::vector<FidelityStep>& steps) {
        int64_t chunks = 0;
        for (const FidelityStep& f : steps) chunks = std::max(chunks, f.chunk + 1);
        for (const FidelityStep& f : steps) {
            const int64_t step = sample * chunks + f.chunk;
            trace::metric(fidelity_metric_name("attn_rel_error", f.layer), step, f.attn_rel_error);
            trace::metric(fidelity_metric_name("kept_mass", f.layer), step, f.kept_mass);
            if (cfg.fidelity_oracle) {
                trace::metric(fidelity_metric_name("oracle_mass", f.layer), step, f.oracle_mass);
                trace::metric(fidelity_metric_name("efficiency", f.layer), step, f.efficiency);
            }
        }
    };
    // The next-token KL is one number per chunk (not per layer): fidelity.next_token_kl, same steps.
    cb.on_fidelity_kl = [&](int64_t sample, const std::vector<FidelityKLStep>& steps) {
        int64_t chunks = 0;
        for (const FidelityKLStep& f : steps) chunks = std::max(chunks, f.chunk + 1);
        for (const FidelityKLStep& f : steps) trace::metric(kFidelityKLMetric, sample * chunks + f.chunk, f.next_token_kl);
    };
    double sample_tokens_seconds = 0;  // pieces + the write, what the per-token record costs the run
    if (hooks.sample_tokens)
        cb.on_sample_tokens = [&](const EvalSampleResult& r, const std::vector<int32_t>& ids, const std::vector<float>& loss) {
            const auto t0 = std::chrono::steady_clock::now();
            storage::SampleTokensRow row;
            row.sample = r.index;
            row.description = r.description;
            row.ids = ids;
            row.loss = loss;
            row.pieces.reserve(ids.size());
            for (int32_t id : ids) row.pieces.push_back(lm.tokenizer->token_to_piece(id));
            for (float l : loss) row.scored += std::isfinite(l) ? 1 : 0;
            row.mean_loss = r.loss;
            row.correct = r.label >= 0 || r.copy_token_accuracy >= 0 ? (r.correct ? 1 : 0) : -1;
            row.token_accuracy = r.copy_token_accuracy;
            hooks.sample_tokens(row);
            sample_tokens_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        };
    cb.chat_frame = [&lm](const std::string& user) { return chat_prompt(*lm.tokenizer, user); };
    cb.chat_turn_end = [&lm] { return chat_turn_end(*lm.tokenizer); };
    EvalSummary s = run_eval(cfg, lm, cb);
    PhaseScope finish(RunPhase::FINISH);  // the summary and text below
    nlohmann::json j;
    j["mode"] = cfg.mode;
    j["samples"] = s.samples.size();
    j["mean_loss"] = s.mean_loss;
    if (s.accuracy >= 0) j["accuracy"] = s.accuracy;
    if (s.perplexity >= 0) j["perplexity"] = s.perplexity;
    if (s.copy_token_accuracy >= 0 && is_ruler_task(cfg.data.name)) {
        // Named apart from the repeat task's copy, so a sweep's "auto" metric stays accuracy
        // (exact answers) for these tasks.
        j["answer_token_accuracy"] = s.copy_token_accuracy;
    } else if (s.copy_token_accuracy >= 0) {
        j["copy_token_accuracy"] = s.copy_token_accuracy;
        j["copy_prefix"] = s.copy_prefix;
    }
    j["tokens"] = s.tokens;
    j["scored_tokens"] = s.scored_tokens;
    if (s.text_bos >= 0) j["bos"] = s.text_bos == 1;
    j["seconds"] = s.seconds;
    j["tokens_per_s"] = s.tokens_per_s;  // the run's own speed (without what measured it)
    if (s.instrumentation_seconds > 0) {
        j["instrumentation_seconds"] = s.instrumentation_seconds;
        j["tokens_per_s_with_instrumentation"] = s.tokens_per_s_with_instrumentation;
    }
    j["kv_bytes"] = s.kv_bytes;
    j["kv_bits_per_element"] = s.kv_bits_per_element;
    j["kv_logical_bytes"] = s.kv_logical_bytes;
    j["kv_physical_bytes"] = s.kv_physical_bytes;
    if (!s.windowed_layers.empty()) {
        // Layers whose window the cache keeps by rule: the policy ran on the others only.
        j["windowed_layers"] = s.windowed_layers;
        j["windowed_layer_slots"] = s.windowed_slots;
        j["kv_bytes_windowed"] = s.kv_bytes_windowed;
    }
    if (!s.layer_kinds.empty()) j["layer_kinds"] = s.layer_kinds;  // the views name each layer's type by it
    j["chunks_per_sample"] = s.chunks_per_sample;
    if (!s.kept_slots.empty()) {  // compress-then-ask: the last sample's context and what its compression kept
        j["context_tokens"] = s.context_tokens;
        j["kept_slots"] = s.kept_slots;
        j["kept_total_slots"] = s.kept_total_slots;
        if (!cfg.protocol.score_threshold.empty()) {
            // The threshold's outcome: the mean share of the context kept over the layers' rows.
            int64_t kept = 0;
            for (int64_t k : s.kept_total_slots) kept += k;
            const double rows = double(s.kept_total_slots.size()) * double(lm.config.cache_kv_heads());
            j["kept_fraction"] = rows > 0 && s.context_tokens > 0 ? double(kept) / (rows * double(s.context_tokens)) : 0.0;
            // Per layer, each (b, g) row's own count: the threshold's outcome per head.
            j["kept_row_slots"] = s.kept_row_slots;
            j["threshold_window"] = cfg.protocol.threshold_window;
        }
        if (!s.decode_final_slots.empty()) {
            j["decoded_tokens"] = s.decoded_tokens;
            j["decode_final_slots"] = s.decode_final_slots;
        }
        j["generated_tokens"] = s.generated_tokens;
        j["generated_score"] = s.generated_score;
        j["contexts_compressed"] = s.contexts_compressed;
        j["questions_per_context"] = s.questions_per_context;
        if (s.questions_per_context > 1) {
            j["turns"] = cfg.data.turns;
            j["question_accuracy"] = s.question_accuracy;
            j["question_score"] = s.question_score;
        }
    }
    if (hooks.sample_tokens) j["sample_tokens_seconds"] = sample_tokens_seconds;
    j["memory"] = memory_json(s.memory);
    if (s.fidelity_attn_rel_error >= 0) {
        j["fidelity_attn_rel_error"] = s.fidelity_attn_rel_error;
        j["fidelity_kept_mass"] = s.fidelity_kept_mass;
        if (s.fidelity_next_token_kl >= 0) j["fidelity_next_token_kl"] = s.fidelity_next_token_kl;
        if (s.fidelity_oracle_mass >= 0) {
            j["fidelity_oracle_mass"] = s.fidelity_oracle_mass;
            j["fidelity_efficiency"] = s.fidelity_efficiency;
        }
        nlohmann::json layers = nlohmann::json::array();
        for (const FidelityLayerSummary& f : s.fidelity_layers) {
            nlohmann::json l = {{"layer", f.layer}, {"attn_rel_error", f.attn_rel_error}, {"kept_mass", f.kept_mass}};
            if (s.fidelity_oracle_mass >= 0) l["oracle_mass"] = f.oracle_mass, l["efficiency"] = f.efficiency;
            layers.push_back(l);
        }
        j["fidelity_layers"] = layers;
    }
    trace::metric("mean_loss", 0, s.mean_loss);
    if (s.accuracy >= 0) trace::metric("accuracy", 0, s.accuracy);
    if (s.perplexity >= 0) trace::metric("perplexity", 0, s.perplexity);
    trace::metric("tokens_per_s", 0, s.tokens_per_s);
    // Several questions per context: a metric per question (per turn of a conversation), step =
    // its index, so the metrics view and a sweep read each turn's score beside the mean.
    if (s.questions_per_context > 1)
        for (size_t q = 0; q < s.question_accuracy.size(); ++q) {
            trace::metric("question_accuracy", int64_t(q), s.question_accuracy[q]);
            trace::metric("question_score", int64_t(q), s.question_score[q]);
        }
    RunOutcome out;
    out.summary_json = j.dump();
    text.precision(4);
    if (s.accuracy >= 0) text << "accuracy " << s.accuracy << " | ";
    if (s.perplexity >= 0) text << "perplexity " << s.perplexity << " | ";
    if (s.copy_token_accuracy >= 0)
        text << (is_ruler_task(cfg.data.name) ? "answer tokens right " : "copied tokens ") << s.copy_token_accuracy << " | ";
    text << "mean loss " << s.mean_loss << " over " << s.scored_tokens << " scored of " << s.tokens << " tokens | " << s.tokens_per_s << " tokens/s";
    if (s.instrumentation_seconds > 0)
        text << " (" << s.tokens_per_s_with_instrumentation << " with the " << s.instrumentation_seconds << " s that measured it)";
    text << " | KV " << format_bytes((long long)s.kv_bytes) << " (" << s.kv_bits_per_element << " bits/element; kept "
         << format_bytes((long long)s.kv_logical_bytes) << ", held " << format_bytes((long long)s.kv_physical_bytes) << ")";
    if (!s.windowed_layers.empty()) {
        text << " | windowed layers";
        for (size_t i = 0; i < s.windowed_layers.size(); ++i) text << (i ? "," : " ") << s.windowed_layers[i];
        text << " keep their window by rule (up to " << *std::max_element(s.windowed_slots.begin(), s.windowed_slots.end())
             << " slots each, " << format_bytes((long long)s.kv_bytes_windowed) << "); the policy ran on the other layers";
    }
    if (s.fidelity_attn_rel_error >= 0)
        text << " | fidelity: attention error " << s.fidelity_attn_rel_error << ", kept attention mass " << s.fidelity_kept_mass
             << ", next-token KL " << s.fidelity_next_token_kl << " nats";
    if (s.fidelity_efficiency >= 0)
        text << " | oracle: kept mass " << s.fidelity_oracle_mass << ", policy efficiency " << s.fidelity_efficiency;
    if (!s.kept_slots.empty())
        text << " | compressed once: " << s.kept_slots.front() << " of " << s.context_tokens << " context slots kept (layer 0)";
    if (j.contains("kept_fraction"))
        text << " | score threshold " << cfg.protocol.score_threshold << " (last " << cfg.protocol.threshold_window
             << " positions protected): " << j["kept_fraction"].get<double>() << " of the context kept (mean over layers and heads)";
    if (s.generated_tokens >= 0)
        text << " | greedy answers: " << s.generated_tokens << " tokens on average, RULER score " << s.generated_score;
    if (!s.decode_final_slots.empty())
        text << " | decoding " << (cfg.protocol.threshold_decode ? str("threshold ", cfg.protocol.score_threshold) : str("budget ", cfg.protocol.decode_ratio))
             << ": " << s.decoded_tokens << " tokens decoded, "
             << s.decode_final_slots.front() << " slots held after the last (layer 0)";
    if (s.questions_per_context > 1) {
        text << " | " << s.questions_per_context << " questions per context ("
             << cfg.data.turns << "), the context compressed once; exact by question:";
        for (size_t q = 0; q < s.question_accuracy.size(); ++q) text << (q ? ", " : " ") << s.question_accuracy[q];
        text << "; greedy answers' RULER score by question:";
        for (size_t q = 0; q < s.question_score.size(); ++q) text << (q ? ", " : " ") << s.question_score[q];
    }
    if (s.text_bos >= 0) text << (s.text_bos ? " | BOS first (the tokenizer adds one)" : " | no BOS (the tokenizer adds none)");
    out.text = text.str();
    return out;
}

RunOutcome run_generate_mode(const RunConfig& cfg, LoadedModel& lm, const RunHooks& hooks) {
    const std::string text = cfg.generate.chat ? chat_prompt(*lm.tokenizer, cfg.generate.prompt) : cfg.generate.prompt;
    std::vector<int32_t> prompt = lm.tokenizer->encode(text, true);
    GenerationCallbacks cb;
    cb.cancel = hooks.cancel;
    cb.on_text = hooks.output;
    GenerationResult r = generate(*lm.model, *lm.tokenizer, prompt, cfg.generate, cfg.kv_cache, cb);
    nlohmann::json j;
    j["mode"] = "generate";
    j["prompt_tokens"] = r.prompt_tokens;
    j["generated_tokens"] = r.tokens.size();
    j["prefill_seconds"] = r.prefill_seconds;
    j["decode_seconds"] = r.decode_seconds;
    // Prefill and decode speed apart: the first token comes from the prefill's logits, so a
    // decode speed exists only when at least one decode forward ran (tokens_per_s is that speed).
    if (r.prefill_seconds > 0) j["prefill_tokens_per_s"] = double(r.prompt_tokens) / r.prefill_seconds;
    j["decode_forwards"] = r.decode_forwards;
    j["decode_evicting_forwards"] = r.evicting_forwards;  // decode steps on a full cache (docs/POLICIES.md)
    if (r.decode_forwards > 0 && r.decode_seconds > 0) {
        j["decode_tokens_per_s"] = double(r.decode_forwards) / r.decode_seconds;
        j["tokens_per_s"] = j["decode_tokens_per_s"];
    }
    j["stop_reason"] = r.stop_reason;
    // Byte-level tokens need not form valid UTF-8 (a model may emit a lone continuation byte).
    // JSON holds text only: invalid bytes become U+FFFD there, and the ids keep the exact output.
    j["text"] = r.text;
    j["token_ids"] = r.tokens;
    j["memory"] = memory_json(current_memory_tracker().all_stats());
    RunOutcome out;
    out.cancelled = r.stop_reason == "cancelled";
    out.summary_json = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    out.text = r.text;
    return out;
}

}  // namespace

namespace {

RunOutcome execute_mode(const RunConfig& cfg, LoadedModel& lm, const RunHooks& hooks) {
    switch (kv::run_mode(cfg.mode).kind) {
        case RunKind::EVALUATE:
            return run_eval_mode(cfg, lm, hooks);
        case RunKind::GENERATE:
            return run_generate_mode(cfg, lm, hooks);
        case RunKind::TRAIN:
            return run_train_mode(cfg, lm, hooks);
    }
    throw Error(str("mode '", cfg.mode, "' cannot run in this build yet"));
}

nlohmann::json phase_seconds_json(const PhaseSeconds& s) {
    nlohmann::json j = nlohmann::json::object();
    for (size_t p = 0; p < kNumRunPhases; ++p)
        if (s[p] > 0) j[run_phase_name(RunPhase(p))] = s[p];
    return j;
}

}  // namespace

RunOutcome execute_run(const RunConfig& cfg, const RunHooks& hooks) {
    validate_run_config(cfg);
    const PhaseSeconds phases_start = PhaseScope::thread_seconds();
    std::optional<PhaseScope> load_phase(std::in_place, RunPhase::LOAD);
    std::optional<LoadedModel> lm(std::in_place, load_model(cfg.model, model_options(cfg), cfg.model_seed));
    // Everything sized by the user's numbers is refused here, before any of it is allocated.
    check_run_memory(cfg, lm->config);
    load_phase.reset();
    RunOutcome out = execute_mode(cfg, *lm, hooks);
    {
        PhaseScope finish(RunPhase::FINISH);  // releasing the weights is the run's time too
        lm.reset();
    }
    // Closed before its seconds are summed: the span and the phase clock say the same time.
    // Where the run's time went, phase by phase (the timeline's RUN spans, summed).
    nlohmann::json j = nlohmann::json::parse(out.summary_json, nullptr, false);
    if (j.is_object()) {
        j["phase_seconds"] = phase_seconds_json(phase_seconds_since(phases_start, PhaseScope::thread_seconds()));
        out.summary_json = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    }
    return out;
}

}  // namespace kv::sessions
