// The policy core and its capabilities (engine/kv/policy_capabilities.h): the registry attaches
// to every policy exactly the capabilities docs/ARCHITECTURE.md lists for it, the position
// layout every policy reports matches the positions it holds, and a chunk's inputs
// (engine/kv/chunk_input.h) are checked against the call they come with.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "engine/core/error.h"
#include "engine/kv/chunk_input.h"
#include "engine/kv/policies/policy_registry.h"
#include "kv_test_util.h"

namespace kv::test {
namespace {

// Policies another test registered in this process (policy_runtime.h): not the built-in table.
bool registered_at_run_time(const PolicyInfo& p) { return p.doc_anchor.find("registered-at-run-time") != std::string::npos; }

std::string buffer_for(const PolicyInfo& p) {
    if (!p.buffers.empty()) return p.buffers[0];
    return p.needs_quantized_buffer ? "q8" : "default";
}

// The capability table of docs/ARCHITECTURE.md ("Policies stay in engine/kv"), written out.
struct Expected {
    bool selects = false, reconstructs = false, pooled = false, cross_layer = false, reorders = false, tokens = false;
};
Expected documented(const std::string& name) {
    Expected e;
    e.selects = name == "quest";
    e.reorders = name == "quest";
    e.reconstructs = name == "kvzip" || name == "ada-kvzip" || name == "global-kvzip";
    e.pooled = name.rfind("ada-", 0) == 0 || name == "critical-ada" || name.rfind("lukv-", 0) == 0 || name == "duo";
    e.cross_layer = name == "cake" || name == "global-kvzip";
    e.tokens = name == "smart-lastrec";
    return e;
}

TEST(PolicyCapabilities, TheRegistryAttachesWhatTheArchitectureTableLists) {
    for (const PolicyInfo& p : policy_registry()) {
        if (registered_at_run_time(p)) continue;
        const std::unique_ptr<KVPolicy> pol = make_test_policy(p.name + "-" + buffer_for(p), 16);
        const PolicyCapabilities& c = pol->capabilities();
        const Expected e = documented(p.name);
        EXPECT_EQ(c.selects_reads != nullptr, e.selects) << p.name;
        EXPECT_EQ(c.reconstructs_context != nullptr, e.reconstructs) << p.name;
        EXPECT_EQ(c.pooled_slots != nullptr, e.pooled) << p.name;
        EXPECT_EQ(c.cross_layer_lengths != nullptr, e.cross_layer) << p.name;
        EXPECT_EQ(c.reorders_batch != nullptr, e.reorders) << p.name;
        EXPECT_EQ(c.reads_tokens != nullptr, e.tokens) << p.name;
    }
}

// Whatever the layout (one row of L per (b, head), one shared row, or a per-head pool), the
// positions a policy holds are rows of position_row_length() slots: B G rows, or one shared row.
TEST(PolicyCapabilities, PositionRowsMatchThePositionsEveryPolicyHolds) {
    for (const PolicyInfo& p : policy_registry()) {
        if (registered_at_run_time(p)) continue;
        const std::unique_ptr<KVPolicy> pol = make_test_policy(p.name + "-" + buffer_for(p), 16);
        pol->reset(3);
        const int64_t rows = pol->per_row_positions() ? 3 * pol->groups() : 1;
        EXPECT_EQ(int64_t(pol->token_positions().size()), rows * pol->position_row_length()) << p.name;
        EXPECT_EQ(pol->position_row_length(), pool_slots(*pol) > 0 ? pool_slots(*pol) : pol->cache_length()) << p.name;
    }
}

// A policy that reads the text gets the chunk's ids with the call; ids of another chunk's shape
// are refused with both counts named, not silently ignored.
TEST(ChunkInput, TokenIdsOfAnotherShapeAreRefused) {
    LayerHarness h("smart-lastrec-default", 24, 7);
    h.step(8);  // the prefill, without text
    std::mt19937_64 rng(3);
    const int64_t n = 4;
    Tensor q = random_tensor({h.B, h.NH, n, h.D}, DType::F32, rng, -2.0, 2.0);
    Tensor k = random_tensor({h.B, h.G, n, h.D}, DType::F32, rng, -2.0, 2.0);
    Tensor v = random_tensor({h.B, h.G, n, h.D}, DType::F32, rng, -2.0, 2.0);
    Tensor y = Tensor::empty({h.B, h.NH, n, h.D}, DType::F32);
    const std::vector<int32_t> wrong(3, 65);
    std::string msg;
    try {
        h.cache->attend(0, q, k, v, h.P, 0.25f, 0, y, ChunkInput{.ids = &wrong});
    } catch (const Error& e) {
        msg = e.what();
    }
    EXPECT_NE(msg.find("hold 3 values"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(h.B) + " x " + std::to_string(n) + " tokens"), std::string::npos) << msg;
    // The right shape is taken (the cache was not advanced by the refused call).
    const std::vector<int32_t> ids(size_t(h.B * n), 65);
    EXPECT_NO_THROW(h.cache->attend(0, q, k, v, h.P, 0.25f, 0, y, ChunkInput{.ids = &ids}));
    EXPECT_EQ(h.layer().input_pos(), h.P + n);
}

// What the transformer hands the attention before each layer attends (RoPE frequencies, W_o)
// reaches the cache through the chunk's binding; critical-* read W_o this way, and a binding
// that dropped it would leave them scoring with W_o = I without a word.
class HandedSpy final : public CacheAttention {
   public:
    void attend(int, const Tensor&, const Tensor&, const Tensor&, int64_t, float, int, Tensor&, const ChunkInput& in) override {
        ++attends, last_ids = in.ids;
    }
    void set_rope_frequencies(const std::vector<double>* inv_freq) override { freq = inv_freq; }
    void set_output_projection(int layer, const Tensor& wo) override { wo_layer = layer, wo_ptr = wo.data_ptr(); }
    int attends = 0, wo_layer = -1;
    const std::vector<double>* freq = nullptr;
    const void* wo_ptr = nullptr;
    const std::vector<int32_t>* last_ids = nullptr;
};

TEST(ChunkInput, TheChunkBindingForwardsWhatTheModelHandsTheCache) {
    HandedSpy spy;
    ChunkInput in;
    const std::vector<int32_t> ids = {5, 6, 7};
    in.ids = &ids;
    ChunkCall call(spy, in);
    const std::vector<double> inv_freq = {1.0, 0.5};
    const Tensor wo = Tensor::from_f32({2, 2}, {1, 2, 3, 4});
    call.set_rope_frequencies(&inv_freq);
    call.set_output_projection(3, wo);
    Tensor q, k, v, y;
    call.attend(3, q, k, v, 0, 1.0f, 0, y);
    EXPECT_EQ(spy.freq, &inv_freq);
    EXPECT_EQ(spy.wo_layer, 3);
    EXPECT_EQ(spy.wo_ptr, wo.data_ptr());
    EXPECT_EQ(spy.attends, 1);
    EXPECT_EQ(spy.last_ids, &ids);
}

}  // namespace
}  // namespace kv::test
