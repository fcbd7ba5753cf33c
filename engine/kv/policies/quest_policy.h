// What the quest read policy (policy_quest.cpp) exposes beyond KVPolicy: its options and the
// pages each query read in the last chunk, for telemetry (eviction map's Quest mode) and tests.
#pragma once

#include <cstdint>
#include <vector>

namespace kv {

struct KVCacheConfig;

// When cfg's policy is quest: its page size and pages per query (true); else false, untouched.
bool quest_reads(const KVCacheConfig& cfg, int64_t* page, int64_t* pages);
// Chunk plans (eval_long, fine-tuning): the planned cache lengths, with quest's
// --kv_cache.quest_prefill > 0 capping the first chunk (the dense prefill) so later chunks
// select pages; the cache itself still holds the whole sequence. Unchanged for other policies.
void quest_plan_lengths(const KVCacheConfig& cfg, std::vector<int64_t>& lengths);

class QuestSelections {
   public:
    virtual ~QuestSelections() = default;
    virtual int64_t page_size() const = 0;
    virtual int64_t pages_per_query() const = 0;
    // (B, heads, queries, pages_per_query + 1) int32: pages read by each query of the last
    // chunk, ascending, -1 after the last; empty before the first chunk after a prefill.
    virtual const std::vector<int32_t>& last_selection(int64_t* heads, int64_t* queries) const = 0;
};

}  // namespace kv
