// The context pass of compress_context on `tiny` (tiny_model<5>: no eviction, chunks of 8), kept
// so a test can read the cache's keys and the policy's scores before compressing it itself
// (the score-threshold and DMS tests).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/driver/long_context.h"
#include "engine/kv/kv_cache.h"
#include "engine/run/compress_then_ask.h"
#include "engine/run/protocol.h"
#include "engine/run/run_config.h"
#include "tests/engine/kv_test_util.h"
#include "tests/engine/tiny_model_util.h"

namespace kv::test {

struct ContextRun {
    KVCacheConfig kc;
    std::unique_ptr<KVCache> cache;
};

inline ContextRun run_context(const std::string& name, const std::vector<int32_t>& ctx) {
    TinyModel& m = tiny_model<5>();
    const int64_t T = int64_t(ctx.size());
    ContextRun r;
    KVCacheConfig base;
    base.name = name;
    apply_required_options(base);
    r.kc = context_cache_config(base, T);
    r.cache = std::make_unique<KVCache>(r.kc, m.cfg, Device{}, DType::F32, T, &byte_codec());
    RunConfig cfg;
    cfg.driver.chunk_size = 8;
    const ChunkPlan plan = context_chunk_plan(cfg, r.kc, m.cfg, T);
    HeadSpec hs;
    hs.kind = HeadKind::NEXT_TOKEN;
    hs.B = 1;
    hs.T = T;
    hs.token_targets.assign(size_t(T), -100);
    HeadResult res;
    m.model.set_context_width(T + 64);
    long_context_forward(m.model, *r.cache, Tensor::from_i32({1, T}, ctx), plan, hs, res, {}, true);
    return r;
}

}  // namespace kv::test
