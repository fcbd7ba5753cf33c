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
#include <algorithm>
#include <cmath>

#include "engine/core/error.h"
#include "engine/kv/policies/policy_math.h"
#include "engine/kv/policies/policy_score_based.h"

namespace kv {

namespace {

class KVzipPolicy final : public ScorePolicy, public ReconstructsContext {
   public:
    KVzipPolicy(const KVCacheConfig& cfg, int64_t L, int64_t G, const TextCodec* text)
        : ScorePolicy(cfg, L, G),
          n_sink_(int64_t(cfg.policy_option("kvzip_n_sink"))),
          piece_(int64_t(cfg.policy_option("kvzip_chunk_size"))),
          quoted_(int64_t(cfg.policy_option("kvzip_quoted_tokens"))) {
        if (text && text->encode) {
            // kvpress' prompts; models without a chat template get "\n" as the suffix.
            prompt_.first = text->encode("\n\nRepeat the previous context exactly.");
            prompt_.later = text->encode("\n\nRepeat the part of the previous context exactly, starting with");
            prompt_.suffix = text->encode("\n");
            have_prompt_ = true;
        }
        prompt_.quoted = quoted_;
        prompt_.piece = piece_;
    }
    const char* name() const override { return "kvzip"; }
    void reset(int64_t batch) override {
        ScorePolicy::reset(batch);
        score_.assign(size_t(rows() * L_), 0.0f);
    }

    ReconstructionPrompt reconstruction_prompt() const override {
        if (!have_prompt_)
            throw Error("kvzip needs the model's tokenizer to encode its reconstruction prompt; this cache was built without one");
        return prompt_;
    }

    void observe_reconstruction(const ReconstructionInput& in) override {
        const int64_t NH = in.query_heads, m = in.m, D = in.head_dim, T = T_;
        if (NH % G_ != 0 || m < 1 || D < 1 || in.queries.size() != size_t(B_ * NH * m * D) ||
            in.own_keys.size() != size_t(B_ * G_ * m * D) || in.cache_keys.size() != size_t(B_ * G_ * T * D))
            throw Error(str("kvzip: a reconstruction piece of ", m, " queries does not match the cache (", B_, " rows, ", G_,
                            " KV heads, ", T, " slots)"));
        const int64_t R = NH / G_;
        std::vector<int32_t> sel;
        std::vector<float> KT, Z;
        std::vector<double> best;
        for (int64_t r = 0; r < rows(); ++r) {
            const int64_t b = r / G_, g = r % G_;
            const int32_t* pos = pos_.data() + r * L_;
            // The keys a piece is normalised over (kvpress' chunked scoring): sinks and the
            // chunk's own slots, then the piece's own keys.
            sel.clear();
            for (int64_t j = 0; j < T; ++j)
                if (pos[j] >= 0 && (pos[j] < n_sink_ || (pos[j] >= in.chunk_begin && pos[j] < in.chunk_end))) sel.push_back(int32_t(j));
            const int64_t S = int64_t(sel.size()), N = S + m;
            // Logits of the group's R m queries against the N keys: one f32 product (D x N keys
            // transposed), then the softmax in f64.
            KT.resize(size_t(D * N));
            const float* K = in.cache_keys.data() + r * T * D;
            const float* own = in.own_keys.data() + r * m * D;
            for (int64_t i = 0; i < N; ++i) {
                const float* k = i < S ? K + sel[size_t(i)] * D : own + (i - S) * D;
                for (int64_t d = 0; d < D; ++d) KT[size_t(d * N + i)] = k[d];
            }
            Z.resize(size_t(R * m * N));
            policy_matmul(R * m, N, D, in.queries.data() + ((b * NH + g * R) * m) * D, D, KT.data(), N, Z.data(), N);
            best.assign(size_t(S), 0.0);
            for (int64_t qi = 0; qi < R * m; ++qi) {
                const int64_t t = qi % m, visible = S + t + 1;  // causal over the piece's own keys
                const float* z = Z.data() + qi * N;
                double mx = -INFINITY, sum = 0;
                for (int64_t i = 0; i < visible; ++i) mx = std::max(mx, double(in.scale) * z[i]);
                for (int64_t i = 0; i < visible; ++i) sum += std::exp(double(in.scale) * z[i] - mx);
                for (int64_t i = 0; i < S; ++i) best[size_t(i)] = std::max(best[size_t(i)], std::exp(double(in.scale) * z[i] - mx) / sum);
            }
            for (int64_t i = 0; i < S; ++i) {
                const int32_t p = pos[sel[size_t(i)]];
                if (p >= n_sink_ && p >= in.chunk_begin && p < in.chunk_end) score_[size_t(r * L_ + sel[size_t(i)])] = float(best[size_t(i)]);
            }
        }
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
    int64_t n_sink_, piece_, quoted_;
    ReconstructionPrompt prompt_;
    bool have_prompt_ = false;
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
