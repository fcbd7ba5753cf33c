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
    bool bare = false;  // the HF name has no ".weight" (gpt-oss's self_attn.sinks); the GGUF name has
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
    // gpt-oss: sinks, router and the experts in llama.cpp's per-expert [out, in] layout (names of
    // the loader's own, not HF's: gguf_experts.h rearranges them into transformers' tensors).
    p.push_back({"attn_sinks", "self_attn.sinks", true});
    p.push_back({"ffn_gate_inp", "mlp.router"});
    p.push_back({"ffn_gate_exps", "mlp.experts.gate_proj"});
    p.push_back({"ffn_up_exps", "mlp.experts.up_proj"});
    p.push_back({"ffn_gate_up_exps", "mlp.experts.gate_up_proj"});
    p.push_back({"ffn_down_exps", "mlp.experts.down_proj"});
    // DeepSeek-V2's latent attention; attn_k_b / attn_v_b (newer converters' split of kv_b_proj,
    // k_b transposed) get names of the loader's own, which it joins back into kv_b_proj.
    p.push_back({"attn_q_a", "self_attn.q_a_proj"});
    p.push_back({"attn_q_a_norm", "self_attn.q_a_layernorm"});
    p.push_back({"attn_q_b", "self_attn.q_b_proj"});
    p.push_back({"attn_kv_a_mqa", "self_attn.kv_a_proj_with_mqa"});
    p.push_back({"attn_kv_a_norm", "self_attn.kv_a_layernorm"});
    p.push_back({"attn_kv_b", "self_attn.kv_b_proj"});
    p.push_back({"attn_k_b", "self_attn.k_b_proj"});
    p.push_back({"attn_v_b", "self_attn.v_b_proj"});
    // LFM2's gated short convolution (conv is [E, L] in the file, [E, 1, L] in the model).
    p.push_back({"shortconv.conv", "conv.conv"});
    p.push_back({"shortconv.in_proj", "conv.in_proj"});
    p.push_back({"shortconv.out_proj", "conv.out_proj"});
    // llama.cpp's names of the norms after attention and after the MLP (LLM_TENSOR_ATTN_POST_NORM,
    // LLM_TENSOR_FFN_POST_NORM) are post_attention_norm and post_ffw_norm.
    switch (layout.norms) {
        case NormPlacement::PRE:
            p.push_back({"attn_norm", "input_layernorm"});
            p.push_back(
                {layout.pre_mlp_norm_is_post_attention ? "post_attention_norm" : "ffn_norm", "post_attention_layernorm"});
            break;
        case NormPlacement::BOTH:
            p.push_back({"attn_norm", "input_layernorm"});
            p.push_back({"ffn_norm", "pre_feedforward_layernorm"});
            [[fallthrough]];
        case NormPlacement::POST:
            p.push_back({"post_attention_norm", "post_attention_layernorm"});
            p.push_back({"post_ffw_norm", "post_feedforward_layernorm"});
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
    if (layout.short_conv && stem == "token_embd_norm") {  // LFM2's final norm (LLM_TENSOR_OUTPUT_NORM_LFM2)
        out.hf = "model.norm" + suffix;
        return out;
    }
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
            if (p.bare && suffix != ".weight") return out;
            out.hf = "model.layers." + std::to_string(layer) + "." + p.hf + (p.bare ? "" : suffix);
            out.layer = layer;
            return out;
        }
    return out;
}

std::string hf_to_gguf_name(const std::string& name, const GgufLayout& layout) {
    std::string stem, suffix;
    if (!split_suffix(name, stem, suffix)) stem = name, suffix = "";  // a bare name (self_attn.sinks)
    if (layout.short_conv && stem == "model.norm" && !suffix.empty()) return "token_embd_norm" + suffix;
    for (const Pair& p : kGlobal)
        if (stem == p.hf && !suffix.empty()) return std::string(p.gguf) + suffix;
    const std::string prefix = "model.layers.";
    if (stem.rfind(prefix, 0) != 0) return "";
    int64_t layer = 0;
    size_t rest = 0;
    if (!parse_layer(stem, prefix.size(), layer, rest)) return "";
    const std::string part = stem.substr(rest);
    for (const Pair& p : layer_parts(layout))
        if (part == p.hf && p.bare == suffix.empty())
            return "blk." + std::to_string(layer) + "." + p.gguf + (p.bare ? ".weight" : suffix);
    return "";
}

}  // namespace kv
