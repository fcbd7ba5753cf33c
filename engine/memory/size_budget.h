// Sizes that scale with user numbers (cache length, sequence length, batch, vocabulary), worked
// out from the configuration before anything is allocated, and refused against the memory
// budget (or physical memory when there is none) with one message naming the number and what it
// needs. All size arithmetic goes through checked_mul/checked_add: an overflow is an error, never
// a wrapped (small) size.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace kv {

// a * b * ...; throws kv::Error "<what> overflows 64 bits" instead of wrapping.
uint64_t checked_mul(std::initializer_list<uint64_t> factors, const std::string& what);
uint64_t checked_add(uint64_t a, uint64_t b, const std::string& what);

struct SizedItem {
    std::string cause;  // the user number that drives it, e.g. "cache_length 100000000"
    std::string what;   // "KV", "scores", "token ids"
    uint64_t bytes = 0;
};

// Bytes of RAM in this machine (0 when unknown).
uint64_t physical_memory_bytes();

// Throws kv::Error when the items together exceed `budget` bytes (or physical memory when
// budget <= 0): "cache_length 100000000 needs 23.8 GiB of KV + 1.5 GiB of scores (budget
// 64.00 MiB)", naming the cause with the largest share first.
void require_within_budget(const std::vector<SizedItem>& items, int64_t budget);

}  // namespace kv
