// A row's slots in token-position order, the order the positional policies (snapkv's pooling,
// lagkv's blocks) walk the cache in.
#pragma once

#include <cstdint>
#include <vector>

namespace kv {

// order[0, T) = the slots [0, T) by ascending pos[slot]: the slots with pos < 0 (empty, or
// another head's in a per-head pool) first, then the rest by position. When the non-negative
// positions are distinct (every cache holds a token once) this is one table pass over the
// positions, the order std::sort by pos gives up to the order among the negative ones; when they
// are not, or span far more than T, it is that std::sort. `table` is scratch.
void slots_by_position(const int32_t* pos, int64_t T, std::vector<int32_t>& order, std::vector<int32_t>& table);

}  // namespace kv
