// Items joined with a separator, for messages that list what is valid ("h2o, lastrec, tova").
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kv {

inline std::string join(const std::vector<std::string>& items, std::string_view sep = ", ") {
    std::string s;
    for (const auto& x : items) {
        if (!s.empty()) s += sep;
        s += x;
    }
    return s;
}

}  // namespace kv
