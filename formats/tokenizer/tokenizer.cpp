// load_tokenizer: picks the loader for a model folder or file. Must not parse tokenizer formats
// itself (hf_tokenizer_json.cpp, sentencepiece_tokenizer.cpp, gguf_bpe.cpp do).
#include "tokenizer.h"

#include <filesystem>
#include <fstream>

#include "engine/core/error.h"

namespace kv {

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
    namespace fs = std::filesystem;
    const char* hint = "expected a model folder containing tokenizer.json or tokenizer.model, or one of those files";
    std::error_code ec;
    if (!fs::exists(path, ec)) throw Error(str("tokenizer: '", path, "' does not exist"), hint);
    if (fs::is_directory(path, ec)) {
        const fs::path dir(path);
        if (fs::is_regular_file(dir / "tokenizer.json", ec)) return load_tokenizer_json((dir / "tokenizer.json").string());
        if (fs::is_regular_file(dir / "tokenizer.model", ec))
            return load_sentencepiece((dir / "tokenizer.model").string());
        throw Error(str(path, ": no tokenizer.json or tokenizer.model in this folder"), hint);
    }
    const std::string ext = fs::path(path).extension().string();
    if (ext == ".json") return load_tokenizer_json(path);
    if (ext == ".model") return load_sentencepiece(path);
    // Unknown extension: JSON starts with '{' (after whitespace); anything else is tried as a
    // SentencePiece protobuf, whose loader names the file if it is not one.
    std::ifstream f(path, std::ios::binary);
    char c = 0;
    while (f.get(c) && (c == ' ' || c == '\n' || c == '\r' || c == '\t')) {
    }
    if (f && c == '{') return load_tokenizer_json(path);
    return load_sentencepiece(path);
}

}  // namespace kv
