// KV cache names, defaults and validation (see kv_config.h).
#include "engine/kv/kv_config.h"
#include "engine/kv/kv_scales.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "engine/core/error.h"
#include "engine/core/join.h"
#include "engine/ops/ops.h"  // quant_format_from_name
#include "kernels/common/quant_formats.h"

namespace kv {

bool policy_needs_attention_weights(const std::string& p) {
    const PolicyInfo* info = find_policy(p);
    return info && info->needs_attention_weights;
}

double KVCacheConfig::policy_option(const std::string& name) const {
    auto it = policy_options.find(name);
    if (it != policy_options.end()) return it->second;
    const PolicyOption* o = find_policy_option(name);
    if (!o) throw Error(str("KV cache: no policy declares the option '", name, "'"));
    return o->def;
}

CacheName KVCacheConfig::cache_name() const {
    // A name that was never checked (set directly, not as a run option) reads as itself with the
    // default buffer, so lookups by policy() fail cleanly instead of throwing here.
    return read_cache_name(name).value_or(CacheName{name, "default"});
}

std::string KVCacheConfig::policy() const { return cache_name().policy; }

std::string KVCacheConfig::buffer() const { return cache_name().buffer; }

int64_t KVCacheConfig::length_for_layer(int64_t layer, int64_t seq_length, int64_t num_layers) const {
    int64_t L = cache_length;
    if (!layer_cache_lengths.empty()) {
        L = layer_cache_lengths[size_t(layer)];
    } else {
        // An explicit rule always applies; a policy's default rule only around a given length.
        const PolicyInfo* info = find_policy(policy());
        const std::string rule = !layer_cache_rule.empty() ? layer_cache_rule
                                 : info && cache_length > 0 ? info->default_layer_rule
                                                            : std::string();
        if (!rule.empty()) L = layer_lengths_from_rule(rule, cache_length, num_layers, snapkv_window)[size_t(layer)];
        // cake: every layer starts at one length and gets its budget during the sequence
        if (rule.empty() && info && info->initial_layer_length && cache_length > 0) L = info->initial_layer_length(*this, num_layers);
    }
    return L > 0 ? L : seq_length;
}

namespace {
const char* kLayerLengthsExpected =
    "expected one slot count >= 1 per layer (\"64,48,32\"), \"linear:FIRST:LAST\", \"pyramid:BETA\" or \"pyramid-kvpress:BETA\" (BETA >= 1) or "
    "\"ratios:R0,R1,...\" / \"ratios:FILE\" (one ratio in (0, 1] per layer)";

int64_t parse_count(const std::string& text, const std::string& whole) {
    char* end = nullptr;
    errno = 0;
    const long long x = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end || errno == ERANGE || x < 1)
        throw Error(str("--kv_cache.layer_cache_lengths: '", whole, "' is invalid ('", text, "'); ", kLayerLengthsExpected));
    return x;
}

std::vector<std::string> split_on(const std::string& s, char sep) {
    std::vector<std::string> out(1);
    for (char c : s) {
        if (c == sep) out.emplace_back();
        else if (c != ' ') out.back() += c;
    }
    return out;
}
}  // namespace

std::vector<int64_t> layer_lengths_from_rule(const std::string& rule, int64_t L, int64_t N, int64_t window) {
    const std::vector<std::string> f = split_on(rule, ':');
    std::vector<int64_t> out((size_t)std::max<int64_t>(N, 0));
    if (f[0] == "linear" && f.size() == 3) {  // FIRST at layer 0 to LAST at layer N-1, rounded
        const int64_t a = parse_count(f[1], rule), b = parse_count(f[2], rule);
        for (int64_t l = 0; l < N; ++l)
            out[size_t(l)] = N == 1 ? a : a + (2 * (b - a) * l + (N - 1) * (b >= a ? 1 : -1)) / (2 * (N - 1));
        return out;
    }
    if (f[0] == "pyramid" && f.size() == 2) {
        // PyramidKV (Cai et al. 2024; KVCache-Factory's PyramidKVCluster): every layer keeps the
        // observation window w plus a budget from an arithmetic sequence over k = L - w: the
        // top layer k / beta, the bottom 2k - k / beta (mean ~ k), steps rounded down.
        const int64_t beta = parse_count(f[1], rule);
        if (N == 1) return {L};  // one layer: nothing to distribute
        if (window < 0 || L <= window)
            throw Error(str("--kv_cache.layer_cache_lengths: '", rule, "' needs cache_length ", L,
                            " larger than the observation window snapkv_window ", window));
        const int64_t k = L - window, lo = std::max<int64_t>(1, k / beta), hi = 2 * k - lo;
        const int64_t step = N > 1 ? (hi - lo) / (N - 1) : 0;
        for (int64_t l = 0; l < N; ++l) out[size_t(l)] = N == 1 ? L : window + hi - l * step;
        return out;
    }
    if (f[0] == "pyramid-kvpress" && f.size() == 2) {
        // kvpress' PyramidKVPress: the same sequence over the whole mean L, the observation window
        // counted inside each layer's length: top L / beta, bottom 2L - L / beta, real-valued
        // steps, each length rounded half to even (Python's round); a top below the window
        // (L / beta < w) falls back to SnapKV's one length for every layer, as the press does.
        const int64_t beta = parse_count(f[1], rule);
        if (N == 1) return {L};
        const double lo = double(L) / double(beta), hi = 2.0 * double(L) - lo;
        if (lo < double(window)) {
            std::fill(out.begin(), out.end(), L);
            return out;
        }
        const double step = (hi - lo) / double(N - 1);
        for (int64_t l = 0; l < N; ++l) out[size_t(l)] = std::max<int64_t>(1, int64_t(std::nearbyint(hi - double(l) * step)));
        return out;
    }
    if (rule.rfind("ratios:", 0) == 0) {
        // A per-layer ratio table (LUKV's and kvpress' PerLayerCompressionPress budgets as keep
        // fractions): layer l keeps round(r_l L) slots, at least 1.
        const std::vector<double> r = parse_layer_ratios(rule.substr(7));
        if (int64_t(r.size()) != N)
            throw Error(str("--kv_cache.layer_cache_lengths: the ratio table has ", r.size(), " entries for a model of ", N,
                            " layers; expected one ratio per layer"));
        for (int64_t l = 0; l < N; ++l) out[size_t(l)] = std::max<int64_t>(1, std::llround(r[size_t(l)] * double(L)));
        return out;
    }
    throw Error(str("--kv_cache.layer_cache_lengths: '", rule, "' is not a list or a known rule; ", kLayerLengthsExpected));
}

std::vector<double> parse_layer_ratios(const std::string& text) {
    const std::string what = str("--kv_cache.layer_cache_lengths: 'ratios:", text, "'");
    std::string list = text;
    if (!text.empty() && text.find_first_not_of("0123456789.,eE+- ") != std::string::npos) {
        // not a list of numbers: a file with one ratio per layer ('#' starts a comment;
        // commas, spaces and line breaks separate)
        std::ifstream f(text);
        if (!f) throw Error(str(what, ": the file '", text, "' cannot be read"), "give the ratios as a list or a readable file");
        list.clear();
        std::string line;
        while (std::getline(f, line)) {
            line = line.substr(0, line.find('#'));
            for (char& ch : line)
                if (ch == ' ' || ch == '\t' || ch == '\r') ch = ',';
            list += "," + line;
        }
    }
    std::vector<double> out;
    for (const std::string& part : split_on(list, ',')) {
        if (part.empty()) continue;
        char* end = nullptr;
        const double r = std::strtod(part.c_str(), &end);
        if (*end || !(r > 0 && r <= 1))
            throw Error(str(what, ": ratio ", out.size(), " is '", part, "'; expected a number in (0, 1] (the fraction of cache_length "
                            "the layer keeps)"));
        out.push_back(r);
    }
    if (out.empty()) throw Error(str(what, " holds no ratio; expected one ratio in (0, 1] per layer"));
    return out;
}

void set_layer_cache_lengths(KVCacheConfig& c, const std::string& text) {
    c.layer_cache_lengths.clear();
    c.layer_cache_rule.clear();
    if (text.empty()) return;
    if (text.rfind("ratios:", 0) == 0) {  // stored as the numbers, so a run never depends on the file again
        std::string r = "ratios:";
        for (double x : parse_layer_ratios(text.substr(7))) {
            char b[32];
            std::snprintf(b, sizeof b, "%.12g", x);
            r += str(r.size() > 7 ? "," : "", b);
        }
        c.layer_cache_rule = r;
        return;
    }
    if (text.find(':') != std::string::npos) {
        layer_lengths_from_rule(text, 64, 2, 0);  // checks the rule's form and numbers now
        c.layer_cache_rule = text;
        return;
    }
    for (const std::string& part : split_on(text, ',')) c.layer_cache_lengths.push_back(parse_count(part, text));
}

std::string layer_cache_lengths_text(const KVCacheConfig& c) {
    if (!c.layer_cache_rule.empty()) return c.layer_cache_rule;
    std::string s;
    for (int64_t L : c.layer_cache_lengths) {
        if (!s.empty()) s += ',';
        s += std::to_string(L);
    }
    return s;
}

CacheName parse_kv_cache_name(const std::string& name) { return parse_cache_name(name, kv_policy_names()); }

void check_kv_cache_name(const std::string& name) { parse_kv_cache_name(name); }

namespace {
// A format's family: the formats of each width that share its coding (scales, blocks).
struct QuantFamily {
    const char* format;
    std::vector<std::pair<int64_t, const char*>> widths;  // bits -> format
};
const std::vector<QuantFamily>& quant_families() {
    static const std::vector<QuantFamily> f = {
        {"q8", {{8, "q8"}, {4, "q4"}}},                 // keys_values' min-max rows
        {"q4", {{8, "q8"}, {4, "q4"}}},
        {"q8_0", {{8, "q8_0"}, {4, "q4_0"}}},           // llama.cpp blocks of 32
        {"q4_0", {{8, "q8_0"}, {4, "q4_0"}}},
        {"fp8_e4m3", {{8, "fp8_e4m3"}, {4, "nvfp4"}}},  // vLLM / SGLang floats
        {"fp8_e5m2", {{8, "fp8_e5m2"}, {4, "nvfp4"}}},
        {"nvfp4", {{8, "fp8_e4m3"}, {4, "nvfp4"}}},
        {"mxfp4", {{8, "fp8_e4m3"}, {4, "mxfp4"}}},
        {"nf4", {{4, "nf4"}}},                          // NF4 has 4-bit levels only
        // TurboQuant: Lloyd-Max key codebooks of up to 16 levels; uniform values up to 8 bits
        {"tqk2", {{2, "tqk2"}, {3, "tqk3"}, {4, "tqk4"}}},
        {"tqk3", {{2, "tqk2"}, {3, "tqk3"}, {4, "tqk4"}}},
        {"tqk4", {{2, "tqk2"}, {3, "tqk3"}, {4, "tqk4"}}},
        {"tqv2", {{2, "tqv2"}, {3, "tqv3"}, {4, "tqv4"}, {8, "tqv8"}}},
        {"tqv3", {{2, "tqv2"}, {3, "tqv3"}, {4, "tqv4"}, {8, "tqv8"}}},
        {"tqv4", {{2, "tqv2"}, {3, "tqv3"}, {4, "tqv4"}, {8, "tqv8"}}},
        {"tqv8", {{2, "tqv2"}, {3, "tqv3"}, {4, "tqv4"}, {8, "tqv8"}}},
    };
    return f;
}

QuantFormat with_bits(const std::string& buffer, const std::string& format, int64_t bits, const char* opt) {
    if (bits == 0) return ops::quant_format_from_name(format);
    for (const QuantFamily& f : quant_families()) {
        if (format != f.format) continue;
        std::string have;
        for (const auto& [w, name] : f.widths) {
            if (w == bits) return ops::quant_format_from_name(name);
            have += (have.empty() ? "" : " or ") + std::to_string(w);
        }
        throw Error(str(opt, ": ", bits, " bits is not a width of the '", buffer, "' buffer's ", format, " codes; expected ", have));
    }
    throw Error(str(opt, ": the '", buffer, "' buffer's ", format, " codes have no other width"));
}
}  // namespace

std::pair<QuantFormat, QuantFormat> kv_quant_formats(const KVCacheConfig& c) {
    const BufferInfo& b = *find_buffer(c.buffer());
    if ((c.key_bits || c.value_bits) && b.kind != BufferKind::QUANTIZED) {
        std::vector<std::string> q;
        for (const BufferInfo& x : kv_buffer_registry())
            if (x.kind == BufferKind::QUANTIZED) q.push_back(x.name);
        const char* opt = c.key_bits ? "--kv_cache.key_bits" : "--kv_cache.value_bits";
        throw Error(str(opt, ": the '", b.name, "' buffer ",
                        b.kind == BufferKind::KIVI ? "packs keys and values with one width (kivi2, kivi4)" : "stores full precision",
                        "; expected a quantized-row buffer (", join(q), ")"));
    }
    return {with_bits(b.name, b.keys_format(), c.key_bits, "--kv_cache.key_bits"),
            with_bits(b.name, b.values_format(), c.value_bits, "--kv_cache.value_bits")};
}

bool quant_rows_over_heads(const KVCacheConfig& c, QuantFormat kf, QuantFormat vf, int64_t D) {
    return c.scale_granularity == "token" || !(D >= 16 && quant_row_ok(kf, D) && quant_row_ok(vf, D));
}

int64_t think_kept_channels(int64_t D, double ratio) { return std::max<int64_t>(1, std::llround((1.0 - ratio) * double(D))); }

int64_t kv_slot_bytes(const KVCacheConfig& c, int64_t G, int64_t D, DType act, int64_t tensors) {
    const BufferInfo& b = *find_buffer(c.buffer());  // buffer() reads known buffers only
    if (b.kind == BufferKind::FULL) return tensors * G * D * int64_t(dtype_size(b.dtype.value_or(act)));
    // the per-head channel index is per sequence, not per slot
    if (b.kind == BufferKind::THINK) return G * (think_kept_channels(D, c.key_channel_ratio) + D) * int64_t(dtype_size(act));
    if (b.kind == BufferKind::KIVI)
        throw Error(str("--kv_cache.budget_bytes / budget_ratio: the '", b.name,
                        "' buffer keeps a fixed full-precision residual pool besides its codes; budgets are for full-precision and "
                        "quantized-row buffers"));
    const auto [kf, vf] = kv_quant_formats(c);
    const bool over = quant_rows_over_heads(c, kf, vf, D);
    const int64_t row = over ? G * D : D, rows = over ? 1 : G;
    return rows * (quant_row_bytes(kf, row) + quant_row_bytes(vf, row));
}

KVCacheConfig apply_kv_budget(const KVCacheConfig& cfg, int64_t num_layers, int64_t G, int64_t D, DType act, int64_t seq_length,
                              int64_t tensors, BudgetLayers layers) {
    if (cfg.budget_bytes == 0 && cfg.budget_ratio == 0.0) return cfg;
    const char* opt = cfg.budget_bytes ? "--kv_cache.budget_bytes" : "--kv_cache.budget_ratio";
    if (cfg.budget_bytes < 0) throw Error(str("--kv_cache.budget_bytes: ", cfg.budget_bytes, " is invalid; expected a byte count >= 1"));
    if (!(cfg.budget_ratio >= 0.0)) throw Error(str("--kv_cache.budget_ratio: ", cfg.budget_ratio, " is invalid; expected a fraction > 0"));
    if (cfg.budget_bytes && cfg.budget_ratio > 0.0) throw Error("--kv_cache.budget_bytes: give a byte budget or a ratio (budget_ratio), not both");
    if (cfg.cache_length > 0 || !cfg.layer_cache_lengths.empty())
        throw Error(str(opt, ": the budget sets the cache length; give no --kv_cache.cache_length or layer_cache_lengths list with it"));
    const int64_t dense_slot = tensors * G * D * int64_t(dtype_size(act));
    if (cfg.budget_ratio > 0.0 && seq_length < 1)
        throw Error("--kv_cache.budget_ratio: the dense cache's bytes need a known sequence length; give --kv_cache.budget_bytes instead");
    const int64_t budget = cfg.budget_bytes ? cfg.budget_bytes
                                            : int64_t(std::floor(cfg.budget_ratio * double(num_layers) * double(seq_length) * double(dense_slot)));
    // One slot in every layer the policy's length applies to; windowed layers' rings are held
    // whatever it is (and KV-shared or convolution layers hold nothing), so they come first.
    const int64_t slot = kv_slot_bytes(cfg, G, D, act, tensors);
    const int64_t policy_layers = layers.policy_layers < 0 ? num_layers : layers.policy_layers;
    const int64_t fixed = layers.fixed_slots * slot;
    if (fixed > budget)
        throw Error(str(opt, ": ", budget, " bytes are less than the windowed layers' rings alone (", layers.fixed_slots, " slots, ",
                        fixed, " bytes of '", cfg.name, "'); expected a larger budget"));
    const int64_t per_slot = std::max<int64_t>(1, policy_layers) * slot;
    const int64_t L = (budget - fixed) / per_slot;
    if (L < 1 && policy_layers > 0)
        throw Error(str(opt, ": ", budget, " bytes hold no slot of '", cfg.name, "'; one slot in all ", policy_layers,
                        policy_layers == num_layers ? "" : " full-attention", " layers takes ", per_slot, " bytes",
                        fixed ? str(" beside the windowed layers' ", fixed) : std::string(), "; expected at least that"));
    KVCacheConfig out = cfg;
    out.budget_bytes = 0;  // consumed: the result is a plain length (applying it again changes nothing)
    out.budget_ratio = 0.0;
    const PolicyInfo* info = find_policy(cfg.policy());
    if (info && !info->needs_cache_length) {  // keeps every token: the budget must hold the sequence
        if (seq_length > 0 && L < seq_length)
            throw Error(str(opt, ": policy '", cfg.policy(), "' keeps every token; ", seq_length, " tokens of '", cfg.name, "' take ",
                            seq_length * per_slot, " bytes, more than the budget of ", budget, "; expected an evicting policy or a larger budget"));
        return out;
    }
    out.cache_length = std::max<int64_t>(L, 1);  // no full layer: the length applies nowhere
    return out;
}

void validate_kv_config(const KVCacheConfig& c, int64_t num_layers, int64_t head_dim, int64_t num_kv_heads) {
    const CacheName cn = parse_kv_cache_name(c.name);
    const std::string& p = cn.policy;
    const std::string& b = cn.buffer;
    const PolicyInfo& info = *find_policy(p);  // parse_kv_cache_name found it
    const BufferInfo& buf = *find_buffer(b);
    const bool quantized = buf.kind == BufferKind::QUANTIZED;
    const bool kivi = buf.kind == BufferKind::KIVI;
    if (info.needs_quantized_buffer && !quantized && !kivi) {
        std::vector<std::string> q;
        for (const BufferInfo& x : kv_buffer_registry())
            if (x.kind != BufferKind::FULL) q.push_back(x.name);
        throw Error(str("--kv_cache.name: policy '", p, "' needs a quantized buffer (", join(q), "), got '", b, "'"));
    }
    if (!info.buffers.empty() && std::find(info.buffers.begin(), info.buffers.end(), b) == info.buffers.end())
        throw Error(str("--kv_cache.name: policy '", p, "' runs on the buffers ", join(info.buffers), ", not '", b, "'"));
    for (const auto& [name, v] : c.policy_options) {
        const PolicyInfo* owner = nullptr;
        const PolicyOption* o = find_policy_option(name, &owner);
        if (!o) throw Error(str("--kv_cache.", name, ": no policy has this option"));
        if (!(v >= o->lo && v <= o->hi) || (o->integer && v != double(int64_t(v))))
            throw Error(str("--kv_cache.", name, ": ", v, " is out of range; expected ", o->integer ? "a whole number" : "a value",
                            " in [", o->lo, ", ", o->hi, "]"));
    }
    if (c.cache_length < 0) throw Error(str("--kv_cache.cache_length: ", c.cache_length, " is invalid; expected >= 1"));
    // A byte budget sets the length once the model is known (apply_kv_budget).
    const bool budget = c.budget_bytes != 0 || c.budget_ratio != 0.0;
    if (c.cache_length == 0 && !budget && c.layer_cache_lengths.empty() && c.layer_cache_rule.rfind("linear:", 0) != 0 && info.needs_cache_length)
        throw Error(str("--kv_cache.cache_length is required for policy '", p, "'; expected a number of slots >= 1"));
    if (!c.layer_cache_lengths.empty() && !c.layer_cache_rule.empty())
        throw Error("--kv_cache.layer_cache_lengths: give a list or a rule, not both");
    if (!c.layer_cache_lengths.empty() && int64_t(c.layer_cache_lengths.size()) != num_layers)
        throw Error(str("--kv_cache.layer_cache_lengths: ", c.layer_cache_lengths.size(), " values for ", num_layers,
                        " layers; expected one per layer"));
    for (int64_t L : c.layer_cache_lengths)
        if (L < 1) throw Error(str("--kv_cache.layer_cache_lengths: ", L, " is invalid; expected >= 1"));
    if ((c.layer_cache_rule.rfind("pyramid:", 0) == 0 || c.layer_cache_rule.rfind("pyramid-kvpress:", 0) == 0 ||
         c.layer_cache_rule.rfind("ratios:", 0) == 0) &&
        c.cache_length == 0)
        throw Error(str("--kv_cache.layer_cache_lengths: the rule '", c.layer_cache_rule,
                        "' needs --kv_cache.cache_length (the mean length per layer)"));
    int64_t Lmin = c.cache_length;
    if (c.cache_length > 0 || !c.layer_cache_lengths.empty() || !c.layer_cache_rule.empty()) {
        Lmin = INT64_MAX;
        for (int64_t l = 0; l < num_layers; ++l) Lmin = std::min(Lmin, c.length_for_layer(l, 0, num_layers));
        if (num_layers == 0) Lmin = c.cache_length;
    }
    if (c.grace_period < 0) throw Error(str("--kv_cache.grace_period: ", c.grace_period, " is invalid; expected >= 0"));
    // Length-bound options are checked only for the policies that read them (a sink count that
    // suits streaming must not reject a pyramid's short top layer under h2o).
    auto uses = [&](const char* o) { return std::find(info.uses.begin(), info.uses.end(), o) != info.uses.end(); };
    if (!c.head_ratios.empty() && !uses("head_ratios")) {
        std::vector<std::string> per_head;
        for (const PolicyInfo& x : policy_registry())
            if (std::find(x.uses.begin(), x.uses.end(), "head_ratios") != x.uses.end()) per_head.push_back(x.name);
        throw Error(str("--kv_cache.head_ratios: policy '", p, "' keeps one budget for every head of a layer; expected a policy that keeps "
                        "per-head budgets in a slot pool (", join(per_head), ")"));
    }
    if (uses("grace_period") && Lmin > 0 && c.grace_period >= Lmin)
        throw Error(str("--kv_cache.grace_period: ", c.grace_period, " must be smaller than the cache length ", Lmin));
    if (!(c.keep_initial_fraction >= 0 && c.keep_initial_fraction < 1))
        throw Error(str("--kv_cache.keep_initial_fraction: ", c.keep_initial_fraction, " must be in [0, 1)"));
    if (c.max_chunk_size < 0) throw Error(str("--kv_cache.max_chunk_size: ", c.max_chunk_size, " is invalid; expected >= 0"));
    if (!(c.combination_constant >= 0 && c.combination_constant <= 1))
        throw Error(str("--kv_cache.combination_constant: ", c.combination_constant, " must be in [0, 1]"));
    if (uses("init_grace_tokens") && Lmin > 0 && c.init_grace_tokens >= Lmin)
        throw Error(str("--kv_cache.init_grace_tokens: ", c.init_grace_tokens, " must be smaller than the cache length ", Lmin));
    if (c.sinks < 0 || (uses("sinks") && Lmin > 0 && c.sinks >= Lmin))
        throw Error(str("--kv_cache.sinks: ", c.sinks, " must be in [0, cache_length)"));
    if (!(c.max_initial_fraction > 0 && c.max_initial_fraction < 1))
        throw Error(str("--kv_cache.max_initial_fraction: ", c.max_initial_fraction, " must be in (0, 1)"));
    if (uses("end_initial_regex") && c.end_initial_regex.empty())
        throw Error(str("--kv_cache.end_initial_regex is required for ", p, " (the end of the protected prompt prefix)"));
    if (c.snapkv_window < 1) throw Error(str("--kv_cache.snapkv_window: ", c.snapkv_window, " must be >= 1"));
    if (c.snapkv_kernel < 1 || c.snapkv_kernel % 2 == 0)
        throw Error(str("--kv_cache.snapkv_kernel: ", c.snapkv_kernel, " must be an odd number >= 1"));
    if (c.max_num_ranges < 1) throw Error(str("--kv_cache.max_num_ranges: ", c.max_num_ranges, " must be >= 1"));
    if (c.scale_granularity != "head" && c.scale_granularity != "token")
        throw Error(str("--kv_cache.scale_granularity: '", c.scale_granularity, "' is invalid; expected head or token"));
    if (c.paged_block_size < 0) throw Error(str("--kv_cache.paged_block_size: ", c.paged_block_size, " must be >= 0"));
    if (c.compact && (c.paged_block_size == 0 || quantized || kivi))
        throw Error(str("--kv_cache.compact: compaction frees whole blocks of paged storage; expected --kv_cache.paged_block_size > 0 "
                        "with a full-precision buffer, got paged_block_size ", c.paged_block_size, " and buffer '", b, "'"));
    if (c.compact && c.cpu_offload)
        throw Error("--kv_cache.compact: compaction acts on device blocks; expected no --kv_cache.cpu_offload with it");
    if (kivi) {
        const int64_t S = c.kivi_group_size;
        if (S < 8 || S % 8 != 0)
            throw Error(str("--kv_cache.kivi_group_size: ", S, " is invalid; expected a multiple of 8 (whole bytes of 2- and 4-bit codes)"));
        if (head_dim % std::min(S, head_dim) != 0)
            throw Error(str("--kv_cache.kivi_group_size: value groups of ", S, " channels do not divide head size ", head_dim,
                            "; expected a divisor of ", head_dim, " or a size >= it"));
        const int bits = buf.bits;
        if ((head_dim * bits) % 8 != 0)
            throw Error(str("--kv_cache.name: buffer '", b, "' packs a value's ", head_dim, " channels into whole bytes; expected a head size that is a multiple of ", 8 / bits));
        if (c.kivi_residual < 0) throw Error(str("--kv_cache.kivi_residual: ", c.kivi_residual, " is invalid; expected >= 0"));
        if (c.paged_block_size > 0)
            throw Error(str("--kv_cache.paged_block_size: paged storage is for full-precision buffers; '", b,
                            "' is quantized (its packed groups of kivi_group_size slots are its blocks)"));
    }
    if (!(c.key_channel_ratio >= 0.0 && c.key_channel_ratio < 1.0))
        throw Error(str("--kv_cache.key_channel_ratio: ", c.key_channel_ratio,
                        " is out of range; expected the fraction of key channels pruned per head, in [0, 1)"));
    if (buf.kind == BufferKind::THINK && (c.paged_block_size > 0 || c.cpu_offload))
        throw Error(str(c.paged_block_size > 0 ? "--kv_cache.paged_block_size" : "--kv_cache.cpu_offload", ": the '", b,
                        "' buffer stores its pruned keys in one tensor per layer; expected it without paged or offloaded storage"));
    if (c.key_bits < 0 || c.value_bits < 0)
        throw Error(str(c.key_bits < 0 ? "--kv_cache.key_bits: " : "--kv_cache.value_bits: ", std::min(c.key_bits, c.value_bits),
                        " is invalid; expected 0 (the buffer's own) or a width of its codes"));
    if (c.key_bits || c.value_bits) kv_quant_formats(c);  // refuses a buffer without widths, a width its family lacks
    if (!c.kv_scales.empty()) {
        const bool fp8 = quantized && [&] {
            const auto [kf, vf] = kv_quant_formats(c);
            auto is8 = [](QuantFormat f) { return f == QuantFormat::FP8_E4M3 || f == QuantFormat::FP8_E5M2; };
            return is8(kf) || is8(vf);
        }();
        if (!fp8)
            throw Error(str("--kv_cache.kv_scales: the '", b, "' buffer stores no fp8 rows; expected an fp8 buffer (fp8_e4m3, fp8_e5m2, kfp8vfp4)"));
        if (c.scale_granularity != "head")
            throw Error("--kv_cache.kv_scales: calibrated scales are per KV head; expected --kv_cache.scale_granularity head");
        check_kv_scales(read_kv_scales(c.kv_scales), c.kv_scales, num_layers, num_kv_heads, head_dim);
    }
    if (info.validate) info.validate(c, num_layers, num_kv_heads);
    if (quantized) {
        // Quantized buffers are named like their format, or name one format for keys and one for values.
        const auto [kf, vf] = kv_quant_formats(c);
        // Blocks span all heads of a token when a head alone is too small (keys_values: D < 16).
        const int64_t over_heads = head_dim * num_kv_heads;
        const int64_t row = quant_rows_over_heads(c, kf, vf, head_dim) ? over_heads : head_dim;
        for (QuantFormat f : {kf, vf}) {
            if (quant_row_ok(f, row)) continue;
            if (tq_bits(f))  // the rotation is a fast Walsh-Hadamard transform: no padding, no other sizes
                throw Error(str("--kv_cache.name: buffer '", b, "' rotates rows with a Hadamard transform; head size ", head_dim,
                                " (or ", over_heads, " over all ", num_kv_heads, " KV heads) is not a power of two from 16 to ", kTqMaxRow,
                                " (", ops::quant_format_name(f), "); expected such a head size"));
            throw Error(str("--kv_cache.name: buffer '", b, "' cannot store head size ", head_dim, " with ", num_kv_heads, " KV heads: ",
                            quant_block_elems(f) ? str("blocks of ", quant_block_elems(f), " values")
                                                 : std::string("an even number of values (4-bit)"),
                            " (", ops::quant_format_name(f), ") do not divide ", head_dim, " or ", over_heads));
        }
    }
}

const std::vector<KVFieldOption>& kv_field_options() {
    static const std::vector<KVFieldOption> t = {
        {.name = "snapkv_window", .help = "snapkv: voting queries at the end of each chunk", .lo = 1, .hi = int64_t(1) << 40,
         .integer = &KVCacheConfig::snapkv_window},
        {.name = "snapkv_kernel", .help = "snapkv: pooling width (odd)", .lo = 1, .hi = 1001, .integer = &KVCacheConfig::snapkv_kernel},
        {.name = "end_initial_regex", .help = "smart-lastrec: regex ending the protected prompt prefix",
         .text = &KVCacheConfig::end_initial_regex},
        {.name = "duo_gates", .help = "duo: gate file from `kvlab calibrate duo` (or pattern:BITS, e.g. pattern:10)",
         .text = &KVCacheConfig::duo_gates},
        {.name = "qfilter", .help = "qfilter: filter file from `kvlab calibrate qfilter` (or axis:C, every filter the unit vector of channel C)",
         .text = &KVCacheConfig::qfilter},
        {.name = "kvzap", .help = "kvzap: surrogate file from `kvlab calibrate kvzap` (or seed:N, pseudo-random weights for tests)",
         .text = &KVCacheConfig::kvzap},
    };
    return t;
}

}  // namespace kv
