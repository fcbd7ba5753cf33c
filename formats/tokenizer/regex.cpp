// PCRE2 wrapper for the tokenizer: one compile (with JIT) per pattern, matches collected as byte
// ranges. Must not cache subjects or match data across calls: tokenizers are shared by threads.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "regex.h"

#include <pcre2.h>

#include <map>
#include <memory>
#include <mutex>

#include "engine/core/error.h"
#include "utf8.h"

namespace kv {

namespace {
std::string pcre2_message(int code) {
    PCRE2_UCHAR buf[256];
    if (pcre2_get_error_message(code, buf, sizeof(buf)) < 0) return str("PCRE2 error ", code);
    return reinterpret_cast<const char*>(buf);
}

struct MatchDataFree {
    void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};
}  // namespace

Regex::Regex(std::string pattern) : pattern_(std::move(pattern)) {
    int err = 0;
    PCRE2_SIZE err_off = 0;
    // MATCH_INVALID_UTF: subjects may hold arbitrary bytes (byte-level BPE accepts any input);
    // invalid sequences simply never match instead of making pcre2_match fail.
    const uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern_.data()), pattern_.size(), opts, &err, &err_off,
                          nullptr);
    if (!code_) {
        throw Error(str("tokenizer regex '", pattern_, "' does not compile: ", pcre2_message(err), " at offset ",
                        err_off));
    }
    // JIT is an optimisation only; without it (or on failure) the interpreter gives the same matches.
    (void)pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);
}

Regex::~Regex() { pcre2_code_free(code_); }

void Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
    std::unique_ptr<pcre2_match_data, MatchDataFree> md(pcre2_match_data_create_from_pattern(code_, nullptr));
    if (!md) throw Error("tokenizer regex: out of memory creating match data");
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t pos = 0;
    while (pos < text.size()) {
        int rc = pcre2_match(code_, subject, text.size(), pos, 0, md.get(), nullptr);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
            // Very long runs can exhaust the JIT's small default stack; the interpreter uses the heap.
            rc = pcre2_match(code_, subject, text.size(), pos, PCRE2_NO_JIT, md.get(), nullptr);
        }
        if (rc == PCRE2_ERROR_NOMATCH) return;
        if (rc < 0) {
            throw Error(str("tokenizer regex '", pattern_, "' failed at byte ", pos, " of a ", text.size(),
                            "-byte text: ", pcre2_message(rc)));
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
        const size_t b = ov[0], e = ov[1];
        if (e > b) {
            out.emplace_back(b, e);
            pos = e;
        } else {
            // Empty match: it splits nothing; step over one character and search on.
            pos = b + utf8::char_len_or_one(text, b);
        }
    }
}

std::string Regex::escape(std::string_view literal) {
    std::string out;
    for (char c : literal) {
        if (std::string_view("\\^$.|?*+()[]{}/-#&~ \t\n\r\f\v").find(c) != std::string_view::npos) {
            if (c == '\n') { out += "\\n"; continue; }
            if (c == '\r') { out += "\\r"; continue; }
            if (c == '\t') { out += "\\t"; continue; }
            if (c == '\f') { out += "\\f"; continue; }
            if (c == '\v') { out += "\\x0B"; continue; }
            out.push_back('\\');
        }
        out.push_back(c);
    }
    return out;
}

std::shared_ptr<const Regex> shared_regex(const std::string& pattern) {
    // Cache of live compiled patterns; weak entries so unloading every tokenizer frees them.
    static std::mutex mu;
    static std::map<std::string, std::weak_ptr<const Regex>> cache;
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = cache.find(pattern); it != cache.end())
        if (auto live = it->second.lock()) return live;
    auto re = std::make_shared<const Regex>(pattern);
    cache[pattern] = re;
    return re;
}

}  // namespace kv
