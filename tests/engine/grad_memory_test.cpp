// Memory of the gradient pipeline does not grow with the sequence: with a fixed cache length
// and cell size, the phase-2 peak of every device category (activations, KV cache, gradients,
// workspace) is the same at 8k and 32k tokens within 10%, read from the allocator's peaks.
// Host checkpoints (layer inputs, KV states at cell starts) grow linearly by design.
#include <gtest/gtest.h>

#include "engine/backend/backend_registry.h"
#include "engine/memory/memory_tracker.h"
#include "grad_test_util.h"

namespace kv::test {
namespace {

struct PhasePeaks {
    int64_t activations = 0, kv_cache = 0, gradients = 0, workspace = 0, checkpoints = 0;
    int64_t device_total() const { return activations + kv_cache + gradients + workspace; }
};

PhasePeaks backward_peaks(int64_t T) {
    MemoryTracker tracker;
    MemoryTrackerScope scope(tracker);
    const ModelConfig cfg = preset_config("tiny");
    auto model = grad_test_model(cfg, DType::F32, 7);
    GradData d = grad_test_data(cfg, 1, T, 5);
    KVCacheConfig kc;
    kc.name = "h2o-default";
    kc.cache_length = 256;
    kc.grace_period = 16;
    KVCache cache(kc, cfg, Device{}, DType::F32, T);
    const ChunkPlan plan = grad_test_plan(cfg, T, 256, 64, 1.0);
    ModelGrads g = ModelGrads::zeros_like(*model);
    GradientTargets tg;
    tg.model = &g;
    GradientStats st = gradient_step(*model, cache, d.ids, plan, d.head, 1.0, GradientOptions{}, tg);
    PhasePeaks p;
    for (const auto& s : st.phase2_memory) {
        if (!s.device.is_cpu()) continue;
        p.activations = s.peak[size_t(MemCategory::ACTIVATIONS)];
        p.kv_cache = s.peak[size_t(MemCategory::KV_CACHE)];
        p.gradients = s.peak[size_t(MemCategory::GRADIENTS)];
        p.workspace = s.peak[size_t(MemCategory::WORKSPACE)];
        p.checkpoints = s.peak[size_t(MemCategory::ACTIVATION_CHECKPOINT)] + s.peak[size_t(MemCategory::KV_CHECKPOINT)];
    }
    return p;
}

TEST(GradientMemory, BackwardPeakIsFlatInSequenceLength) {
    const int saved = num_threads();
    set_num_threads(1);
    const PhasePeaks a = backward_peaks(8192), b = backward_peaks(32768);
    set_num_threads(saved);
    auto near = [](int64_t x, int64_t y) { return double(std::max(x, y)) <= 1.10 * double(std::min(x, y)); };
    EXPECT_GT(a.activations, 0);
    EXPECT_GT(a.kv_cache, 0);
    EXPECT_TRUE(near(a.activations, b.activations)) << a.activations << " vs " << b.activations;
    EXPECT_TRUE(near(a.kv_cache, b.kv_cache)) << a.kv_cache << " vs " << b.kv_cache;
    EXPECT_TRUE(near(a.gradients, b.gradients)) << a.gradients << " vs " << b.gradients;
    EXPECT_TRUE(near(a.workspace, b.workspace)) << a.workspace << " vs " << b.workspace;
    EXPECT_TRUE(near(a.device_total(), b.device_total())) << a.device_total() << " vs " << b.device_total();
    // the host checkpoints are what grows, about 4x for 4x the tokens
    EXPECT_GT(double(b.checkpoints), 3.0 * double(a.checkpoints));
    std::printf("backward peaks 8k / 32k tokens: activations %lld / %lld, kv cache %lld / %lld, gradients %lld / %lld, "
                "workspace %lld / %lld, checkpoints %lld / %lld bytes\n",
                (long long)a.activations, (long long)b.activations, (long long)a.kv_cache, (long long)b.kv_cache,
                (long long)a.gradients, (long long)b.gradients, (long long)a.workspace, (long long)b.workspace,
                (long long)a.checkpoints, (long long)b.checkpoints);
}

}  // namespace
}  // namespace kv::test
