// The cache name parser and printer (see cache_name.h).
#include "cache_name.h"

#include <algorithm>

#include "error.h"
#include "join.h"
#include "kv_names.h"

namespace kv {

std::optional<CacheName> read_cache_name(const std::string& text) {
    // Canonical buffer names have no '-', aliases may ("torch-quantized8"): try every spelling
    // as a suffix and keep the longest, so an alias wins over a shorter name it ends with.
    const BufferInfo* best = nullptr;
    size_t best_len = 0;
    auto consider = [&](const BufferInfo& b, const std::string& s) {
        if (text.size() > s.size() + 1 && s.size() > best_len && text.compare(text.size() - s.size(), s.size(), s) == 0 &&
            text[text.size() - s.size() - 1] == '-') {
            best = &b;
            best_len = s.size();
        }
    };
    for (const BufferInfo& b : kv_buffer_registry()) {
        consider(b, b.name);
        for (const std::string& a : b.aliases) consider(b, a);
    }
    if (!best) return std::nullopt;
    return CacheName{text.substr(0, text.size() - best_len - 1), best->name};
}

CacheName parse_cache_name(const std::string& text, const std::vector<std::string>& policies) {
    const std::optional<CacheName> n = read_cache_name(text);
    std::string why;
    if (n && std::find(policies.begin(), policies.end(), n->policy) != policies.end()) return *n;
    if (n) {
        why = str(": unknown policy '", n->policy, "'");
    } else {
        // No buffer suffix: name the unknown buffer after the longest known policy, if any.
        size_t best = 0;
        for (const std::string& p : policies)
            if (text.size() > p.size() + 1 && p.size() > best && text.compare(0, p.size(), p) == 0 && text[p.size()] == '-') best = p.size();
        if (best) why = str(": unknown buffer '", text.substr(best + 1), "'");
    }
    throw Error(str("--kv_cache.name: '", text, "' is not {policy}-{buffer}", why, "; expected policies: ", join(policies),
                    "; buffers: ", join(kv_buffer_names()), " (aliases: ", kv_buffer_aliases_text(), ")"));
}

}  // namespace kv
