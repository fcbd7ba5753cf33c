// Sizes before allocations (see size_budget.h).
#include "engine/memory/size_budget.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>

#include "engine/core/error.h"

namespace kv {

uint64_t checked_mul(std::initializer_list<uint64_t> factors, const std::string& what) {
    uint64_t r = 1;
    for (uint64_t f : factors)
        if (__builtin_mul_overflow(r, f, &r))
            throw Error(str(what, " overflows 64 bits; expected sizes a computer can hold"),
                        "lower the lengths, batch or vocabulary that multiply into it");
    return r;
}

uint64_t checked_add(uint64_t a, uint64_t b, const std::string& what) {
    uint64_t r = 0;
    if (__builtin_add_overflow(a, b, &r))
        throw Error(str(what, " overflows 64 bits; expected sizes a computer can hold"));
    return r;
}

uint64_t physical_memory_bytes() {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) : 0;
}

namespace {
std::string gib(uint64_t b) {
    // "23.8 GiB": one decimal is enough to see why it does not fit.
    static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double v = double(b);
    int u = 0;
    while (v >= 1024 && u < 6) v /= 1024, ++u;
    char buf[48];
    std::snprintf(buf, sizeof buf, u ? "%.1f %s" : "%.0f %s", v, units[u]);
    return buf;
}
}  // namespace

void require_within_budget(const std::vector<SizedItem>& items, int64_t budget) {
    uint64_t total = 0;
    std::map<std::string, uint64_t> by_cause;
    for (const auto& it : items) {
        total = checked_add(total, it.bytes, "the run's memory");
        by_cause[it.cause] = checked_add(by_cause[it.cause], it.bytes, "the run's memory");
    }
    const uint64_t phys = physical_memory_bytes();
    const uint64_t limit = budget > 0 ? uint64_t(budget) : phys;
    if (limit == 0 || total <= limit) return;
    std::vector<std::pair<uint64_t, std::string>> causes;
    for (const auto& [c, b] : by_cause) causes.push_back({b, c});
    std::sort(causes.rbegin(), causes.rend());
    std::string msg;
    for (const auto& [bytes, cause] : causes) {
        std::string parts;
        for (const auto& it : items)
            if (it.cause == cause && it.bytes) parts += str(parts.empty() ? "" : " + ", gib(it.bytes), " of ", it.what);
        if (parts.empty()) continue;
        msg += str(msg.empty() ? "" : "; ", cause, " needs ", parts);
    }
    throw Error(str(msg, " (", budget > 0 ? str("budget ", format_bytes(budget)) : str("this machine has ", gib(phys), " of memory"),
                    ")"),
                budget > 0 ? "lower those numbers or raise --memory.budget" : "lower those numbers");
}

}  // namespace kv
