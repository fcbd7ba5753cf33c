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

}  // namespace

ModelConfig gguf_model_config(const GgufFile& f) { return gguf_model_config(f, gguf_tokenizer_data(f)); }

ModelConfig gguf_model_config(const GgufFile& f, const GgufTokenizerData& tok) {
    const std::string arch = f.get("general.architecture").as_string(f.what("general.architecture"));
    ModelConfig c;
    if (arch == "llama") {
        c.arch = Arch::LLAMA;
    } else if (arch == "qwen2") {
        c.arch = Arch::QWEN2;
    } else {
        throw Error(str(f.source, ": architecture '", arch, "' is not supported from GGUF, expected llama or qwen2"));
    }
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
    c.validate(f.source);
    return c;
}

}  // namespace kv
