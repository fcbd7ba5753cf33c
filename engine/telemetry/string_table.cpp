// Interned string table (see string_table.h). Strings live in a deque so references handed out
// under the lock stay valid while other threads append.
#include "string_table.h"

#include <deque>
#include <mutex>
#include <unordered_map>

namespace kv::trace {

namespace {
struct StringTable {
    std::mutex mu;
    std::deque<std::string> strings{std::string()};  // id 0 = ""
    std::unordered_map<std::string_view, uint32_t> ids{{std::string_view(), 0u}};
};

StringTable& table() {
    static StringTable* t = new StringTable();  // never destroyed: ids outlive static teardown
    return *t;
}
}  // namespace

uint32_t intern(std::string_view text) {
    if (text.empty()) return 0;
    StringTable& t = table();
    std::lock_guard<std::mutex> lk(t.mu);
    auto it = t.ids.find(text);
    if (it != t.ids.end()) return it->second;
    uint32_t id = uint32_t(t.strings.size());
    t.strings.emplace_back(text);
    t.ids.emplace(std::string_view(t.strings.back()), id);
    return id;
}

std::string interned(uint32_t id) {
    StringTable& t = table();
    std::lock_guard<std::mutex> lk(t.mu);
    return id < t.strings.size() ? t.strings[id] : std::string();
}

uint32_t interned_count() {
    StringTable& t = table();
    std::lock_guard<std::mutex> lk(t.mu);
    return uint32_t(t.strings.size());
}

}  // namespace kv::trace
