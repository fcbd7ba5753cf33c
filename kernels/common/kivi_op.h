// The shape contract of SDPA_KIVI (kernels/common/op.h), checked alike by every backend's
// supports_op and by the engine before dispatch. Beyond op.h: an optional src9, sink logits
// float (NH) as SDPA's src5 (gpt-oss), in every query row's denominator, weight sums included
// (CPU backend only: the CUDA kernel refuses it).
#pragma once

#include "kivi_math.h"
#include "op.h"

namespace kv {

inline bool kivi_call_ok(const OpCall& c) {
    if ((c.nsrc != 9 && c.nsrc != 10) || c.dst.ndim != 4) return false;
    if (c.nsrc == 10) {
        const TensorView& sk = c.src[9];
        if (!sk.data || sk.ndim != 1 || sk.ne[0] != c.src[0].ne[1] ||
            !(sk.dtype == DType::F32 || sk.dtype == DType::F64 || sk.dtype == DType::F16 || sk.dtype == DType::BF16))
            return false;
    }
    const TensorView &q = c.src[0], &kc = c.src[1], &ks = c.src[2], &vc = c.src[3], &vs = c.src[4], &res = c.src[5],
                     &map = c.src[6], &kpos = c.src[7], &qpos = c.src[8];
    auto flt = [](DType t) { return t == DType::F32 || t == DType::F64 || t == DType::F16 || t == DType::BF16; };
    const int bits = c.p.kivi_bits;
    const int64_t S = c.p.kivi_group;
    if ((bits != 2 && bits != 4) || S <= 0 || (S * bits) % 8 != 0) return false;
    if (!flt(q.dtype) || !flt(c.dst.dtype) || q.ndim != 4 || kc.dtype != DType::U8 || ks.dtype != DType::F16 ||
        vc.dtype != DType::U8 || vs.dtype != DType::F16 || !flt(res.dtype) || map.dtype != DType::I32 ||
        kpos.dtype != DType::I32 || qpos.dtype != DType::I32)
        return false;
    if (kc.ndim != 5 || ks.ndim != 5 || vc.ndim != 4 || vs.ndim != 5 || res.ndim != 4 || map.ndim != 3 || kpos.ndim != 3 ||
        qpos.ndim != 2)
        return false;
    const int64_t B = q.ne[0], NH = q.ne[1], n = q.ne[2], D = q.ne[3], G = kc.ne[1], NG = kc.ne[2], T = kpos.ne[2];
    if (G <= 0 || NH % G != 0 || kc.ne[0] != B || kc.ne[3] != D || kc.ne[4] != S * bits / 8) return false;
    if (ks.ne[0] != B || ks.ne[1] != G || ks.ne[2] != NG || ks.ne[3] != D || ks.ne[4] != 2) return false;
    const int64_t L = vc.ne[2], VG = kivi_value_group(S, D);
    if (D % VG != 0 || (D * bits) % 8 != 0 || vc.ne[0] != B || vc.ne[1] != G || vc.ne[3] != D * bits / 8) return false;
    if (vs.ne[0] != B || vs.ne[1] != G || vs.ne[2] != L || vs.ne[3] != D / VG || vs.ne[4] != 2) return false;
    if (res.ne[1] != 2 || res.ne[2] != S || res.ne[3] != D || res.ne[0] < 1) return false;
    if (map.ne[0] != B || map.ne[1] != G || map.ne[2] != NG) return false;
    if (T > L || T > NG * S || (kpos.ne[0] != 1 && kpos.ne[0] != B) || (kpos.ne[1] != 1 && kpos.ne[1] != G)) return false;
    if ((qpos.ne[0] != 1 && qpos.ne[0] != B) || qpos.ne[1] != n) return false;
    if (c.dst.ne[0] != B || c.dst.ne[1] != NH || c.dst.ne[2] != n || c.dst.ne[3] != D) return false;
    if (c.dst2.data && (c.dst2.ndim != 3 || c.dst2.ne[0] != B || c.dst2.ne[1] != G || c.dst2.ne[2] != T || !flt(c.dst2.dtype)))
        return false;
    // Unit-stride innermost rows of the packed bytes and scales (the kernels walk them as arrays).
    return kc.nb[4] == 1 && kc.nb[3] == S * bits / 8 && ks.nb[4] == 2 && ks.nb[3] == 4 && vc.nb[3] == 1 && vs.nb[4] == 2 &&
           vs.nb[3] == 4;
}

}  // namespace kv
