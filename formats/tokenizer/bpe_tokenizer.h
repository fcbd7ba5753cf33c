// The BPE tokenizer pipeline shared by tokenizer.json and GGUF vocabularies:
// added tokens -> normalizer -> added tokens (normalized) -> pre-tokenizer -> BPE model ->
// post-processor; decoding runs the decoder chain. Loaders fill a BpePipeline; this file must not
// parse files itself.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "added_tokens.h"
#include "bpe_model.h"
#include "normalizer.h"
#include "pre_tokenizer.h"
#include "token_decoder.h"
#include "tokenizer.h"

namespace kv {

// Ids wrapped around a single sequence when add_special_tokens is set (TemplateProcessing's
// "single" template, RobertaProcessing's cls/sep).
struct PostProcessor {
    std::vector<int32_t> prefix, suffix;
};

struct BpePipeline {
    std::string source;  // file named in messages
    std::unique_ptr<BpeModel> model;
    std::vector<AddedToken> added;
    Normalizer normalizer;
    PreTokenizer pre;
    PostProcessor post;
    TokenDecoder decoder;
    int32_t bos = -1, pad = -1;
    std::vector<int32_t> eos;
};

class BpeTokenizer final : public Tokenizer {
   public:
    explicit BpeTokenizer(BpePipeline p);
    // The added-token matchers point into p_: never copied or moved.
    BpeTokenizer(const BpeTokenizer&) = delete;
    BpeTokenizer& operator=(const BpeTokenizer&) = delete;

    std::string token_to_piece(int32_t id) const override;
    int32_t token_id(const std::string& piece) const override;
    int32_t vocab_size() const override { return vocab_size_; }
    int32_t bos_id() const override { return p_.bos; }
    const std::vector<int32_t>& eos_ids() const override { return p_.eos; }
    int32_t pad_id() const override { return p_.pad; }
    bool is_special(int32_t id) const override;
    std::string kind() const override { return "bpe"; }

   protected:
    std::vector<int32_t> encode_impl(const std::string& text, bool add_special_tokens,
                                     bool parse_special) const override;
    std::string decode_impl(const std::vector<int32_t>& ids, bool skip_special_tokens) const override;

   private:
    enum class Alphabet : uint8_t { PLAIN, BYTE_LEVEL, METASPACE };
    void encode_text(std::string_view text, bool at_start, bool parse_special, std::vector<int32_t>& out) const;
    DecodePiece piece_of(int32_t id) const;

    BpePipeline p_;
    std::vector<AddedToken> added_normalized_;  // `added` with normalized contents (second pass)
    AddedTokenMatcher raw_matcher_, norm_matcher_;
    std::unordered_map<std::string, int32_t> added_by_content_;
    std::vector<int32_t> added_index_;  // id -> index into p_.added, -1 if not an added token
    int32_t vocab_size_ = 0;
    Alphabet alphabet_ = Alphabet::PLAIN;
    std::string metaspace_char_;
};

}  // namespace kv
