// Normalizer steps. Unicode forms and lowercasing go through ICU (Debian libicu), applied to each
// maximal valid UTF-8 run so stray bytes pass through untouched. Must not split or tokenize.
#include "normalizer.h"

#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include "engine/core/error.h"
#include "regex.h"
#include "utf8.h"

namespace kv {

namespace {

bool is_ascii(std::string_view s) {
    for (char c : s)
        if (static_cast<unsigned char>(c) >= 0x80) return false;
    return true;
}

void transform_valid_run(std::string_view run, NormKind kind, std::string& out) {
    if (kind != NormKind::LOWERCASE && is_ascii(run)) {  // ASCII is invariant under all four forms
        out.append(run);
        return;
    }
    icu::UnicodeString us = icu::UnicodeString::fromUTF8(icu::StringPiece(run.data(), int32_t(run.size())));
    if (kind == NormKind::LOWERCASE) {
        us.toLower(icu::Locale::getRoot());
    } else {
        UErrorCode st = U_ZERO_ERROR;
        const icu::Normalizer2* n = nullptr;
        switch (kind) {
            case NormKind::NFC: n = icu::Normalizer2::getNFCInstance(st); break;
            case NormKind::NFD: n = icu::Normalizer2::getNFDInstance(st); break;
            case NormKind::NFKC: n = icu::Normalizer2::getNFKCInstance(st); break;
            default: n = icu::Normalizer2::getNFKDInstance(st); break;
        }
        if (U_FAILURE(st)) throw Error(str("tokenizer normalizer: ICU could not load its data: ", u_errorName(st)));
        if (n->isNormalized(us, st) && U_SUCCESS(st)) {
            out.append(run);
            return;
        }
        st = U_ZERO_ERROR;
        us = n->normalize(us, st);
        if (U_FAILURE(st)) throw Error(str("tokenizer normalizer: ICU normalization failed: ", u_errorName(st)));
    }
    us.toUTF8String(out);
}

std::string strip_whitespace(std::string_view s, bool left, bool right) {
    auto ws = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; };
    size_t b = 0, e = s.size();
    if (left)
        while (b < e && ws(s[b])) ++b;
    if (right)
        while (e > b && ws(s[e - 1])) --e;
    return std::string(s.substr(b, e - b));
}

std::string replace_all(std::string_view s, const NormStep& st) {
    std::string out;
    if (st.regex) {
        std::vector<std::pair<size_t, size_t>> m;
        st.regex->find_all(s, m);
        size_t prev = 0;
        for (auto [b, e] : m) {
            out.append(s.substr(prev, b - prev));
            out.append(st.text);
            prev = e;
        }
        out.append(s.substr(prev));
        return out;
    }
    if (st.literal.empty()) return std::string(s);
    size_t prev = 0;
    for (size_t p = s.find(st.literal); p != std::string_view::npos; p = s.find(st.literal, prev)) {
        out.append(s.substr(prev, p - prev));
        out.append(st.text);
        prev = p + st.literal.size();
    }
    out.append(s.substr(prev));
    return out;
}

}  // namespace

std::string unicode_transform(std::string_view text, NormKind kind) {
    std::string out;
    out.reserve(text.size());
    size_t run_begin = 0, i = 0;
    uint32_t cp;
    while (i < text.size()) {
        const int n = utf8::decode(text, i, &cp);
        if (n > 0) {
            i += size_t(n);
            continue;
        }
        transform_valid_run(text.substr(run_begin, i - run_begin), kind, out);
        out.push_back(text[i]);  // the invalid byte itself
        run_begin = ++i;
    }
    transform_valid_run(text.substr(run_begin), kind, out);
    return out;
}

std::string Normalizer::apply(std::string_view text) const {
    std::string cur(text);
    for (const NormStep& st : steps_) {
        switch (st.kind) {
            case NormKind::NFC:
            case NormKind::NFD:
            case NormKind::NFKC:
            case NormKind::NFKD:
            case NormKind::LOWERCASE: cur = unicode_transform(cur, st.kind); break;
            case NormKind::PREPEND:
                if (!cur.empty()) cur.insert(0, st.text);  // Hugging Face leaves empty text empty
                break;
            case NormKind::REPLACE: cur = replace_all(cur, st); break;
            case NormKind::STRIP: cur = strip_whitespace(cur, st.strip_left, st.strip_right); break;
        }
    }
    return cur;
}

}  // namespace kv
