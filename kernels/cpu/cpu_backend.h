// CPU backend: every op in kernels/common/op.h (forward ops, their gradients, the losses and
// the optimizer step), multi-threaded with OpenMP, matmul through oneDNN (f32, bf16) with a
// plain fallback, SDPA through register-blocked tiles. Storage dtypes f32/bf16/f16 compute in
// f32; f64 computes in f64 (reference checks, finite differences).
#pragma once

#include <string>

#include "kernels/common/backend_iface.h"

namespace kv {

// The CPU backend compiled into this library (the build's own flags: the "base" variant of
// a portable build). The engine asks backend_registry's cpu_backend() instead, which may be
// a faster variant library; labs and tests use this one directly.
KernelBackend& cpu_kernel_backend();

namespace cpu {
// oneDNN implementation names used so far ("brg:avx512_core, ...") for benchmark reports
// (also KernelBackend::impl_info()).
std::string matmul_impl_info();
}  // namespace cpu

}  // namespace kv
