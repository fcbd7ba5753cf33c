// The option table (see run_config.h). Each entry binds a dotted name to a field with its
// parser, bounds and help text.
#include "run_config.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cmath>
#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "engine/core/error.h"
#include "engine/core/join.h"
#include "engine/core/run_mode.h"
#include "engine/data/ruler.h"
#include "engine/kv/head_ratios.h"

namespace kv {

namespace {

using Json = nlohmann::json;

int64_t parse_int(const std::string& name, const std::string& v, int64_t lo, int64_t hi) {
    char* end = nullptr;
    errno = 0;
    long long x = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end || errno == ERANGE)
        throw Error(str("--", name, ": '", v, "' is not an integer; expected a whole number in [", lo, ", ", hi, "]"));
    if (x < lo || x > hi) throw Error(str("--", name, ": ", x, " is out of range; expected a whole number in [", lo, ", ", hi, "]"));
    return x;
}

double parse_float(const std::string& name, const std::string& v, double lo, double hi) {
    char* end = nullptr;
    double x = std::strtod(v.c_str(), &end);
    if (v.empty() || *end || !std::isfinite(x))
        throw Error(str("--", name, ": '", v, "' is not a number; expected a value in [", lo, ", ", hi, "]"));
    if (x < lo || x > hi) throw Error(str("--", name, ": ", x, " is out of range; expected a value in [", lo, ", ", hi, "]"));
    return x;
}

bool parse_bool(const std::string& name, const std::string& v) {
    if (v == "true" || v == "1" || v == "True" || v == "yes") return true;
    if (v == "false" || v == "0" || v == "False" || v == "no") return false;
    throw Error(str("--", name, ": '", v, "' is not a boolean; expected true or false"));
}

std::string fmt_double(double x) {
    std::ostringstream os;
    os.precision(10);
    os << x;
    return os.str();
}

std::vector<std::string> split_list(const std::string& v) {
    std::vector<std::string> out;
    std::string cur;
    for (char c : v) {
        if (c == ',') {
            if (!cur.empty()) out.push_back(cur);
            cur.clear();
        } else {
            cur += c;
        }
    }
    if (!cur.empty()) out.push_back(cur);
    return out;
}


template <class Acc>
OptionDef int_opt(std::string name, std::string group, std::string help, int64_t lo, int64_t hi, Acc acc) {
    OptionDef d{name, OptionType::INT, std::move(group), std::move(help), {}, {}, {}};
    d.set = [name, lo, hi, acc](RunConfig& c, const std::string& v) { acc(c) = parse_int(name, v, lo, hi); };
    d.get = [acc](const RunConfig& c) { return std::to_string(acc(const_cast<RunConfig&>(c))); };
    return d;
}

template <class Acc>
OptionDef uint_opt(std::string name, std::string group, std::string help, Acc acc) {
    OptionDef d{name, OptionType::INT, std::move(group), std::move(help), {}, {}, {}};
    d.set = [name, acc](RunConfig& c, const std::string& v) { acc(c) = uint64_t(parse_int(name, v, 0, INT64_MAX)); };
    d.get = [acc](const RunConfig& c) { return std::to_string(acc(const_cast<RunConfig&>(c))); };
    return d;
}

template <class Acc>
OptionDef float_opt(std::string name, std::string group, std::string help, double lo, double hi, Acc acc) {
    OptionDef d{name, OptionType::FLOAT, std::move(group), std::move(help), {}, {}, {}};
    d.set = [name, lo, hi, acc](RunConfig& c, const std::string& v) { acc(c) = parse_float(name, v, lo, hi); };
    d.get = [acc](const RunConfig& c) { return fmt_double(acc(const_cast<RunConfig&>(c))); };
    return d;
}

template <class Acc>
OptionDef bool_opt(std::string name, std::string group, std::string help, Acc acc) {
    OptionDef d{name, OptionType::BOOL, std::move(group), std::move(help), {"false", "true"}, {}, {}};
    d.set = [name, acc](RunConfig& c, const std::string& v) { acc(c) = parse_bool(name, v); };
    d.get = [acc](const RunConfig& c) { return std::string(acc(const_cast<RunConfig&>(c)) ? "true" : "false"); };
    return d;
}

template <class Acc>
OptionDef str_opt(std::string name, std::string group, std::string help, std::vector<std::string> choices, Acc acc) {
    OptionDef d{name, OptionType::STRING, std::move(group), std::move(help), choices, {}, {}};
    d.set = [name, choices, acc](RunConfig& c, const std::string& v) {
        if (!choices.empty() && std::find(choices.begin(), choices.end(), v) == choices.end())
            throw Error(str("--", name, ": '", v, "' is not allowed; expected one of: ", join(choices, ",")));
        acc(c) = v;
    };
    d.get = [acc](const RunConfig& c) { return acc(const_cast<RunConfig&>(c)); };
    return d;
}

template <class Acc>
OptionDef list_opt(std::string name, std::string group, std::string help, Acc acc) {
    OptionDef d{name, OptionType::LIST, std::move(group), std::move(help), {}, {}, {}};
    d.set = [acc](RunConfig& c, const std::string& v) { acc(c) = split_list(v); };
    d.get = [acc](const RunConfig& c) { return join(acc(const_cast<RunConfig&>(c)), ","); };
    return d;
}

std::vector<OptionDef> build_options() {
    const int64_t BIG = int64_t(1) << 40;
    std::vector<std::string> caches;
    for (const auto& p : kv_policy_names())
        for (const auto& b : kv_buffer_names()) caches.push_back(CacheName{p, b}.text());
    std::vector<OptionDef> o;
    // ---- model
    o.push_back(str_opt("mode", "mode", "what the run does", run_modes(), [](RunConfig& c) -> std::string& { return c.mode; }));
    o.push_back(str_opt("model", "model", "preset name (tiny, small, qwen2.5-0.5b, ...), model folder or .gguf file", {},
                        [](RunConfig& c) -> std::string& { return c.model; }));
    o.push_back(str_opt("name", "model", "run name shown in the session", {}, [](RunConfig& c) -> std::string& { return c.name; }));
    o.push_back(str_opt("precision", "model", "weight and activation storage", {"f32", "bf16"},
                        [](RunConfig& c) -> std::string& { return c.dtype; }));
    o.push_back(str_opt("rope", "model", "position encoding: yarn (keys_values default), plain, or hf (config.json's rope_scaling)",
                        {"yarn", "plain", "hf"}, [](RunConfig& c) -> std::string& { return c.rope; }));
    o.push_back(str_opt("model.mla_cache", "model",
                        "multi-head latent attention (DeepSeek-V2): the cache holds per token the latent and k_pe (latent, one KV "
                        "head) or every head's K and V (expanded); auto: latent, expanded for training",
                        {"auto", "latent", "expanded"}, [](RunConfig& c) -> std::string& { return c.mla_cache; }));
    o.push_back(uint_opt("model_seed", "model", "seed of the preset models' random weights",
                         [](RunConfig& c) -> uint64_t& { return c.model_seed; }));
    o.push_back(bool_opt("model.verify", "model", "check the model file's SHA-256 against FILE.sha256 before loading",
                         [](RunConfig& c) -> bool& { return c.model_verify; }));
    o.push_back(str_opt("model.weights", "model",
                        "GGUF weights: packed (kept in their block format, CPU f32 runs; training that updates the base "
                        "uses f32), f32 or bf16 (dequantized at load)",
                        {"packed", "f32", "bf16"}, [](RunConfig& c) -> std::string& { return c.model_weights; }));
    // ---- data
    std::vector<std::string> data_names = {"passkey", "recall", "needle", "repeat"};
    for (const std::string& t : ruler_task_names()) data_names.push_back(t);  // engine/data/ruler.h: the one list
    for (const char* t : {"text", "longbench", "helmet"}) data_names.push_back(t);
    o.push_back(str_opt("data", "data", "data source (niah_*, vt, cwe, fwe, qa_*: RULER's 13 tasks, scored by exact match)", data_names,
                        [](RunConfig& c) -> std::string& { return c.data.name; }));
    o.push_back(int_opt("data.seq_length", "data", "tokens per sample / text window", 8, BIG,
                        [](RunConfig& c) -> int64_t& { return c.data.seq_length; }));
    o.push_back(int_opt("data.num_samples", "data", "samples (or text windows) to evaluate", 1, BIG,
                        [](RunConfig& c) -> int64_t& { return c.data.num_samples; }));
    o.push_back(uint_opt("data.seed", "data", "seed of the synthetic tasks and splits", [](RunConfig& c) -> uint64_t& { return c.data.seed; }));
    {
        OptionDef d{"data.depths", OptionType::LIST, "data", "needle, passkey, RULER one-needle tasks: insertion depths in [0, 1], comma-separated (sample i at depth i mod their count)", {}, {}, {}};
        d.set = [](RunConfig& c, const std::string& v) {
            c.data.depths.clear();
            for (const auto& s : split_list(v)) c.data.depths.push_back(parse_float("data.depths", s, 0.0, 1.0));
        };
        d.get = [](const RunConfig& c) {
            std::vector<std::string> s;
            for (double x : c.data.depths) s.push_back(fmt_double(x));
            return join(s, ",");
        };
        o.push_back(d);
    }
    o.push_back(int_opt("data.num_keys", "data", "recall: key-value pairs in the context", 2, 100000,
                        [](RunConfig& c) -> int64_t& { return c.data.num_keys; }));
    o.push_back(int_opt("data.ruler_keys", "data", "RULER: keys (niah_multikey, niah_multiquery: up to 4 asked), values (niah_multivalue), chain length (vt), common words (cwe)",
                        1, 30, [](RunConfig& c) -> int64_t& { return c.data.ruler_keys; }));
    o.push_back(int_opt("data.questions", "data",
                        "RULER niah_multikey / niah_multiquery: questions asked of each context, each answered in turn from the one "
                        "compressed cache (--protocol compress-then-ask; SCBench's multi-request)",
                        1, 64, [](RunConfig& c) -> int64_t& { return c.data.questions; }));
    o.push_back(str_opt("data.turns", "data",
                        "compress-then-ask with several questions: multi-request (each from the compressed context alone) or "
                        "multi-turn (SCBench's conversation: each after the earlier questions and the model's greedy answers)",
                        question_turns_names(), [](RunConfig& c) -> std::string& { return c.data.turns; }));
    o.push_back(int_opt("data.repeat_length", "data", "repeat: tokens of the passage that is copied", 5, BIG,
                        [](RunConfig& c) -> int64_t& { return c.data.repeat_length; }));
    o.push_back(int_opt("data.repeat_distance", "data", "repeat: filler tokens between the two copies (-1: the rest of seq_length)", -1, BIG,
                        [](RunConfig& c) -> int64_t& { return c.data.repeat_distance; }));
    o.push_back(list_opt("data.files", "data", "text: files to read, comma-separated",
                         [](RunConfig& c) -> std::vector<std::string>& { return c.data.files; }));
    o.push_back(str_opt("data.path", "data", "longbench / helmet: the dataset JSON file", {},
                        [](RunConfig& c) -> std::string& { return c.data.path; }));
    o.push_back(str_opt("data.dataset_key", "data", "helmet: task (nq, trec_coarse, ...)", {},
                        [](RunConfig& c) -> std::string& { return c.data.dataset_key; }));
    o.push_back(int_opt("data.max_seq_length", "data", "longbench / helmet: keep records up to this many tokens", 1, BIG,
                        [](RunConfig& c) -> int64_t& { return c.data.max_seq_length; }));
    o.push_back(float_opt("data.val_split_fraction", "data", "fraction of the training data held out for validation", 0.0, 0.9,
                          [](RunConfig& c) -> double& { return c.data.val_split_fraction; }));
    o.push_back(str_opt("data.metadata_dir", "data", "where token-length metadata is cached", {},
                        [](RunConfig& c) -> std::string& { return c.data.metadata_dir; }));
    // ---- cache
    o.push_back(str_opt("kv_cache.name", "cache",
                        "{policy}-{buffer}, e.g. h2o-q8, lastrec-default; policies (docs/POLICIES.md):\n" + policy_help_text() +
                            "    buffers: " + join(kv_buffer_names(), ",") + " (aliases: " + kv_buffer_aliases_text() + ")",
                        {}, [](RunConfig& c) -> std::string& { return c.kv_cache.name; }));
    o.back().choices = caches;  // offered by the GUI; checked by structure, not by list
    // Parsed once here and stored canonically (an alias becomes its buffer's name), so the
    // stored config, the sessions and every table show one spelling.
    o.back().set = [](RunConfig& c, const std::string& v) { c.kv_cache.name = parse_kv_cache_name(v).text(); };
    o.push_back(int_opt("kv_cache.cache_length", "cache", "slots per layer (0: the whole sequence, dense only)", 0, BIG,
                        [](RunConfig& c) -> int64_t& { return c.kv_cache.cache_length; }));
    {
        OptionDef d{"kv_cache.layer_cache_lengths", OptionType::STRING, "cache",
                    "slots per layer: one per layer (64,48,32), linear:FIRST:LAST, pyramid:BETA around cache_length (the "
                    "observation window on top, KVCache-Factory's), pyramid-kvpress:BETA (the window inside, kvpress'), or "
                    "ratios:R0,R1,... / ratios:FILE (layer l keeps R_l x cache_length, R_l in (0, 1]) "
                    "(overrides cache_length; pyramidkv defaults to pyramid:20)",
                    {}, {}, {}};
        d.set = [](RunConfig& c, const std::string& v) { set_layer_cache_lengths(c.kv_cache, v); };
        d.get = [](const RunConfig& c) { return layer_cache_lengths_text(c.kv_cache); };
        o.push_back(d);
    }
    {
        OptionDef d{"kv_cache.head_ratios", OptionType::STRING, "cache",
                    "lukv-*: one ratio in (0, 1] per (layer, KV head), head g of layer l keeping R x the layer's length: "
                    "\"1,0.5;0.25,1\" (';' between layers), pattern:R0,R1,... (repeated over the heads of every layer in order) or "
                    "FILE (one line per layer, '#' comments); stored as the numbers",
                    {}, {}, {}};
        d.set = [](RunConfig& c, const std::string& v) { set_head_ratios(c.kv_cache, v); };
        d.get = [](const RunConfig& c) { return c.kv_cache.head_ratios; };
        o.push_back(d);
    }
    o.push_back(int_opt("kv_cache.chunk_size", "cache", "tokens per chunk after the prefill", 1, BIG,
                        [](RunConfig& c) -> int64_t& { return c.driver.chunk_size; }));
    o.push_back(int_opt("kv_cache.prefill_length", "cache",
                        "tokens of the first chunk (0: the cache length; a dense reference given the compared runs' cache "
                        "length steps through the sequence in their chunks)",
                        0, BIG, [](RunConfig& c) -> int64_t& { return c.driver.prefill_length; }));
    o.push_back(bool_opt("kv_cache.randomize_chunk_sizes", "cache", "draw chunk sizes around chunk_size (up to 1.5x)",
                         [](RunConfig& c) -> bool& { return c.driver.randomize_chunk_sizes; }));
    o.push_back(int_opt("kv_cache.grace_period", "cache", "most recent tokens that can never be evicted", 0, BIG,
                        [](RunConfig& c) -> int64_t& { return c.kv_cache.grace_period; }));
    o.push_back(float_opt("kv_cache.keep_initial_fraction", "cache", "first chunk after a full prefill keeps this fraction", 0.0,
                          0.999, [](RunConfig& c) -> double& { return c.kv_cache.keep_initial_fraction; }));
    o.push_back(int_opt("kv_cache.max_chunk_size", "cache", "top-k eviction size (0: the chunk size)", 0, BIG,
                        [](RunConfig& c) -> int64_t& { return c.kv_cache.max_chunk_size; }));
    o.push_back(bool_opt("kv_cache.normalize_scores", "cache", "divide H2O scores by token age",
                         [](RunConfig& c) -> bool& { return c.kv_cache.normalize_scores; }));
    o.push_back(float_opt("kv_cache.combination_constant", "cache", "qh2o: weight of the H2O score against the quantization error",
                          0.0, 1.0, [](RunConfig& c) -> double& { return c.kv_cache.combination_constant; }));
    o.push_back(int_opt("kv_cache.init_grace_tokens", "cache", "lastrec: protected first tokens (-1: min(16, L/8))", -1, BIG,
                        [](RunConfig& c) -> int64_t& { return c.kv_cache.init_grace_tokens; }));
    o.push_back(int_opt("kv_cache.sinks", "cache", "streaming: attention sinks", 0, BIG, [](RunConfig& c) -> int64_t& { return c.kv_cache.sinks; }));
    for (const KVFieldOption& f : kv_field_options()) {  // the fields a policy names (engine/kv/kv_config.h)
        const std::string name = str("kv_cache.", f.name);
        if (f.integer)
            o.push_back(int_opt(name, "cache", f.help, f.lo, f.hi, [m = f.integer](RunConfig& c) -> int64_t& { return c.kv_cache.*m; }));
        else
            o.push_back(str_opt(name, "cache", f.help, {}, [m = f.text](RunConfig& c) -> std::string& { return c.kv_cache.*m; }));
    }
    o.push_back(float_opt("kv_cache.max_initial_fraction", "cache", "smart-lastrec: largest protected fraction of L", 0.001, 0.999,
                          [](RunConfig& c) -> double& { return c.kv_cache.max_initial_fraction; }));
    o.push_back(int_opt("kv_cache.max_num_ranges", "cache", "quantized buffers: dirty ranges re-quantized per write-back", 1, 1024,
                        [](RunConfig& c) -> int64_t& { return c.kv_cache.max_num_ranges; }));
    o.push_back(str_opt("kv_cache.scale_granularity", "cache",
                        "quantized buffers: a scale per token and head (head) or per token over all heads (token)", {"head", "token"},
                        [](RunConfig& c) -> std::string& { return c.kv_cache.scale_granularity; }));
    o.push_back(str_opt("kv_cache.kv_scales", "cache",
                        "fp8 buffers: per-head K/V scales from `kvlab calibrate kv-scales` (empty: a dynamic scale per row)", {},
                        [](RunConfig& c) -> std::string& { return c.kv_cache.kv_scales; }));
    o.push_back(int_opt("kv_cache.budget_bytes", "cache",
                        "sets cache_length: all layers' stored K/V bytes per sequence (codes and scales) for this policy x buffer (0: off)",
                        0, int64_t(1) << 50, [](RunConfig& c) -> int64_t& { return c.kv_cache.budget_bytes; }));
    o.push_back(float_opt("kv_cache.budget_ratio", "cache",
                          "sets cache_length: this fraction of the dense cache's bytes (seq_length tokens in the activation dtype; 0: off)",
                          0.0, 1000.0, [](RunConfig& c) -> double& { return c.kv_cache.budget_ratio; }));
    o.push_back(int_opt("kv_cache.key_bits", "cache",
                        "quantized buffers: bits of the key codes, the format of that width in the buffer's family (0: the buffer's own)", 0, 8,
                        [](RunConfig& c) -> int64_t& { return c.kv_cache.key_bits; }));
    o.push_back(int_opt("kv_cache.value_bits", "cache",
                        "quantized buffers: bits of the value codes, the format of that width in the buffer's family (0: the buffer's own)", 0, 8,
                        [](RunConfig& c) -> int64_t& { return c.kv_cache.value_bits; }));
    o.push_back(int_opt("kv_cache.paged_block_size", "cache", "paged storage block size in slots (0: not paged)", 0, 1 << 20,
                        [](RunConfig& c) -> int64_t& { return c.kv_cache.paged_block_size; }));
    o.push_back(bool_opt("kv_cache.compact", "cache", "paged storage: after each chunk move kept slots so whole blocks are freed",
                         [](RunConfig& c) -> bool& { return c.kv_cache.compact; }));
    o.push_back(int_opt("kv_cache.kivi_group_size", "cache", "kivi2/kivi4: slots per key group and channels per value group", 8, 4096,
                        [](RunConfig& c) -> int64_t& { return c.kv_cache.kivi_group_size; }));
    o.push_back(int_opt("kv_cache.kivi_residual", "cache", "kivi2/kivi4: most recent tokens kept in full precision", 0, 1 << 20,
                        [](RunConfig& c) -> int64_t& { return c.kv_cache.kivi_residual; }));
    o.push_back(float_opt("kv_cache.key_channel_ratio", "cache",
                          "think: fraction of each KV head's key channels pruned (ThinK's query-driven channel choice); in [0, 1)",
                          0.0, 1.0, [](RunConfig& c) -> double& { return c.kv_cache.key_channel_ratio; }));
    o.push_back(bool_opt("kv_cache.cpu_offload", "cache", "park each layer's buffers in host memory between uses",
                         [](RunConfig& c) -> bool& { return c.kv_cache.cpu_offload; }));
    o.push_back(str_opt("protocol", "cache",
                        "eval: chunked (keys_values: the sample streamed through cache_length slots) or compress-then-ask "
                        "(kvpress: the context compressed once by kv_cache.compression_ratio or keep_tokens, then the question "
                        "answered from it, never evicted)",
                        protocol_names(), [](RunConfig& c) -> std::string& { return c.protocol.name; }));
    o.push_back(float_opt("kv_cache.compression_ratio", "cache",
                          "compress-then-ask: fraction of the context's T tokens dropped; floor((1 - r) T) slots kept per layer "
                          "(per head for per-head policies)",
                          0.0, 0.999, [](RunConfig& c) -> double& { return c.protocol.compression_ratio; }));
    o.push_back(int_opt("kv_cache.keep_tokens", "cache", "compress-then-ask: slots kept of the context instead of a ratio (0: the ratio)",
                        0, BIG, [](RunConfig& c) -> int64_t& { return c.protocol.keep_tokens; }));
    o.push_back(bool_opt("kv_cache.query_aware", "cache",
                         "compress-then-ask: the question is part of what the policy scores and compresses (kvpress's query_aware)",
                         [](RunConfig& c) -> bool& { return c.protocol.query_aware; }));
    o.push_back(str_opt("kv_cache.score_threshold", "cache",
                        "compress-then-ask: keep the context slots whose policy score is >= this number instead of a ratio (a "
                        "count per layer, per head for per-head policies, recorded as an outcome; empty: no threshold)",
                        {}, [](RunConfig& c) -> std::string& { return c.protocol.score_threshold; }));
    o.push_back(int_opt("kv_cache.threshold_window", "cache",
                        "compress-then-ask with score_threshold: the last N context positions are kept whatever their score "
                        "(DMS's protected recent window; kvpress protects 128; 0: none)",
                        0, BIG, [](RunConfig& c) -> int64_t& { return c.protocol.threshold_window; }));
    o.push_back(bool_opt("kv_cache.threshold_decode", "cache",
                         "compress-then-ask with score_threshold: evict below it while decoding too (context slots leaving the "
                         "last threshold_window positions seen; DMS's decoding)",
                         [](RunConfig& c) -> bool& { return c.protocol.threshold_decode; }));
    o.push_back(float_opt("kv_cache.decode_ratio", "cache",
                          "compress-then-ask: while the question and answer are decoded, keep floor((1 - r) seen) slots per layer "
                          "of everything seen so far, evicting context slots in the policy's order (0: none; the compression's "
                          "ratio too unless compression_ratio is set)",
                          0.0, 0.999, [](RunConfig& c) -> double& { return c.protocol.decode_ratio; }));
    o.push_back(int_opt("kv_cache.decode_rescore_every", "cache",
                        "compress-then-ask with decode_ratio: every N decoded tokens each context slot's score grows by the attention "
                        "the tokens decoded since paid it (0: never; the compression's scores rank the slots for the whole decode)",
                        0, BIG, [](RunConfig& c) -> int64_t& { return c.protocol.decode_rescore_every; }));
    o.push_back(str_opt("kv_cache.save", "cache",
                        "compress-then-ask: save each sample's compressed cache (kept K/V, positions, scores) to this file "
                        "(sample i > 0: FILE.i)",
                        {}, [](RunConfig& c) -> std::string& { return c.protocol.save_path; }));
    o.push_back(str_opt("kv_cache.load", "cache",
                        "compress-then-ask: load each sample's compressed cache from this file (as kv_cache.save wrote it) "
                        "instead of running the context",
                        {}, [](RunConfig& c) -> std::string& { return c.protocol.load_path; }));
    o.push_back(bool_opt("fidelity", "cache",
                         "eval: also attend over the full context per layer and chunk (an uncompressed K/V shadow) and record "
                         "the policy's attention error and the attention mass on the tokens it kept",
                         [](RunConfig& c) -> bool& { return c.fidelity; }));
    o.push_back(int_opt("fidelity_kl_positions", "cache",
                        "fidelity: the next-token KL per chunk over this many evenly spaced positions, the chunk's last "
                        "included (0: every position; fewer positions skip most lm_head work)",
                        0, 1 << 20, [](RunConfig& c) -> int64_t& { return c.fidelity_kl_positions; }));
    o.push_back(bool_opt("fidelity_oracle", "cache",
                         "fidelity: also the oracle's kept mass per layer and chunk (the same number of positions, those the "
                         "chunk's queries attend to most, known in hindsight) and the policy's efficiency = kept / oracle; "
                         "steps that drop something then recompute full attention instead of merging",
                         [](RunConfig& c) -> bool& { return c.fidelity_oracle; }));
    // Options of single policies: one row each, generated from the policy registry.
    for (const PolicyInfo& p : policy_registry())
        for (const PolicyOption& po : p.options) {
            const std::string name = "kv_cache." + po.name, key = po.name;
            OptionDef d{name, po.integer ? OptionType::INT : OptionType::FLOAT, "cache", po.help, {}, {}, {}};
            const bool integer = po.integer;
            const double lo = po.lo, hi = po.hi;
            d.set = [name, key, integer, lo, hi](RunConfig& c, const std::string& v) {
                c.kv_cache.policy_options[key] = integer ? double(parse_int(name, v, int64_t(lo), int64_t(hi))) : parse_float(name, v, lo, hi);
            };
            d.get = [key, integer](const RunConfig& c) {
                const double x = c.kv_cache.policy_option(key);
                return integer ? std::to_string(int64_t(x)) : fmt_double(x);
            };
            o.push_back(d);
        }
    // ---- gradient
    o.push_back(int_opt("grad.layers_per_cell", "gradient", "layers per row of cells", 1, 4096,
                        [](RunConfig& c) -> int64_t& { return c.grad.layers_per_cell; }));
    o.push_back(float_opt("grad.chunks_per_cell_multiplier", "gradient", "cell length in units of 2 G D L / E", 0.1, 1000.0,
                          [](RunConfig& c) -> double& { return c.grad.chunks_per_cell_multiplier; }));
    o.push_back(str_opt("grad.layercp_qname", "gradient", "layer-input checkpoint storage", {"default", "q8", "q4"},
                        [](RunConfig& c) -> std::string& { return c.grad.layercp_qname; }));
    o.push_back(str_opt("grad.cachecp_qname", "gradient", "KV checkpoint storage (empty: as layercp_qname)", {"", "default", "q8", "q4"},
                        [](RunConfig& c) -> std::string& { return c.grad.cachecp_qname; }));
    o.push_back(bool_opt("grad.single_tokens_for_targets", "gradient", "feed target tokens one by one",
                         [](RunConfig& c) -> bool& { return c.grad.single_tokens_for_targets; }));
    // ---- training
    o.push_back(str_opt("head_model", "training", "loss head",
                        {"next_token_prediction", "seq_classification_on_logits", "seq_classification"},
                        [](RunConfig& c) -> std::string& { return c.train.head_model; }));
    o.push_back(str_opt("optimizer", "training", "optimizer", {"AdamW", "Adam", "Adamax", "SGD", "RMSprop", "Adadelta"},
                        [](RunConfig& c) -> std::string& { return c.train.optimizer; }));
    o.push_back(float_opt("train.lr", "training", "peak learning rate", 0.0, 10.0, [](RunConfig& c) -> double& { return c.train.lr; }));
    o.push_back(float_opt("train.weight_decay", "training", "weight decay", 0.0, 10.0,
                          [](RunConfig& c) -> double& { return c.train.weight_decay; }));
    o.push_back(float_opt("train.momentum", "training", "SGD/RMSprop momentum", 0.0, 1.0, [](RunConfig& c) -> double& { return c.train.momentum; }));
    o.push_back(float_opt("train.dampening", "training", "SGD dampening", 0.0, 1.0, [](RunConfig& c) -> double& { return c.train.dampening; }));
    o.push_back(float_opt("train.adam_beta1", "training", "Adam beta1", 0.0, 0.99999, [](RunConfig& c) -> double& { return c.train.adam_beta1; }));
    o.push_back(float_opt("train.adam_beta2", "training", "Adam beta2", 0.0, 0.9999999, [](RunConfig& c) -> double& { return c.train.adam_beta2; }));
    o.push_back(float_opt("train.eps", "training", "optimizer epsilon", 0.0, 1.0, [](RunConfig& c) -> double& { return c.train.eps; }));
    o.push_back(float_opt("train.rmsprop_alpha", "training", "RMSprop smoothing", 0.0, 1.0,
                          [](RunConfig& c) -> double& { return c.train.rmsprop_alpha; }));
    o.push_back(float_opt("train.adadelta_rho", "training", "Adadelta rho", 0.0, 1.0, [](RunConfig& c) -> double& { return c.train.adadelta_rho; }));
    o.push_back(float_opt("train.lr_warmup_fraction", "training", "warm-up steps as a fraction of all steps", 0.0, 1.0,
                          [](RunConfig& c) -> double& { return c.train.lr_warmup_fraction; }));
    o.push_back(int_opt("train.lr_warmup_steps", "training", "warm-up steps (-1: use the fraction)", -1, BIG,
                        [](RunConfig& c) -> int64_t& { return c.train.lr_warmup_steps; }));
    o.push_back(float_opt("train.max_grad_norm", "training", "gradient clipping (0: off)", 0.0, 1e9,
                          [](RunConfig& c) -> double& { return c.train.max_grad_norm; }));
    o.push_back(int_opt("train.micro_batch_size", "training", "sequences per forward/backward", 1, 4096,
                        [](RunConfig& c) -> int64_t& { return c.train.micro_batch_size; }));
    o.push_back(int_opt("train.global_batch_size", "training", "sequences per optimizer step", 1, 1 << 20,
                        [](RunConfig& c) -> int64_t& { return c.train.global_batch_size; }));
    o.push_back(int_opt("train.epochs", "training", "passes over the training data", 1, 100000,
                        [](RunConfig& c) -> int64_t& { return c.train.epochs; }));
    o.push_back(int_opt("train.max_steps", "training", "optimizer steps (0: from epochs)", 0, BIG,
                        [](RunConfig& c) -> int64_t& { return c.train.max_steps; }));
    o.push_back(int_opt("train.save_interval", "training", "steps between checkpoints (0: only at the end)", 0, BIG,
                        [](RunConfig& c) -> int64_t& { return c.train.save_interval; }));
    o.push_back(int_opt("train.training_state_num", "training",
                        "newest checkpoints that keep the resumable state for --resume (0: all)",
                        0, BIG, [](RunConfig& c) -> int64_t& { return c.train.training_state_num; }));
    o.push_back(int_opt("train.eval_interval", "training", "steps between validations (0: only at the end)", 0, BIG,
                        [](RunConfig& c) -> int64_t& { return c.train.eval_interval; }));
    o.push_back(str_opt("out_dir", "training", "where checkpoints and training state go", {},
                        [](RunConfig& c) -> std::string& { return c.train.out_dir; }));
    o.push_back(str_opt("resume", "training", "resume from this saved training state", {},
                        [](RunConfig& c) -> std::string& { return c.train.resume; }));
    o.push_back(bool_opt("train.average_loss_per_batch", "training",
                         "true: mean over the micro-batch's target tokens; false: mean over rows of each row's token mean",
                         [](RunConfig& c) -> bool& { return c.train.average_loss_per_batch; }));
    o.push_back(int_opt("lora.r", "training", "LoRA rank", 1, 4096, [](RunConfig& c) -> int64_t& { return c.train.lora_r; }));
    o.push_back(float_opt("lora.alpha", "training", "LoRA alpha (scale alpha / r)", 0.0, 1e6,
                          [](RunConfig& c) -> double& { return c.train.lora_alpha; }));
    o.push_back(float_opt("lora.dropout", "training", "LoRA dropout", 0.0, 0.99, [](RunConfig& c) -> double& { return c.train.lora_dropout; }));
    o.push_back(str_opt("lora.targets", "training", "LoRA targets: any of q,k,v,proj,mlp,head", {},
                        [](RunConfig& c) -> std::string& { return c.train.lora_targets; }));
    o.push_back(bool_opt("lora.qlora", "training", "QLoRA: NF4-quantized frozen base weights",
                         [](RunConfig& c) -> bool& { return c.train.qlora; }));
    // ---- generation
    o.push_back(str_opt("prompt", "generation", "prompt text", {}, [](RunConfig& c) -> std::string& { return c.generate.prompt; }));
    o.push_back(int_opt("max_new_tokens", "generation", "tokens to generate", 1, BIG,
                        [](RunConfig& c) -> int64_t& { return c.generate.max_new_tokens; }));
    o.push_back(float_opt("temperature", "generation", "sampling temperature (0: greedy)", 0.0, 100.0,
                          [](RunConfig& c) -> double& { return c.generate.temperature; }));
    o.push_back(int_opt("top_k", "generation", "keep the k most likely tokens (0: off)", 0, BIG,
                        [](RunConfig& c) -> int64_t& { return c.generate.top_k; }));
    o.push_back(float_opt("top_p", "generation", "nucleus sampling mass (1: off)", 0.0, 1.0,
                          [](RunConfig& c) -> double& { return c.generate.top_p; }));
    o.push_back(int_opt("beam_width", "generation", "beam search width (1: off)", 1, 64,
                        [](RunConfig& c) -> int64_t& { return c.generate.beam_width; }));
    o.push_back(float_opt("length_penalty", "generation", "beam search length penalty exponent", 0.0, 10.0,
                          [](RunConfig& c) -> double& { return c.generate.length_penalty; }));
    o.push_back(uint_opt("seed", "generation", "sampling seed", [](RunConfig& c) -> uint64_t& { return c.generate.seed; }));
    o.push_back(list_opt("stop", "generation", "stop strings, comma-separated",
                         [](RunConfig& c) -> std::vector<std::string>& { return c.generate.stop; }));
    o.push_back(bool_opt("chat", "generation", "wrap the prompt in the model's chat template",
                         [](RunConfig& c) -> bool& { return c.generate.chat; }));
    o.push_back(bool_opt("ignore_eos", "generation", "keep generating past end-of-sequence (exactly max_new_tokens, as benchmarks need)",
                         [](RunConfig& c) -> bool& { return c.generate.ignore_eos; }));
    // ---- telemetry
    o.push_back(bool_opt("telemetry.enabled", "telemetry", "record spans, memory and cache events",
                         [](RunConfig& c) -> bool& { return c.telemetry.enabled; }));
    o.push_back(int_opt("telemetry.score_interval", "telemetry", "chunks between full score snapshots (0: automatic)", 0, BIG,
                        [](RunConfig& c) -> int64_t& { return c.telemetry.score_interval; }));
    o.push_back(bool_opt("telemetry.cupti", "telemetry", "record GPU kernels and memory with CUPTI (when a GPU is present)",
                         [](RunConfig& c) -> bool& { return c.telemetry.cupti; }));
    o.push_back(str_opt("telemetry.on_error", "telemetry",
                        "when events cannot be written (disk full): stop the run, or continue without telemetry",
                        {"stop", "continue"}, [](RunConfig& c) -> std::string& { return c.telemetry.on_error; }));
    // ---- distributed (fine-tuning under mpirun; docs/DISTRIBUTED.md)
    o.push_back(str_opt("dist.backend", "distributed", "data parallelism: auto (mpi when started by mpirun), none, mpi or nccl",
                        {"auto", "none", "mpi", "nccl"}, [](RunConfig& c) -> std::string& { return c.dist.backend; }));
    o.push_back(int_opt("dist.ranks", "distributed", "ranks of a data-parallel run (set by the launcher; recorded with the run)", 1, 1 << 20,
                        [](RunConfig& c) -> int64_t& { return c.dist.ranks; }));
    o.push_back(float_opt("dist.timeout", "distributed", "seconds a collective waits for every rank before naming the missing ones", 0.1, 1e6,
                          [](RunConfig& c) -> double& { return c.dist.timeout; }));
    o.push_back(int_opt("dist.check_interval", "distributed", "steps between checks that every rank holds identical weights (0: at the end)",
                        0, BIG, [](RunConfig& c) -> int64_t& { return c.dist.check_interval; }));
    o.push_back(int_opt("dist.bucket_mb", "distributed", "gradient all-reduce bucket size in MiB", 1, 1 << 16,
                        [](RunConfig& c) -> int64_t& { return c.dist.bucket_mb; }));
    o.push_back(bool_opt("dist.overlap", "distributed", "start each gradient bucket's all-reduce during the backward pass, as soon as its layers are done",
                         [](RunConfig& c) -> bool& { return c.dist.overlap; }));
    return o;
}

}  // namespace

const std::vector<std::string>& run_modes() { return run_mode_names(); }

const std::vector<OptionDef>& run_options() {
    static const std::vector<OptionDef> opts = build_options();
    return opts;
}

const OptionDef* find_run_option(const std::string& name) {
    for (const auto& o : run_options())
        if (o.name == name) return &o;
    return nullptr;
}

void set_run_option(RunConfig& cfg, const std::string& name, const std::string& value) {
    const OptionDef* o = find_run_option(name);
    if (!o) throw Error(str("unknown option --", name));
    o->set(cfg, value);
}

// An option that is also the prefix of others ("data" and "data.seq_length") is stored as
// "<name>.name" in JSON, since a JSON key cannot be both a string and an object.
static std::string json_path(const std::string& name) {
    for (const auto& o : run_options())
        if (o.name.size() > name.size() && o.name.compare(0, name.size() + 1, name + ".") == 0) return name + ".name";
    return name;
}

std::string run_config_to_json(const RunConfig& cfg, bool pretty) {
    Json j = Json::object();
    for (const auto& o : run_options()) {
        Json* node = &j;
        std::string key = json_path(o.name);
        for (size_t dot; (dot = key.find('.')) != std::string::npos;) {
            node = &(*node)[key.substr(0, dot)];
            key = key.substr(dot + 1);
        }
        const std::string v = o.get(cfg);
        switch (o.type) {
            case OptionType::INT: (*node)[key] = std::stoll(v); break;
            case OptionType::FLOAT: (*node)[key] = std::stod(v); break;
            case OptionType::BOOL: (*node)[key] = v == "true"; break;
            default: (*node)[key] = v; break;
        }
    }
    return pretty ? j.dump(2) : j.dump();
}

RunConfig run_config_from_json(const std::string& text, const std::string& source) {
    Json j;
    try {
        j = Json::parse(text);
    } catch (const std::exception& e) {
        throw Error(str(source, ": not valid JSON (", e.what(), ")"));
    }
    if (!j.is_object()) throw Error(str(source, ": expected a JSON object of run options"));
    RunConfig cfg;
    // Walk nested objects to dotted names; unknown names are errors (typos must not pass).
    std::function<void(const Json&, const std::string&)> walk = [&](const Json& node, const std::string& prefix) {
        for (auto it = node.begin(); it != node.end(); ++it) {
            const std::string name = prefix.empty() ? it.key() : prefix + "." + it.key();
            if (it->is_object()) {  // option values are never objects
                walk(*it, name);
                continue;
            }
            const OptionDef* o = find_run_option(name);
            if (!o && name.size() > 5 && name.compare(name.size() - 5, 5, ".name") == 0) o = find_run_option(name.substr(0, name.size() - 5));
            if (!o) throw Error(str(source, ": unknown option '", name, "'"));
            std::string v;
            if (it->is_string()) v = it->get<std::string>();
            else if (it->is_boolean()) v = it->get<bool>() ? "true" : "false";
            else if (it->is_number_integer()) v = std::to_string(it->get<int64_t>());
            else if (it->is_number()) v = fmt_double(it->get<double>());
            else if (it->is_array()) {
                std::vector<std::string> parts;
                for (const auto& e : *it) parts.push_back(e.is_string() ? e.get<std::string>() : e.dump());
                v = join(parts, ",");
            } else {
                throw Error(str(source, ": option '", name, "' has an unsupported JSON type"));
            }
            try {
                o->set(cfg, v);
            } catch (const Error& e) {
                throw Error(str(source, ": ", e.what()));
            }
        }
    };
    walk(j, "");
    return cfg;
}

std::vector<std::string> run_config_problems(const RunConfig& c) {
    std::vector<std::string> p;
    const std::string policy = c.kv_cache.policy();
    const int64_t L = c.kv_cache.cache_length;
    const PolicyInfo* info = find_policy(policy);
    const bool evicts = info && info->needs_cache_length;
    const bool budget = c.kv_cache.budget_bytes != 0 || c.kv_cache.budget_ratio != 0.0;  // sets the length with the model
    const bool ask = parse_protocol(c.protocol.name) == Protocol::COMPRESS_THEN_ASK;
    const RunModeInfo* run_mode = find_run_mode(c.mode);
    if (ask) {
        // The budget is the compression's; the chunked protocol's length options do not apply.
        if (!is_ruler_task(c.data.name))
            p.push_back(str("--protocol compress-then-ask: --data ", c.data.name, " has no question apart from its context; expected a RULER task (",
                            join(ruler_task_names(), ", "), ")"));
        if (!run_mode || run_mode->kind != RunKind::EVALUATE)
            p.push_back(str("--protocol compress-then-ask: mode '", c.mode, "' does not support it; expected an evaluation mode (eval_long)"));
        if (L != 0 || !c.kv_cache.layer_cache_lengths.empty() || !c.kv_cache.layer_cache_rule.empty() || budget)
            p.push_back("--protocol compress-then-ask: the budget is --kv_cache.compression_ratio or --kv_cache.keep_tokens; expected no "
                        "cache_length, layer_cache_lengths or budget_bytes / budget_ratio");
        if (info && !info->evicts && (c.protocol.compression_ratio > 0.0 || c.protocol.keep_tokens > 0))
            p.push_back(str("--protocol compress-then-ask: policy '", policy, "' never evicts, so it compresses nothing; expected a policy that "
                            "does (h2o, snapkv, lastrec, ...), or no compression_ratio / keep_tokens (the uncompressed reference)"));
        if (info && !info->default_layer_rule.empty())
            p.push_back(str("--protocol compress-then-ask: policy '", policy, "' sizes each layer by its own rule (", info->default_layer_rule,
                            "); one compression keeps the same count in every layer; expected a policy with one budget for all layers"));
        if (c.fidelity) p.push_back("--fidelity: not measured under --protocol compress-then-ask; expected the chunked protocol");
        try {
            if (score_threshold(c.protocol) && (c.protocol.compression_ratio > 0.0 || c.protocol.keep_tokens > 0))
                p.push_back("--kv_cache.score_threshold: a budget of its own; expected no compression_ratio or keep_tokens with it");
        } catch (const Error& e) {
            p.push_back(e.what());
        }
        if (c.protocol.threshold_window > 0 && c.protocol.score_threshold.empty())
            p.push_back(str("--kv_cache.threshold_window: ", c.protocol.threshold_window,
                            " protects the recent context from a score threshold; expected --kv_cache.score_threshold with it"));
        if (c.protocol.threshold_decode && c.protocol.score_threshold.empty())
            p.push_back("--kv_cache.threshold_decode: evicts below a score threshold while decoding; expected --kv_cache.score_threshold with it");
        if (c.protocol.decode_ratio > 0.0 && (!c.protocol.score_threshold.empty() || c.protocol.keep_tokens > 0 ||
                                              (c.protocol.compression_ratio > 0.0 && c.protocol.compression_ratio != c.protocol.decode_ratio)))
            p.push_back(str("--kv_cache.decode_ratio: ", c.protocol.decode_ratio, " is the ratio kept of everything seen, the compressed "
                            "context included; expected no keep_tokens or score_threshold, and no compression_ratio or the same one"));
        if (c.protocol.decode_rescore_every > 0 && c.protocol.decode_ratio <= 0.0)
            p.push_back(str("--kv_cache.decode_rescore_every: ", c.protocol.decode_rescore_every,
                            " re-scores the slots a decoding budget evicts; expected --kv_cache.decode_ratio with it"));
        if (c.data.questions > 1 && c.protocol.query_aware)
            p.push_back(str("--data.questions: ", c.data.questions, " questions per context with --kv_cache.query_aware, which compresses one "
                            "question with the context; expected 1 question, or no query_aware"));
    } else if (c.protocol.compression_ratio != 0.0 || c.protocol.keep_tokens != 0 || c.protocol.query_aware || !c.protocol.save_path.empty() ||
               !c.protocol.load_path.empty() || !c.protocol.score_threshold.empty() || c.protocol.threshold_window != 0 ||
               c.protocol.threshold_decode || c.protocol.decode_ratio != 0.0 || c.protocol.decode_rescore_every != 0) {
        p.push_back("--kv_cache.compression_ratio, keep_tokens, score_threshold, threshold_window, threshold_decode, decode_ratio, decode_rescore_every, query_aware, save and load belong to --protocol compress-then-ask; expected "
                    "that protocol or none of them");
    }
    try {
        if (parse_question_turns(c.data.turns) == QuestionTurns::MULTI_TURN && !ask)
            p.push_back("--data.turns multi-turn: a conversation over one compressed context needs --protocol compress-then-ask; expected that "
                        "protocol, or multi-request");
    } catch (const Error& e) {
        p.push_back(e.what());
    }
    if (c.data.questions > 1) {
        const auto& multi = ruler_multi_question_tasks();
        if (!ask)
            p.push_back(str("--data.questions: ", c.data.questions, " questions per context need --protocol compress-then-ask (the context "
                            "compressed once, each question answered from it); expected 1 under the chunked protocol"));
        else if (std::find(multi.begin(), multi.end(), c.data.name) == multi.end())
            p.push_back(str("--data.questions: --data ", c.data.name, " asks one question of its context; expected 1, or a task with several "
                            "keys to ask about (", join(multi, ", "), ")"));
    }
    if (evicts && L == 0 && !budget && !ask && c.kv_cache.layer_cache_lengths.empty() && c.kv_cache.layer_cache_rule.rfind("linear:", 0) != 0)
        p.push_back(str("--kv_cache.cache_length is required for policy '", policy, "' (or a --kv_cache.budget_bytes / budget_ratio)"));
    // A policy that never drops a token fills its cache and then has nowhere to put the next
    // chunk: refuse before the run, with the numbers, rather than fail at that chunk.
    const RunModeInfo* mode = find_run_mode(c.mode);
    const bool sequence_modes = mode && mode->reads_dataset();
    if (info && !info->evicts && sequence_modes && L > 0 && L < c.data.seq_length && c.kv_cache.layer_cache_lengths.empty())
        p.push_back(str("--kv_cache.cache_length: ", L, " slots cannot hold a sample of ", c.data.seq_length, " tokens (--data.seq_length) with policy '",
                        policy, "', which never evicts; expected 0 (the whole sequence) or at least ", c.data.seq_length,
                        ", or a policy that evicts (e.g. h2o, lastrec)"));
    if (L > 0 && c.driver.prefill_length > L)
        p.push_back(str("--kv_cache.prefill_length: ", c.driver.prefill_length, " is larger than the cache length ", L,
                        "; expected at most cache_length (or 0: the cache length)"));
    if (L > 0 && c.driver.chunk_size > L)
        p.push_back(str("--kv_cache.chunk_size: ", c.driver.chunk_size, " is larger than the cache length ", L,
                        "; expected at most cache_length"));
    if (L > 0 && evicts && c.driver.chunk_size + c.kv_cache.grace_period > L)
        p.push_back(str("--kv_cache.chunk_size: ", c.driver.chunk_size, " plus grace_period ", c.kv_cache.grace_period,
                        " exceeds the cache length ", L));
    if (L > 0 && c.kv_cache.grace_period >= L)
        p.push_back(str("--kv_cache.grace_period: ", c.kv_cache.grace_period, " must be smaller than the cache length ", L));
    if ((c.data.name == "longbench" || c.data.name == "helmet") && c.data.path.empty())
        p.push_back(str("--data.path is required for --data ", c.data.name, " (the dataset JSON file)"));
    if (c.data.name == "text" && c.data.files.empty()) p.push_back("--data.files is required for --data text");
    if (mode && mode->kind == RunKind::GENERATE && c.generate.prompt.empty()) p.push_back("--prompt is required for generate");
    if (c.fidelity && mode && !mode->supports_fidelity) {
        std::vector<std::string> with;
        for (const RunModeInfo& m : run_mode_registry())
            if (m.supports_fidelity) with.push_back(m.name);
        p.push_back(str("--fidelity: mode '", c.mode, "' does not support it; expected mode ", join(with, " or ")));
    }
    if (c.train.global_batch_size % c.train.micro_batch_size != 0)
        p.push_back(str("--train.global_batch_size: ", c.train.global_batch_size, " is not a multiple of the micro batch size ",
                        c.train.micro_batch_size));
    return p;
}

LatentAttention::Cache mla_cache_choice(const RunConfig& cfg) {
    const bool train = run_mode(cfg.mode).kind == RunKind::TRAIN;
    if (cfg.mla_cache == "expanded" || (cfg.mla_cache == "auto" && train)) return LatentAttention::Cache::EXPANDED;
    if (cfg.mla_cache == "latent" && train)
        throw Error(str("--model.mla_cache latent: ", cfg.mode, " computes gradients, which run through the expanded form of multi-head "
                        "latent attention; expected --model.mla_cache auto or expanded"));
    return LatentAttention::Cache::LATENT;
}

void validate_run_config(const RunConfig& cfg) {
    auto p = run_config_problems(cfg);
    if (!p.empty()) throw Error(p.front());
}

}  // namespace kv
