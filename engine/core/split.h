// A list option's items ("h2o,lastrec" -> {"h2o", "lastrec"}): every piece between separators,
// empty ones included ("" -> {""}, "a,,b" -> {"a", "", "b"}), so the caller can name an empty
// item in its message or skip it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kv {

inline std::vector<std::string> split(std::string_view s, char sep = ',') {
    std::vector<std::string> out;
    size_t p = 0;
    while (true) {
        const size_t q = s.find(sep, p);
        out.emplace_back(s.substr(p, q == std::string_view::npos ? std::string_view::npos : q - p));
        if (q == std::string_view::npos) return out;
        p = q + 1;
    }
}

}  // namespace kv
