// The name table of gguf_names.h. Layer numbers are parsed strictly (decimal, no sign, no leading
// zeros, < 10^6) so a hostile name cannot alias another tensor or overflow.
#include "formats/gguf/gguf_names.h"

#include <cstring>
#include <vector>

namespace kv {

namespace {

struct Pair {
    const char* gguf;
    const char* hf;
};

// Per-layer parts (after "blk.N.") and their HF counterparts (after "model.layers.N."), for
// one layout: the parts every family shares, then the norms by placement and the fused names.
std::vector<Pair> layer_parts(const GgufLayout& layout) {
    std::vector<Pair> p = {
        {"attn_q", "self_attn.q_proj"},       {"attn_k", "self_attn.k_proj"},       {"attn_v", "self_attn.v_proj"},
        {"attn_output", "self_attn.o_proj"},  {"ffn_gate", "mlp.gate_proj"},        {"ffn_down", "mlp.down_proj"},
        {"attn_q_norm", "self_attn.q_norm"},  {"attn_k_norm", "self_attn.k_norm"},
    };
    p.push_back(layout.fused ? Pair{"ffn_up", "mlp.gate_up_proj"} : Pair{"ffn_up", "mlp.up_proj"});
    if (layout.fused) p.push_back({"attn_qkv", "self_attn.qkv_proj"});
    switch (layout.norms) {
        case NormPlacement::PRE:
            p.push_back({"attn_norm", "input_layernorm"});
            p.push_back({"ffn_norm", "post_attention_layernorm"});
            break;
        case NormPlacement::BOTH:
            p.push_back({"attn_norm", "input_layernorm"});
            p.push_back({"ffn_norm", "pre_feedforward_layernorm"});
            [[fallthrough]];
        case NormPlacement::POST:
            p.push_back({"attn_post_norm", "post_attention_layernorm"});
            p.push_back({"ffn_post_norm", "post_feedforward_layernorm"});
            break;
    }
    return p;
}

constexpr Pair kGlobal[] = {
    {"token_embd", "model.embed_tokens"},
    {"output_norm", "model.norm"},
    {"output", "lm_head"},
};

bool split_suffix(const std::string& name, std::string& stem, std::string& suffix) {
    for (const char* s : {".weight", ".bias"}) {
        size_t n = std::strlen(s);
        if (name.size() > n && name.compare(name.size() - n, n, s) == 0) {
            stem = name.substr(0, name.size() - n);
            suffix = s;
            return true;
        }
    }
    return false;
}

// "123.rest" -> 123 and "rest"; false unless a canonical decimal < 10^6 followed by '.'.
bool parse_layer(const std::string& s, size_t start, int64_t& layer, size_t& rest) {
    size_t i = start;
    int64_t v = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9' && i - start < 6) v = v * 10 + (s[i++] - '0');
    if (i == start || i >= s.size() || s[i] != '.') return false;
    if (s[start] == '0' && i - start > 1) return false;  // leading zero
    layer = v;
    rest = i + 1;
    return true;
}

}  // namespace

GgufHfName gguf_to_hf_name(const std::string& name, const GgufLayout& layout) {
    GgufHfName out;
    std::string stem, suffix;
    if (!split_suffix(name, stem, suffix)) return out;
    for (const Pair& p : kGlobal)
        if (stem == p.gguf) {
            out.hf = std::string(p.hf) + suffix;
            return out;
        }
    if (stem.rfind("blk.", 0) != 0) return out;
    int64_t layer = 0;
    size_t rest = 0;
    if (!parse_layer(stem, 4, layer, rest)) return out;
    const std::string part = stem.substr(rest);
    for (const Pair& p : layer_parts(layout))
        if (part == p.gguf) {
            out.hf = "model.layers." + std::to_string(layer) + "." + p.hf + suffix;
            out.layer = layer;
            return out;
        }
    return out;
}

std::string hf_to_gguf_name(const std::string& name, const GgufLayout& layout) {
    std::string stem, suffix;
    if (!split_suffix(name, stem, suffix)) return "";
    for (const Pair& p : kGlobal)
        if (stem == p.hf) return std::string(p.gguf) + suffix;
    const std::string prefix = "model.layers.";
    if (stem.rfind(prefix, 0) != 0) return "";
    int64_t layer = 0;
    size_t rest = 0;
    if (!parse_layer(stem, prefix.size(), layer, rest)) return "";
    const std::string part = stem.substr(rest);
    for (const Pair& p : layer_parts(layout))
        if (part == p.hf) return "blk." + std::to_string(layer) + "." + p.gguf + suffix;
    return "";
}

}  // namespace kv
