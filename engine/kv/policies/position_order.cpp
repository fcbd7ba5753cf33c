// A row's slots in token-position order (see position_order.h).
#include "engine/kv/policies/position_order.h"

#include <algorithm>
#include <numeric>

namespace kv {

void slots_by_position(const int32_t* pos, int64_t T, std::vector<int32_t>& order, std::vector<int32_t>& table) {
    order.resize(size_t(T));
    int32_t lo = INT32_MAX, hi = -1;
    int64_t empty = 0;
    for (int64_t i = 0; i < T; ++i) {
        if (pos[i] < 0) {
            ++empty;
            continue;
        }
        lo = std::min(lo, pos[i]), hi = std::max(hi, pos[i]);
    }
    const int64_t span = hi >= 0 ? int64_t(hi) - int64_t(lo) + 1 : 0;
    bool distinct = span <= 8 * T + 1024;
    if (distinct && span > 0) {
        table.assign(size_t(span), -1);
        for (int64_t i = 0; i < T && distinct; ++i) {
            if (pos[i] < 0) continue;
            int32_t& at = table[size_t(pos[i] - lo)];
            distinct = at < 0;
            at = int32_t(i);
        }
    }
    if (!distinct) {
        std::iota(order.begin(), order.end(), 0);
        std::sort(order.begin(), order.end(), [pos](int32_t a, int32_t b) { return pos[a] < pos[b]; });
        return;
    }
    int64_t k = 0;
    if (empty > 0)
        for (int64_t i = 0; i < T; ++i)
            if (pos[i] < 0) order[size_t(k++)] = int32_t(i);
    if (span > 0)
        for (const int32_t i : table)
            if (i >= 0) order[size_t(k++)] = i;
}

}  // namespace kv
