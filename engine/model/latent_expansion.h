// What a latent cache needs to run a chunk of multi-head latent attention in the expanded form
// while it stores latents (latent_attend builds it; LayerCache uses it without knowing MLA).
//
// The absorbed form scores C = qk_rope_head_dim + kv_lora_rank channels per head and sums C
// value channels; the expanded form scores head_dim and sums v_head_dim, after turning each held
// latent into every head's key and value once. For n queries over T held latents and NH heads:
//   absorbed  n T NH 2C                  multiply-adds
//   expanded  T r NH (D + VD) + n T NH (HS + VD)
// so the expanded form is cheaper iff n (2C - HS - VD) > r (D + VD), whatever T is: decode
// (n = 1) stays absorbed, a long enough chunk (a prefill) expands.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>

#include "engine/core/tensor.h"

namespace kv {

struct LatentExpansion {
    // The chunk's per-head queries (B, NH, n, HS), rotated like the expanded form's.
    Tensor q;
    // Held latents (B, 1, T, C) = [RoPE(k_pe) ; c] -> every head's keys and values (B, NH, T, HS):
    // K_h = [k_pe ; W_uk_h c], V_h = [W_uv_h c ; zeros].
    std::function<std::pair<Tensor, Tensor>(const Tensor& latents)> expand;
    // The smallest chunk (queries) that runs expanded; decode keeps the absorbed form below it.
    int64_t min_queries = 0;
    // (B, NH, n, HS): where the output goes when the expanded form ran (the call's own y, the
    // absorbed (B, NH, n, C) output, is then left unwritten).
    Tensor y;
    // Set by the attention that ran the expanded form.
    bool ran = false;
    // Writes the absorbed queries (the call's q) when the caller left them unwritten: a chunk
    // that runs expanded reads q only where its cache or policy looks at the queries (a prefill
    // of a long prompt would otherwise form them for nothing). Every attention that reads q calls
    // ensure_queries() first; empty once they are written.
    std::function<void()> write_queries;

    bool wants(int64_t n) const { return expand && n >= min_queries; }
    void ensure_queries() {
        if (!write_queries) return;
        const std::function<void()> w = std::move(write_queries);
        write_queries = nullptr;
        w();
    }
};

}  // namespace kv
