// Formatting helpers for error messages and tables.
#include "error.h"

#include <cctype>
#include <cmath>
#include <cstdio>

namespace kv {

std::string format_bytes(long long bytes) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = double(bytes < 0 ? -bytes : bytes);
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        ++u;
    }
    char buf[64];
    if (u == 0)
        std::snprintf(buf, sizeof buf, "%s%lld B", bytes < 0 ? "-" : "", (long long)v);
    else
        std::snprintf(buf, sizeof buf, "%s%.2f %s", bytes < 0 ? "-" : "", v, units[u]);
    return buf;
}

long long parse_bytes(const std::string& text, const std::string& what) {
    size_t i = 0;
    while (i < text.size() && (std::isdigit((unsigned char)text[i]) || text[i] == '.')) ++i;
    std::string num = text.substr(0, i), unit = text.substr(i);
    for (auto& c : unit) c = char(std::tolower((unsigned char)c));
    double mult = 0;
    if (unit.empty() || unit == "b") mult = 1;
    else if (unit == "k" || unit == "kib") mult = 1024.0;
    else if (unit == "kb") mult = 1e3;
    else if (unit == "m" || unit == "mib") mult = 1024.0 * 1024;
    else if (unit == "mb") mult = 1e6;
    else if (unit == "g" || unit == "gib") mult = 1024.0 * 1024 * 1024;
    else if (unit == "gb") mult = 1e9;
    else if (unit == "t" || unit == "tib") mult = 1024.0 * 1024 * 1024 * 1024;
    else if (unit == "tb") mult = 1e12;
    char* end = nullptr;
    double v = num.empty() ? -1 : std::strtod(num.c_str(), &end);
    if (mult == 0 || num.empty() || end != num.c_str() + num.size() || !(v > 0) || !std::isfinite(v * mult) ||
        v * mult > 9.0e18)
        throw Error(str(what, ": '", text, "' is not a positive size; expected a number with an optional unit, e.g. 512MiB, 8GiB, 2GB, 1048576"));
    return (long long)std::llround(v * mult);
}

}  // namespace kv
