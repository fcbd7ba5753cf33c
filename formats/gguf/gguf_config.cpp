// The key table of gguf_config.h. Every integer is range-checked before it reaches ModelConfig,
// so a hostile file cannot make later size arithmetic overflow.
#include "formats/gguf/gguf_config.h"

#include <cmath>
#include <vector>

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
    // A key the family cannot do without: its absence names the key and what it gives.
    int64_t dim_needed(const char* k, const std::string& expected) const {
        if (!f.find(key(k))) throw Error(str(f.source, ": metadata key '", key(k), "' is missing, expected ", expected));
        return dim(k);
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
constexpr ArchName kArchs[] = {{"llama", Arch::LLAMA},     {"qwen2", Arch::QWEN2},     {"gemma2", Arch::GEMMA2},
                               {"gemma3", Arch::GEMMA3},   {"phi3", Arch::PHI3},       {"olmo2", Arch::OLMO2},
                               {"smollm3", Arch::SMOLLM3}, {"gpt-oss", Arch::GPT_OSS}, {"deepseek2", Arch::DEEPSEEK_V2},
                               {"lfm2", Arch::LFM2}};

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

// SmolLM3 as llama.cpp reads it (load_hparams: n_no_rope_layer_step = 4, not stored in the
// file): layer il rotates iff (il + 1) % 4 != 0, transformers' default no_rope_layers. llama.cpp
// runs it without a window, so a file with one is refused rather than windowing every layer.
void read_smollm3(const Keys& k, ModelConfig& c) {
    if (c.sliding_window > 0)
        throw Error(str(k.f.what(k.key("attention.sliding_window")), " is ", c.sliding_window,
                        "; windowed SmolLM3 layers are not supported from GGUF (llama.cpp runs none), expected no window"));
    constexpr int64_t kNoRopeStep = 4;
    c.layer_specs.resize(size_t(c.num_layers));
    for (int64_t l = 0; l < c.num_layers; ++l) {
        LayerSpec& s = c.layer_specs[size_t(l)];
        s.rope_theta = c.rope_theta;
        s.rotary_fraction = (l + 1) % kNoRopeStep != 0 ? c.partial_rotary_factor : 0.0;
    }
}

// gpt-oss as llama.cpp reads it (LLM_ARCH_OPENAI_MOE): attention.sliding_window required and
// every even layer windowed (set_swa_pattern(2): il % 2 < 1, transformers' sliding, full, ...);
// expert_count experts of expert_feed_forward_length, expert_used_count per token; the SwiGLU's
// limit 7 and alpha 1.702 are constants of llama.cpp's graph, not keys. expert_count 0 (absent)
// is kvlab's dense form (ffn_gate / ffn_up / ffn_down), which llama.cpp does not write.
void read_gpt_oss(const Keys& k, ModelConfig& c) {
    c.attention_sinks = true;
    const int64_t window = k.dim_needed("attention.sliding_window", "the window of gpt-oss's sliding layers (0, 2, 4, ...)");
    const int64_t experts = k.dim_or("expert_count", 0, 0);
    if (experts > 0) {
        c.moe.num_experts = experts;
        c.moe.top_k =
            k.dim_needed("expert_used_count", str("the number of experts run per token (of expert_count = ", experts, ")"));
        if (c.moe.top_k > experts)
            throw Error(str(k.f.what(k.key("expert_used_count")), " is ", c.moe.top_k, ", expected at most ",
                            k.key("expert_count"), " = ", experts));
        c.intermediate_size = k.dim_needed("expert_feed_forward_length", "the width of each expert's SwiGLU");
    } else {
        c.intermediate_size = k.dim("feed_forward_length");
    }
    c.sliding_window = 0;  // per layer below
    c.layer_specs.resize(size_t(c.num_layers));
    for (int64_t l = 0; l < c.num_layers; ++l) {
        LayerSpec& s = c.layer_specs[size_t(l)];
        s.rope_theta = c.rope_theta;
        s.rotary_fraction = c.partial_rotary_factor;
        if (l % 2 == 0) s.attention = AttnKind::SLIDING, s.window = window;
        if (experts > 0) s.mlp = MlpKind::EXPERTS;
    }
}

// DeepSeek-V2 as llama.cpp's converter writes it (DeepseekV2Model): kv_lora_rank, q_lora_rank
// (absent: q_proj, DeepSeek-V2-Lite), rope.dimension_count = qk_rope_head_dim. Newer files hold
// the query/key and value head sizes in key_length_mla / value_length_mla, with key_length =
// kv_lora_rank + rope and value_length = kv_lora_rank describing the latent as one MQA head
// (head_count_kv 1); older ones hold the head sizes in key_length / value_length. kvlab's
// latent attention decompresses every head, so num_kv_heads = head_count. The experts are not
// run: every layer must be dense (leading_dense_block_count >= block_count).
void read_deepseek2_heads(const Keys& k, ModelConfig& c) {
    LatentAttention& a = c.latent;
    c.attn_projection = AttnProjection::LATENT;
    a.kv_lora_rank = k.dim_needed("attention.kv_lora_rank", "the width of the key/value latent (kv_lora_rank)");
    a.q_lora_rank = k.dim_or("attention.q_lora_rank", 0, 1);
    a.qk_rope_head_dim = k.dim_needed("rope.dimension_count", "the rotated key channels per head (qk_rope_head_dim)");
    const bool mla = k.f.find(k.key("attention.key_length_mla")) != nullptr;
    const char* klen_key = mla ? "attention.key_length_mla" : "attention.key_length";
    const int64_t klen = k.dim_needed(klen_key, "the query/key head size qk_nope_head_dim + qk_rope_head_dim");
    a.v_head_dim =
        k.dim_needed(mla ? "attention.value_length_mla" : "attention.value_length", "the value head size (v_head_dim)");
    if (mla) {
        const int64_t mqa_k = k.dim_or("attention.key_length", a.kv_lora_rank + a.qk_rope_head_dim);
        const int64_t mqa_v = k.dim_or("attention.value_length", a.kv_lora_rank);
        if (mqa_k != a.kv_lora_rank + a.qk_rope_head_dim || mqa_v != a.kv_lora_rank)
            throw Error(str(k.f.source, ": ", k.key("attention.key_length"), " / ", k.key("attention.value_length"), " are ",
                            mqa_k, " / ", mqa_v,
                            ", expected kv_lora_rank + rope.dimension_count = ", a.kv_lora_rank + a.qk_rope_head_dim,
                            " / kv_lora_rank = ", a.kv_lora_rank, " beside key_length_mla"));
    }
    if (klen < a.qk_rope_head_dim)
        throw Error(
            str(k.f.what(k.key(klen_key)), " is ", klen, ", expected at least rope.dimension_count = ", a.qk_rope_head_dim));
    a.qk_nope_head_dim = klen - a.qk_rope_head_dim;
    c.head_dim = klen;
    if (a.v_head_dim > c.head_dim)
        throw Error(str(k.f.what(k.key(mla ? "attention.value_length_mla" : "attention.value_length")), " is ", a.v_head_dim,
                        ", expected at most the key head ", c.head_dim, " (kvlab caches values padded to the key head)"));
    if (c.num_kv_heads != 1 && c.num_kv_heads != c.num_heads)
        throw Error(str(k.f.what(k.key("attention.head_count_kv")), " is ", c.num_kv_heads,
                        ", expected 1 (the latent as one MQA head) or ", "head_count = ", c.num_heads));
    c.num_kv_heads = c.num_heads;
    const int64_t dense = k.dim_or("leading_dense_block_count", c.num_layers, 0);
    if (dense < c.num_layers)
        throw Error(
            str(k.f.what(k.key("leading_dense_block_count")), " is ", dense, "; DeepSeek-V2's mixture-of-experts MLP is not ",
                "supported (kvlab runs its latent attention over a dense SwiGLU MLP in every layer), expected at least ",
                k.key("block_count"), " = ", c.num_layers));
}

// llama.cpp's per-layer head_count_kv (an array), which LFM2's converter writes: 0 marks a
// short-convolution layer, the attention layers share one count.
int64_t read_per_layer_kv_heads(const Keys& k, const GgufValue& v, const ModelConfig& c, std::vector<bool>& conv_layers) {
    const std::string what = k.f.what(k.key("attention.head_count_kv"));
    if (c.arch != Arch::LFM2)
        throw Error(str(what, " is ", v.describe(), "; per-layer counts are read for lfm2 only, expected one number"));
    const std::vector<int64_t> n = v.as_int_array(what);
    if (int64_t(n.size()) != c.num_layers)
        throw Error(str(what, " lists ", n.size(), " layers, expected block_count = ", c.num_layers));
    int64_t kv = 0;
    for (size_t i = 0; i < n.size(); ++i) {
        conv_layers.push_back(n[i] == 0);
        if (n[i] == 0) continue;
        if (n[i] < 0 || n[i] >= kMaxDim || (kv != 0 && n[i] != kv))
            throw Error(str(what, " entry ", i, " is ", n[i], ", expected 0 (a convolution layer) or ",
                            kv != 0 ? str("the other attention layers' ", kv) : std::string("a count >= 1")));
        kv = n[i];
    }
    if (kv == 0) throw Error(str(what, " is 0 in every layer, expected at least one attention layer"));
    return kv;
}

// LFM2 as llama.cpp reads it: shortconv.l_cache (conv_L_cache), the convolution layers from
// head_count_kv (above), q/k RMSNorm per head in the attention layers; feed_forward_length is
// the MLP's width after Lfm2Config's adjustment (the converter's _add_feed_forward_length).
void read_lfm2(const Keys& k, const std::vector<bool>& conv_layers, ModelConfig& c) {
    c.qk_norm = true;
    c.conv_kernel = k.dim_needed("shortconv.l_cache", "the short convolution's width (conv_L_cache)");
    if (c.conv_kernel > 64)
        throw Error(str(k.f.what(k.key("shortconv.l_cache")), " is ", c.conv_kernel, ", expected a width in [1, 64]"));
    if (c.sliding_window > 0)
        throw Error(str(k.f.what(k.key("attention.sliding_window")), " is ", c.sliding_window,
                        "; windowed LFM2 attention is not supported, expected no window"));
    c.layer_specs.resize(size_t(c.num_layers));
    for (int64_t l = 0; l < c.num_layers; ++l) {
        LayerSpec& s = c.layer_specs[size_t(l)];
        s.rope_theta = c.rope_theta;
        s.rotary_fraction = c.partial_rotary_factor;
        if (!conv_layers.empty() && conv_layers[size_t(l)]) s.mixer = LayerMixer::SHORT_CONV, s.attention = AttnKind::NONE;
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
    // gpt-oss's MLP width is its experts' when it has experts (read_gpt_oss).
    c.intermediate_size = c.arch == Arch::GPT_OSS ? 0 : k.dim("feed_forward_length");
    c.num_heads = k.dim("attention.head_count");
    std::vector<bool> conv_layers;  // LFM2: layers with head_count_kv 0
    if (const GgufValue* v = f.find(k.key("attention.head_count_kv")); v && v->is_array())
        c.num_kv_heads = read_per_layer_kv_heads(k, *v, c, conv_layers);
    else
        c.num_kv_heads = k.dim_or("attention.head_count_kv", c.num_heads);
    c.max_position_embeddings = k.dim("context_length");
    if (c.arch == Arch::DEEPSEEK_V2) {
        read_deepseek2_heads(k, c);
    } else if (f.find(k.key("attention.key_length"))) {
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
        case Arch::SMOLLM3:
            read_smollm3(k, c);
            break;
        case Arch::GPT_OSS:
            read_gpt_oss(k, c);
            break;
        case Arch::LFM2:
            read_lfm2(k, conv_layers, c);
            break;
        case Arch::DEEPSEEK_V2:
            if (!c.rope_scaling.type.empty())
                throw Error(str(f.what(k.key("rope.scaling.type")), " is '", c.rope_scaling.type,
                                "'; DeepSeek's YaRN (with its mscale on ",
                                "the softmax scale) is not implemented for latent attention, expected no rope scaling"));
            break;
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
