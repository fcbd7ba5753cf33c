// kvzip (Kim et al. 2025, "KVzip: Query-Agnostic KV Cache Compression with Context
// Reconstruction"; kvpress' KVzipPress): a KV pair is worth its slot by the most attention it
// receives while the model repeats the context. After each chunk the driver runs a
// reconstruction piece ("Repeat the previous context exactly." + the chunk's tokens) through
// the model without caching it (engine/kv/context_reconstruction.*); at every layer this policy
// scores the chunk's slots by the maximum softmax weight over the KV group's query heads and
// the piece's queries, normalised as kvpress' chunked scoring does: over the sinks, the chunk's
// own cached keys and the piece's own keys (causal). A token is scored once, by its own chunk's
// piece; the first kvzip_n_sink tokens score 1 (kept). Eviction: the lowest scores per (b, g)
// row, with the shared grace ring and keep-initial rule (docs/POLICIES.md#kvzip).
#include "engine/kv/policies/kvzip_scores.h"
#include "engine/kv/policies/policy_score_based.h"

namespace kv {

namespace {

class KVzipPolicy final : public ScorePolicy, public ReconstructsContext {
   public:
    KVzipPolicy(const KVCacheConfig& cfg, int64_t L, int64_t G, const TextCodec* text)
        : ScorePolicy(cfg, L, G), prompt_(kvzip_prompt(cfg, text)), n_sink_(int64_t(cfg.policy_option("kvzip_n_sink"))) {}
    const char* name() const override { return "kvzip"; }
    void reset(int64_t batch) override {
        ScorePolicy::reset(batch);
        score_.assign(size_t(rows() * L_), 0.0f);
    }

    ReconstructionPrompt reconstruction_prompt() const override { return kvzip_prompt_or_throw(prompt_, name()); }

    void observe_reconstruction(const ReconstructionInput& in) override {
        kvzip_score_piece(in, B_, G_, T_, pos_, L_, n_sink_, name(), score_);
        if (T_ == L_ && !driven_by_pool_) ScorePolicy::update({}, 0);  // the next chunk's victims, from the new scores
    }

   protected:
    void init_slot(int64_t r, int64_t slot, const InsertFeatures&, int64_t) override {
        // pos_ already holds the new token's position; sinks are kept (a weight is at most 1).
        score_[size_t(r * L_ + slot)] = pos_[size_t(r * L_ + slot)] < n_sink_ ? 1.0f : 0.0f;
    }
    void move_slot(int64_t r, int64_t from, int64_t to) override { score_[size_t(r * L_ + to)] = score_[size_t(r * L_ + from)]; }
    void accumulate(const std::vector<float>&, int64_t) override {}
    void eviction_scores(std::vector<float>& S) const override {
        const int64_t cand = L_ - grace();
        for (int64_t r = 0; r < rows(); ++r)
            for (int64_t j = 0; j < cand; ++j) S[size_t(r * cand + j)] = score_[size_t(r * L_ + j)];
    }

   private:
    std::optional<ReconstructionPrompt> prompt_;  // none without a tokenizer (the pass says so)
    int64_t n_sink_;
    std::vector<float> score_;  // (B*G, L)
};

}  // namespace

std::vector<PolicyInfo> kvzip_policies() {
    return {{.name = "kvzip",
             .summary = "KVzip: max attention a slot receives while the model repeats the context (a second pass, ~2x prefill)",
             .make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> {
                 return std::make_unique<KVzipPolicy>(a.cfg, a.L, a.G, a.text);
             },
             .needs_text = true,
             .uses = {"grace_period", "keep_initial_fraction", "max_chunk_size"},
             .options = {{.name = "kvzip_n_sink", .help = "kvzip: first tokens kept as attention sinks (score 1)", .def = 4, .lo = 0,
                          .hi = 1 << 20, .integer = true},
                         {.name = "kvzip_chunk_size",
                          .help = "kvzip: longest reconstruction piece (a longer chunk is repeated in pieces)",
                          .def = 2048,
                          .lo = 1,
                          .hi = 1 << 24,
                          .integer = true},
                         {.name = "kvzip_quoted_tokens",
                          .help = "kvzip: tokens before a later piece quoted in its prompt (\"starting with ...\")",
                          .def = 8,
                          .lo = 0,
                          .hi = 1024,
                          .integer = true}},
             .doc_anchor = "docs/POLICIES.md#kvzip"}};
}

}  // namespace kv
