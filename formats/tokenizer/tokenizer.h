// The tokenizer interface the engine, data loaders and generation use, and the factories that
// build one: a Hugging Face model folder or file (tokenizer.json byte-level BPE, tokenizer.model
// SentencePiece) or the raw vocabulary arrays of a GGUF file. Errors are kv::Error naming the
// file and the problem. Must not know about models, tensors or the KV cache.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kv {

class Tokenizer {
   public:
    virtual ~Tokenizer() = default;

    // ---- encoding / decoding --------------------------------------------------------------
    // Text -> ids. `add_special_tokens`: apply the post-processor (e.g. Llama 3's BOS).
    // `parse_special`: text such as "<|im_end|>" becomes its special id; false treats special
    // tokens' text as ordinary text (for untrusted data). Non-special added tokens always match.
    std::vector<int32_t> encode(const std::string& text, bool add_special_tokens = true,
                                bool parse_special = true) const {
        return encode_impl(text, add_special_tokens, parse_special);
    }
    // Ids -> text (raw bytes; exact inverse of encode for byte-level BPE, even for invalid
    // UTF-8). Throws kv::Error on an id outside [0, vocab_size()).
    std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const {
        return decode_impl(ids, skip_special_tokens);
    }
    // The text one token stands for ("Ġworld" -> " world"; "<0x0A>" -> "\n"), with its leading
    // space kept: what llama.cpp calls a piece. May be an incomplete UTF-8 sequence.
    virtual std::string token_to_piece(int32_t id) const = 0;
    // The id whose piece is exactly `piece` (token_id(" A") finds "ĠA"), or -1. Added tokens match
    // their content. For class-label tokens such as "A".."D".
    virtual int32_t token_id(const std::string& piece) const = 0;

    // ---- vocabulary ------------------------------------------------------------------------
    virtual int32_t vocab_size() const = 0;  // highest id + 1
    virtual int32_t bos_id() const = 0;      // -1 if none
    virtual const std::vector<int32_t>& eos_ids() const = 0;  // end-of-generation ids, primary first
    int32_t eos_id() const { return eos_ids().empty() ? -1 : eos_ids().front(); }
    virtual int32_t pad_id() const = 0;      // -1 if none
    virtual bool is_special(int32_t id) const = 0;  // control tokens (skipped by skip_special_tokens)
    // "bpe", "sentencepiece": for messages and the UI.
    virtual std::string kind() const = 0;

   protected:
    virtual std::vector<int32_t> encode_impl(const std::string& text, bool add_special_tokens,
                                             bool parse_special) const = 0;
    virtual std::string decode_impl(const std::vector<int32_t>& ids, bool skip_special_tokens) const = 0;
};

// A model folder (tokenizer.json preferred, else tokenizer.model) or a file. Next to
// tokenizer.json, tokenizer_config.json / generation_config.json / config.json supply the
// BOS/EOS/PAD ids (tokenizer.json itself does not name them).
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

// A Hugging Face tokenizer.json file (model type BPE); side files are read from its folder.
std::unique_ptr<Tokenizer> load_tokenizer_json(const std::string& json_path);

// tokenizer.json content already in memory (fuzzing, embedded files); `source` names it in
// errors. No side files are read, so BOS/EOS come from the template and well-known names.
std::unique_ptr<Tokenizer> parse_tokenizer_json(const std::string& text, const std::string& source);

// A SentencePiece model file; tokenizer_config.json beside it may set add_bos_token/add_eos_token.
std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& model_path);

// Byte-level BPE from a GGUF vocabulary (tokenizer.ggml.model == "gpt2"):
//   tokens       tokenizer.ggml.tokens (byte-level unicode-mapped strings, index = id)
//   merges       tokenizer.ggml.merges ("a b", rank order)
//   token_types  tokenizer.ggml.token_type (llama.cpp: 1 normal, 2 unknown, 3 control,
//                4 user-defined, 5 unused, 6 byte); empty = all normal. Control and user-defined
//                tokens are matched in the text before pre-tokenization; control ones are special.
//   bos/eos/pad  tokenizer.ggml.{bos,eos,padding}_token_id, -1 if absent
//   pre_tokenizer_name  tokenizer.ggml.pre: "gpt2"/"gpt-2", "llama-bpe"/"llama3", "qwen2",
//                "smollm", "default" and their llama.cpp aliases; anything else is a kv::Error.
//   add_bos/add_eos  tokenizer.ggml.add_bos_token / add_eos_token when present; otherwise the
//                llama.cpp default for the pre-tokenizer (BOS for llama3, nothing else).
// `source` names the file in error messages.
std::unique_ptr<Tokenizer> make_bpe_tokenizer(const std::vector<std::string>& tokens,
                                              const std::vector<std::string>& merges,
                                              const std::vector<int32_t>& token_types, int32_t bos, int32_t eos,
                                              int32_t pad, const std::string& pre_tokenizer_name,
                                              std::optional<bool> add_bos = std::nullopt,
                                              std::optional<bool> add_eos = std::nullopt,
                                              const std::string& source = "GGUF vocabulary");

}  // namespace kv
