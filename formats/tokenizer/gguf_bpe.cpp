// Byte-level BPE from GGUF vocabulary arrays (tokenizer.ggml.*): maps llama.cpp's pre-tokenizer
// names to the same pipeline stages tokenizer.json files describe. Facts per name (regexes,
// ignore_merges, BOS) follow llama.cpp's llama-vocab.cpp. Must not read files itself.
#include <algorithm>
#include <cstdio>
#include <set>

#include "bpe_tokenizer.h"
#include "engine/core/error.h"
#include "regex.h"
#include "special_ids.h"
#include "tokenizer.h"

namespace kv {

namespace {

// llama.cpp token types (tokenizer.ggml.token_type).
enum GgufTokenType : int32_t { GGUF_TOKEN_NORMAL = 1, GGUF_TOKEN_UNKNOWN = 2, GGUF_TOKEN_CONTROL = 3,
                               GGUF_TOKEN_USER_DEFINED = 4, GGUF_TOKEN_UNUSED = 5, GGUF_TOKEN_BYTE = 6 };

struct PreSpec {
    std::vector<std::string> isolated_splits;  // Split steps (Isolated) before ByteLevel
    bool byte_level_regex = false;             // ByteLevel runs the GPT-2 regex itself
    bool nfc = false;
    bool ignore_merges = false;
    bool add_bos = false;
};

bool one_of(const std::string& s, std::initializer_list<const char*> names) {
    for (const char* n : names)
        if (s == n) return true;
    return false;
}

PreSpec pre_spec(const std::string& name, const std::string& source) {
    PreSpec s;
    if (one_of(name, {"gpt2", "gpt-2", "phi-2", "jina-es", "jina-de", "jina-v2-es", "jina-v2-de", "gigachat", "mpt",
                      "olmo", "jais", "exaone4"})) {
        s.byte_level_regex = true;
    } else if (one_of(name, {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
                             "lfm2"})) {
        s.isolated_splits = {pretok_pattern::kLlama3};
        s.ignore_merges = true;
        s.add_bos = true;
    } else if (one_of(name, {"qwen2", "deepseek-r1-qwen", "megrez"})) {
        // Qwen's tokenizer.json normalizes to NFC first; llama.cpp skips that step, we keep it so
        // GGUF and tokenizer.json give the same ids.
        s.isolated_splits = {pretok_pattern::kQwen2};
        s.nfc = true;
    } else if (one_of(name, {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"})) {
        // Hugging Face: Digits(individual_digits) then ByteLevel(use_regex) — every digit alone.
        s.isolated_splits = {R"(\p{N})"};
        s.byte_level_regex = true;
    } else if (name == "default" || name.empty()) {
        // llama.cpp's fallback for BPE vocabularies: punctuation runs, GPT-2 words, digit runs,
        // then digit triples, each split in turn.
        s.isolated_splits = {R"([\p{P}\$\+<=>\^~\|]+)", pretok_pattern::kGpt2, R"(\p{N}+)", "[0-9][0-9][0-9]"};
    } else {
        throw Error(str(source, ": pre-tokenizer \"", name,
                        "\" (tokenizer.ggml.pre) is not supported (expected gpt2, gpt-2, llama-bpe, llama3, qwen2, "
                        "smollm, starcoder, default or a llama.cpp alias of these)"),
                    "re-convert the model with a llama.cpp that knows its tokenizer, or load its tokenizer.json");
    }
    return s;
}

}  // namespace

std::unique_ptr<Tokenizer> make_bpe_tokenizer(const std::vector<std::string>& tokens,
                                              const std::vector<std::string>& merges,
                                              const std::vector<int32_t>& token_types, int32_t bos, int32_t eos,
                                              int32_t pad, const std::string& pre_tokenizer_name,
                                              std::optional<bool> add_bos, std::optional<bool> add_eos,
                                              const std::string& source) {
    const int32_t n = int32_t(tokens.size());
    if (n == 0) throw Error(str(source, ": tokenizer.ggml.tokens is empty (expected the vocabulary)"));
    if (!token_types.empty() && token_types.size() != tokens.size())
        throw Error(str(source, ": tokenizer.ggml.token_type has ", token_types.size(), " entries for ", tokens.size(),
                        " tokens (expected one type per token)"));
    for (auto [what, id] : {std::pair<const char*, int32_t>{"bos", bos}, {"eos", eos}, {"padding", pad}}) {
        if (id < -1 || id >= n)
            throw Error(str(source, ": tokenizer.ggml.", what, "_token_id ", id, " is out of range (expected -1..",
                            n - 1, ")"));
    }
    const PreSpec spec = pre_spec(pre_tokenizer_name, source);

    std::vector<std::pair<std::string, std::string>> pairs;
    pairs.reserve(merges.size());
    for (size_t i = 0; i < merges.size(); ++i) {
        const std::string& m = merges[i];
        const size_t sp = m.find(' ', 1);
        if (sp == std::string::npos || sp + 1 >= m.size())
            throw Error(str(source, ": tokenizer.ggml.merges[", i, "] \"", m,
                            "\" is not two tokens separated by a space"));
        pairs.emplace_back(m.substr(0, sp), m.substr(sp + 1));
    }

    BpePipeline p;
    p.source = source;
    BpeOptions opt;
    opt.ignore_merges = spec.ignore_merges;
    for (int32_t i = 0; i < n; ++i) {
        const int32_t type = token_types.empty() ? GGUF_TOKEN_NORMAL : token_types[size_t(i)];
        if (type == GGUF_TOKEN_BYTE) opt.byte_fallback = true;
        if (type == GGUF_TOKEN_UNKNOWN && opt.unk_token.empty()) opt.unk_token = tokens[size_t(i)];
        if ((type == GGUF_TOKEN_CONTROL || type == GGUF_TOKEN_USER_DEFINED) && !tokens[size_t(i)].empty()) {
            // Stored as plain text (not byte-mapped) by convert_hf_to_gguf; matched on the raw input.
            AddedToken t;
            t.content = tokens[size_t(i)];
            t.id = i;
            t.special = type == GGUF_TOKEN_CONTROL;
            p.added.push_back(std::move(t));
        }
    }
    p.model = std::make_unique<BpeModel>(tokens, pairs, opt, source);

    if (spec.nfc) p.normalizer.add(NormStep{NormKind::NFC, {}, {}, nullptr, false, false});
    for (const std::string& pat : spec.isolated_splits) {
        PreTokStep s;
        s.kind = PreTokKind::SPLIT;
        s.regex = shared_regex(pat);
        p.pre.add(std::move(s));
    }
    PreTokStep bl;
    bl.kind = PreTokKind::BYTE_LEVEL;
    if (spec.byte_level_regex) bl.regex = shared_regex(pretok_pattern::kGpt2);
    p.pre.add(std::move(bl));
    p.decoder.add(DecoderStep{});  // ByteLevel

    const bool with_bos = add_bos.value_or(spec.add_bos);
    const bool with_eos = add_eos.value_or(false);
    if (with_bos && bos < 0)
        throw Error(str(source, ": add_bos_token is set but tokenizer.ggml.bos_token_id is missing"));
    if (with_eos && eos < 0)
        throw Error(str(source, ": add_eos_token is set but tokenizer.ggml.eos_token_id is missing"));
    if (with_bos) p.post.prefix.push_back(bos);
    if (with_eos) p.post.suffix.push_back(eos);

    p.bos = bos;
    p.pad = pad;
    if (eos >= 0) p.eos.push_back(eos);
    // Like llama.cpp's end-of-generation set: chat end markers among the control tokens also stop.
    for (const AddedToken& t : p.added) {
        if (!t.special || std::find(p.eos.begin(), p.eos.end(), t.id) != p.eos.end()) continue;
        for (std::string_view name : kEndOfGenerationNames)
            if (t.content == name) p.eos.push_back(t.id);
    }
    return std::make_unique<BpeTokenizer>(std::move(p));
}

}  // namespace kv
