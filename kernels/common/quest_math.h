// Quest page selection (Tang et al. 2024, "Quest: Query-Aware Sparsity for Efficient
// Long-Context LLM Inference"), shared by the CPU and CUDA kernels of SDPA_QUEST and by the
// engine's tests. The cache is cut into pages of P consecutive slots; page j covers slots
// [jP, min(jP + P, T)) and keeps the element-wise min and max of its keys per KV head. For a
// query q the score of any key k in page j is bounded by
//     U_j(q) = sum_d max(q_d * kmin_jd, q_d * kmax_jd)  >=  q . k,
// since q_d k_d is linear in k_d on [kmin_jd, kmax_jd], so its maximum sits at an end.
// A query reads its top-`pages` visible pages by U (ties: the lower page index first, so the
// choice is deterministic) plus, always, the page holding its own most recent visible slot.
#pragma once

#include <cstdint>

#include "hd.h"

#if !KV_NVCC
#include <algorithm>
#include <vector>
#endif

namespace kv {

// U_j(q) over D channels; A is the accumulation type (f32 kernels, f64 references).
template <class A, class Q, class K>
KV_HD A quest_page_bound(const Q* q, const K* kmin, const K* kmax, int64_t D) {
    A u = A(0);
    for (int64_t d = 0; d < D; ++d) {
        const A a = A(q[d]) * A(kmin[d]), b = A(q[d]) * A(kmax[d]);
        u += a > b ? a : b;
    }
    return u;
}

// The selection order: page a before page b when its bound is larger, or equal with a lower
// index. A NaN bound (a NaN query) sorts last so the choice stays a strict order.
template <class A>
KV_HD bool quest_before(A ua, int64_t a, A ub, int64_t b) {
    const bool na = ua != ua, nb = ub != ub;
    if (na != nb) return nb;
    if (!na && ua != ub) return ua > ub;
    return a < b;
}

// Pages a query selects from `visible` candidate pages [0, visible) with bounds u: the
// `pages` first in quest_before order, plus `forced` (the page of its most recent slot) when
// it is not among them. Written ascending to out (at most pages + 1 entries); returns the count.
#if !KV_NVCC
template <class A>
int64_t quest_select(const A* u, int64_t visible, int64_t pages, int64_t forced, int32_t* out, std::vector<int32_t>& scratch) {
    if (visible <= 0) return 0;
    if (pages >= visible) {
        for (int64_t j = 0; j < visible; ++j) out[j] = int32_t(j);
        return visible;
    }
    scratch.resize(size_t(visible));
    for (int64_t j = 0; j < visible; ++j) scratch[size_t(j)] = int32_t(j);
    auto before = [u](int32_t a, int32_t b) { return quest_before<A>(u[a], a, u[b], b); };
    int64_t n = 0;
    if (pages > 0) {
        std::nth_element(scratch.begin(), scratch.begin() + (pages - 1), scratch.end(), before);
        n = pages;
    }
    bool has_forced = false;
    for (int64_t i = 0; i < n; ++i) has_forced |= scratch[size_t(i)] == forced;
    if (!has_forced && forced >= 0 && forced < visible) {
        // nth_element keeps [0, pages) as the first `pages`; put the forced page after them.
        for (int64_t i = n; i < visible; ++i)
            if (scratch[size_t(i)] == forced) std::swap(scratch[size_t(i)], scratch[size_t(n)]);
        ++n;
    }
    std::copy(scratch.begin(), scratch.begin() + n, out);
    std::sort(out, out + n);
    return n;
}
#endif

// Pages per query from the options: `pages` when > 0, else ceil(token_budget / P) (at least 1).
KV_HD int64_t quest_pages_for(int64_t pages, int64_t token_budget, int64_t page_size) {
    if (pages > 0) return pages;
    const int64_t k = (token_budget + page_size - 1) / page_size;
    return k > 0 ? k : 1;
}

}  // namespace kv
