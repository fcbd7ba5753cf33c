// A non-owning description of a strided array on one device: what every kernel receives.
// Shape vocabulary used across kernels (defined once, here):
//   B batch, T tokens of a call (a chunk), C channels (= E, model width), NH query heads,
//   G KV heads (query groups), HS head size (= D), L cache slots, V vocabulary.
// Stride rule: address(i_0, ..., i_{n-1}) = data + sum_k i_k * nb[k]   (bytes; nb[k] may be 0
// for a broadcast dimension). ne[0] is the OUTERMOST dimension (PyTorch order, not ggml's).
#pragma once

#include <cstdint>

#include "dtype.h"
#include "hd.h"

namespace kv {

constexpr int KV_MAX_DIMS = 6;

enum class DeviceType : uint8_t { CPU = 0, CUDA = 1 };

struct Device {
    DeviceType type = DeviceType::CPU;
    int index = 0;

    KV_HD bool operator==(const Device& o) const { return type == o.type && index == o.index; }
    KV_HD bool operator!=(const Device& o) const { return !(*this == o); }
    KV_HD bool is_cpu() const { return type == DeviceType::CPU; }
};

struct TensorView {
    void* data = nullptr;
    DType dtype = DType::F32;
    Device device{};
    int ndim = 0;
    int64_t ne[KV_MAX_DIMS] = {0};  // element counts, outermost first
    int64_t nb[KV_MAX_DIMS] = {0};  // byte strides

    KV_HD int64_t numel() const {
        int64_t n = 1;
        for (int i = 0; i < ndim; ++i) n *= ne[i];
        return n;
    }
    // Size of the innermost dimension (1 for a scalar).
    KV_HD int64_t last() const { return ndim ? ne[ndim - 1] : 1; }
    KV_HD bool last_contiguous() const { return ndim == 0 || ne[ndim - 1] == 1 || nb[ndim - 1] == dtype_size(dtype); }
    KV_HD bool is_contiguous() const {
        int64_t expect = dtype_size(dtype);
        for (int i = ndim - 1; i >= 0; --i) {
            if (ne[i] != 1 && nb[i] != expect) return false;
            expect *= ne[i];
        }
        return true;
    }
    // Number of rows when the innermost dimension is treated as a row.
    KV_HD int64_t rows() const { return ndim ? numel() / (ne[ndim - 1] ? ne[ndim - 1] : 1) : 1; }
    // Byte offset of row r (row-major over the outer ndim-1 dimensions).
    KV_HD int64_t row_offset(int64_t r) const {
        int64_t off = 0;
        for (int i = ndim - 2; i >= 0; --i) {
            int64_t idx = r % ne[i];
            r /= ne[i];
            off += idx * nb[i];
        }
        return off;
    }
    template <class T>
    KV_HD T* ptr() const {
        return static_cast<T*>(data);
    }
    KV_HD char* bytes() const { return static_cast<char*>(data); }
};

}  // namespace kv
