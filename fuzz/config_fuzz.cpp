// libFuzzer target for config.json / generation_config.json parsing: any text must give a
// valid ModelConfig or a kv::Error; an accepted config must survive our writer and reader
// unchanged. Strings only — no files, no tensors (formats/io/hf_config.h).
// fuzz-sources: formats/io/hf_config.cpp formats/io/json_strict.cpp engine/core/error.cpp
#include <cstdint>
#include <cstdlib>
#include <string>

#include "engine/core/error.h"
#include "formats/io/hf_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::string text(reinterpret_cast<const char*>(data), size);
    try {
        kv::ModelConfig c = kv::parse_model_config(text, "fuzz/config.json");
        std::string written = kv::model_config_to_json(c);
        kv::ModelConfig again = kv::parse_model_config(written, "fuzz/rewritten.json");
        if (kv::model_config_to_json(again) != written) std::abort();
        kv::apply_generation_config(text, "fuzz/generation_config.json", c);
    } catch (const kv::Error&) {
    }
    return 0;
}
