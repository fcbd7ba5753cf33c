// One SDPA_QROWS decode call straight on a CPU variant's backend, for the code-by-code tests of
// the row formats (qrows_fp8_codes_test, qrows_fp4_codes_test): one query per batch row over
// T keys/values whose rows the test wrote, positions 0..T-1, the query at T-1, scale 1.
#pragma once

#include "engine/backend/backend_registry.h"
#include "engine/ops/ops.h"
#include "kernels/common/quant_formats.h"

namespace kv::test {

// q (B, 1, 1, D) f32; k, v (B, 1, T, row bytes) of format f. Returns false when the backend
// does not take the call (the caller fails its test); y (B, 1, 1, D) f32 otherwise.
inline bool qrows_decode(KernelBackend* be, QuantFormat f, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& y) {
    const int64_t T = k.size(2);
    std::vector<int32_t> pos(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) pos[size_t(t)] = int32_t(t);
    const Tensor kpos = Tensor::from_i32({1, 1, T}, pos), qpos = Tensor::from_i32({1, 1}, {int32_t(T - 1)});
    OpCall c;
    c.op = OpKind::SDPA_QROWS;
    c.p.alpha = 1.0f;
    c.p.qformat = c.p.qformat_v = int(f);
    const Tensor* srcs[] = {&q, &k, &v, &kpos, &qpos};
    for (const Tensor* t : srcs) c.src[c.nsrc++] = t->view();
    c.dst = y.view();
    if (!be->supports_op(c)) return false;
    OpContext ctx = ops::current_context();
    ctx.workspace = nullptr;
    be->compute(ctx, c);
    return true;
}

}  // namespace kv::test
