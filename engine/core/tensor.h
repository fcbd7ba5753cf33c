// Tensor: a strided view into reference-counted storage from the tracked allocator.
// Views (slice, select, transpose, permute, reshape of contiguous data, expand) share storage
// and never copy. Strides are in elements here; TensorView (what kernels see) uses bytes.
// Element access helpers are for tests and host-side glue, never for hot loops.
//
// Index
//   [SECTION] Shape
//   [SECTION] Storage
//   [SECTION] Tensor: creation, metadata, views, copies, host access
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "engine/memory/mem_category.h"
#include "kernels/common/tensor_view.h"

namespace kv {

// =========================================================================================
// [SECTION] Shape
// =========================================================================================
struct Shape {
    int ndim = 0;
    int64_t d[KV_MAX_DIMS] = {0};

    Shape() = default;
    Shape(std::initializer_list<int64_t> dims);
    explicit Shape(const std::vector<int64_t>& dims);
    int64_t operator[](int i) const { return d[i]; }
    int64_t& operator[](int i) { return d[i]; }
    int64_t numel() const;
    bool operator==(const Shape& o) const;
    bool operator!=(const Shape& o) const { return !(*this == o); }
    std::vector<int64_t> vec() const { return std::vector<int64_t>(d, d + ndim); }
    std::string str() const;  // "(2, 3, 4)"
};

// =========================================================================================
// [SECTION] Storage
// =========================================================================================
// One allocation. Frees itself through the tracker that allocated it (even when the last
// reference goes away on another thread).
struct Storage {
    void* data = nullptr;
    size_t bytes = 0;
    Device device{};
    MemCategory category = MemCategory::ACTIVATIONS;
    std::string label;
    uint64_t id = 0;
    class MemoryTracker* tracker = nullptr;
    bool owned = true;                     // false: external memory, only accounted
    std::shared_ptr<void> keepalive;       // external memory owner (e.g. a file mapping)

    Storage() = default;
    Storage(const Storage&) = delete;
    Storage& operator=(const Storage&) = delete;
    ~Storage();
};

// =========================================================================================
// [SECTION] Tensor
// =========================================================================================
struct TensorOptions {
    Device device{};
    MemCategory category = MemCategory::ACTIVATIONS;
    std::string label;
};

class Tensor {
   public:
    Tensor() = default;

    // ---- creation ------------------------------------------------------------------------
    // Uninitialized memory from current_memory_tracker().
    static Tensor empty(const Shape& shape, DType dtype, const TensorOptions& opt = {});
    static Tensor zeros(const Shape& shape, DType dtype, const TensorOptions& opt = {});
    static Tensor full(const Shape& shape, DType dtype, double value, const TensorOptions& opt = {});
    // Copy host values (converted to dtype) into a new tensor.
    static Tensor from_f32(const Shape& shape, const std::vector<float>& values, DType dtype = DType::F32,
                           const TensorOptions& opt = {});
    static Tensor from_f64(const Shape& shape, const std::vector<double>& values, DType dtype = DType::F64,
                           const TensorOptions& opt = {});
    static Tensor from_i32(const Shape& shape, const std::vector<int32_t>& values, const TensorOptions& opt = {});
    static Tensor from_i64(const Shape& shape, const std::vector<int64_t>& values, const TensorOptions& opt = {});
    // Wrap memory owned elsewhere (kept alive by `owner`); accounted to the tracker under
    // `opt.category` when `account` is true.
    static Tensor from_external(void* data, const Shape& shape, DType dtype, std::shared_ptr<void> owner,
                                const TensorOptions& opt = {}, bool account = true);

    // ---- metadata ------------------------------------------------------------------------
    bool defined() const { return storage_ != nullptr; }
    DType dtype() const { return dtype_; }
    Device device() const { return storage_ ? storage_->device : Device{}; }
    int ndim() const { return shape_.ndim; }
    const Shape& shape() const { return shape_; }
    int64_t size(int dim) const;      // negative dims count from the end
    int64_t stride(int dim) const;    // in elements
    int64_t numel() const { return shape_.numel(); }
    size_t nbytes() const { return size_t(numel()) * size_t(dtype_size(dtype_)); }
    int64_t offset() const { return offset_; }
    bool is_contiguous() const;
    const std::shared_ptr<Storage>& storage() const { return storage_; }
    MemCategory category() const { return storage_ ? storage_->category : MemCategory::ACTIVATIONS; }
    std::string describe() const;  // "f32 (2, 3) cpu"

    // Raw pointer to element (0, ..., 0).
    void* data_ptr() const;
    template <class T>
    T* data() const {
        return static_cast<T*>(data_ptr());
    }
    // What kernels receive.
    TensorView view() const;

    // ---- views (no copies) ---------------------------------------------------------------
    Tensor slice(int dim, int64_t start, int64_t end) const;  // [start, end)
    Tensor select(int dim, int64_t index) const;              // drops `dim`
    Tensor transpose(int d0, int d1) const;
    Tensor permute(const std::vector<int>& order) const;
    Tensor reshape(const Shape& shape) const;  // view; throws unless contiguous (-1 allowed once)
    Tensor unsqueeze(int dim) const;
    Tensor squeeze(int dim) const;
    Tensor expand(const Shape& shape) const;   // size-1 dims repeat with stride 0
    Tensor as_strided(const Shape& shape, const std::vector<int64_t>& strides, int64_t offset) const;

    // ---- copies --------------------------------------------------------------------------
    Tensor contiguous() const;                                 // self if already contiguous
    Tensor clone(const TensorOptions* opt = nullptr) const;    // always a new contiguous copy
    Tensor to(DType dtype) const;                              // new tensor (self if same dtype)
    Tensor to(Device device) const;
    void copy_from(const Tensor& src);                         // elementwise, converts dtypes
    void fill(double value);

    // ---- host access (tests and glue; copies to host if needed) -------------------------
    std::vector<float> to_f32_vector() const;
    std::vector<double> to_f64_vector() const;
    std::vector<int64_t> to_i64_vector() const;
    double item() const;  // single-element tensor

   private:
    std::shared_ptr<Storage> storage_;
    Shape shape_;
    int64_t strides_[KV_MAX_DIMS] = {0};
    int64_t offset_ = 0;  // elements
    DType dtype_ = DType::F32;

    int norm_dim(int dim, int ndim_for_check) const;
};

}  // namespace kv
