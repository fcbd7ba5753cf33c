// The BPE pipeline: runs the stages a BpePipeline describes, in Hugging Face's order. Must not
// parse files; thread-safe for concurrent encode/decode (only the model's word cache mutates).
#include "bpe_tokenizer.h"

#include <algorithm>
#include <cstdio>

#include "byte_level.h"
#include "engine/core/error.h"

namespace kv {

BpeTokenizer::BpeTokenizer(BpePipeline p) : p_(std::move(p)) {
    int32_t max_id = p_.model->max_id();
    for (const AddedToken& t : p_.added) max_id = std::max(max_id, t.id);
    vocab_size_ = max_id + 1;
    added_index_.assign(size_t(vocab_size_), -1);
    for (size_t i = 0; i < p_.added.size(); ++i) {
        added_index_[size_t(p_.added[i].id)] = int32_t(i);
        added_by_content_.emplace(p_.added[i].content, p_.added[i].id);
    }
    // Raw pass: tokens with normalized=false. Normalized pass: the others, with their content
    // normalized the same way the text is.
    added_normalized_ = p_.added;
    std::vector<bool> use_raw(p_.added.size()), use_norm(p_.added.size());
    for (size_t i = 0; i < p_.added.size(); ++i) {
        use_raw[i] = !p_.added[i].normalized || p_.normalizer.empty();
        use_norm[i] = !use_raw[i];
        if (use_norm[i]) added_normalized_[i].content = p_.normalizer.apply(p_.added[i].content);
    }
    raw_matcher_.build(p_.added, use_raw);
    norm_matcher_.build(added_normalized_, use_norm);

    if (p_.decoder.has(DecoderKind::BYTE_LEVEL) || p_.pre.has_byte_level()) {
        alphabet_ = Alphabet::BYTE_LEVEL;
    } else if (p_.decoder.has(DecoderKind::METASPACE) || p_.decoder.has(DecoderKind::REPLACE)) {
        alphabet_ = Alphabet::METASPACE;
        metaspace_char_ = "\xE2\x96\x81";
    }
    for (int32_t id : p_.post.prefix)
        if (id < 0 || id >= vocab_size_) throw Error(str(p_.source, ": post-processor token id ", id, " is out of range"));
    for (int32_t id : p_.post.suffix)
        if (id < 0 || id >= vocab_size_) throw Error(str(p_.source, ": post-processor token id ", id, " is out of range"));
}

void BpeTokenizer::encode_text(std::string_view text, bool at_start, bool parse_special,
                               std::vector<int32_t>& out) const {
    std::string normalized;
    std::string_view norm = text;
    if (!p_.normalizer.empty()) {
        normalized = p_.normalizer.apply(text);
        norm = normalized;
    }
    std::vector<TextSegment> segs;
    if (norm_matcher_.empty()) {
        segs.push_back({0, norm.size(), -1});
    } else {
        norm_matcher_.split(norm, parse_special, segs);
    }
    std::vector<std::string> words;
    for (const TextSegment& s : segs) {
        if (s.id >= 0) {
            out.push_back(s.id);
            continue;
        }
        words.clear();
        p_.pre.split(norm.substr(s.begin, s.end - s.begin), at_start && s.begin == 0, words);
        for (const std::string& w : words) p_.model->encode_word(w, out);
    }
}

std::vector<int32_t> BpeTokenizer::encode_impl(const std::string& text, bool add_special_tokens,
                                               bool parse_special) const {
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 8);
    if (add_special_tokens) out.insert(out.end(), p_.post.prefix.begin(), p_.post.prefix.end());
    std::vector<TextSegment> segs;
    if (raw_matcher_.empty()) {
        segs.push_back({0, text.size(), -1});
    } else {
        raw_matcher_.split(text, parse_special, segs);
    }
    for (const TextSegment& s : segs) {
        if (s.id >= 0) {
            out.push_back(s.id);
        } else {
            encode_text(std::string_view(text).substr(s.begin, s.end - s.begin), s.begin == 0, parse_special, out);
        }
    }
    if (add_special_tokens) out.insert(out.end(), p_.post.suffix.begin(), p_.post.suffix.end());
    return out;
}

DecodePiece BpeTokenizer::piece_of(int32_t id) const {
    if (id < 0 || id >= vocab_size_)
        throw Error(str(p_.source, ": token id ", id, " is out of range (expected 0..", vocab_size_ - 1, ")"));
    const int32_t ai = added_index_[size_t(id)];
    if (ai >= 0) return {p_.added[size_t(ai)].content, true};
    const std::string* t = p_.model->id_to_token(id);
    return {t ? *t : std::string(), false};  // an id hole decodes to nothing
}

std::string BpeTokenizer::decode_impl(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
    std::vector<DecodePiece> pieces;
    pieces.reserve(ids.size());
    for (int32_t id : ids) {
        DecodePiece p = piece_of(id);
        if (skip_special_tokens && is_special(id)) continue;
        pieces.push_back(std::move(p));
    }
    return p_.decoder.decode(std::move(pieces));
}

std::string BpeTokenizer::token_to_piece(int32_t id) const {
    DecodePiece p = piece_of(id);
    if (p.literal) return p.text;
    std::vector<DecodePiece> one{std::move(p)};
    // Without a decoder the text is the token string itself (no joining spaces for one piece).
    return p_.decoder.decode(std::move(one), /*mid_sequence=*/true);
}

int32_t BpeTokenizer::token_id(const std::string& piece) const {
    auto it = added_by_content_.find(piece);
    if (it != added_by_content_.end()) return it->second;
    std::string form;
    switch (alphabet_) {
        case Alphabet::BYTE_LEVEL: form = byte_level_encode(piece); break;
        case Alphabet::METASPACE:
            for (char c : piece) {
                if (c == ' ') {
                    form += metaspace_char_;
                } else {
                    form.push_back(c);
                }
            }
            break;
        case Alphabet::PLAIN: form = piece; break;
    }
    int32_t id = p_.model->token_to_id(form);
    if (id < 0 && piece.size() == 1 && p_.model->options().byte_fallback) {
        char name[8];
        std::snprintf(name, sizeof(name), "<0x%02X>", unsigned(static_cast<uint8_t>(piece[0])));
        id = p_.model->token_to_id(name);
    }
    return id;
}

bool BpeTokenizer::is_special(int32_t id) const {
    if (id < 0 || id >= vocab_size_) return false;
    const int32_t ai = added_index_[size_t(id)];
    return ai >= 0 && p_.added[size_t(ai)].special;
}

}  // namespace kv
