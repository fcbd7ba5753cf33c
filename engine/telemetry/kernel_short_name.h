// A kernel's short name from its demangled signature, as the CUPTI tracer stores it
// (CUPTI_ACTIVITY_KIND_KERNEL.shortName). Header-only and free of CUPTI so tests reach it.
#pragma once

#include <string>

namespace kv::trace {

// "void ns::kern<float>(int, float*)" -> "kern<float>"; nsys's shortName convention. The
// "(anonymous namespace)::" qualifier goes first: its '(' is not the parameter list (every
// kvlab kernel lives in one, and all of them came out as "" on the first GPU run).
inline std::string kernel_short_name(std::string demangled) {
    static const std::string anon = "(anonymous namespace)::";
    for (size_t at; (at = demangled.find(anon)) != std::string::npos;) demangled.erase(at, anon.size());
    int depth = 0;
    size_t end = demangled.size();
    for (size_t i = 0; i < demangled.size(); ++i) {
        char c = demangled[i];
        if (c == '<')
            ++depth;
        else if (c == '>')
            --depth;
        else if (c == '(' && depth == 0) {
            end = i;
            break;
        }
    }
    std::string head = demangled.substr(0, end);
    depth = 0;
    size_t start = 0;
    for (size_t i = 0; i < head.size(); ++i) {
        char c = head[i];
        if (c == '<')
            ++depth;
        else if (c == '>')
            --depth;
        else if (depth == 0 && (c == ' ' || (c == ':' && i + 1 < head.size() && head[i + 1] == ':')))
            start = c == ' ' ? i + 1 : i + 2;
    }
    return head.substr(start);
}

}  // namespace kv::trace
