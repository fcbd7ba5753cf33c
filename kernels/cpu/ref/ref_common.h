// Element access shared by the reference files: f64 get/set through any view (broadcast
// dims read index 0) and plain multi-index loops. Reference code only: slow on purpose.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/common/op.h"

namespace kv::ref::detail {

using Index = std::vector<int64_t>;

inline double get(const TensorView& v, const Index& idx) {
    const char* p = v.bytes();
    for (int i = 0; i < v.ndim; ++i) p += (v.ne[i] == 1 ? 0 : idx[size_t(i)]) * v.nb[i];
    switch (v.dtype) {
        case DType::F32: return *reinterpret_cast<const float*>(p);
        case DType::F64: return *reinterpret_cast<const double*>(p);
        case DType::F16: return f16_to_f32(*reinterpret_cast<const uint16_t*>(p));
        case DType::BF16: return bf16_to_f32(*reinterpret_cast<const uint16_t*>(p));
        case DType::I32: return *reinterpret_cast<const int32_t*>(p);
        case DType::I64: return double(*reinterpret_cast<const int64_t*>(p));
        case DType::U8: return *reinterpret_cast<const uint8_t*>(p);
        default: return 0;
    }
}

inline void set(const TensorView& v, const Index& idx, double x) {
    char* p = v.bytes();
    for (int i = 0; i < v.ndim; ++i) p += idx[size_t(i)] * v.nb[i];
    switch (v.dtype) {
        case DType::F32: *reinterpret_cast<float*>(p) = float(x); break;
        case DType::F64: *reinterpret_cast<double*>(p) = x; break;
        case DType::F16: *reinterpret_cast<uint16_t*>(p) = f32_to_f16(float(x)); break;
        case DType::BF16: *reinterpret_cast<uint16_t*>(p) = f32_to_bf16(float(x)); break;
        case DType::I32: *reinterpret_cast<int32_t*>(p) = int32_t(x); break;
        case DType::I64: *reinterpret_cast<int64_t*>(p) = int64_t(x); break;
        case DType::U8: *reinterpret_cast<uint8_t*>(p) = uint8_t(x); break;
        default: break;
    }
}

// Visit every multi-index of `ne` (ndim dims) in row-major order.
template <class F>
void for_each_index(int ndim, const int64_t* ne, F&& f) {
    int64_t total = 1;
    for (int i = 0; i < ndim; ++i) total *= ne[i];
    Index idx(size_t(ndim), 0);
    for (int64_t n = 0; n < total; ++n) {
        int64_t rem = n;
        for (int i = ndim - 1; i >= 0; --i) {
            idx[size_t(i)] = rem % ne[i];
            rem /= ne[i];
        }
        f(idx);
    }
}

// Ops over the last dimension: rows are the outer multi-indices.
template <class F>
void for_each_row(const TensorView& v, F&& f) {
    for_each_index(v.ndim - 1, v.ne, [&](const Index& outer) {
        Index idx = outer;
        idx.push_back(0);
        f(idx);
    });
}

// Multi-index of element i of a view (row-major over its ne).
inline Index unflatten(const TensorView& v, int64_t i) {
    Index idx(size_t(v.ndim), 0);
    for (int k = v.ndim - 1; k >= 0; --k) {
        idx[size_t(k)] = i % v.ne[k];
        i /= v.ne[k];
    }
    return idx;
}

// The gradient, loss and optimizer references (ref_backward.cpp); false for other ops.
bool compute_backward(const OpCall& c);

}  // namespace kv::ref::detail
