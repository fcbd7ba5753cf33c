// `kvlab bench quest`: decode SDPA (one query per head) over a paged cache at a long context,
// Quest reading 1/8 of the pages (SDPA_QUEST: page bounds, top-k, attention over the chosen
// pages) vs full attention (SDPA) over the same keys and values, timed in one run.
#pragma once

#include <functional>
#include <vector>

#include "cache_bench.h"

namespace kv::bench {

struct QuestBenchOptions {
    int64_t heads = 9, kv_heads = 3, head_dim = 64;  // SmolLM2-135M
    std::vector<int64_t> contexts = {8192, 32768};
    int64_t page = 16;        // Quest's page size
    int64_t fraction = 8;     // read 1/fraction of the pages
    double min_seconds = 0.3;
};
std::vector<CacheBenchRow> run_quest_bench(const QuestBenchOptions& opt, const std::function<void(int, int, const std::string&)>& progress);

}  // namespace kv::bench
