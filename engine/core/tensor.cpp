// Tensor implementation: storage management, view arithmetic, copies through the COPY op.
#include "tensor.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "engine/backend/backend_registry.h"
#include "engine/core/device.h"
#include "engine/core/error.h"
#include "engine/memory/memory_tracker.h"
#include "engine/ops/ops.h"

namespace kv {

// ---- Shape ------------------------------------------------------------------------------
Shape::Shape(std::initializer_list<int64_t> dims) {
    if (dims.size() > size_t(KV_MAX_DIMS)) throw Error(kv::str("tensor rank ", dims.size(), " exceeds the maximum of ", KV_MAX_DIMS));
    for (int64_t v : dims) d[ndim++] = v;
}
Shape::Shape(const std::vector<int64_t>& dims) {
    if (dims.size() > size_t(KV_MAX_DIMS)) throw Error(kv::str("tensor rank ", dims.size(), " exceeds the maximum of ", KV_MAX_DIMS));
    for (int64_t v : dims) d[ndim++] = v;
}
int64_t Shape::numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= d[i];
    return n;
}
bool Shape::operator==(const Shape& o) const {
    if (ndim != o.ndim) return false;
    for (int i = 0; i < ndim; ++i)
        if (d[i] != o.d[i]) return false;
    return true;
}
std::string Shape::str() const {
    std::string s = "(";
    for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(d[i]);
    return s + (ndim == 1 ? ",)" : ")");
}

// ---- Storage ----------------------------------------------------------------------------
Storage::~Storage() {
    if (!tracker) return;
    if (owned)
        tracker->release(device, data, bytes, category, label, id);
    else if (id)
        tracker->unaccount(device, bytes, category, label, id, data);
}

// ---- creation ---------------------------------------------------------------------------
namespace {
void set_contiguous_strides(const Shape& s, int64_t* strides) {
    int64_t st = 1;
    for (int i = s.ndim - 1; i >= 0; --i) {
        strides[i] = st;
        st *= std::max<int64_t>(s.d[i], 1);
    }
}
void check_shape(const Shape& s) {
    for (int i = 0; i < s.ndim; ++i)
        if (s.d[i] < 0) throw Error(str("invalid tensor shape ", s.str(), ": sizes must be >= 0"));
}
}  // namespace

Tensor Tensor::empty(const Shape& shape, DType dtype, const TensorOptions& opt) {
    check_shape(shape);
    if (dtype == DType::COUNT) throw Error("invalid dtype");
    Tensor t;
    auto st = std::make_shared<Storage>();
    st->bytes = size_t(shape.numel()) * size_t(dtype_size(dtype));
    st->device = opt.device;
    st->category = opt.category;
    st->label = opt.label.empty() ? MemoryLabelScope::current() : opt.label;
    MemoryTracker& tr = current_memory_tracker();
    st->data = tr.allocate(opt.device, st->bytes, opt.category, st->label, &st->id);
    st->tracker = &tr;
    t.storage_ = std::move(st);
    t.shape_ = shape;
    t.dtype_ = dtype;
    set_contiguous_strides(shape, t.strides_);
    return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, const TensorOptions& opt) {
    Tensor t = empty(shape, dtype, opt);
    t.fill(0.0);
    return t;
}

Tensor Tensor::full(const Shape& shape, DType dtype, double value, const TensorOptions& opt) {
    Tensor t = empty(shape, dtype, opt);
    t.fill(value);
    return t;
}

Tensor Tensor::from_f32(const Shape& shape, const std::vector<float>& values, DType dtype, const TensorOptions& opt) {
    if (int64_t(values.size()) != shape.numel())
        throw Error(str("from_f32: ", values.size(), " values for shape ", shape.str(), " (", shape.numel(), " elements)"));
    TensorOptions host = opt;
    host.device = Device{};
    Tensor src = empty(shape, DType::F32, host);
    std::memcpy(src.data_ptr(), values.data(), values.size() * 4);
    if (dtype == DType::F32 && opt.device.is_cpu()) return src;
    Tensor out = empty(shape, dtype, opt);
    out.copy_from(src);
    return out;
}

Tensor Tensor::from_f64(const Shape& shape, const std::vector<double>& values, DType dtype, const TensorOptions& opt) {
    if (int64_t(values.size()) != shape.numel())
        throw Error(str("from_f64: ", values.size(), " values for shape ", shape.str(), " (", shape.numel(), " elements)"));
    TensorOptions host = opt;
    host.device = Device{};
    Tensor src = empty(shape, DType::F64, host);
    std::memcpy(src.data_ptr(), values.data(), values.size() * 8);
    if (dtype == DType::F64 && opt.device.is_cpu()) return src;
    Tensor out = empty(shape, dtype, opt);
    out.copy_from(src);
    return out;
}

Tensor Tensor::from_i32(const Shape& shape, const std::vector<int32_t>& values, const TensorOptions& opt) {
    if (int64_t(values.size()) != shape.numel())
        throw Error(str("from_i32: ", values.size(), " values for shape ", shape.str()));
    TensorOptions host = opt;
    host.device = Device{};
    Tensor src = empty(shape, DType::I32, host);
    std::memcpy(src.data_ptr(), values.data(), values.size() * 4);
    return opt.device.is_cpu() ? src : src.to(opt.device);
}

Tensor Tensor::from_i64(const Shape& shape, const std::vector<int64_t>& values, const TensorOptions& opt) {
    if (int64_t(values.size()) != shape.numel())
        throw Error(str("from_i64: ", values.size(), " values for shape ", shape.str()));
    TensorOptions host = opt;
    host.device = Device{};
    Tensor src = empty(shape, DType::I64, host);
    std::memcpy(src.data_ptr(), values.data(), values.size() * 8);
    return opt.device.is_cpu() ? src : src.to(opt.device);
}

Tensor Tensor::from_external(void* data, const Shape& shape, DType dtype, std::shared_ptr<void> owner,
                             const TensorOptions& opt, bool account) {
    check_shape(shape);
    Tensor t;
    auto st = std::make_shared<Storage>();
    st->data = data;
    st->bytes = size_t(shape.numel()) * size_t(dtype_size(dtype));
    st->device = opt.device;
    st->category = opt.category;
    st->label = opt.label;
    st->owned = false;
    st->keepalive = std::move(owner);
    if (account) {
        MemoryTracker& tr = current_memory_tracker();
        st->id = tr.account(opt.device, st->bytes, opt.category, st->label, data);
        st->tracker = &tr;
    }
    t.storage_ = std::move(st);
    t.shape_ = shape;
    t.dtype_ = dtype;
    set_contiguous_strides(shape, t.strides_);
    return t;
}

// ---- metadata ---------------------------------------------------------------------------
int Tensor::norm_dim(int dim, int nd) const {
    int d = dim < 0 ? dim + nd : dim;
    if (d < 0 || d >= nd) throw Error(str("dimension ", dim, " is out of range for a tensor of rank ", nd));
    return d;
}

int64_t Tensor::size(int dim) const { return shape_.d[norm_dim(dim, shape_.ndim)]; }
int64_t Tensor::stride(int dim) const { return strides_[norm_dim(dim, shape_.ndim)]; }

bool Tensor::is_contiguous() const {
    int64_t expect = 1;
    for (int i = shape_.ndim - 1; i >= 0; --i) {
        if (shape_.d[i] != 1 && strides_[i] != expect) return false;
        expect *= shape_.d[i];
    }
    return true;
}

std::string Tensor::describe() const {
    static const char* names[] = {"f32", "f64", "f16", "bf16", "i32", "i64", "u8"};
    static_assert(sizeof(names) / sizeof(names[0]) == size_t(DType::COUNT), "dtype names out of date");
    Device d = device();
    return str(names[size_t(dtype_)], " ", shape_.str(), " ", device_name(d));
}

void* Tensor::data_ptr() const {
    if (!storage_) return nullptr;
    return static_cast<char*>(storage_->data) + offset_ * dtype_size(dtype_);
}

TensorView Tensor::view() const {
    TensorView v;
    v.data = data_ptr();
    v.dtype = dtype_;
    v.device = device();
    v.ndim = shape_.ndim;
    for (int i = 0; i < shape_.ndim; ++i) {
        v.ne[i] = shape_.d[i];
        v.nb[i] = strides_[i] * dtype_size(dtype_);
    }
    return v;
}

// ---- views ------------------------------------------------------------------------------
Tensor Tensor::slice(int dim, int64_t start, int64_t end) const {
    int d = norm_dim(dim, shape_.ndim);
    if (start < 0 || end < start || end > shape_.d[d])
        throw Error(str("slice [", start, ", ", end, ") is out of range for dimension ", d, " of size ", shape_.d[d]));
    Tensor t = *this;
    t.offset_ += start * strides_[d];
    t.shape_.d[d] = end - start;
    return t;
}

Tensor Tensor::select(int dim, int64_t index) const {
    int d = norm_dim(dim, shape_.ndim);
    if (index < 0 || index >= shape_.d[d])
        throw Error(str("index ", index, " is out of range for dimension ", d, " of size ", shape_.d[d]));
    Tensor t = *this;
    t.offset_ += index * strides_[d];
    for (int i = d; i + 1 < shape_.ndim; ++i) {
        t.shape_.d[i] = shape_.d[i + 1];
        t.strides_[i] = strides_[i + 1];
    }
    t.shape_.ndim--;
    return t;
}

Tensor Tensor::transpose(int d0, int d1) const {
    int a = norm_dim(d0, shape_.ndim), b = norm_dim(d1, shape_.ndim);
    Tensor t = *this;
    std::swap(t.shape_.d[a], t.shape_.d[b]);
    std::swap(t.strides_[a], t.strides_[b]);
    return t;
}

Tensor Tensor::permute(const std::vector<int>& order) const {
    if (int(order.size()) != shape_.ndim) throw Error(str("permute: ", order.size(), " dims given for a rank-", shape_.ndim, " tensor"));
    std::vector<bool> seen(size_t(shape_.ndim), false);
    Tensor t = *this;
    for (int i = 0; i < shape_.ndim; ++i) {
        int s = norm_dim(order[size_t(i)], shape_.ndim);
        if (seen[size_t(s)]) throw Error("permute: repeated dimension");
        seen[size_t(s)] = true;
        t.shape_.d[i] = shape_.d[s];
        t.strides_[i] = strides_[s];
    }
    return t;
}

Tensor Tensor::reshape(const Shape& shape) const {
    Shape s = shape;
    int infer = -1;
    int64_t known = 1;
    for (int i = 0; i < s.ndim; ++i) {
        if (s.d[i] == -1) {
            if (infer >= 0) throw Error("reshape: only one dimension may be -1");
            infer = i;
        } else {
            known *= s.d[i];
        }
    }
    if (infer >= 0) s.d[infer] = known ? numel() / known : 0;
    if (s.numel() != numel())
        throw Error(str("reshape: cannot view ", shape_.str(), " (", numel(), " elements) as ", shape.str()));
    if (!is_contiguous()) throw Error(str("reshape: tensor ", describe(), " is not contiguous; call contiguous() first"));
    Tensor t = *this;
    t.shape_ = s;
    set_contiguous_strides(s, t.strides_);
    return t;
}

Tensor Tensor::unsqueeze(int dim) const {
    int nd = shape_.ndim + 1;
    int d = dim < 0 ? dim + nd : dim;
    if (d < 0 || d >= nd || nd > KV_MAX_DIMS) throw Error(str("unsqueeze: dimension ", dim, " invalid for rank ", shape_.ndim));
    Tensor t = *this;
    for (int i = nd - 1; i > d; --i) {
        t.shape_.d[i] = shape_.d[i - 1];
        t.strides_[i] = strides_[i - 1];
    }
    t.shape_.d[d] = 1;
    t.strides_[d] = d + 1 < nd ? t.strides_[d + 1] * t.shape_.d[d + 1] : 1;
    t.shape_.ndim = nd;
    return t;
}

Tensor Tensor::squeeze(int dim) const {
    int d = norm_dim(dim, shape_.ndim);
    if (shape_.d[d] != 1) throw Error(str("squeeze: dimension ", d, " has size ", shape_.d[d], ", expected 1"));
    return select(d, 0);
}

Tensor Tensor::expand(const Shape& shape) const {
    if (shape.ndim != shape_.ndim) throw Error(str("expand: rank ", shape.ndim, " != ", shape_.ndim));
    Tensor t = *this;
    for (int i = 0; i < shape.ndim; ++i) {
        if (shape.d[i] == shape_.d[i]) continue;
        if (shape_.d[i] != 1) throw Error(str("expand: cannot expand ", shape_.str(), " to ", shape.str()));
        t.shape_.d[i] = shape.d[i];
        t.strides_[i] = 0;
    }
    return t;
}

Tensor Tensor::as_strided(const Shape& shape, const std::vector<int64_t>& strides, int64_t offset) const {
    if (int(strides.size()) != shape.ndim) throw Error("as_strided: strides and shape differ in rank");
    // bounds check against the storage
    int64_t lo = offset, hi = offset;
    for (int i = 0; i < shape.ndim; ++i) {
        if (shape.d[i] == 0) { lo = hi = offset; break; }
        int64_t span = (shape.d[i] - 1) * strides[size_t(i)];
        if (span < 0) lo += span; else hi += span;
    }
    int64_t cap = storage_ ? int64_t(storage_->bytes / size_t(dtype_size(dtype_))) : 0;
    if (lo < 0 || (shape.numel() > 0 && hi >= cap))
        throw Error(str("as_strided: view ", shape.str(), " at offset ", offset, " exceeds storage of ", cap, " elements"));
    Tensor t = *this;
    t.shape_ = shape;
    for (int i = 0; i < shape.ndim; ++i) t.strides_[i] = strides[size_t(i)];
    t.offset_ = offset;
    return t;
}

// ---- copies -----------------------------------------------------------------------------
Tensor Tensor::contiguous() const {
    if (is_contiguous()) return *this;
    return clone();
}

Tensor Tensor::clone(const TensorOptions* opt) const {
    TensorOptions o;
    if (opt) o = *opt;
    else {
        o.device = device();
        o.category = category();
        o.label = storage_ ? storage_->label : std::string();
    }
    Tensor t = empty(shape_, dtype_, o);
    t.copy_from(*this);
    return t;
}

Tensor Tensor::to(DType dtype) const {
    if (dtype == dtype_) return *this;
    TensorOptions o{device(), category(), storage_ ? storage_->label : std::string()};
    Tensor t = empty(shape_, dtype, o);
    t.copy_from(*this);
    return t;
}

Tensor Tensor::to(Device dev) const {
    if (dev == device()) return *this;
    TensorOptions o{dev, category(), storage_ ? storage_->label : std::string()};
    Tensor t = empty(shape_, dtype_, o);
    t.copy_from(*this);
    return t;
}

void Tensor::copy_from(const Tensor& src) {
    if (src.shape_ != shape_)
        throw Error(str("copy: source shape ", src.shape_.str(), " differs from destination ", shape_.str()));
    if (numel() == 0) return;
    Device sd = src.device(), dd = device();
    if (sd == dd) {
        ops::copy_(*this, src);
        return;
    }
    // Cross-device: stage a contiguous copy in the source dtype, move bytes, convert on arrival.
    Tensor s = src.contiguous();
    if (sd.is_cpu()) {
        Tensor staging = (is_contiguous() && dtype_ == s.dtype_) ? *this : empty(shape_, s.dtype_, {dd, MemCategory::WORKSPACE, "h2d staging"});
        backend_for(dd).copy_h2d(dd.index, staging.data_ptr(), s.data_ptr(), s.nbytes());
        if (staging.data_ptr() != data_ptr()) ops::copy_(*this, staging);
    } else if (dd.is_cpu()) {
        Tensor staging = (is_contiguous() && dtype_ == s.dtype_) ? *this : empty(shape_, s.dtype_, {dd, MemCategory::WORKSPACE, "d2h staging"});
        backend_for(sd).copy_d2h(sd.index, staging.data_ptr(), s.data_ptr(), s.nbytes());
        if (staging.data_ptr() != data_ptr()) ops::copy_(*this, staging);
    } else {
        Tensor host = s.to(Device{});
        copy_from(host);
    }
}

namespace {
template <class T>
void fill_cpu(const TensorView& v, T value) {
    int64_t n = v.numel();
    if (v.is_contiguous()) {
        T* p = v.ptr<T>();
        std::fill(p, p + n, value);
        return;
    }
    int64_t rows = v.rows(), cols = v.last();
    int64_t cs = v.ndim ? v.nb[v.ndim - 1] : 0;
    for (int64_t r = 0; r < rows; ++r) {
        char* row = v.bytes() + v.row_offset(r);
        for (int64_t c = 0; c < cols; ++c) *reinterpret_cast<T*>(row + c * cs) = value;
    }
}
}  // namespace

void Tensor::fill(double value) {
    if (!device().is_cpu()) {
        Tensor host = full(shape_, dtype_, value);
        copy_from(host);
        return;
    }
    TensorView v = view();
    switch (dtype_) {
        case DType::F32: fill_cpu<float>(v, float(value)); break;
        case DType::F64: fill_cpu<double>(v, value); break;
        case DType::F16: fill_cpu<uint16_t>(v, f32_to_f16(float(value))); break;
        case DType::BF16: fill_cpu<uint16_t>(v, f32_to_bf16(float(value))); break;
        case DType::I32: fill_cpu<int32_t>(v, int32_t(value)); break;
        case DType::I64: fill_cpu<int64_t>(v, int64_t(value)); break;
        case DType::U8: fill_cpu<uint8_t>(v, uint8_t(value)); break;
        default: throw Error("fill: invalid dtype");
    }
}

// ---- host access ------------------------------------------------------------------------
std::vector<float> Tensor::to_f32_vector() const {
    if (dtype_ == DType::F32 && device().is_cpu() && is_contiguous())  // no staging copy
        return std::vector<float>(data<float>(), data<float>() + numel());
    Tensor h = to(Device{});
    Tensor f = Tensor::empty(shape_, DType::F32, {Device{}, MemCategory::WORKSPACE, "host readback"});
    f.copy_from(h);
    return std::vector<float>(f.data<float>(), f.data<float>() + numel());
}

std::vector<double> Tensor::to_f64_vector() const {
    if (dtype_ == DType::F64 && device().is_cpu() && is_contiguous())
        return std::vector<double>(data<double>(), data<double>() + numel());
    Tensor h = to(Device{});
    Tensor f = Tensor::empty(shape_, DType::F64, {Device{}, MemCategory::WORKSPACE, "host readback"});
    f.copy_from(h);
    return std::vector<double>(f.data<double>(), f.data<double>() + numel());
}

std::vector<int64_t> Tensor::to_i64_vector() const {
    Tensor h = to(Device{});
    Tensor f = Tensor::empty(shape_, DType::I64, {Device{}, MemCategory::WORKSPACE, "host readback"});
    f.copy_from(h);
    return std::vector<int64_t>(f.data<int64_t>(), f.data<int64_t>() + numel());
}

double Tensor::item() const {
    if (numel() != 1) throw Error(str("item(): tensor ", describe(), " has ", numel(), " elements, expected 1"));
    return to_f64_vector()[0];
}

}  // namespace kv
