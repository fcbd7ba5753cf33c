// The shape contract of SDPA_QUEST (kernels/common/op.h), checked alike by every backend's
// supports_op and by the engine before dispatch. Beyond op.h: an optional src7, sink logits
// float (NH) as SDPA's src5 (gpt-oss), in each query's denominator over its selected slots
// (CPU backend only).
#pragma once

#include "op.h"
#include "quest_math.h"

namespace kv {

inline bool quest_call_ok(const OpCall& c) {
    // Source 7, optional: sink logits float (NH) (CPU only: the CUDA backend asks for nsrc 7).
    if ((c.nsrc != 7 && c.nsrc != 8) || c.dst.ndim != 4 || c.p.quest_page <= 0 || c.p.quest_pages < 0 || c.p.window != 0) return false;
    if (c.nsrc == 8) {
        const TensorView& sk = c.src[7];
        if (!sk.data || sk.ndim != 1 || sk.ne[0] != c.src[0].ne[1] ||
            !(sk.dtype == DType::F32 || sk.dtype == DType::F64 || sk.dtype == DType::F16 || sk.dtype == DType::BF16))
            return false;
    }
    const TensorView &q = c.src[0], &k = c.src[1], &v = c.src[2], &kpos = c.src[3], &qpos = c.src[4], &mn = c.src[5], &mx = c.src[6];
    auto flt = [](DType t) { return t == DType::F32 || t == DType::F64 || t == DType::F16 || t == DType::BF16; };
    if (q.ndim != 4 || k.ndim != 4 || v.ndim != 4 || kpos.ndim != 3 || qpos.ndim != 2 || mn.ndim != 4 || mx.ndim != 4) return false;
    if (!flt(q.dtype) || !flt(k.dtype) || !flt(v.dtype) || !flt(c.dst.dtype) || kpos.dtype != DType::I32 ||
        qpos.dtype != DType::I32 || mn.dtype != DType::F32 || mx.dtype != DType::F32)
        return false;
    const int64_t B = q.ne[0], NH = q.ne[1], n = q.ne[2], D = q.ne[3], G = k.ne[1], T = k.ne[2];
    const int64_t NP = (T + c.p.quest_page - 1) / c.p.quest_page;
    if (G <= 0 || NH % G != 0 || k.ne[0] != B || k.ne[3] != D) return false;
    for (int i = 0; i < 4; ++i)
        if (v.ne[i] != k.ne[i]) return false;
    if (mn.ne[0] != B || mn.ne[1] != G || mn.ne[2] < NP || mn.ne[3] != D) return false;
    for (int i = 0; i < 4; ++i)
        if (mx.ne[i] != mn.ne[i]) return false;
    if ((kpos.ne[0] != 1 && kpos.ne[0] != B) || (kpos.ne[1] != 1 && kpos.ne[1] != G) || kpos.ne[2] != T) return false;
    if ((qpos.ne[0] != 1 && qpos.ne[0] != B) || qpos.ne[1] != n) return false;
    if (c.dst.ne[0] != B || c.dst.ne[1] != NH || c.dst.ne[2] != n || c.dst.ne[3] != D) return false;
    if (c.dst2.data && (c.dst2.ndim != 3 || c.dst2.ne[0] != B || c.dst2.ne[1] != G || c.dst2.ne[2] != T || !flt(c.dst2.dtype)))
        return false;
    if (c.dst3.data && (c.dst3.ndim != 4 || c.dst3.dtype != DType::I32 || c.dst3.ne[0] != B || c.dst3.ne[1] != NH ||
                        c.dst3.ne[2] != n || c.dst3.ne[3] != c.p.quest_pages + 1))
        return false;
    // Unit-stride metadata rows (the bound walks them as arrays).
    return mn.nb[3] == 4 && mx.nb[3] == 4;
}

}  // namespace kv
