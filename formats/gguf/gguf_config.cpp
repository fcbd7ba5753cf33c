// The key table of gguf_config.h. Every integer is range-checked before it reaches ModelConfig,
// so a hostile file cannot make later size arithmetic overflow.
#include "formats/gguf/gguf_config.h"

#include <cmath>

#include "engine/core/error.h"

namespace kv {

namespace {

constexpr int64_t kMaxDim = int64_t(1) << 31;  // any count or width beyond this is not a real model

struct Keys {
    const GgufFile& f;
    std::string arch;

    std::string key(const char* k) const { return arch + "." + k; }

    int64_t dim(const char* k, int64_t lo = 1) const {
        const std::string name = key(k);
        int64_t v = f.get(name).as_int(f.what(name));
        if (v < lo || v >= kMaxDim) throw Error(str(f.what(name), " is ", v, ", expected a value in [", lo, ", 2^31)"));
        return v;
    }
    int64_t dim_or(const char* k, int64_t fallback, int64_t lo = 1) const {
        return f.find(key(k)) ? dim(k, lo) : fallback;
    }
    double real_or(const char* k, double fallback, bool positive) const {
        const std::string name = key(k);
        const GgufValue* v = f.find(name);
        if (!v) return fallback;
        double x = v->as_float(f.what(name));
        if (!std::isfinite(x) || x < 0 || (positive && x == 0))
            throw Error(str(f.what(name), " is ", x, ", expected a finite ", positive ? "positive" : "non-negative", " number"));
        return x;
    }
};

// llama.cpp's general.architecture values kvlab loads.
struct ArchName {
    const char* name;
    Arch arch;
};
constexpr ArchName kArchs[] = {{"llama", Arch::LLAMA}, {"qwen2", Arch::QWEN2}, {"gemma2", Arch::GEMMA2},
                               {"gemma3", Arch::GEMMA3}, {"phi3", Arch::PHI3},   {"olmo2", Arch::OLMO2}};

std::string arch_list() {
    std::string s;
    for (const ArchName& a : kArchs) s += (s.empty() ? "" : ", ") + std::string(a.name);
    return s;
}

// Gemma 2 / Gemma 3 as llama.cpp reads them (llama-model.cpp, load_hparams): layer il is
// sliding iff il % pattern < pattern - 1 (pattern 2 and 6, not stored in the file; the same
// layers as transformers' (i + 1) % pattern != 0); Gemma 3's sliding layers rotate with base
// 10000 (not stored) and no rope scaling; queries scaled by head_dim^-1/2, except the 27B
// models (46 / 62 layers), scaled by (hidden / heads)^-1/2 (their query_pre_attn_scalar);
// Gemma 2's caps default to 50 and 30 (llama_hparams). The converter stores every Gemma norm
// weight as 1 + w (convert_hf_to_gguf.py adds the one), so the offset is 0 here.
void read_gemma(const Keys& k, ModelConfig& c) {
    const bool g3 = c.arch == Arch::GEMMA3;
    c.norm_placement = NormPlacement::BOTH;
    c.norm_weight_offset = 0.0;
    c.embedding_scale = std::sqrt(double(c.hidden_size));
    c.mlp_act = MlpAct::GELU_TANH;
    c.qk_norm = g3;
    const bool is_27b = c.num_layers == (g3 ? 62 : 46);
    c.query_pre_attn_scalar = is_27b ? double(c.hidden_size / c.num_heads) : double(c.head_dim);
    if (!g3) {
        c.attn_logit_softcap = k.real_or("attn_logit_softcapping", 50.0, false);
        c.final_logit_softcap = k.real_or("final_logit_softcapping", 30.0, false);
    }
    const int64_t window = g3 ? k.dim("attention.sliding_window") : k.dim_or("attention.sliding_window", 4096);
    c.sliding_window = 0;  // per layer below
    const int64_t pattern = g3 ? 6 : 2;
    c.layer_specs.resize(size_t(c.num_layers));
    for (int64_t l = 0; l < c.num_layers; ++l) {
        LayerSpec& s = c.layer_specs[size_t(l)];
        const bool sliding = l % pattern < pattern - 1;
        s.rotary_fraction = c.partial_rotary_factor;
        s.rope_theta = g3 && sliding ? 10000.0 : c.rope_theta;
        s.rope_scaled = !(g3 && sliding);
        if (sliding) s.attention = AttnKind::SLIDING, s.window = window;
    }
}

}  // namespace

ModelConfig gguf_model_config(const GgufFile& f) { return gguf_model_config(f, gguf_tokenizer_data(f)); }

ModelConfig gguf_model_config(const GgufFile& f, const GgufTokenizerData& tok) {
    const std::string arch = f.get("general.architecture").as_string(f.what("general.architecture"));
    ModelConfig c;
    const ArchName* found = nullptr;
    for (const ArchName& a : kArchs)
        if (arch == a.name) found = &a;
    if (!found) throw Error(str(f.source, ": architecture '", arch, "' is not supported from GGUF, expected one of ", arch_list()));
    c.arch = found->arch;
    c.model_type = arch;
    Keys k{f, arch};
    if (const GgufValue* v = f.find("general.name")) c.name = v->as_string(f.what("general.name"));

    c.num_layers = k.dim("block_count");
    c.hidden_size = k.dim("embedding_length");
    c.intermediate_size = k.dim("feed_forward_length");
    c.num_heads = k.dim("attention.head_count");
    c.num_kv_heads = k.dim_or("attention.head_count_kv", c.num_heads);
    c.max_position_embeddings = k.dim("context_length");
    if (f.find(k.key("attention.key_length"))) {
        c.head_dim = k.dim("attention.key_length");
        int64_t vlen = k.dim_or("attention.value_length", c.head_dim);
        if (vlen != c.head_dim)
            throw Error(str(f.source, ": attention.key_length ", c.head_dim, " differs from attention.value_length ", vlen,
                            ", expected equal key and value head sizes"));
    } else {
        if (c.hidden_size % c.num_heads != 0)
            throw Error(str(f.what(k.key("embedding_length")), " = ", c.hidden_size, " is not divisible by head_count ",
                            c.num_heads, "; expected attention.key_length to give the head size"));
        c.head_dim = c.hidden_size / c.num_heads;
    }
    const int64_t rope_dims = k.dim_or("rope.dimension_count", c.head_dim);
    if (rope_dims > c.head_dim || rope_dims % 2 != 0)
        throw Error(str(f.what(k.key("rope.dimension_count")), " = ", rope_dims, ", expected an even number <= head size ",
                        c.head_dim));
    c.partial_rotary_factor = double(rope_dims) / double(c.head_dim);
    c.rms_norm_eps = k.real_or("attention.layer_norm_rms_epsilon", -1.0, false);
    if (c.rms_norm_eps < 0) throw Error(str(f.what(k.key("attention.layer_norm_rms_epsilon")), " is missing"));
    c.rope_theta = k.real_or("rope.freq_base", 10000.0, true);
    // llama.cpp's key for a sliding window (LLM_KV_ATTENTION_SLIDING_WINDOW). As far as we
    // know its converters write it only for architectures with windowed layers, not for llama
    // or qwen2; if a file has one, every layer gets it, as in Mistral's config.json, rather
    // than dropping it silently. 0 = none.
    c.sliding_window = k.dim_or("attention.sliding_window", 0, 0);

    // RoPE scaling: newer keys first, then the older linear-only key.
    if (const GgufValue* v = f.find(k.key("rope.scaling.type"))) {
        std::string type = v->as_string(f.what(k.key("rope.scaling.type")));
        if (type == "linear" || type == "yarn") {
            c.rope_scaling.type = type;
            c.rope_scaling.factor = k.real_or("rope.scaling.factor", 1.0, true);
            c.rope_scaling.original_max_position_embeddings =
                k.dim_or("rope.scaling.original_context_length", c.max_position_embeddings);
        } else if (type != "none" && !type.empty()) {
            throw Error(str(f.what(k.key("rope.scaling.type")), " is '", type, "', expected none, linear or yarn"));
        }
    } else if (f.find(k.key("rope.scale_linear"))) {
        double factor = k.real_or("rope.scale_linear", 1.0, true);
        if (factor != 1.0) {
            c.rope_scaling.type = "linear";
            c.rope_scaling.factor = factor;
        }
    }

    if (!tok.tokens.empty()) {
        c.vocab_size = int64_t(tok.tokens.size());
    } else if (f.find(k.key("vocab_size"))) {
        c.vocab_size = k.dim("vocab_size");
    } else {
        throw Error(str(f.source, ": no vocabulary size: neither tokenizer.ggml.tokens nor ", k.key("vocab_size"),
                        " is present"));
    }
    c.bos_token_id = tok.bos_id;
    if (tok.eos_id >= 0) c.eos_token_ids = {tok.eos_id};
    c.pad_token_id = tok.pad_id;
    c.qkv_bias = false;  // set from the tensors present (Qwen2 has q/k/v biases)
    c.tie_word_embeddings = false;
    switch (c.arch) {
        case Arch::GEMMA2:
        case Arch::GEMMA3: read_gemma(k, c); break;
        case Arch::PHI3:  // llama.cpp's Phi-3: attn_qkv and ffn_up (gate then up) fused
            c.fused_projections = true;
            if (!f.find_tensor("blk.0.attn_qkv.weight"))
                throw Error(str(f.source, ": phi3 without blk.0.attn_qkv.weight; expected the fused q/k/v projection llama.cpp's "
                                "converter writes"));
            if (f.find_tensor("rope_factors_long.weight") || f.find_tensor("rope_factors_short.weight"))
                throw Error(str(f.source, ": Phi-3 LongRoPE (rope_factors_long / rope_factors_short) is not supported; expected a "
                                "model without rope scaling (4k context)"));
            break;
        case Arch::OLMO2:  // norms on the attention and MLP outputs, q/k norm over the whole projection
            c.norm_placement = NormPlacement::POST;
            c.qk_norm = c.qk_norm_whole = true;
            if (c.sliding_window > 0)
                throw Error(str(f.what(k.key("attention.sliding_window")), " is ", c.sliding_window,
                                "; windowed OLMo layers (llama.cpp's pattern of 4) are not supported, expected no window"));
            break;
        default: break;
    }
    c.validate(f.source);
    return c;
}

}  // namespace kv
