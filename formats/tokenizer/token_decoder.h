// Decoders (Hugging Face `decoder`): turn the token strings of a sequence back into text.
// ByteLevel maps characters back to bytes; Metaspace/Replace/Strip undo SentencePiece-style
// spacing; ByteFallback turns <0xNN> tokens into bytes; Fuse joins. Output is raw bytes: an
// incomplete UTF-8 sequence is kept as is (the stream decoder relies on that). Added tokens are
// literal text and bypass the byte mapping. Must not look at ids or vocabularies.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace kv {

enum class DecoderKind : uint8_t { BYTE_LEVEL, METASPACE, REPLACE, BYTE_FALLBACK, FUSE, STRIP };

struct DecoderStep {
    DecoderKind kind = DecoderKind::BYTE_LEVEL;
    std::string from, to;  // REPLACE: literal pattern and its replacement
    std::string replacement = "\xE2\x96\x81";  // METASPACE character
    bool prepend = true;       // METASPACE: the encoder prepended it, so the first token loses one space
    std::string strip_content = " ";  // STRIP: the character removed
    int strip_start = 0, strip_stop = 0;
};

struct DecodePiece {
    std::string text;
    bool literal = false;  // an added token's content: not byte-mapped
};

class TokenDecoder {
   public:
    void add(DecoderStep s) { steps_.push_back(std::move(s)); }
    bool empty() const { return steps_.empty(); }
    bool has(DecoderKind k) const;

    // Joins the pieces of one sequence into text. `mid_sequence`: the pieces do not start the
    // sequence (token_to_piece), so start-of-text space stripping (Metaspace, Strip) is skipped.
    // With no steps the pieces are joined with spaces, as Hugging Face does without a decoder.
    std::string decode(std::vector<DecodePiece> pieces, bool mid_sequence = false) const;

   private:
    std::vector<DecoderStep> steps_;
};

}  // namespace kv
