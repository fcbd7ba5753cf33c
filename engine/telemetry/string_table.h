// Process-wide interned strings for telemetry: span names, allocation labels, metric names and
// GPU kernel names become small integer ids, so records stay fixed-size. Ids are stable for the
// life of the process (the storage writer maps them to a session's StringIds table).
// Must stay lock-cheap on lookup of known strings; never frees a string.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kv::trace {

// Id of `text` (0 is the empty string). Thread-safe; the first call for a string takes a lock.
uint32_t intern(std::string_view text);
// The string behind an id from intern(); "" for 0 or an unknown id. Thread-safe.
std::string interned(uint32_t id);
// Number of ids handed out so far (ids are 0 .. count-1).
uint32_t interned_count();

// A name interned once, typically held in a function-local static at the call site:
//   static const trace::Name kAttention("attention");
struct Name {
    uint32_t id = 0;
    Name() = default;
    explicit Name(std::string_view text) : id(intern(text)) {}
};

}  // namespace kv::trace
