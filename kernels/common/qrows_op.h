// The shape contract of SDPA_QROWS (kernels/common/op.h), checked alike by every backend's
// supports_op and by the engine before dispatch.
#pragma once

#include "op.h"
#include "quant_formats.h"

namespace kv {

// Formats SDPA_QROWS reads, as keys or values: fp8, the two fp4 layouts and TurboQuant's
// (codebook or uniform codes, rotated rows).
inline bool qrows_format(QuantFormat f) {
    return f == QuantFormat::FP8_E4M3 || f == QuantFormat::FP8_E5M2 || f == QuantFormat::NVFP4 || f == QuantFormat::MXFP4 ||
           tq_bits(f) != 0;
}

inline bool qrows_call_ok(const OpCall& c) {
    if (c.nsrc != 5 || c.dst.ndim != 4) return false;
    if (c.p.qformat < 0 || c.p.qformat >= int(QuantFormat::COUNT) || c.p.qformat_v < 0 || c.p.qformat_v >= int(QuantFormat::COUNT))
        return false;
    const QuantFormat kf = QuantFormat(c.p.qformat), vf = QuantFormat(c.p.qformat_v);
    if (!qrows_format(kf) || !qrows_format(vf)) return false;
    const TensorView &q = c.src[0], &k = c.src[1], &v = c.src[2], &kpos = c.src[3], &qpos = c.src[4];
    if (q.dtype != DType::F32 || c.dst.dtype != DType::F32 || k.dtype != DType::U8 || v.dtype != DType::U8 ||
        kpos.dtype != DType::I32 || qpos.dtype != DType::I32)
        return false;
    if (q.ndim != 4 || k.ndim != 4 || v.ndim != 4 || kpos.ndim != 3 || qpos.ndim != 2) return false;
    const int64_t B = q.ne[0], NH = q.ne[1], n = q.ne[2], D = q.ne[3], G = k.ne[1], L = k.ne[2], T = kpos.ne[2];
    if (G <= 0 || NH % G != 0 || !quant_row_ok(kf, D) || !quant_row_ok(vf, D)) return false;
    if (k.ne[0] != B || k.ne[3] != quant_row_bytes(kf, D) || v.ne[0] != B || v.ne[1] != G || v.ne[2] != L ||
        v.ne[3] != quant_row_bytes(vf, D))
        return false;
    if (T > L || (kpos.ne[0] != 1 && kpos.ne[0] != B) || (kpos.ne[1] != 1 && kpos.ne[1] != G)) return false;
    if ((qpos.ne[0] != 1 && qpos.ne[0] != B) || qpos.ne[1] != n) return false;
    if (c.dst.ne[0] != B || c.dst.ne[1] != NH || c.dst.ne[2] != n || c.dst.ne[3] != D) return false;
    if (c.dst2.data && (c.dst2.ndim != 3 || c.dst2.ne[0] != B || c.dst2.ne[1] != G || c.dst2.ne[2] != T || c.dst2.dtype != DType::F32))
        return false;
    // Byte rows contiguous, one after another along the slots (the kernel walks a range of rows as one array).
    return k.nb[3] == 1 && v.nb[3] == 1 && k.nb[2] == k.ne[3] && v.nb[2] == v.ne[3] && q.nb[3] == 4;
}

}  // namespace kv
