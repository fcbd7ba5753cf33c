// Leftmost-longest matching of added tokens, bucketed by first byte so ordinary prose (which rarely
// contains '<') costs one table lookup per byte. Must not touch the text between matches.
#include "added_tokens.h"

#include <unicode/uchar.h>

#include <algorithm>

#include "utf8.h"

namespace kv {

namespace {

bool is_space_cp(uint32_t cp) { return u_isUWhiteSpace(UChar32(cp)) != 0; }
bool is_word_cp(uint32_t cp) { return cp == '_' || u_isalnum(UChar32(cp)) != 0; }

// Code point ending at byte `end` (exclusive), or 0 when there is none / it is invalid.
uint32_t cp_before(std::string_view s, size_t end, size_t* len) {
    for (size_t back = 1; back <= 4 && back <= end; ++back) {
        uint32_t cp;
        if (utf8::decode(s, end - back, &cp) == int(back)) {
            *len = back;
            return cp;
        }
    }
    *len = 0;
    return 0;
}

}  // namespace

void AddedTokenMatcher::build(const std::vector<AddedToken>& tokens, const std::vector<bool>& use) {
    tokens_ = &tokens;
    count_ = 0;
    for (auto& b : by_first_byte_) b.clear();
    for (size_t i = 0; i < tokens.size(); ++i) {
        if (!use[i] || tokens[i].content.empty()) continue;
        by_first_byte_[static_cast<uint8_t>(tokens[i].content[0])].push_back(uint32_t(i));
        ++count_;
    }
    for (auto& b : by_first_byte_) {
        std::stable_sort(b.begin(), b.end(), [&](uint32_t x, uint32_t y) {
            return tokens[x].content.size() > tokens[y].content.size();
        });
    }
}

void AddedTokenMatcher::split(std::string_view text, bool parse_special, std::vector<TextSegment>& out) const {
    size_t run_begin = 0;  // start of the pending ordinary-text run
    size_t i = 0;
    while (i < text.size()) {
        const auto& cands = by_first_byte_[static_cast<uint8_t>(text[i])];
        const AddedToken* hit = nullptr;
        for (uint32_t k : cands) {
            const AddedToken& t = (*tokens_)[k];
            if (t.special && !parse_special) continue;
            if (text.compare(i, t.content.size(), t.content) != 0) continue;
            if (t.single_word) {
                size_t len;
                uint32_t cp;
                const uint32_t before = cp_before(text, i, &len);
                const size_t after = i + t.content.size();
                if ((len > 0 && is_word_cp(before)) ||
                    (after < text.size() && utf8::decode(text, after, &cp) > 0 && is_word_cp(cp)))
                    continue;
            }
            hit = &t;
            break;
        }
        if (!hit) {
            ++i;
            continue;
        }
        size_t b = i, e = i + hit->content.size();
        if (hit->lstrip) {
            size_t len;
            while (b > run_begin) {
                const uint32_t cp = cp_before(text, b, &len);
                if (len == 0 || !is_space_cp(cp)) break;
                b -= len;
            }
        }
        if (hit->rstrip) {
            uint32_t cp;
            for (int n; e < text.size() && (n = utf8::decode(text, e, &cp)) > 0 && is_space_cp(cp);) e += size_t(n);
        }
        if (b > run_begin) out.push_back({run_begin, b, -1});
        out.push_back({b, e, hit->id});
        run_begin = i = e;
    }
    if (run_begin < text.size()) out.push_back({run_begin, text.size(), -1});
}

}  // namespace kv
