// Pre-tokenizer steps. The delimiter behaviours follow Hugging Face's definitions (consecutive
// matches stay separate pieces except under CONTIGUOUS). Must not consult the vocabulary.
#include "pre_tokenizer.h"

#include <algorithm>

#include "byte_level.h"
#include "regex.h"

namespace kv {

namespace {

struct Span {
    size_t b, e;
    bool match;
};

void emit(std::string_view text, const std::vector<Span>& spans, std::vector<std::string>& out) {
    for (const Span& s : spans)
        if (s.e > s.b) out.emplace_back(text.substr(s.b, s.e - s.b));
}

void metaspace(std::string_view text, const PreTokStep& st, bool first_piece, std::vector<std::string>& out) {
    std::string s;
    s.reserve(text.size() + 3);
    for (char c : text) {
        if (c == ' ') {
            s += st.replacement;
        } else {
            s.push_back(c);
        }
    }
    const bool starts = s.compare(0, st.replacement.size(), st.replacement) == 0;
    if (!starts && (st.prepend == PrependScheme::ALWAYS || (st.prepend == PrependScheme::FIRST && first_piece)))
        s.insert(0, st.replacement);
    if (!st.split || st.replacement.empty()) {
        if (!s.empty()) out.push_back(std::move(s));
        return;
    }
    // MergedWithNext on the replacement: every piece starts at a replacement character.
    size_t start = 0;
    for (size_t p = s.find(st.replacement, 1); p != std::string::npos; p = s.find(st.replacement, p + 1)) {
        if (p > start) out.push_back(s.substr(start, p - start));
        start = p;
    }
    if (start < s.size()) out.push_back(s.substr(start));
}

}  // namespace

void split_by_regex(std::string_view text, const Regex& re, SplitBehavior behavior, bool invert,
                    std::vector<std::string>& out) {
    std::vector<std::pair<size_t, size_t>> m;
    re.find_all(text, m);
    // Cover the text with alternating gap/match spans; consecutive matches stay separate.
    std::vector<Span> spans;
    spans.reserve(2 * m.size() + 1);
    size_t prev = 0;
    for (auto [b, e] : m) {
        if (b > prev) spans.push_back({prev, b, invert});
        spans.push_back({b, e, !invert});
        prev = e;
    }
    if (prev < text.size()) spans.push_back({prev, text.size(), invert});

    std::vector<Span> merged;
    switch (behavior) {
        case SplitBehavior::ISOLATED: emit(text, spans, out); return;
        case SplitBehavior::REMOVED:
            for (const Span& s : spans)
                if (!s.match) merged.push_back(s);
            break;
        case SplitBehavior::MERGED_WITH_PREVIOUS: {
            bool previous_match = false;
            for (const Span& s : spans) {
                if (s.match && !previous_match && !merged.empty()) {
                    merged.back().e = s.e;
                } else {
                    merged.push_back(s);
                }
                previous_match = s.match;
            }
            break;
        }
        case SplitBehavior::MERGED_WITH_NEXT: {
            // Walk right to left: a delimiter joins the piece after it.
            bool previous_match = false;
            for (size_t k = spans.size(); k-- > 0;) {
                const Span& s = spans[k];
                if (s.match && !previous_match && !merged.empty()) {
                    merged.back().b = s.b;
                } else {
                    merged.push_back(s);
                }
                previous_match = s.match;
            }
            std::reverse(merged.begin(), merged.end());
            break;
        }
        case SplitBehavior::CONTIGUOUS: {
            bool previous_match = false;
            for (const Span& s : spans) {
                if (s.match && previous_match && !merged.empty()) {
                    merged.back().e = s.e;
                } else {
                    merged.push_back(s);
                }
                previous_match = s.match;
            }
            break;
        }
    }
    emit(text, merged, out);
}

bool PreTokenizer::has_byte_level() const {
    for (const PreTokStep& s : steps_)
        if (s.kind == PreTokKind::BYTE_LEVEL) return true;
    return false;
}

void PreTokenizer::split(std::string_view text, bool at_text_start, std::vector<std::string>& out) const {
    if (text.empty()) return;
    if (steps_.empty()) {
        out.emplace_back(text);
        return;
    }
    std::vector<std::string> cur, next;
    cur.emplace_back(text);
    for (size_t si = 0; si < steps_.size(); ++si) {
        const PreTokStep& st = steps_[si];
        next.clear();
        for (size_t pi = 0; pi < cur.size(); ++pi) {
            const std::string& piece = cur[pi];
            switch (st.kind) {
                case PreTokKind::SPLIT: split_by_regex(piece, *st.regex, st.behavior, st.invert, next); break;
                case PreTokKind::METASPACE: metaspace(piece, st, at_text_start && pi == 0, next); break;
                case PreTokKind::BYTE_LEVEL: {
                    std::string p = (st.add_prefix_space && !piece.empty() && piece[0] != ' ') ? " " + piece : piece;
                    if (!st.regex) {
                        next.push_back(byte_level_encode(p));
                        break;
                    }
                    const size_t first = next.size();
                    split_by_regex(p, *st.regex, SplitBehavior::ISOLATED, false, next);
                    for (size_t k = first; k < next.size(); ++k) next[k] = byte_level_encode(next[k]);
                    break;
                }
            }
        }
        cur.swap(next);
    }
    for (std::string& s : cur) out.push_back(std::move(s));
}

}  // namespace kv
