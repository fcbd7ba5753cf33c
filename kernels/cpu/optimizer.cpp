// OPTIMIZER_STEP on the CPU: one pass over param, gradient and state rows, the per-element
// formula from kernels/common/optim_math.h (the same code the CUDA kernel runs). In place:
// param and state are read and written; absent state slots read and write per-thread scratch.
#include "cpu_common.h"
#include "kernels/common/optim_math.h"

namespace kv::cpu {

namespace {
template <class A>
void optimizer_rows(const OpContext& ctx, const OpCall& c) {
    const OptimConsts<A> k = optim_consts<A>(c.p.opt);
    const TensorView& p = c.dst;
    TensorView rest[3];
    int nr = 0;
    rest[nr++] = broadcast_to(c.src[0], p);
    const bool has1 = c.dst2.data != nullptr, has2 = c.dst3.data != nullptr;
    if (has1) rest[nr++] = c.dst2;
    if (has2) rest[nr++] = c.dst3;
    for_rows(ctx, p, rest, nr, [&](const int64_t* off, int64_t n) {
        A* pr = row_out_acc<A>(p, off[0], n, 0, true);
        const A* gr = row_in<A>(rest[0], off[1], n, 1);
        A* s1 = has1 ? row_out_acc<A>(c.dst2, off[2], n, 2, true) : scratch<A>(2, n);
        A* s2 = has2 ? row_out_acc<A>(c.dst3, off[has1 ? 3 : 2], n, 3, true) : scratch<A>(3, n);
        for (int64_t i = 0; i < n; ++i) kv_optim_update(k, pr + i, gr[i], s1 + i, s2 + i);
        row_commit(p, off[0], n, pr);
        if (has1) row_commit(c.dst2, off[2], n, s1);
        if (has2) row_commit(c.dst3, off[has1 ? 3 : 2], n, s2);
    });
}
}  // namespace

void optimizer_step(const OpContext& ctx, const OpCall& c) {
    if (is_f64_call(c)) optimizer_rows<double>(ctx, c);
    else optimizer_rows<float>(ctx, c);
}

}  // namespace kv::cpu
