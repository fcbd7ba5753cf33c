// Hugging Face folder loading and writing (see hf_folder.h): file discovery and glue only;
// the formats live in hf_config, safetensors_* and weight_names.
#include "formats/io/hf_folder.h"

#include <filesystem>

#include "engine/core/error.h"
#include "formats/io/file_util.h"
#include "formats/io/hf_config.h"
#include "formats/io/safetensors_index.h"
#include "formats/io/safetensors_write.h"
#include "formats/io/weight_names.h"

namespace kv {

namespace fs = std::filesystem;

namespace {
std::string join(const std::string& dir, const char* name) { return (fs::path(dir) / name).string(); }

// Some GPT-2 repositories keep the module prefix; the table uses the bare names of
// openai-community/gpt2's model.safetensors.
void strip_gpt2_prefix(TensorMap& weights) {
    const std::string prefix = "transformer.";
    TensorMap out;
    for (auto& [name, t] : weights) {
        std::string bare = name.rfind(prefix, 0) == 0 ? name.substr(prefix.size()) : name;
        if (out.count(bare)) throw Error(str("weights contain both '", bare, "' and '", prefix, bare, "'"));
        out[bare] = std::move(t);
    }
    weights = std::move(out);
}
// LFM2 checkpoints name the parts kvlab shares with Llama differently (Lfm2DecoderLayer's
// operator_norm / ffn_norm, feed_forward.w1/w3/w2, self_attn.out_proj, q_layernorm /
// k_layernorm, the final model.embedding_norm); they are renamed to the Llama names the weight
// table and the model use. The convolution's own tensors (conv.*) keep their names.
void rename_lfm2_weights(TensorMap& weights) {
    static const std::pair<const char*, const char*> kSuffixes[] = {
        {".operator_norm.weight", ".input_layernorm.weight"},   {".ffn_norm.weight", ".post_attention_layernorm.weight"},
        {".feed_forward.w1.weight", ".mlp.gate_proj.weight"},   {".feed_forward.w3.weight", ".mlp.up_proj.weight"},
        {".feed_forward.w2.weight", ".mlp.down_proj.weight"},   {".self_attn.out_proj.weight", ".self_attn.o_proj.weight"},
        {".self_attn.q_layernorm.weight", ".self_attn.q_norm.weight"}, {".self_attn.k_layernorm.weight", ".self_attn.k_norm.weight"},
    };
    TensorMap out;
    for (auto& [name, t] : weights) {
        std::string to = name == "model.embedding_norm.weight" ? "model.norm.weight" : name;
        for (const auto& [from, repl] : kSuffixes) {
            const size_t n = std::char_traits<char>::length(from);
            if (name.size() > n && name.compare(name.size() - n, n, from) == 0) to = name.substr(0, name.size() - n) + repl;
        }
        if (out.count(to)) throw Error(str("weights contain both '", to, "' and its LFM2 name '", name, "'"));
        out[to] = std::move(t);
    }
    weights = std::move(out);
}
// Gemma 3n's multimodal checkpoints (Gemma3nForConditionalGeneration) keep the text decoder under
// model.language_model. (transformers' _checkpoint_conversion_mapping for Gemma3nForCausalLM
// maps it to model.); the vision and audio towers and their embedders are not read.
void select_gemma3n_text_weights(TensorMap& weights) {
    const std::string prefix = "model.language_model.";
    bool nested = false;
    for (const auto& [name, t] : weights) nested = nested || name.rfind(prefix, 0) == 0;
    if (!nested) return;
    TensorMap out;
    for (auto& [name, t] : weights)
        if (name.rfind(prefix, 0) == 0) out["model." + name.substr(prefix.size())] = std::move(t);
        else if (name == "lm_head.weight") out[name] = std::move(t);
    weights = std::move(out);
}
}  // namespace

ModelConfig read_hf_model_config(const std::string& dir) {
    std::string cfg_path = join(dir, "config.json");
    if (!is_regular_file(cfg_path))
        throw Error(str(dir, ": no config.json; expected a Hugging Face model folder (config.json, model.safetensors, tokenizer.json)"));
    ModelConfig cfg = parse_model_config(read_text_file(cfg_path, "config.json"), cfg_path);
    std::string gen_path = join(dir, "generation_config.json");
    if (is_regular_file(gen_path)) apply_generation_config(read_text_file(gen_path, "generation_config.json"), gen_path, cfg);
    cfg.name = fs::path(dir).lexically_normal().filename().string();
    if (cfg.name.empty()) cfg.name = fs::path(dir).lexically_normal().parent_path().filename().string();
    return cfg;
}

HfModelFolder load_hf_model_folder(const std::string& dir) {
    HfModelFolder f;
    f.config = read_hf_model_config(dir);

    // transformers' order: a single file wins over an index.
    std::string single = join(dir, "model.safetensors"), index = join(dir, "model.safetensors.index.json");
    std::string source;
    if (is_regular_file(single)) {
        f.weights = load_safetensors(single).tensors;
        source = single;
    } else if (is_regular_file(index)) {
        f.weights = load_safetensors_sharded(index).tensors;
        source = index;
    } else {
        throw Error(str(dir, ": no model.safetensors or model.safetensors.index.json; expected safetensors weights",
                        " (PyTorch .bin checkpoints are not read)"));
    }
    if (f.config.arch == Arch::GPT2 || f.config.arch == Arch::LFM2) {
        try {
            if (f.config.arch == Arch::GPT2) strip_gpt2_prefix(f.weights);
            else rename_lfm2_weights(f.weights);
        } catch (const Error& e) {
            throw Error(str(source, ": ", e.what()));
        }
    }
    if (f.config.arch == Arch::GEMMA3N) select_gemma3n_text_weights(f.weights);
    require_weights(f.config, f.weights, source);

    for (const char* tok : {"tokenizer.json", "tokenizer.model"}) {
        std::string p = join(dir, tok);
        if (is_regular_file(p)) {
            f.tokenizer_path = p;
            break;
        }
    }
    return f;
}

void write_hf_model_config(const std::string& dir, const ModelConfig& cfg) {
    std::string config_text = model_config_to_json(cfg), gen_text = generation_config_to_json(cfg);
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw Error(str(dir, ": cannot create the model folder: ", ec.message()));
    write_file_atomic(join(dir, "config.json"), config_text);
    write_file_atomic(join(dir, "generation_config.json"), gen_text);
}

void write_hf_model_folder(const std::string& dir, const ModelConfig& cfg, const TensorMap& weights) {
    require_weights(cfg, weights, str(dir, " (writing)"));
    write_hf_model_config(dir, cfg);
    write_safetensors(join(dir, "model.safetensors"), weights);
}

}  // namespace kv
