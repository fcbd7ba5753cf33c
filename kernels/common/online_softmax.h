// The online softmax (Milakov & Gimelshein 2018; FlashAttention's running statistics): the
// running maximum m and sum l of exp(s - m) over scores seen one at a time, and the merge of
// partial states computed over disjoint key sets (one per warp, page or thread range). One
// piece of code for the -inf conventions every SDPA variant needs: a state that has seen no
// visible key has m = -inf and l = 0, its accumulators are dropped (scale 0) when a real key
// arrives, and it contributes nothing to a merge.
#pragma once

#include <cmath>

#include "kernels/common/element_math.h"
#include "kernels/common/hd.h"

namespace kv {

// How to update accumulators after a score was pushed: acc = acc * corr + e * v.
template <class A>
struct SoftmaxStep {
    A corr, e;
};

// Pushes one visible score s into (m, l).
template <class A>
KV_HD SoftmaxStep<A> online_softmax_push(A& m, A& l, A s) {
    const A m_new = s > m ? s : m;
    const A corr = m == -INFINITY ? A(0) : kv_exp(m - m_new);
    const A e = kv_exp(s - m_new);
    l = l * corr + e;
    m = m_new;
    return {corr, e};
}

// The factor that brings a partial state with maximum mu to a common maximum mt (0 for a
// state that saw no key).
template <class A>
KV_HD A online_softmax_scale(A mu, A mt) {
    return mu == -INFINITY ? A(0) : kv_exp(mu - mt);
}

// The common maximum and total sum of n partial states (wm[u], wl[u]).
template <class A>
KV_HD void online_softmax_merge(const A* wm, const A* wl, int n, A& mt, A& lt) {
    mt = -INFINITY;
    for (int u = 0; u < n; ++u) mt = wm[u] > mt ? wm[u] : mt;
    lt = A(0);
    for (int u = 0; u < n; ++u) lt += wl[u] * online_softmax_scale(wm[u], mt);
}

}  // namespace kv
