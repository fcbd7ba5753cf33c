// The online softmax (Milakov & Gimelshein 2018; FlashAttention's running statistics): the
// running maximum m and sum l of exp(s - m) over scores seen one at a time or a block at a
// time, a sink score with no value, and the merge of partial states computed over disjoint key
// sets (one per warp, page, thread range or unit). One piece of code for the -inf conventions
// every SDPA variant needs: a state that has seen no visible key has m = -inf and l = 0, its
// accumulators are dropped (scale 0) when a real key arrives, and it contributes nothing to a
// merge.
//
// The exponential is a template parameter: KvExp (kv_exp, the vectorizable polynomial on the
// CPU) by default; LibmExp (std::exp) for the CPU kernels whose results, and the replay hashes
// and stored values over them, were fixed with libm's rounding.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/common/element_math.h"
#include "kernels/common/hd.h"

namespace kv {

struct KvExp {
    template <class A>
    KV_HD A operator()(A x) const {
        return kv_exp(x);
    }
};

#if !KV_DEVICE_PASS
struct LibmExp {
    template <class A>
    A operator()(A x) const {
        return std::exp(x);
    }
};
#endif

// How to update accumulators after a score was pushed: acc = acc * corr + e * v.
template <class A>
struct SoftmaxStep {
    A corr, e;
};

// The factor that brings a partial state with maximum mu to a common maximum mt (0 for a
// state that saw no key).
template <class A, class Exp = KvExp>
KV_HD A online_softmax_scale(A mu, A mt, Exp ex = {}) {
    return mu == -INFINITY ? A(0) : ex(mu - mt);
}

// Pushes one visible score s into (m, l).
template <class A, class Exp = KvExp>
KV_HD SoftmaxStep<A> online_softmax_push(A& m, A& l, A s, Exp ex = {}) {
    const A m_new = s > m ? s : m;
    const A corr = online_softmax_scale(m, m_new, ex);
    const A e = ex(s - m_new);
    l = l * corr + e;
    m = m_new;
    return {corr, e};
}

// Raises (m, l) to a block of scores whose maximum is mb (finite) before the block's terms
// exp(s - m) are added to l: l is rescaled, and the returned factor is the one the
// accumulators formed under the old maximum must be multiplied by.
template <class A, class Exp = KvExp>
KV_HD A online_softmax_raise(A& m, A& l, A mb, Exp ex = {}) {
    const A m_new = mb > m ? mb : m;
    const A corr = online_softmax_scale(m, m_new, ex);
    l *= corr;
    m = m_new;
    return corr;
}

// Folds a sink score (a logit in the denominator with no value, gpt-oss) into (m, l); returns
// the factor for the accumulators.
template <class A, class Exp = KvExp>
KV_HD A online_softmax_sink(A& m, A& l, A sink, Exp ex = {}) {
    const A m_new = sink > m ? sink : m;
    const A corr = online_softmax_scale(m, m_new, ex);
    l = l * corr + ex(sink - m_new);
    m = m_new;
    return corr;
}

// The common maximum and total sum of n partial states (wm[u * stride], wl[u * stride]).
template <class A, class Exp = KvExp>
KV_HD void online_softmax_merge(const A* wm, const A* wl, int n, A& mt, A& lt, int64_t stride = 1, Exp ex = {}) {
    mt = -INFINITY;
    for (int u = 0; u < n; ++u) mt = wm[u * stride] > mt ? wm[u * stride] : mt;
    lt = A(0);
    for (int u = 0; u < n; ++u) lt += wl[u * stride] * online_softmax_scale(wm[u * stride], mt, ex);
}

}  // namespace kv
