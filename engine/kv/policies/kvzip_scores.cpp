// KVzip's prompt and piece scoring (see kvzip_scores.h).
#include "engine/kv/policies/kvzip_scores.h"

#include <algorithm>
#include <cmath>

#include "engine/core/error.h"
#include "engine/kv/policies/policy_math.h"

namespace kv {

std::optional<ReconstructionPrompt> kvzip_prompt(const KVCacheConfig& cfg, const TextCodec* text) {
    if (!text || !text->encode) return std::nullopt;
    ReconstructionPrompt p;
    p.first = text->encode("\n\nRepeat the previous context exactly.");
    p.later = text->encode("\n\nRepeat the part of the previous context exactly, starting with");
    p.suffix = text->encode("\n");
    p.quoted = int64_t(cfg.policy_option("kvzip_quoted_tokens"));
    p.piece = int64_t(cfg.policy_option("kvzip_chunk_size"));
    return p;
}

const ReconstructionPrompt& kvzip_prompt_or_throw(const std::optional<ReconstructionPrompt>& prompt, const char* policy) {
    if (!prompt)
        throw Error(str(policy, " needs the model's tokenizer to encode its reconstruction prompt; this cache was built without one"));
    return *prompt;
}

void kvzip_score_piece(const ReconstructionInput& in, int64_t B, int64_t G, int64_t T, const std::vector<int32_t>& pos_all, int64_t stride,
                       int64_t n_sink, const char* policy, std::vector<float>& score) {
    const int64_t NH = in.query_heads, m = in.m, D = in.head_dim;
    if (G < 1 || NH % G != 0 || m < 1 || D < 1 || in.queries.size() != size_t(B * NH * m * D) ||
        in.own_keys.size() != size_t(B * G * m * D) || in.cache_keys.size() != size_t(B * G * T * D) || T > stride ||
        pos_all.size() != size_t(B * G * stride) || score.size() != pos_all.size())
        throw Error(str(policy, ": a reconstruction piece of ", m, " queries does not match the cache (", B, " rows, ", G, " KV heads, ",
                        stride, " slots)"));
    const int64_t R = NH / G;
    std::vector<int32_t> sel;
    std::vector<float> KT, Z;
    std::vector<double> best;
    for (int64_t r = 0; r < B * G; ++r) {
        const int64_t b = r / G, g = r % G;
        const int32_t* pos = pos_all.data() + r * stride;
        // The keys a piece is normalised over (kvpress' chunked scoring): sinks and the chunk's
        // own slots, then the piece's own keys.
        sel.clear();
        for (int64_t j = 0; j < T; ++j)
            if (pos[j] >= 0 && (pos[j] < n_sink || (pos[j] >= in.chunk_begin && pos[j] < in.chunk_end))) sel.push_back(int32_t(j));
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
            if (p >= n_sink && p >= in.chunk_begin && p < in.chunk_end) score[size_t(r * stride + sel[size_t(i)])] = float(best[size_t(i)]);
        }
    }
}

}  // namespace kv
