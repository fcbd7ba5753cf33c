// random: the floor every comparison needs. Each time a full cache chooses its next victims,
// every slot of the eviction range draws a fresh uniform score from a counter-based hash of
// (seed, layer, row, input position, token position), and the lowest scores go — a uniformly
// random choice per (b, g) row and layer, reproducible from the seed, independent of any
// attention or key value (so it needs no weights and runs on the fast SDPA path).
#include "engine/kv/policies/policy_score_based.h"

namespace kv {

namespace {

// splitmix64's finalizer (Steele et al. 2014): a bijection of 64-bit words with full avalanche.
uint64_t mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

class RandomPolicy final : public SlotScorePolicy {
   public:
    RandomPolicy(const KVCacheConfig& cfg, int64_t L, int64_t G, int64_t layer)
        : SlotScorePolicy(cfg, L, G), seed_(uint64_t(cfg.policy_option("random_seed"))), layer_(uint64_t(layer)) {}
    const char* name() const override { return "random"; }

   protected:
    // Draw after every chunk (the scores are only read once the cache is full). The top 24 bits
    // make a float in [0, 1) exactly, so every platform draws the same numbers.
    void accumulate(const std::vector<float>&, int64_t) override {
        for (int64_t r = 0; r < rows(); ++r)
            for (int64_t j = 0; j < T_; ++j) {
                const uint64_t h = mix64(mix64(mix64(mix64(seed_ ^ layer_) ^ uint64_t(r)) ^ uint64_t(P_)) ^
                                         uint64_t(uint32_t(pos_[size_t(r * L_ + j)])));
                score(r, j) = float(h >> 40) * 0x1p-24f;
            }
    }

   private:
    uint64_t seed_, layer_;
};

}  // namespace

std::vector<PolicyInfo> random_policies() {
    return {{.name = "random",
             .summary = "evict uniformly random slots (seeded by random_seed; the floor of every comparison)",
             .make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> {
                 return std::make_unique<RandomPolicy>(a.cfg, a.L, a.G, a.layer);
             },
             .uses = {"grace_period", "keep_initial_fraction", "max_chunk_size"},
             .options = {{.name = "random_seed",
                          .help = "random: seed of the eviction draws",
                          .def = 0,
                          .lo = 0,
                          .hi = 9007199254740992.0,  // 2^53: every integer up to it is exact in a double
                          .integer = true}},
             .doc_anchor = "docs/POLICIES.md#random"}};
}

}  // namespace kv
