// Extraction of tokenizer.ggml.* metadata. Pure (no tensors, no files), so the fuzz target runs it
// on every parsed input.
#include "formats/gguf/gguf_tokenizer_data.h"

#include "engine/core/error.h"

namespace kv {

GgufTokenizerData gguf_tokenizer_data(const GgufFile& f) {
    GgufTokenizerData t;
    auto opt_string = [&](const char* key, std::string& out) {
        if (const GgufValue* v = f.find(key)) out = v->as_string(f.what(key));
    };
    opt_string("tokenizer.ggml.model", t.model);
    opt_string("tokenizer.ggml.pre", t.pre);
    opt_string("tokenizer.chat_template", t.chat_template);
    if (const GgufValue* v = f.find("tokenizer.ggml.tokens")) t.tokens = v->as_string_array(f.what("tokenizer.ggml.tokens"));
    if (const GgufValue* v = f.find("tokenizer.ggml.merges")) t.merges = v->as_string_array(f.what("tokenizer.ggml.merges"));
    const int64_t n = int64_t(t.tokens.size());

    if (const GgufValue* v = f.find("tokenizer.ggml.scores")) {
        const std::string key = "tokenizer.ggml.scores";
        std::vector<double> s = v->as_float_array(f.what(key));
        if (int64_t(s.size()) != n)
            throw Error(str(f.what(key), " has ", s.size(), " entries, expected one per token (", n, ")"));
        t.scores.assign(s.begin(), s.end());
    }
    if (const GgufValue* v = f.find("tokenizer.ggml.token_type")) {
        const std::string key = "tokenizer.ggml.token_type";
        std::vector<int64_t> s = v->as_int_array(f.what(key));
        if (int64_t(s.size()) != n)
            throw Error(str(f.what(key), " has ", s.size(), " entries, expected one per token (", n, ")"));
        t.token_types.reserve(s.size());
        for (size_t i = 0; i < s.size(); ++i) {
            if (s[i] < 0 || s[i] > 6)
                throw Error(str(f.what(key), " entry ", i, " is ", s[i], ", expected a token type in 0..6"));
            t.token_types.push_back(int32_t(s[i]));
        }
    }
    auto opt_id = [&](const char* key, int64_t& out) {
        const GgufValue* v = f.find(key);
        if (!v) return;
        int64_t id = v->as_int(f.what(key));
        if (id < 0 || id >= n) throw Error(str(f.what(key), " is ", id, ", expected a token id in [0, ", n, ")"));
        out = id;
    };
    opt_id("tokenizer.ggml.bos_token_id", t.bos_id);
    opt_id("tokenizer.ggml.eos_token_id", t.eos_id);
    opt_id("tokenizer.ggml.unknown_token_id", t.unk_id);
    opt_id("tokenizer.ggml.padding_token_id", t.pad_id);
    if (const GgufValue* v = f.find("tokenizer.ggml.add_bos_token"))
        t.add_bos_token = v->as_bool(f.what("tokenizer.ggml.add_bos_token"));
    if (const GgufValue* v = f.find("tokenizer.ggml.add_eos_token"))
        t.add_eos_token = v->as_bool(f.what("tokenizer.ggml.add_eos_token"));
    return t;
}

}  // namespace kv
