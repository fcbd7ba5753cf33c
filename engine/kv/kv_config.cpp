// KV cache names, defaults and validation (see kv_config.h).
#include "kv_config.h"

#include <algorithm>

#include "engine/core/error.h"
#include "kernels/common/quant_formats.h"

namespace kv {

bool policy_needs_attention_weights(const std::string& p) {
    return p.rfind("h2o", 0) == 0 || p.rfind("qh2o", 0) == 0 || p == "tova" || p == "snapkv";
}

namespace {
// keys_values buffer names map onto ours.
std::string canonical_buffer(const std::string& b) {
    if (b == "torch-quantized8") return "q8";
    if (b == "torch-quantized4") return "q4";
    return b;
}

std::string join(const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
    return s;
}

// Longest policy name that prefixes `name` followed by '-'.
bool split_name(const std::string& name, std::string* policy, std::string* buffer) {
    size_t best = 0;
    for (const auto& p : kv_policy_names())
        if (name.size() > p.size() + 1 && name.compare(0, p.size(), p) == 0 && name[p.size()] == '-' && p.size() > best)
            best = p.size();
    if (!best) return false;
    *policy = name.substr(0, best);
    *buffer = canonical_buffer(name.substr(best + 1));
    return true;
}
}  // namespace

std::string KVCacheConfig::policy() const {
    std::string p, b;
    if (!split_name(name, &p, &b)) return name;
    return p;
}

std::string KVCacheConfig::buffer() const {
    std::string p, b;
    if (!split_name(name, &p, &b)) return "default";
    return b;
}

int64_t KVCacheConfig::length_for_layer(int64_t layer, int64_t seq_length) const {
    int64_t L = layer_cache_lengths.empty() ? cache_length : layer_cache_lengths[size_t(layer)];
    return L > 0 ? L : seq_length;
}

void check_kv_cache_name(const std::string& name) {
    std::string p, b;
    if (!split_name(name, &p, &b))
        throw Error(str("--kv_cache.name: '", name, "' is not {policy}-{buffer}; policies: ", join(kv_policy_names()),
                        "; buffers: ", join(kv_buffer_names())));
    if (std::find(kv_buffer_names().begin(), kv_buffer_names().end(), b) == kv_buffer_names().end())
        throw Error(str("--kv_cache.name: unknown buffer '", b, "' in '", name, "'; expected one of: ", join(kv_buffer_names()),
                        " (or torch-quantized8/4)"));
}

void validate_kv_config(const KVCacheConfig& c, int64_t num_layers, int64_t head_dim, int64_t num_kv_heads) {
    check_kv_cache_name(c.name);
    std::string p, b;
    split_name(c.name, &p, &b);
    const bool quantized = b == "q8" || b == "q4" || b == "nf4" || b == "q8_0" || b == "q4_0";
    if (p.rfind("qh2o", 0) == 0 && !quantized)
        throw Error(str("--kv_cache.name: policy '", p, "' needs a quantized buffer (q8, q4, nf4, q8_0, q4_0), got '", b, "'"));
    if (c.cache_length < 0) throw Error(str("--kv_cache.cache_length: ", c.cache_length, " is invalid; expected >= 1"));
    if (c.cache_length == 0 && c.layer_cache_lengths.empty() && p != "dense")
        throw Error(str("--kv_cache.cache_length is required for policy '", p, "'; expected a number of slots >= 1"));
    if (!c.layer_cache_lengths.empty() && int64_t(c.layer_cache_lengths.size()) != num_layers)
        throw Error(str("--kv_cache.layer_cache_lengths: ", c.layer_cache_lengths.size(), " values for ", num_layers, " layers"));
    for (int64_t L : c.layer_cache_lengths)
        if (L < 1) throw Error(str("--kv_cache.layer_cache_lengths: ", L, " is invalid; expected >= 1"));
    const int64_t Lmin = c.layer_cache_lengths.empty()
                             ? c.cache_length
                             : *std::min_element(c.layer_cache_lengths.begin(), c.layer_cache_lengths.end());
    if (c.grace_period < 0) throw Error(str("--kv_cache.grace_period: ", c.grace_period, " is invalid; expected >= 0"));
    if (Lmin > 0 && c.grace_period >= Lmin)
        throw Error(str("--kv_cache.grace_period: ", c.grace_period, " must be smaller than the cache length ", Lmin));
    if (!(c.keep_initial_fraction >= 0 && c.keep_initial_fraction < 1))
        throw Error(str("--kv_cache.keep_initial_fraction: ", c.keep_initial_fraction, " must be in [0, 1)"));
    if (c.max_chunk_size < 0) throw Error(str("--kv_cache.max_chunk_size: ", c.max_chunk_size, " is invalid; expected >= 0"));
    if (!(c.combination_constant >= 0 && c.combination_constant <= 1))
        throw Error(str("--kv_cache.combination_constant: ", c.combination_constant, " must be in [0, 1]"));
    if (Lmin > 0 && c.init_grace_tokens >= Lmin)
        throw Error(str("--kv_cache.init_grace_tokens: ", c.init_grace_tokens, " must be smaller than the cache length ", Lmin));
    if (c.sinks < 0 || (Lmin > 0 && c.sinks >= Lmin))
        throw Error(str("--kv_cache.sinks: ", c.sinks, " must be in [0, cache_length)"));
    if (!(c.max_initial_fraction > 0 && c.max_initial_fraction < 1))
        throw Error(str("--kv_cache.max_initial_fraction: ", c.max_initial_fraction, " must be in (0, 1)"));
    if (p == "smart-lastrec" && c.end_initial_regex.empty())
        throw Error("--kv_cache.end_initial_regex is required for smart-lastrec (the end of the protected prompt prefix)");
    if (c.snapkv_window < 1) throw Error(str("--kv_cache.snapkv_window: ", c.snapkv_window, " must be >= 1"));
    if (c.snapkv_kernel < 1 || c.snapkv_kernel % 2 == 0)
        throw Error(str("--kv_cache.snapkv_kernel: ", c.snapkv_kernel, " must be an odd number >= 1"));
    if (c.max_num_ranges < 1) throw Error(str("--kv_cache.max_num_ranges: ", c.max_num_ranges, " must be >= 1"));
    if (c.paged_block_size < 0) throw Error(str("--kv_cache.paged_block_size: ", c.paged_block_size, " must be >= 0"));
    if (quantized) {
        QuantFormat f = b == "q8" ? QuantFormat::Q8 : b == "q4" ? QuantFormat::Q4 : b == "nf4" ? QuantFormat::NF4
                        : b == "q8_0" ? QuantFormat::Q8_0 : QuantFormat::Q4_0;
        // Blocks span all heads of a token when a head alone is too small (keys_values: D < 16).
        const int64_t per_head = head_dim, over_heads = head_dim * num_kv_heads;
        const bool ok = (head_dim >= 16 && quant_row_ok(f, per_head)) || quant_row_ok(f, over_heads);
        if (!ok)
            throw Error(str("--kv_cache.name: buffer '", b, "' cannot store head size ", head_dim, " with ", num_kv_heads,
                            " KV heads: ", quant_block_elems(f) ? str("blocks of ", quant_block_elems(f), " values")
                                                                 : std::string("an even number of values (4-bit)"),
                            " do not divide ", head_dim, " or ", over_heads));
    }
}

}  // namespace kv
