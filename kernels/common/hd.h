// Host/device qualifier for element math shared by the CPU and CUDA kernels.
// Anything marked KV_HD must compile as plain C++ (CPU build, tests) and under nvcc;
// it must not touch engine types, allocation or I/O.
#pragma once

#if defined(__CUDACC__)
#define KV_HD __host__ __device__ __forceinline__
#define KV_NVCC 1
#else
#define KV_HD inline
#define KV_NVCC 0
#endif

// True only in the device pass of nvcc (device intrinsics allowed).
#if defined(__CUDA_ARCH__)
#define KV_DEVICE_PASS 1
#else
#define KV_DEVICE_PASS 0
#endif
