// config.json / generation_config.json parsing and writing (see hf_config.h).
// Defaults follow the transformers config classes (LlamaConfig, MistralConfig, Qwen2Config,
// Qwen3Config, GPT2Config, Gemma2Config, Gemma3TextConfig, SmolLM3Config, Phi3Config,
// Olmo2Config, GptOssConfig, DeepseekV2Config) so a config that HF loads means the
// same thing here.
//
// Index
//   [SECTION] Helpers: architecture names, bounded sizes, dtype names, token ids
//   [SECTION] rope_scaling
//   [SECTION] Reading
//   [SECTION] Writing
#include "formats/io/hf_config.h"

#include <limits>

#include "formats/io/json_strict.h"

namespace kv {

namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

// =========================================================================================
// [SECTION] Helpers
// =========================================================================================
// Any real model is far below this; the bound keeps every product of two sizes inside int64.
constexpr int64_t kMaxSize = std::numeric_limits<int32_t>::max();
// The deepest released models have ~130 layers; the bound keeps per-layer name tables (and the
// memory a hostile config could demand before any weight is read) small.
constexpr int64_t kMaxLayers = 65536;

struct ArchNames {
    Arch arch;
    const char* model_type;
    const char* architecture;
};
constexpr ArchNames kArchNames[] = {
    {Arch::LLAMA, "llama", "LlamaForCausalLM"},       {Arch::MISTRAL, "mistral", "MistralForCausalLM"},
    {Arch::QWEN2, "qwen2", "Qwen2ForCausalLM"},       {Arch::QWEN3, "qwen3", "Qwen3ForCausalLM"},
    {Arch::GPT2, "gpt2", "GPT2LMHeadModel"},         {Arch::GEMMA2, "gemma2", "Gemma2ForCausalLM"},
    {Arch::GEMMA3, "gemma3_text", "Gemma3ForCausalLM"}, {Arch::SMOLLM3, "smollm3", "SmolLM3ForCausalLM"},
    {Arch::PHI3, "phi3", "Phi3ForCausalLM"},             {Arch::OLMO2, "olmo2", "Olmo2ForCausalLM"},
    {Arch::GPT_OSS, "gpt_oss", "GptOssForCausalLM"},     {Arch::DEEPSEEK_V2, "deepseek_v2", "DeepseekV2ForCausalLM"},
    {Arch::LFM2, "lfm2", "Lfm2ForCausalLM"},            {Arch::GEMMA3N, "gemma3n_text", "Gemma3nForCausalLM"},
};

const ArchNames& names_of(Arch a) {
    for (const auto& n : kArchNames)
        if (n.arch == a) return n;
    throw Error(str("architecture ", int(a), " has no config.json name"));
}

std::string model_type_list() {
    std::string s;
    for (const auto& n : kArchNames) s += (s.empty() ? "" : ", ") + std::string(n.model_type);
    return s;
}

std::string architecture_list() {
    std::string s;
    for (const auto& n : kArchNames) s += (s.empty() ? "" : ", ") + std::string(n.architecture);
    return s;
}

Arch detect_arch(const JsonFields& f) {
    std::string model_type = f.get_string("model_type", "");
    std::string architecture;
    if (const json* a = f.find("architectures")) {
        if (!a->is_array()) f.fail("architectures", str("must be a list of strings, got ", json_describe(*a)));
        if (!a->empty()) {
            if (!(*a)[0].is_string())
                f.fail("architectures", str("must be a list of strings, got a list containing ", json_describe((*a)[0])));
            architecture = (*a)[0].get<std::string>();
        }
    }
    const ArchNames* by_arch = nullptr;
    for (const auto& n : kArchNames)
        if (architecture == n.architecture) by_arch = &n;
    if (!model_type.empty()) {
        for (const auto& n : kArchNames) {
            if (model_type != n.model_type) continue;
            // Heads other than *ForCausalLM (e.g. ...ForSequenceClassification) are fine, but a
            // known architecture of another family means the file contradicts itself.
            if (by_arch && by_arch->arch != n.arch)
                f.fail("architectures", str("names '", architecture, "', which contradicts model_type '", model_type, "'"));
            return n.arch;
        }
        f.fail("model_type", str("is '", model_type, "', which kvlab does not support; expected one of ", model_type_list()));
    }
    if (by_arch) return by_arch->arch;
    if (!architecture.empty())
        f.fail("architectures", str("names '", architecture, "', which kvlab does not support, and model_type is missing; expected one of ",
                                    architecture_list()));
    f.fail("model_type", str("is missing (and so is architectures); expected one of ", model_type_list()));
}

int64_t bounded(const JsonFields& f, const char* key, int64_t v) {
    if (v > kMaxSize) f.fail(key, str("is ", v, "; expected at most ", kMaxSize));
    return v;
}
int64_t size_field(const JsonFields& f, const char* key) { return bounded(f, key, f.get_int(key)); }
int64_t size_field(const JsonFields& f, const char* key, int64_t fallback) { return bounded(f, key, f.get_int(key, fallback)); }
int64_t layers_field(const JsonFields& f, const char* key) {
    int64_t v = f.get_int(key);
    if (v > kMaxLayers) f.fail(key, str("is ", v, "; expected at most ", kMaxLayers));
    return v;
}

struct DTypeName {
    DType dtype;
    const char* name;
};
constexpr DTypeName kTorchDTypes[] = {
    {DType::F32, "float32"}, {DType::F16, "float16"}, {DType::BF16, "bfloat16"}, {DType::F64, "float64"}};

DType parse_torch_dtype(const JsonFields& f) {
    // transformers >= 4.56 writes "dtype"; older versions "torch_dtype".
    const char* key = f.has("dtype") ? "dtype" : "torch_dtype";
    if (!f.has(key)) return DType::F32;
    std::string s = f.get_string(key);
    for (const auto& d : kTorchDTypes)
        if (s == d.name) return d.dtype;
    f.fail(key, str("is '", s, "'; expected one of float32, float16, bfloat16, float64"));
}

const char* torch_dtype_name(DType t) {
    for (const auto& d : kTorchDTypes)
        if (t == d.dtype) return d.name;
    throw Error(str("config.json: the checkpoint dtype must be float32, float16, bfloat16 or float64, got dtype ", int(t)));
}

// Token ids must index the vocabulary; pad may be negative (some configs use -1 for "none").
void check_token_ids(const ModelConfig& cfg, const std::string& source) {
    auto check = [&](const char* field, int64_t id) {
        if (id < 0 || id >= cfg.vocab_size)
            throw Error(str(source, ": field '", field, "' is ", id, "; expected a token id in [0, ", cfg.vocab_size, ")"));
    };
    if (cfg.bos_token_id != -1) check("bos_token_id", cfg.bos_token_id);
    for (int64_t id : cfg.eos_token_ids) check("eos_token_id", id);
    if (cfg.pad_token_id != -1) check("pad_token_id", cfg.pad_token_id);
}

void read_token_ids(const JsonFields& f, ModelConfig& cfg) {
    if (f.has("bos_token_id")) cfg.bos_token_id = f.get_int("bos_token_id");
    if (f.has("eos_token_id")) cfg.eos_token_ids = f.get_int_list("eos_token_id");
    if (f.has("pad_token_id")) {
        int64_t pad = f.get_int("pad_token_id");
        cfg.pad_token_id = pad < 0 ? -1 : pad;
    }
}

// =========================================================================================
// [SECTION] rope_scaling
// =========================================================================================
// `field` is "rope_scaling" or "rope_parameters" (transformers v5 moves rope_theta and the
// scaling parameters there). The scaling types are those the RoPE code can be asked for; the
// model code decides which it implements.
RopeScaling parse_rope_scaling(const json& v, const std::string& source, const std::string& field) {
    RopeScaling r;
    if (v.is_null()) return r;
    if (!v.is_object()) throw Error(str(source, ": field '", field, "' must be an object or null, got ", json_describe(v)));
    JsonFields f(v, source, field + ".");
    const char* type_key = f.has("rope_type") ? "rope_type" : "type";  // "type" is the legacy spelling
    std::string type = f.get_string(type_key, "default");
    if (type == "default") return r;
    if (type != "linear" && type != "dynamic" && type != "yarn" && type != "llama3" && type != "longrope")
        f.fail(type_key, str("is '", type, "'; expected one of default, linear, dynamic, yarn, llama3, longrope"));
    r.type = type;
    if (type == "longrope") {  // Phi-3's per-pair factors; its `factor` is derived from the lengths
        auto factors = [&](const char* key) {
            const json* a = f.find(key);
            if (!a || !a->is_array() || a->empty()) f.fail(key, "must be a non-empty list of numbers (one per rotated channel pair)");
            std::vector<double> out;
            for (const json& x : *a) {
                if (!x.is_number() || !(x.get<double>() > 0) || !std::isfinite(x.get<double>()))
                    f.fail(key, str("contains ", json_describe(x), "; expected numbers > 0"));
                out.push_back(x.get<double>());
            }
            return out;
        };
        r.short_factor = factors("short_factor");
        r.long_factor = factors("long_factor");
        r.attention_factor = f.get_number("attention_factor", 0.0);
        if (!(r.attention_factor >= 0)) f.fail("attention_factor", str("is ", r.attention_factor, "; expected a number > 0"));
        r.original_max_position_embeddings = size_field(f, "original_max_position_embeddings", 0);
        return r;
    }
    r.factor = f.get_number("factor");
    if (!(r.factor > 0)) f.fail("factor", str("is ", r.factor, "; expected a number > 0"));
    if (type == "llama3") {
        r.low_freq_factor = f.get_number("low_freq_factor");
        r.high_freq_factor = f.get_number("high_freq_factor");
        if (!(r.low_freq_factor > 0)) f.fail("low_freq_factor", str("is ", r.low_freq_factor, "; expected a number > 0"));
        // The llama3 rule interpolates over (high - low): equal factors would divide by zero.
        if (!(r.high_freq_factor > r.low_freq_factor))
            f.fail("high_freq_factor", str("is ", r.high_freq_factor, "; expected a number > low_freq_factor (", r.low_freq_factor, ")"));
        r.original_max_position_embeddings = size_field(f, "original_max_position_embeddings");
        if (r.original_max_position_embeddings <= 0)
            f.fail("original_max_position_embeddings", str("is ", r.original_max_position_embeddings, "; expected a number > 0"));
    } else if (type == "yarn") {
        r.original_max_position_embeddings = size_field(f, "original_max_position_embeddings", 0);
        if (r.original_max_position_embeddings < 0)
            f.fail("original_max_position_embeddings", str("is ", r.original_max_position_embeddings, "; expected a number > 0"));
    }
    return r;
}

// =========================================================================================
// [SECTION] Reading
// =========================================================================================
// Qwen2/Qwen3 (transformers' Qwen2Config/Qwen3Config): sliding_window counts only with
// use_sliding_window, and then only in layers i >= max_window_layers (default 28) -- their
// layer_types default is "sliding_attention" iff sliding_window is set and i >= max_window_layers.
// An explicit layer_types list wins; we take it when it has that shape (full layers, then
// windowed ones) and refuse any other pattern rather than misread it.
void read_qwen_window(const JsonFields& f, ModelConfig& c) {
    if (!f.get_bool("use_sliding_window", false)) return;
    c.sliding_window = size_field(f, "sliding_window", 4096);  // the configs' default when absent
    c.window_from_layer = size_field(f, "max_window_layers", 28);
    const json* lt = f.find("layer_types");
    if (!lt) return;
    if (!lt->is_array() || int64_t(lt->size()) != c.num_layers)
        f.fail("layer_types", str("is ", json_describe(*lt), "; expected a list of ", c.num_layers, " strings"));
    int64_t first = c.num_layers;
    for (int64_t i = 0; i < c.num_layers; ++i) {
        const json& t = (*lt)[size_t(i)];
        const bool full = t.is_string() && t.get<std::string>() == "full_attention";
        const bool windowed = t.is_string() && t.get<std::string>() == "sliding_attention";
        if (!full && !windowed)
            f.fail("layer_types", str("entry ", i, " is ", json_describe(t), "; expected \"full_attention\" or \"sliding_attention\""));
        if (windowed && first == c.num_layers) first = i;
        if (full && first < i)
            f.fail("layer_types", str("has a full_attention layer ", i, " after sliding_attention layer ", first,
                                      "; expected full layers first, then windowed ones (max_window_layers)"));
    }
    c.window_from_layer = first;
}

// Gemma 2 / Gemma 3 text (transformers' Gemma2Config, Gemma3TextConfig): four (1 + w) RMSNorms
// per block, embeddings times sqrt(hidden), queries scaled by query_pre_attn_scalar^-1/2, and
// layers alternating sliding and full attention. Without layer_types, layer i is sliding iff
// (i + 1) % pattern != 0 (pattern 2 for Gemma 2, sliding_window_pattern (6) for Gemma 3). Gemma 3
// rotates sliding layers with rope_local_base_freq and full ones with rope_theta, rope_scaling
// applying to full layers only (transformers v5 nests both under rope_parameters by layer type).
void read_gemma(const JsonFields& f, const json& root, const std::string& source, ModelConfig& c) {
    const bool g3 = c.arch == Arch::GEMMA3;
    c.norm_placement = NormPlacement::BOTH;
    c.norm_weight_offset = 1.0;
    c.embedding_scale = std::sqrt(double(c.hidden_size));
    c.qkv_bias = c.o_bias = f.get_bool("attention_bias", false);
    c.qk_norm = g3;
    c.query_pre_attn_scalar = f.get_number("query_pre_attn_scalar", 256);
    if (!(c.query_pre_attn_scalar > 0))
        f.fail("query_pre_attn_scalar", str("is ", c.query_pre_attn_scalar, "; expected a number > 0"));
    // Absent: the class default (Gemma 2 caps, Gemma 3 does not); null: no cap.
    auto cap = [&](const char* key, double absent) {
        const double v = root.contains(key) ? f.get_number(key, 0.0) : absent;
        if (!(v >= 0)) f.fail(key, str("is ", v, "; expected a number > 0 or null"));
        return v;
    };
    c.attn_logit_softcap = cap("attn_logit_softcapping", g3 ? 0.0 : 50.0);
    c.final_logit_softcap = cap("final_logit_softcapping", g3 ? 0.0 : 30.0);
    const int64_t window = root.contains("sliding_window") ? size_field(f, "sliding_window", 0) : 4096;
    double global_theta = c.rope_theta, local_theta = c.rope_theta;
    if (g3) {
        global_theta = f.get_number("rope_theta", 1000000.0);
        local_theta = f.get_number("rope_local_base_freq", 10000.0);
        if (const json* rp = f.find("rope_parameters"); rp && rp->is_object()) {
            JsonFields rf(*rp, source, "rope_parameters.");
            if (const json* full = rf.find("full_attention")) {
                c.rope_scaling = parse_rope_scaling(*full, source, "rope_parameters.full_attention");
                if (full->is_object())
                    global_theta = JsonFields(*full, source, "rope_parameters.full_attention.").get_number("rope_theta", global_theta);
            }
            if (const json* local = rf.find("sliding_attention"); local && local->is_object())
                local_theta = JsonFields(*local, source, "rope_parameters.sliding_attention.").get_number("rope_theta", local_theta);
        }
        c.rope_theta = global_theta;
    }
    const int64_t pattern = g3 ? f.get_int("sliding_window_pattern", 6) : 2;
    if (pattern <= 0) f.fail("sliding_window_pattern", str("is ", pattern, "; expected a number > 0"));
    const json* lt = f.find("layer_types");
    if (lt && (!lt->is_array() || int64_t(lt->size()) != c.num_layers))
        f.fail("layer_types", str("is ", json_describe(*lt), "; expected a list of ", c.num_layers, " strings"));
    c.layer_specs.resize(size_t(c.num_layers));
    for (int64_t i = 0; i < c.num_layers; ++i) {
        bool sliding = (i + 1) % pattern != 0;
        if (lt) {
            const json& t = (*lt)[size_t(i)];
            const bool full = t.is_string() && t.get<std::string>() == "full_attention";
            sliding = t.is_string() && t.get<std::string>() == "sliding_attention";
            if (!full && !sliding)
                f.fail("layer_types", str("entry ", i, " is ", json_describe(t), "; expected \"full_attention\" or \"sliding_attention\""));
        }
        LayerSpec& s = c.layer_specs[size_t(i)];
        s.rotary_fraction = c.partial_rotary_factor;
        s.rope_theta = sliding ? local_theta : global_theta;
        s.rope_scaled = !(g3 && sliding);
        if (sliding && window > 0) s.attention = AttnKind::SLIDING, s.window = window;
    }
}

// Gemma 3n's text decoder (transformers' Gemma3nTextConfig): Gemma 3's four norms per block but
// RMSNorms multiplying by w, q/k RMSNorm and v RMSNorm without weight, scores scaled by 1.0,
// layer_types (default: full iff (i + 1) % 5 == 0) with rope_local_base_freq on sliding layers,
// final logits capped (default 30); AltUp, LAUREL and per-layer inputs (AltUpSpec); gaussian
// top-k on the MLP gate (activation_sparsity_pattern: default 0.95 in the first 10 layers of a
// model deeper than 10); the last num_kv_shared_layers layers read the K/V of the last earlier
// layer of their type (LayerSpec::kv_source).
void read_gemma3n(const JsonFields& f, const json& root, ModelConfig& c) {
    c.norm_placement = NormPlacement::BOTH;
    c.norm_weight_offset = 0.0;
    c.embedding_scale = std::sqrt(double(c.hidden_size));
    if (f.get_bool("attention_bias", false)) f.fail("attention_bias", "is true; Gemma 3n has no attention biases (expected false)");
    c.qk_norm = true;
    c.v_norm = true;
    c.query_pre_attn_scalar = 1.0;  // Gemma3nTextAttention calls its attention with scaling=1.0
    c.final_logit_softcap = root.contains("final_logit_softcapping") ? f.get_number("final_logit_softcapping", 0.0) : 30.0;
    if (!(c.final_logit_softcap >= 0)) f.fail("final_logit_softcapping", str("is ", c.final_logit_softcap, "; expected a number > 0 or null"));
    const int64_t window = root.contains("sliding_window") ? size_field(f, "sliding_window", 0) : 512;
    const double global_theta = f.get_number("rope_theta", 1000000.0), local_theta = f.get_number("rope_local_base_freq", 10000.0);
    c.rope_theta = global_theta;
    const json* lt = f.find("layer_types");
    if (lt && (!lt->is_array() || int64_t(lt->size()) != c.num_layers))
        f.fail("layer_types", str("is ", json_describe(*lt), "; expected a list of ", c.num_layers, " strings"));
    std::vector<double> sparsity(size_t(c.num_layers), 0.0);
    if (const json* sp = f.find("activation_sparsity_pattern")) {
        if (sp->is_number()) {
            sparsity.assign(size_t(c.num_layers), sp->get<double>());
        } else if (sp->is_array() && int64_t(sp->size()) == c.num_layers) {
            for (size_t i = 0; i < sp->size(); ++i) {
                if (!(*sp)[i].is_number())
                    f.fail("activation_sparsity_pattern", str("entry ", i, " is ", json_describe((*sp)[i]), "; expected a number in [0, 1)"));
                sparsity[i] = (*sp)[i].get<double>();
            }
        } else {
            f.fail("activation_sparsity_pattern", str("is ", json_describe(*sp), "; expected a number or a list of ", c.num_layers, " numbers"));
        }
    } else if (c.num_layers > 10) {
        for (size_t i = 0; i < 10; ++i) sparsity[i] = 0.95;
    }
    std::vector<bool> sliding(size_t(c.num_layers));
    c.layer_specs.resize(size_t(c.num_layers));
    for (int64_t i = 0; i < c.num_layers; ++i) {
        bool sl = (i + 1) % 5 != 0;
        if (lt) {
            const json& t = (*lt)[size_t(i)];
            const bool full = t.is_string() && t.get<std::string>() == "full_attention";
            sl = t.is_string() && t.get<std::string>() == "sliding_attention";
            if (!full && !sl)
                f.fail("layer_types", str("entry ", i, " is ", json_describe(t), "; expected \"full_attention\" or \"sliding_attention\""));
        }
        sliding[size_t(i)] = sl;
        LayerSpec& s = c.layer_specs[size_t(i)];
        s.rope_theta = sl ? local_theta : global_theta;
        s.rope_scaled = !sl;
        if (sl && window > 0) s.attention = AttnKind::SLIDING, s.window = window;
        s.activation_sparsity = sparsity[size_t(i)];
    }
    // Sharing: layers from first = L - num_kv_shared_layers on (when first > 0) read the last
    // layer before `first` of their type.
    const int64_t shared = f.get_int("num_kv_shared_layers", 15);
    if (shared < 0 || shared > c.num_layers)
        f.fail("num_kv_shared_layers", str("is ", shared, "; expected a count in [0, num_hidden_layers = ", c.num_layers, "]"));
    const int64_t first = c.num_layers - shared;
    if (first > 0)
        for (int64_t i = first; i < c.num_layers; ++i) {
            int64_t src = -1;
            for (int64_t j = first - 1; j >= 0 && src < 0; --j)
                if (sliding[size_t(j)] == sliding[size_t(i)]) src = j;
            if (src < 0)
                f.fail("num_kv_shared_layers", str("makes layer ", i, " (", sliding[size_t(i)] ? "sliding" : "full",
                                                   "_attention) shared, but no earlier layer of that type keeps its own keys and values"));
            c.layer_specs[size_t(i)].kv_source = src;
        }
    AltUpSpec& a = c.altup;
    a.num_inputs = f.get_int("altup_num_inputs", 4);
    a.active_idx = f.get_int("altup_active_idx", 0);
    a.coef_clip = root.contains("altup_coef_clip") ? f.get_number("altup_coef_clip", 0.0) : 120.0;
    a.correct_scale = f.get_bool("altup_correct_scale", true);
    a.laurel_rank = f.get_int("laurel_rank", 64);
    a.per_layer_dim = f.get_int("hidden_size_per_layer_input", 256);
    a.per_layer_vocab = f.get_int("vocab_size_per_layer_input", 262144);
    if (a.num_inputs < 1) f.fail("altup_num_inputs", str("is ", a.num_inputs, "; expected a count >= 1"));
    if (a.laurel_rank < 1) f.fail("laurel_rank", str("is ", a.laurel_rank, "; expected a rank >= 1"));
    if (a.per_layer_dim < 1) f.fail("hidden_size_per_layer_input", str("is ", a.per_layer_dim, "; expected a width >= 1"));
    if (a.per_layer_vocab < 1) f.fail("vocab_size_per_layer_input", str("is ", a.per_layer_vocab, "; expected a size >= 1"));
    if (!(a.coef_clip >= 0)) f.fail("altup_coef_clip", str("is ", a.coef_clip, "; expected a number >= 0 or null"));
}

// SmolLM3 (transformers' SmolLM3Config): no_rope_layers[i] = 1 where layer i uses RoPE, by
// default int((i + 1) % no_rope_layer_interval != 0) (interval 4: every 4th layer is NoPE); with
// use_sliding_window, the NoPE layers are the windowed ones. An explicit layer_types list wins.
void read_smollm3(const JsonFields& f, ModelConfig& c) {
    c.qkv_bias = c.o_bias = f.get_bool("attention_bias", false);
    c.mlp_bias = f.get_bool("mlp_bias", false);
    std::vector<int64_t> uses_rope;
    if (f.has("no_rope_layers")) {
        uses_rope = f.get_int_list("no_rope_layers");
        if (int64_t(uses_rope.size()) != c.num_layers)
            f.fail("no_rope_layers", str("lists ", uses_rope.size(), " layers; expected num_hidden_layers = ", c.num_layers));
    } else {
        const int64_t interval = f.get_int("no_rope_layer_interval", 4);
        if (interval <= 0) f.fail("no_rope_layer_interval", str("is ", interval, "; expected a number > 0"));
        for (int64_t i = 0; i < c.num_layers; ++i) uses_rope.push_back((i + 1) % interval != 0);
    }
    const int64_t window = f.get_bool("use_sliding_window", false) ? size_field(f, "sliding_window", 0) : 0;
    const json* lt = f.find("layer_types");
    if (lt && (!lt->is_array() || int64_t(lt->size()) != c.num_layers))
        f.fail("layer_types", str("is ", json_describe(*lt), "; expected a list of ", c.num_layers, " strings"));
    c.layer_specs.resize(size_t(c.num_layers));
    for (int64_t i = 0; i < c.num_layers; ++i) {
        bool sliding = window > 0 && !uses_rope[size_t(i)];
        if (lt) {
            const json& t = (*lt)[size_t(i)];
            const bool full = t.is_string() && t.get<std::string>() == "full_attention";
            sliding = t.is_string() && t.get<std::string>() == "sliding_attention";
            if (!full && !sliding)
                f.fail("layer_types", str("entry ", i, " is ", json_describe(t), "; expected \"full_attention\" or \"sliding_attention\""));
            if (sliding && window <= 0) f.fail("layer_types", str("entry ", i, " is sliding_attention but there is no sliding_window"));
        }
        LayerSpec& s = c.layer_specs[size_t(i)];
        s.rope_theta = c.rope_theta;
        s.rotary_fraction = uses_rope[size_t(i)] ? c.partial_rotary_factor : 0.0;
        if (sliding) s.attention = AttnKind::SLIDING, s.window = window;
    }
}

// gpt-oss (transformers' GptOssConfig): a learned sink logit per query head in every softmax
// (self_attn.sinks), biases on q/k/v and o_proj, layer_types alternating sliding_attention
// (sliding_window, 128) and full_attention, starting with a sliding layer, and in every layer a
// mixture of num_local_experts experts (128) of which num_experts_per_tok (4) run per token,
// each a SwiGLU clamped at swiglu_limit (7.0) with gain swiglu_alpha (1.702) (MixtureOfExperts).
// num_local_experts 0 is kvlab's own form with a dense SwiGLU MLP (mlp.{gate,up,down}_proj).
// The released checkpoints store the experts in MXFP4 blocks (quantization_config
// quant_method "mxfp4"), which kvlab does not read: it says so by name.
void read_gpt_oss(const JsonFields& f, ModelConfig& c) {
    c.attention_sinks = true;
    c.qkv_bias = c.o_bias = f.get_bool("attention_bias", true);
    if (const json* q = f.find("quantization_config")) {
        const json* m = q->is_object() && q->contains("quant_method") ? &(*q)["quant_method"] : nullptr;
        const std::string method = m && m->is_string() ? m->get<std::string>() : json_describe(*q);
        f.fail("quantization_config", str("has quant_method ", method, "; kvlab reads gpt-oss's experts as float tensors only (the "
                                          "MXFP4 blocks mlp.experts.*_blocks / *_scales are not supported): dequantize the checkpoint "
                                          "first (transformers: Mxfp4Config(dequantize=True), then save_pretrained)"));
    }
    const int64_t experts = f.get_int("num_local_experts", 128);
    if (experts < 0) f.fail("num_local_experts", str("is ", experts, "; expected 0 (a dense SwiGLU MLP) or the number of experts"));
    if (experts > 0) {
        c.moe.num_experts = experts;
        c.moe.top_k = f.get_int("num_experts_per_tok", 4);
        c.moe.limit = f.get_number("swiglu_limit", 7.0);
        c.moe.alpha = f.get_number("swiglu_alpha", 1.702);
    }
    const int64_t window = size_field(f, "sliding_window", 128);
    const json* lt = f.find("layer_types");
    if (lt && (!lt->is_array() || int64_t(lt->size()) != c.num_layers))
        f.fail("layer_types", str("is ", json_describe(*lt), "; expected a list of ", c.num_layers, " strings"));
    c.layer_specs.resize(size_t(c.num_layers));
    for (int64_t i = 0; i < c.num_layers; ++i) {
        bool sliding = i % 2 == 0;  // GptOssConfig's default: sliding, full, sliding, ...
        if (lt) {
            const json& t = (*lt)[size_t(i)];
            const bool full = t.is_string() && t.get<std::string>() == "full_attention";
            sliding = t.is_string() && t.get<std::string>() == "sliding_attention";
            if (!full && !sliding)
                f.fail("layer_types", str("entry ", i, " is ", json_describe(t), "; expected \"full_attention\" or \"sliding_attention\""));
        }
        if (sliding && window <= 0) f.fail("sliding_window", str("is ", window, "; layer ", i, " is sliding_attention, expected a window > 0"));
        LayerSpec& s = c.layer_specs[size_t(i)];
        s.rope_theta = c.rope_theta;
        s.rotary_fraction = c.partial_rotary_factor;
        if (sliding) s.attention = AttnKind::SLIDING, s.window = window;
        if (experts > 0) s.mlp = MlpKind::EXPERTS;
    }
}

// DeepSeek-V2 (transformers' DeepseekV2Config): multi-head latent attention. head_dim in its
// config.json is qk_rope_head_dim (the RoPE tables' width); kvlab's head_dim is the query/key
// head, qk_nope_head_dim + qk_rope_head_dim, whose first qk_rope_head_dim channels it rotates
// (the loader moves the rotated channels first; the dot product q.k does not change).
// q_lora_rank null = q_proj. The MoE MLP is not run: every layer must be dense
// (first_k_dense_replace >= num_hidden_layers). rope_scaling (DeepSeek's YaRN with mscale) and
// attention_bias are refused.
void read_deepseek_v2(const JsonFields& f, const json& root, ModelConfig& c) {
    LatentAttention& a = c.latent;
    c.attn_projection = AttnProjection::LATENT;
    a.kv_lora_rank = size_field(f, "kv_lora_rank", 512);
    // null = no query compression (DeepSeek-V2-Lite); absent = DeepseekV2Config's default 1536
    a.q_lora_rank = f.has("q_lora_rank") ? size_field(f, "q_lora_rank") : root.contains("q_lora_rank") ? 0 : 1536;
    a.qk_nope_head_dim = size_field(f, "qk_nope_head_dim", 128);
    a.qk_rope_head_dim = size_field(f, "qk_rope_head_dim", 64);
    a.v_head_dim = size_field(f, "v_head_dim", 128);
    if (a.kv_lora_rank <= 0) f.fail("kv_lora_rank", str("is ", a.kv_lora_rank, "; expected a number > 0"));
    if (a.q_lora_rank < 0) f.fail("q_lora_rank", str("is ", a.q_lora_rank, "; expected a number > 0 or null"));
    if (a.qk_rope_head_dim <= 0 || a.qk_rope_head_dim % 2 != 0)
        f.fail("qk_rope_head_dim", str("is ", a.qk_rope_head_dim, "; expected a positive even number"));
    if (a.qk_nope_head_dim < 0) f.fail("qk_nope_head_dim", str("is ", a.qk_nope_head_dim, "; expected a number >= 0"));
    c.head_dim = a.qk_nope_head_dim + a.qk_rope_head_dim;
    if (a.v_head_dim <= 0 || a.v_head_dim > c.head_dim)
        f.fail("v_head_dim", str("is ", a.v_head_dim, "; expected a number in [1, qk_nope_head_dim + qk_rope_head_dim = ", c.head_dim,
                                 "] (kvlab caches values padded to the key head)"));
    c.partial_rotary_factor = double(a.qk_rope_head_dim) / double(c.head_dim);
    if (c.num_kv_heads != c.num_heads)
        f.fail("num_key_value_heads", str("is ", c.num_kv_heads, "; latent attention decompresses keys and values per head, expected ",
                                          "num_attention_heads = ", c.num_heads));
    const int64_t dense = f.get_int("first_k_dense_replace", 0);
    if (dense < c.num_layers)
        f.fail("first_k_dense_replace", str("is ", dense, "; DeepSeek-V2's mixture-of-experts MLP is not supported (kvlab runs its "
                                            "latent attention over a dense SwiGLU MLP in every layer: first_k_dense_replace >= "
                                            "num_hidden_layers = ", c.num_layers, ")"));
    if (f.get_bool("attention_bias", false))
        f.fail("attention_bias", "is true; biases on q_a_proj / kv_a_proj_with_mqa / o_proj are not supported (expected false)");
    if (!c.rope_scaling.type.empty() && c.rope_scaling.type != "default")
        f.fail("rope_scaling", str("has type '", c.rope_scaling.type, "'; DeepSeek's YaRN (with its mscale on the softmax scale) is not ",
                                   "implemented for latent attention; expected no rope_scaling"));
    c.mlp_bias = f.get_bool("mlp_bias", false);
}

// LFM2 (transformers' Lfm2Config): layers are attention ("full_attention": GQA, per-head q/k
// RMSNorm, RoPE) or gated short convolutions ("conv", conv_L_cache wide), from layer_types or
// else full_attn_idxs (absent: every layer attends). Liquid's own keys are read where
// Lfm2Config reads them (norm_eps, theta, block_ff_dim, tie_embedding). The MLP width is
// int(2 I / 3) with block_auto_adjust_ff_dim, times block_ffn_dim_multiplier, rounded up to
// block_multiple_of. Biases on the convolution (conv_bias) are refused.
void read_lfm2(const JsonFields& f, const json& root, ModelConfig& c) {
    c.qk_norm = true;
    c.rms_norm_eps = f.get_number("norm_eps", 1e-5);
    if (!f.has("rope_theta") && !root.contains("rope_parameters")) c.rope_theta = f.get_number("theta", 1000000.0);  // Lfm2Config's default base is 1e6
    c.tie_word_embeddings = f.has("tie_word_embeddings") ? f.get_bool("tie_word_embeddings", true) : f.get_bool("tie_embedding", true);
    if (f.get_bool("block_auto_adjust_ff_dim", true)) {
        int64_t I = 2 * c.intermediate_size / 3;
        if (f.has("block_ffn_dim_multiplier") || !root.contains("block_ffn_dim_multiplier")) {  // null: no multiplier, no rounding
            const double mult = f.get_number("block_ffn_dim_multiplier", 1.0);
            const int64_t m = size_field(f, "block_multiple_of", 256);
            if (m <= 0) f.fail("block_multiple_of", str("is ", m, "; expected a number > 0"));
            I = int64_t(mult * double(I));
            I = m * ((I + m - 1) / m);
        }
        c.intermediate_size = I;
    }
    if (f.get_bool("conv_bias", false))
        f.fail("conv_bias", "is true; biases on the short convolution's in_proj, conv and out_proj are not supported (expected false)");
    c.conv_kernel = size_field(f, "conv_L_cache", 3);
    if (c.conv_kernel < 1 || c.conv_kernel > 64) f.fail("conv_L_cache", str("is ", c.conv_kernel, "; expected a width in [1, 64]"));
    std::vector<bool> attn(size_t(c.num_layers), true);
    if (const json* lt = f.find("layer_types")) {
        if (!lt->is_array() || int64_t(lt->size()) != c.num_layers)
            f.fail("layer_types", str("is ", json_describe(*lt), "; expected a list of ", c.num_layers, " strings"));
        for (int64_t i = 0; i < c.num_layers; ++i) {
            const json& t = (*lt)[size_t(i)];
            const bool full = t.is_string() && t.get<std::string>() == "full_attention";
            if (!full && !(t.is_string() && t.get<std::string>() == "conv"))
                f.fail("layer_types", str("entry ", i, " is ", json_describe(t), "; expected \"full_attention\" or \"conv\""));
            attn[size_t(i)] = full;
        }
    } else if (const json* idx = f.find("full_attn_idxs")) {
        if (!idx->is_array()) f.fail("full_attn_idxs", str("is ", json_describe(*idx), "; expected a list of layer indices"));
        attn.assign(size_t(c.num_layers), false);
        for (const json& i : *idx) {
            if (!i.is_number_integer() || i.get<int64_t>() < 0 || i.get<int64_t>() >= c.num_layers)
                f.fail("full_attn_idxs", str("has entry ", json_describe(i), "; expected layer indices in [0, ", c.num_layers, ")"));
            attn[size_t(i.get<int64_t>())] = true;
        }
    }
    c.layer_specs.resize(size_t(c.num_layers));
    for (int64_t i = 0; i < c.num_layers; ++i) {
        LayerSpec& s = c.layer_specs[size_t(i)];
        s.rope_theta = c.rope_theta;
        s.rotary_fraction = c.partial_rotary_factor;
        if (!attn[size_t(i)]) s.mixer = LayerMixer::SHORT_CONV, s.attention = AttnKind::NONE;
    }
}

void read_llama_family(const JsonFields& f, const json& root, const std::string& source, ModelConfig& c) {
    c.vocab_size = size_field(f, "vocab_size");
    c.hidden_size = size_field(f, "hidden_size");
    // Lfm2Config takes Liquid's block_ff_dim for intermediate_size
    if (const json* is = f.find("intermediate_size"); c.arch == Arch::GEMMA3N && is && is->is_array()) {
        // Gemma3nTextConfig: one width per layer (MatFormer); kvlab's MLP has one width.
        if (is->empty() || !(*is)[0].is_number_integer()) f.fail("intermediate_size", str("is ", json_describe(*is), "; expected positive integers"));
        for (const json& v : *is)
            if (v != (*is)[0])
                f.fail("intermediate_size", str("is ", json_describe(*is), "; MLP widths that differ by layer (MatFormer) are not supported, "
                                                                            "expected one width for every layer"));
        c.intermediate_size = (*is)[0].get<int64_t>();
        if (c.intermediate_size <= 0) f.fail("intermediate_size", str("is ", c.intermediate_size, "; expected a positive width"));
    } else {
        c.intermediate_size = c.arch == Arch::LFM2 && !f.has("intermediate_size") ? size_field(f, "block_ff_dim")
                                                                                  : size_field(f, "intermediate_size");
    }
    c.num_layers = layers_field(f, "num_hidden_layers");
    c.num_heads = size_field(f, "num_attention_heads");
    c.num_kv_heads = size_field(f, "num_key_value_heads", c.num_heads);  // absent = multi-head attention
    c.max_position_embeddings = size_field(f, "max_position_embeddings");
    if (f.has("head_dim")) {
        c.head_dim = size_field(f, "head_dim");
    } else if (c.arch == Arch::QWEN3) {
        c.head_dim = 128;  // Qwen3Config's default, independent of hidden_size / heads
    } else if (c.arch == Arch::GEMMA2 || c.arch == Arch::GEMMA3 || c.arch == Arch::GEMMA3N) {
        c.head_dim = 256;  // Gemma2Config's, Gemma3TextConfig's and Gemma3nTextConfig's default
    } else if (c.num_heads > 0) {
        if (c.hidden_size % c.num_heads != 0)
            f.fail("head_dim", str("is missing and hidden_size (", c.hidden_size, ") is not divisible by num_attention_heads (",
                                   c.num_heads, "); expected an explicit head_dim"));
        c.head_dim = c.hidden_size / c.num_heads;
    }
    c.rms_norm_eps = f.get_number("rms_norm_eps", 1e-6);
    c.rope_theta = f.get_number("rope_theta", 10000.0);
    c.partial_rotary_factor = f.get_number("partial_rotary_factor", 1.0);
    if (!(c.partial_rotary_factor > 0 && c.partial_rotary_factor <= 1))
        f.fail("partial_rotary_factor", str("is ", c.partial_rotary_factor, "; expected a number in (0, 1]"));
    if (const json* rs = f.find("rope_scaling")) c.rope_scaling = parse_rope_scaling(*rs, source, "rope_scaling");
    if (const json* rp = f.find("rope_parameters")) {
        c.rope_scaling = parse_rope_scaling(*rp, source, "rope_parameters");
        if (rp->is_object()) c.rope_theta = JsonFields(*rp, source, "rope_parameters.").get_number("rope_theta", c.rope_theta);
    }
    const bool gemma = c.arch == Arch::GEMMA2 || c.arch == Arch::GEMMA3 || c.arch == Arch::GEMMA3N;
    if (gemma) {
        // Gemma's key is hidden_activation; both its configs default to the tanh GELU.
        const char* key = f.has("hidden_activation") ? "hidden_activation" : "hidden_act";
        std::string act = f.get_string(key, "gelu_pytorch_tanh");
        if (act != "gelu_pytorch_tanh" && act != "gelu_new")
            f.fail(key, str("is '", act, "'; expected 'gelu_pytorch_tanh' (GELU-tanh gated MLP)"));
        c.mlp_act = MlpAct::GELU_TANH;
    } else {
        std::string act = f.get_string("hidden_act", "silu");
        if (act != "silu") f.fail("hidden_act", str("is '", act, "'; expected 'silu' (SwiGLU MLP)"));
    }
    c.tie_word_embeddings = f.get_bool("tie_word_embeddings", gemma);

    switch (c.arch) {
        case Arch::LLAMA:
            c.qkv_bias = c.o_bias = f.get_bool("attention_bias", false);
            c.mlp_bias = f.get_bool("mlp_bias", false);
            break;
        case Arch::MISTRAL:  // no biases; sliding_window (every layer) is an int, or null for none
            // MistralConfig's default is 4096 when the key is absent (Mistral 7B v0.1's window).
            c.sliding_window = root.contains("sliding_window") ? size_field(f, "sliding_window", 0) : 4096;
            break;
        case Arch::QWEN2:  // q/k/v always carry biases, o_proj never does
            c.qkv_bias = true;
            read_qwen_window(f, c);
            break;
        case Arch::QWEN3:
            c.qkv_bias = c.o_bias = f.get_bool("attention_bias", false);
            c.qk_norm = true;
            read_qwen_window(f, c);
            break;
        case Arch::GEMMA2:
        case Arch::GEMMA3: read_gemma(f, root, source, c); break;
        case Arch::SMOLLM3: read_smollm3(f, c); break;
        case Arch::PHI3:  // fused qkv_proj / gate_up_proj; sliding_window (null = none) in every layer
            c.fused_projections = true;
            c.sliding_window = size_field(f, "sliding_window", 0);
            // Phi3Config keeps the pretraining length beside rope_scaling (default 4096).
            if (c.rope_scaling.type == "longrope" && c.rope_scaling.original_max_position_embeddings == 0)
                c.rope_scaling.original_max_position_embeddings = size_field(f, "original_max_position_embeddings", 4096);
            break;
        case Arch::OLMO2:  // norms on the attention and MLP outputs, q/k norm over the whole projection
            c.qkv_bias = c.o_bias = f.get_bool("attention_bias", false);
            c.norm_placement = NormPlacement::POST;
            c.qk_norm = c.qk_norm_whole = true;
            break;
        case Arch::GPT_OSS: read_gpt_oss(f, c); break;
        case Arch::DEEPSEEK_V2: read_deepseek_v2(f, root, c); break;
        case Arch::LFM2: read_lfm2(f, root, c); break;
        case Arch::GEMMA3N: read_gemma3n(f, root, c); break;
        case Arch::GPT2: break;
    }
    if (c.sliding_window < 0) f.fail("sliding_window", str("is ", c.sliding_window, "; expected a number > 0 or null"));
}

void read_gpt2(const JsonFields& f, ModelConfig& c) {
    c.vocab_size = size_field(f, "vocab_size");
    c.hidden_size = size_field(f, "n_embd");
    c.num_layers = layers_field(f, "n_layer");
    c.num_heads = size_field(f, "n_head");
    c.num_kv_heads = c.num_heads;
    c.max_position_embeddings = size_field(f, "n_positions", 1024);
    c.intermediate_size = f.has("n_inner") ? size_field(f, "n_inner") : 4 * c.hidden_size;
    if (c.num_heads > 0) {
        if (c.hidden_size % c.num_heads != 0)
            f.fail("n_head", str("is ", c.num_heads, ", which does not divide n_embd (", c.hidden_size, ")"));
        c.head_dim = c.hidden_size / c.num_heads;
    }
    c.rms_norm_eps = f.get_number("layer_norm_epsilon", 1e-5);  // LayerNorm eps for GPT-2
    std::string act = f.get_string("activation_function", "gelu_new");
    if (act != "gelu_new" && act != "gelu_pytorch_tanh")
        f.fail("activation_function", str("is '", act, "'; expected 'gelu_new' (tanh-approximated GELU)"));
    c.tie_word_embeddings = f.get_bool("tie_word_embeddings", true);
    c.qkv_bias = c.o_bias = c.mlp_bias = true;
}

}  // namespace

ModelConfig parse_model_config(const std::string& json_text, const std::string& source) {
    json root = parse_json_strict(json_text, source, "config");
    if (!root.is_object()) throw Error(str(source, ": config must be a JSON object, got ", json_describe(root)));
    if (const auto mt = root.find("model_type"); mt != root.end() && *mt == "gemma3n") {
        // Gemma3nConfig (the released multimodal checkpoints): kvlab runs the text decoder its
        // text_config describes; token ids and the dtype may sit at the top level.
        const auto tc = root.find("text_config");
        if (tc == root.end() || !tc->is_object())
            throw Error(str(source, ": model_type 'gemma3n' needs a text_config object (Gemma3nTextConfig); got ",
                            tc == root.end() ? std::string("none") : json_describe(*tc)));
        json text = *tc;
        text["model_type"] = "gemma3n_text";
        text.erase("architectures");
        for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype", "tie_word_embeddings"})
            if (!text.contains(key) && root.contains(key)) text[key] = root[key];
        return parse_model_config(text.dump(), source + " (text_config)");
    }
    JsonFields f(root, source);
    ModelConfig c;
    c.arch = detect_arch(f);
    c.model_type = arch_name(c.arch);
    if (c.arch == Arch::GPT2)
        read_gpt2(f, c);
    else
        read_llama_family(f, root, source, c);
    c.dtype = parse_torch_dtype(f);
    read_token_ids(f, c);
    c.validate(source);
    check_token_ids(c, source);
    return c;
}

void apply_generation_config(const std::string& json_text, const std::string& source, ModelConfig& cfg) {
    json root = parse_json_strict(json_text, source, "generation config");
    if (!root.is_object()) throw Error(str(source, ": generation config must be a JSON object, got ", json_describe(root)));
    ModelConfig updated = cfg;  // all or nothing: a bad id leaves cfg untouched
    read_token_ids(JsonFields(root, source), updated);
    check_token_ids(updated, source);
    cfg = std::move(updated);
}

// =========================================================================================
// [SECTION] Writing
// =========================================================================================
namespace {

void write_token_ids(const ModelConfig& c, ojson& j) {
    if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
    if (c.eos_token_ids.size() == 1) j["eos_token_id"] = c.eos_token_ids[0];
    else if (!c.eos_token_ids.empty()) j["eos_token_id"] = c.eos_token_ids;
    if (c.pad_token_id >= 0) j["pad_token_id"] = c.pad_token_id;
}

// Refuses combinations the architecture's config.json cannot carry, so the file we write
// always reads back as the same ModelConfig.
void check_expressible(const ModelConfig& c) {
    auto need = [&](bool ok, const std::string& what) {
        if (!ok) throw Error(str("config.json for ", arch_name(c.arch), " model '", c.name, "': ", what));
    };
    switch (c.arch) {
        case Arch::LLAMA:
            need(c.qkv_bias == c.o_bias, "attention_bias covers q/k/v and o_proj together; qkv_bias and o_bias must match");
            need(c.sliding_window == 0, "llama has no sliding window; sliding_window must be 0");
            break;
        case Arch::MISTRAL:
            need(!c.qkv_bias && !c.o_bias && !c.mlp_bias, "mistral has no biases");
            need(c.window_from_layer == 0, "mistral windows every layer; window_from_layer must be 0");
            break;
        case Arch::QWEN2:
            need(c.qkv_bias && !c.o_bias && !c.mlp_bias, "qwen2 always has q/k/v biases and no other biases");
            break;
        case Arch::QWEN3:
            need(c.qkv_bias == c.o_bias, "attention_bias covers q/k/v and o_proj together; qkv_bias and o_bias must match");
            need(!c.mlp_bias, "qwen3 has no MLP biases");
            break;
        case Arch::GEMMA2:
        case Arch::GEMMA3:
        case Arch::SMOLLM3:
        case Arch::PHI3:
        case Arch::OLMO2:
        case Arch::GPT_OSS:
        case Arch::LFM2:
        case Arch::GEMMA3N:
        case Arch::DEEPSEEK_V2: need(false, "writing this family's config.json is not supported (kvlab reads these checkpoints only)"); break;
        case Arch::GPT2:
            need(c.qkv_bias && c.o_bias && c.mlp_bias, "gpt2 always has biases");
            need(c.num_kv_heads == c.num_heads && c.head_dim * c.num_heads == c.hidden_size,
                 "gpt2 has head_dim = n_embd / n_head and no grouped-query attention");
            need(c.sliding_window == 0 && c.rope_scaling.type.empty() && c.partial_rotary_factor == 1.0,
                 "gpt2 has learned positions: no sliding window, rope_scaling or partial_rotary_factor");
            break;
    }
    need(c.qk_norm == (c.arch == Arch::QWEN3), "q/k norm exists exactly in qwen3");
}

}  // namespace

std::string model_config_to_json(const ModelConfig& c) {
    c.validate(str("config.json for '", c.name, "'"));
    check_expressible(c);
    const ArchNames& n = names_of(c.arch);
    ojson j;
    j["architectures"] = ojson::array({n.architecture});
    j["model_type"] = n.model_type;
    if (c.arch == Arch::GPT2) {
        j["vocab_size"] = c.vocab_size;
        j["n_embd"] = c.hidden_size;
        j["n_layer"] = c.num_layers;
        j["n_head"] = c.num_heads;
        j["n_inner"] = c.intermediate_size;
        j["n_positions"] = c.max_position_embeddings;
        j["n_ctx"] = c.max_position_embeddings;
        j["layer_norm_epsilon"] = c.rms_norm_eps;
        j["activation_function"] = "gelu_new";
    } else {
        j["vocab_size"] = c.vocab_size;
        j["hidden_size"] = c.hidden_size;
        j["intermediate_size"] = c.intermediate_size;
        j["num_hidden_layers"] = c.num_layers;
        j["num_attention_heads"] = c.num_heads;
        j["num_key_value_heads"] = c.num_kv_heads;
        j["head_dim"] = c.head_dim;
        j["max_position_embeddings"] = c.max_position_embeddings;
        j["hidden_act"] = "silu";
        j["rms_norm_eps"] = c.rms_norm_eps;
        j["rope_theta"] = c.rope_theta;
        if (c.partial_rotary_factor != 1.0) j["partial_rotary_factor"] = c.partial_rotary_factor;
        if (c.rope_scaling.type.empty()) {
            j["rope_scaling"] = nullptr;
        } else {
            const RopeScaling& r = c.rope_scaling;
            ojson rs;
            rs["rope_type"] = r.type;
            if (r.type == "longrope") {
                rs["short_factor"] = r.short_factor;
                rs["long_factor"] = r.long_factor;
                if (r.attention_factor > 0) rs["attention_factor"] = r.attention_factor;
                rs["original_max_position_embeddings"] = r.original_max_position_embeddings;
            } else {
                rs["factor"] = r.factor;
            }
            if (r.type == "llama3") {
                rs["low_freq_factor"] = r.low_freq_factor;
                rs["high_freq_factor"] = r.high_freq_factor;
            }
            if (r.type == "llama3" || (r.type == "yarn" && r.original_max_position_embeddings > 0))
                rs["original_max_position_embeddings"] = r.original_max_position_embeddings;
            j["rope_scaling"] = rs;
        }
        if (c.arch == Arch::LLAMA || c.arch == Arch::QWEN3) j["attention_bias"] = c.qkv_bias;
        if (c.arch == Arch::LLAMA) j["mlp_bias"] = c.mlp_bias;
        if (c.arch == Arch::MISTRAL) {
            if (c.sliding_window > 0) j["sliding_window"] = c.sliding_window;
            else j["sliding_window"] = nullptr;
        }
        if (c.arch == Arch::QWEN2 || c.arch == Arch::QWEN3) {
            j["use_sliding_window"] = c.sliding_window > 0;
            if (c.sliding_window > 0) j["sliding_window"] = c.sliding_window;
            else j["sliding_window"] = nullptr;
            if (c.sliding_window > 0) j["max_window_layers"] = c.window_from_layer;
        }
    }
    j["tie_word_embeddings"] = c.tie_word_embeddings;
    j["torch_dtype"] = torch_dtype_name(c.dtype);
    write_token_ids(c, j);
    return j.dump(2) + "\n";
}

std::string generation_config_to_json(const ModelConfig& c) {
    ojson j = ojson::object();
    write_token_ids(c, j);
    return j.dump(2) + "\n";
}

}  // namespace kv
