// eval_long's driver over a model fixture's tokens, as the fixture tests run it: a prefill of 6
// tokens, chunks of 2 up to position 14, then single tokens (every path of the cache: prefill,
// small chunks, decode), every next token scored, a test's CacheAttention in front of the cache.
#pragma once

#include <algorithm>
#include <vector>

#include "engine/driver/long_context.h"
#include "engine/kv/kv_cache.h"
#include "engine/model/transformer.h"

namespace kv::test {

inline ChunkPlan fixture_chunk_plan(int64_t T) {
    ChunkPlan plan;
    for (int64_t s = 0; s < T;) {
        const int64_t n = s == 0 ? 6 : (s < 14 ? 2 : 1);
        plan.starts.push_back(s), plan.chunks.push_back(std::min(n, T - s));
        s += n;
    }
    plan.cells.push_back({0, plan.chunks.size()});
    return plan;
}

// ids (1, T) through `plan` with `attention` observing the cache; every next token scored.
inline HeadResult drive_next_token(Transformer& model, KVCache& cache, const Tensor& ids, const ChunkPlan& plan, CacheAttention& attention) {
    const int64_t T = ids.size(1);
    HeadSpec hs;
    hs.kind = HeadKind::NEXT_TOKEN;
    hs.T = T;
    const std::vector<int64_t> iv = ids.to_i64_vector();
    hs.token_targets.assign(size_t(T), -100);
    for (int64_t p = 0; p + 1 < T; ++p) hs.token_targets[size_t(p)] = int32_t(iv[size_t(p + 1)]);
    HeadResult res;
    DriverCallbacks cb;
    cb.attention = &attention;
    long_context_forward(model, cache, ids, plan, hs, res, cb);
    return res;
}

}  // namespace kv::test
