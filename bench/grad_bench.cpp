// Gradient benchmark (see grad_bench.h).
#include "grad_bench.h"

#include <chrono>
#include <random>

#include "engine/core/error.h"
#include "engine/driver/long_context.h"
#include "engine/grad/gradient_pipeline.h"
#include "engine/grad/lora.h"
#include "engine/model/model_loader.h"

namespace kv::bench {

GradBenchResult run_grad_bench(const GradBenchOptions& o, const std::function<void(int, int, const std::string&)>& progress) {
    if (o.mode != "lora" && o.mode != "full") throw Error(str("bench grad: --mode '", o.mode, "'; expected lora or full"));
    GradBenchResult r;
    r.model = o.model, r.cache = o.cache, r.mode = o.mode, r.tokens = o.tokens;
    MemoryTracker tracker;
    MemoryTrackerScope scope(tracker);
    const int steps = 2 + 2 * o.repeats;
    int step = 0;
    if (progress) progress(step++, steps, "loading " + o.model);
    LoadedModel lm = load_model(o.model, ModelOptions{}, 0);
    Transformer& m = *lm.model;
    const ModelConfig& c = lm.config;
    r.weight_bytes = m.weight_bytes();

    std::mt19937_64 rng(1);
    std::vector<int32_t> idv((size_t)o.tokens);
    for (auto& x : idv) x = int32_t(rng() % uint64_t(c.vocab_size));
    Tensor ids = Tensor::from_i32({1, o.tokens}, idv);
    HeadSpec head;
    head.B = 1, head.T = o.tokens;
    head.token_targets.assign(size_t(o.tokens), -100);
    for (int64_t t = 0; t + 1 < o.tokens; ++t) head.token_targets[size_t(t)] = idv[size_t(t + 1)];
    KVCacheConfig kc;
    kc.name = o.cache;
    kc.cache_length = o.cache_length;
    ChunkPlanOptions po;
    po.chunk_size = o.chunk;
    po.cell_factor = cell_factor(c);
    po.chunks_per_cell_multiplier = o.chunks_per_cell_multiplier;
    const ChunkPlan plan = plan_chunks(o.tokens, std::vector<int64_t>(size_t(c.num_layers), o.cache_length), po);

    std::unique_ptr<Lora> lora;
    ModelGrads grads;
    GradientTargets tg;
    if (o.mode == "lora") {
        lora = std::make_unique<Lora>(m, LoraConfig{});
        m.set_adapters(lora.get());
        r.trainable_bytes = size_t(lora->parameter_count()) * dtype_size(m.act_dtype());
    } else {
        grads = ModelGrads::zeros_like(m);
        tg.model = &grads;
        r.trainable_bytes = r.weight_bytes;
    }
    using Clock = std::chrono::steady_clock;
    auto secs = [](Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); };
    r.forward_s = r.step_s = 1e300;
    for (int rep = 0; rep < o.repeats; ++rep) {
        {
            if (progress) progress(step++, steps, "forward-only pass");
            KVCache cache(kc, c, Device{}, m.act_dtype(), o.tokens);
            HeadResult hr;
            tracker.reset_peaks();
            const auto t0 = Clock::now();
            long_context_forward(m, cache, ids, plan, head, hr);
            r.forward_s = std::min(r.forward_s, secs(t0));
            r.forward_memory = tracker.all_stats();
        }
        {
            if (progress) progress(step++, steps, "gradient step");
            KVCache cache(kc, c, Device{}, m.act_dtype(), o.tokens);
            GradientOptions go;
            go.layers_per_cell = o.layers_per_cell;
            const auto t0 = Clock::now();
            GradientStats st = gradient_step(m, cache, ids, plan, head, 1.0, go, tg);
            const double s = secs(t0);
            if (s < r.step_s) {
                r.step_s = s;
                r.phase1_s = st.phase1_seconds, r.phase2_s = st.phase2_seconds;
                r.phase1_memory = st.phase1_memory, r.phase2_memory = st.phase2_memory;
                r.cells = st.cells, r.rows = st.rows;
                r.layer_checkpoint_bytes = st.layer_checkpoint_bytes, r.kv_checkpoint_bytes = st.kv_checkpoint_bytes;
            }
        }
    }
    m.set_adapters(nullptr);
    // Offload modes (reference §10.1): phase 1 clones the weights to the device, phase 2 copies
    // each row's shard (plus lm_head/norm and the embedding) once more; gradients of what is
    // trained come back. Checkpoints live on the host in every mode: layer inputs go out in
    // phase 1 and come back in phase 2 (the row replay and the cells each read them), KV
    // checkpoints go out and come back once.
    r.offload_h2d = 2 * r.weight_bytes + 2 * r.layer_checkpoint_bytes + r.kv_checkpoint_bytes;
    r.offload_d2h = r.trainable_bytes + r.layer_checkpoint_bytes + r.kv_checkpoint_bytes;
    if (progress) progress(steps, steps, "done");
    return r;
}

}  // namespace kv::bench
