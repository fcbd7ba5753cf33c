// load_gguf_model: reader + config + names + shape checks + Q/K un-permutation. All checks run
// before any tensor is converted, so a bad file fails fast and allocates nothing.
#include "engine/gguf/gguf_model.h"

#include <cstring>
#include <map>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/weight_check.h"
#include "engine/gguf/gguf_config.h"
#include "engine/gguf/gguf_dequant.h"
#include "engine/gguf/gguf_names.h"
#include "engine/gguf/gguf_reader.h"
#include "engine/gguf/gguf_rope_permute.h"

namespace kv {

namespace {

std::string shape_text(const std::vector<int64_t>& s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i) out += str(i ? ", " : "", s[i]);
    return out + "]";
}

bool ends_with(const std::string& s, const char* suffix) {
    size_t n = std::strlen(suffix);
    return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

// HF name -> expected PyTorch shape, from the config.
std::map<std::string, std::vector<int64_t>> expected_shapes(const ModelConfig& c) {
    const int64_t E = c.hidden_size, Q = c.q_dim(), KV = c.kv_dim(), I = c.intermediate_size, V = c.vocab_size;
    std::map<std::string, std::vector<int64_t>> s;
    s["model.embed_tokens.weight"] = {V, E};
    s["model.norm.weight"] = {E};
    if (!c.tie_word_embeddings) s["lm_head.weight"] = {V, E};
    for (int64_t l = 0; l < c.num_layers; ++l) {
        const std::string p = "model.layers." + std::to_string(l) + ".";
        s[p + "self_attn.q_proj.weight"] = {Q, E};
        s[p + "self_attn.k_proj.weight"] = {KV, E};
        s[p + "self_attn.v_proj.weight"] = {KV, E};
        s[p + "self_attn.o_proj.weight"] = {E, Q};
        s[p + "mlp.gate_proj.weight"] = {I, E};
        s[p + "mlp.up_proj.weight"] = {I, E};
        s[p + "mlp.down_proj.weight"] = {E, I};
        s[p + "input_layernorm.weight"] = {E};
        s[p + "post_attention_layernorm.weight"] = {E};
        if (c.qkv_bias) {
            s[p + "self_attn.q_proj.bias"] = {Q};
            s[p + "self_attn.k_proj.bias"] = {KV};
            s[p + "self_attn.v_proj.bias"] = {KV};
        }
    }
    return s;
}

// Reorders the elements of a 1-D tensor in place: element r moves to map[r].
void permute_elements(Tensor& t, const std::vector<int64_t>& map) {
    const size_t es = size_t(dtype_size(t.dtype()));
    std::vector<uint8_t> tmp(t.nbytes());
    const uint8_t* src = static_cast<const uint8_t*>(t.data_ptr());
    for (size_t r = 0; r < map.size(); ++r) std::memcpy(tmp.data() + size_t(map[r]) * es, src + r * es, es);
    std::memcpy(t.data_ptr(), tmp.data(), tmp.size());
}

}  // namespace

GgufModel load_gguf_model(const std::string& path, const GgufLoadOptions& opt) {
    if (opt.dtype != DType::F32 && opt.dtype != DType::BF16)
        throw Error(str(path, ": GGUF models load as f32 or bf16, not dtype ", int(opt.dtype)));
    GgufReader reader(path);
    const GgufFile& f = reader.file();
    GgufModel m;
    m.tokenizer = gguf_tokenizer_data(f);
    m.config = gguf_model_config(f, m.tokenizer);
    ModelConfig& c = m.config;
    c.dtype = opt.dtype;
    if (c.name.empty()) {
        size_t slash = path.find_last_of('/');
        c.name = slash == std::string::npos ? path : path.substr(slash + 1);
    }

    // ---- names: every tensor must belong to the layout --------------------------------------
    struct Item {
        const GgufTensorInfo* info;
        std::string hf;
    };
    std::vector<Item> items;
    for (const GgufTensorInfo& t : f.tensors) {
        GgufHfName n = gguf_to_hf_name(t.name);
        if (n.hf.empty())
            throw Error(str(f.source, ": tensor '", t.name, "' is not part of the ", c.model_type,
                            " layout kvlab loads, expected token_embd, output_norm, output or blk.N.{attn_q, attn_k, "
                            "attn_v, attn_output, ffn_gate, ffn_up, ffn_down, attn_norm, ffn_norm} (.weight/.bias)"));
        if (n.layer >= c.num_layers)
            throw Error(str(f.source, ": tensor '", t.name, "' belongs to layer ", n.layer, " but ", c.model_type,
                            ".block_count is ", c.num_layers));
        items.push_back({&t, n.hf});
    }

    // ---- facts that depend on which tensors exist --------------------------------------------
    const GgufTensorInfo* emb = f.find_tensor("token_embd.weight");
    if (!emb) throw Error(str(f.source, ": tensor 'token_embd.weight' is missing"));
    if (emb->n_dims == 2 && emb->ne[1] != c.vocab_size) {
        // Embeddings may be padded beyond the token list; never shorter than it.
        if (emb->ne[1] < c.vocab_size)
            throw Error(str(f.source, ": token_embd.weight has ", emb->ne[1], " rows but the vocabulary has ",
                            c.vocab_size, " tokens, expected at least one row per token"));
        c.vocab_size = emb->ne[1];
    }
    c.tie_word_embeddings = f.find_tensor("output.weight") == nullptr;
    c.qkv_bias = f.find_tensor("blk.0.attn_q.bias") != nullptr;

    // ---- shapes -----------------------------------------------------------------------------
    std::map<std::string, std::vector<int64_t>> want = expected_shapes(c);
    for (const Item& it : items) {
        auto w = want.find(it.hf);
        if (w == want.end())
            throw Error(str(f.source, ": tensor '", it.info->name, "' (", it.hf, ") is not expected in a ", c.model_type,
                            " model with these settings (qkv_bias ", c.qkv_bias ? "on" : "off", ")"));
        std::vector<int64_t> got = it.info->torch_shape();
        if (got != w->second)
            throw Error(str(f.source, ": tensor '", it.info->name, "' (", it.hf, ") has shape ", shape_text(got),
                            " (ggml ", it.info->shape_str(), "), expected ", shape_text(w->second), " from the metadata"));
        if (!gguf_can_dequantize(it.info->type))
            throw Error(str(f.source, ": tensor '", it.info->name, "' has ggml type ", ggml_type_name(it.info->type),
                            ", which kvlab cannot dequantize; supported: ", ggml_dequantizable_type_list()));
        want.erase(w);
    }
    if (!want.empty()) {
        std::string missing;
        int shown = 0;
        for (const auto& [name, shape] : want) {
            if (shown++ == 3) { missing += ", ..."; break; }
            missing += str(shown > 1 ? ", " : "", hf_to_gguf_name(name), " (", name, ")");
        }
        throw Error(str(f.source, ": ", want.size(), " tensor(s) of the ", c.model_type, " layout are missing: ", missing));
    }

    // ---- load (one batch: one parallel region for the whole model) -------------------------
    // llama.cpp permutes Q/K rows only for architectures it runs with interleaved ("normal")
    // RoPE: llama yes, qwen2 (NeoX RoPE) no.
    const bool unpermute = c.arch == Arch::LLAMA;
    std::vector<GgufLoadJob> jobs(items.size());
    std::vector<std::vector<int64_t>> bias_maps(items.size());  // 1-D q/k biases: permuted after loading
    for (size_t i = 0; i < items.size(); ++i) {
        const Item& it = items[i];
        GgufLoadJob& job = jobs[i];
        job.info = it.info;
        job.dtype = opt.dtype;
        job.zero_copy = opt.zero_copy;
        const bool is_q = ends_with(it.hf, "self_attn.q_proj.weight") || ends_with(it.hf, "self_attn.q_proj.bias");
        const bool is_k = ends_with(it.hf, "self_attn.k_proj.weight") || ends_with(it.hf, "self_attn.k_proj.bias");
        if (!unpermute || !(is_q || is_k)) continue;
        const int64_t heads = is_q ? c.num_heads : c.num_kv_heads;
        const std::string what = str(f.source, ": tensor '", it.info->name, "'");
        job.zero_copy = false;
        if (it.info->n_dims == 1)
            bias_maps[i] = gguf_unpermute_rows(it.info->ne[0], heads, what);
        else
            job.row_map = gguf_unpermute_rows(it.info->n_rows(), heads, what);
    }
    std::vector<Tensor> loaded = reader.load_batch(jobs);
    for (size_t i = 0; i < items.size(); ++i) {
        if (!bias_maps[i].empty()) permute_elements(loaded[i], bias_maps[i]);
        m.tensors[items[i].hf] = std::move(loaded[i]);
    }
    m.qk_unpermuted = unpermute;
    c.validate(f.source);
    // Every block scale went into the dequantized values: a NaN/Inf scale or weight shows here.
    m.weight_check = check_weights(m.tensors, f.source);
    return m;
}

}  // namespace kv
