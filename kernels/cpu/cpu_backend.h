// CPU backend: every op in kernels/common/op.h (forward ops, their gradients, the losses and
// the optimizer step), multi-threaded with OpenMP, matmul through oneDNN (f32, bf16) with a
// plain fallback, SDPA through register-blocked tiles. Storage dtypes f32/bf16/f16 compute in
// f32; f64 computes in f64 (reference checks, finite differences).
#pragma once

#include <string>

#include "kernels/common/backend_iface.h"

namespace kv {

// The process-wide CPU backend instance.
KernelBackend& cpu_kernel_backend();

namespace cpu {
// oneDNN implementation names used so far ("brg:avx512_core, ...") for benchmark reports.
std::string matmul_impl_info();
}  // namespace cpu

}  // namespace kv
