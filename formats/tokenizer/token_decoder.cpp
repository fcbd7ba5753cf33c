// Decoder steps, each a function from token pieces to token pieces, applied in order as Hugging
// Face's decode_chain does. Must not lose bytes: no lossy UTF-8 replacement happens here.
#include "token_decoder.h"

#include <cstdlib>

#include "byte_level.h"

namespace kv {

namespace {

std::string replace_all(const std::string& s, const std::string& from, const std::string& to) {
    if (from.empty()) return s;
    std::string out;
    size_t prev = 0;
    for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, prev)) {
        out.append(s, prev, p - prev);
        out += to;
        prev = p + from.size();
    }
    out.append(s, prev, std::string::npos);
    return out;
}

// "<0x0A>" -> 0x0A, else -1.
int byte_token_value(const std::string& t) {
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
    char* end = nullptr;
    const long v = std::strtol(t.c_str() + 3, &end, 16);
    return end == t.c_str() + 5 ? int(v) : -1;
}

void strip(std::string& s, const std::string& c, int start, int stop) {
    if (c.empty()) return;
    for (int k = 0; k < start && s.compare(0, c.size(), c) == 0; ++k) s.erase(0, c.size());
    for (int k = 0; k < stop && s.size() >= c.size() && s.compare(s.size() - c.size(), c.size(), c) == 0; ++k)
        s.erase(s.size() - c.size());
}

}  // namespace

bool TokenDecoder::has(DecoderKind k) const {
    for (const DecoderStep& s : steps_)
        if (s.kind == k) return true;
    return false;
}

std::string TokenDecoder::decode(std::vector<DecodePiece> pieces, bool mid_sequence) const {
    if (steps_.empty()) {
        std::string out;
        for (size_t i = 0; i < pieces.size(); ++i) {
            if (i) out.push_back(' ');
            out += pieces[i].text;
        }
        return out;
    }
    for (const DecoderStep& st : steps_) {
        switch (st.kind) {
            case DecoderKind::BYTE_LEVEL:
                for (DecodePiece& p : pieces)
                    if (!p.literal) p.text = byte_level_decode(p.text);
                break;
            case DecoderKind::REPLACE:
                for (DecodePiece& p : pieces) p.text = replace_all(p.text, st.from, st.to);
                break;
            case DecoderKind::METASPACE:
                for (size_t i = 0; i < pieces.size(); ++i) {
                    DecodePiece& p = pieces[i];
                    p.text = replace_all(p.text, st.replacement, " ");
                    if (i == 0 && !mid_sequence && st.prepend && !p.text.empty() && p.text[0] == ' ')
                        p.text.erase(0, 1);
                }
                break;
            case DecoderKind::BYTE_FALLBACK:
                for (DecodePiece& p : pieces) {
                    const int b = p.literal ? -1 : byte_token_value(p.text);
                    if (b >= 0) p.text = std::string(1, char(b));
                }
                break;
            case DecoderKind::FUSE: {
                DecodePiece all;
                for (const DecodePiece& p : pieces) all.text += p.text;
                pieces.assign(1, std::move(all));
                break;
            }
            case DecoderKind::STRIP:
                if (mid_sequence) break;  // strips the start of the text; a lone piece is mid-text
                for (DecodePiece& p : pieces) strip(p.text, st.strip_content, st.strip_start, st.strip_stop);
                break;
        }
    }
    std::string out;
    for (const DecodePiece& p : pieces) out += p.text;
    return out;
}

}  // namespace kv
