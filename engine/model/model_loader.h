// One entry point from a model name to a runnable model and its tokenizer: a preset (random
// weights, byte tokenizer), a Hugging Face folder (config.json + safetensors + tokenizer), a
// GGUF file, or the name smollm2-135m (the GGUF the setup script fetched). Every failure is
// one kv::Error naming what was looked for and where.
#pragma once

#include <memory>
#include <string>

#include "formats/tokenizer/tokenizer.h"
#include "transformer.h"

namespace kv {

struct LoadedModel {
    ModelConfig config;
    std::unique_ptr<Transformer> model;
    std::unique_ptr<Tokenizer> tokenizer;  // never null: presets use the byte tokenizer
    std::string source;                    // "preset tiny", a folder or file path
};

LoadedModel load_model(const std::string& name_or_path, const ModelOptions& opt, uint64_t seed = 0);

// Where kvlab looks for downloaded assets: $KVLAB_ASSETS, else assets/cache in the source
// tree it was built from, else (installed) $XDG_DATA_HOME/kvlab/assets or
// ~/.local/share/kvlab/assets.
std::string asset_cache_dir();
// How to fetch the assets into asset_cache_dir() (the source tree's setup script, or the
// installed share/kvlab/fetch_assets.sh).
std::string asset_fetch_hint();

}  // namespace kv
