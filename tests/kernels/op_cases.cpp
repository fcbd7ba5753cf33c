// CaseBuilder: random inputs in several layouts and guarded outputs.
#include "op_cases.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "tests/support/test_support.h"

namespace kv::test {

namespace {
constexpr unsigned char kSentinel = 0xCD;
constexpr int64_t kGuard = 37;  // elements of sentinel before and after the visible view
}  // namespace

std::vector<OpCase>& op_cases() {
    static std::vector<OpCase> cases;
    return cases;
}

// Tolerances (max |err| / max |ref|):
//   f64  1e-12  only reassociation differs from the reference
//   f32  3e-5   f32 accumulation over at most a few hundred terms; exp within 1.4 ulp
//   f16  2e-3   output rounding alone is up to 2^-11 relative
//   bf16 1e-2   output rounding alone is up to 2^-8 relative
double tol_for(DType out) {
    switch (out) {
        case DType::F64: return 1e-12;
        case DType::F32: return 3e-5;
        case DType::F16: return 2e-3;
        case DType::BF16: return 1e-2;
        default: return 0.0;  // integer outputs must match exactly
    }
}

Tensor CaseBuilder::input(const Shape& shape, DType dtype, Layout layout, double lo, double hi) {
    switch (layout) {
        case Layout::CONTIG: return random_tensor(shape, dtype, rng, lo, hi);
        case Layout::TRANSPOSED: {
            Shape s = shape;
            std::swap(s.d[s.ndim - 1], s.d[s.ndim - 2]);
            return random_tensor(s, dtype, rng, lo, hi).transpose(-1, -2);
        }
        case Layout::STRIDED: {
            Shape s = shape;
            s.d[s.ndim - 1] += 5;
            Tensor wide = random_tensor(s, dtype, rng, lo, hi);
            return wide.slice(-1, 2, 2 + shape.d[shape.ndim - 1]);
        }
    }
    return {};
}

Tensor CaseBuilder::index(const Shape& shape, int64_t limit, DType dtype) {
    std::uniform_int_distribution<int64_t> u(0, limit - 1);
    std::vector<int64_t> v((size_t)shape.numel());
    for (auto& x : v) x = u(rng);
    Tensor t = Tensor::from_i64(shape, v);
    return dtype == DType::I64 ? t : t.to(DType::I32);
}

Tensor CaseBuilder::unique_index(const Shape& shape, int axis, int64_t limit, DType dtype) {
    // For every line along `axis`, the first shape[axis] entries of a random permutation.
    std::vector<int64_t> v((size_t)shape.numel());
    int64_t inner = 1, outer = 1, n = shape.d[axis];
    for (int i = axis + 1; i < shape.ndim; ++i) inner *= shape.d[i];
    for (int i = 0; i < axis; ++i) outer *= shape.d[i];
    std::vector<int64_t> perm((size_t)limit);
    for (int64_t o = 0; o < outer; ++o)
        for (int64_t in = 0; in < inner; ++in) {
            std::iota(perm.begin(), perm.end(), 0);
            std::shuffle(perm.begin(), perm.end(), rng);
            for (int64_t j = 0; j < n; ++j) v[size_t((o * n + j) * inner + in)] = perm[size_t(j)];
        }
    Tensor t = Tensor::from_i64(shape, v);
    return dtype == DType::I64 ? t : t.to(DType::I32);
}

void sdpa_positions(CaseBuilder& b, int64_t B, int64_t G, int64_t n, int64_t T, bool scattered, bool per_row) {
    const int64_t P = scattered ? 2 * T : T - n;  // first query position
    const int64_t rows = per_row ? B * G : 1;
    std::vector<int32_t> kp((size_t)(rows * T));
    for (int64_t r = 0; r < rows; ++r) {
        std::vector<int32_t> pool;
        if (scattered) {
            std::vector<int32_t> old((size_t)P);
            std::iota(old.begin(), old.end(), 0);
            std::shuffle(old.begin(), old.end(), b.rng);
            pool.assign(old.begin(), old.begin() + (T - n));
            for (int64_t i = 0; i < n; ++i) pool.push_back(int32_t(P + i));
            std::shuffle(pool.begin(), pool.end(), b.rng);
        } else {
            for (int64_t j = 0; j < T; ++j) pool.push_back(int32_t(j));
        }
        std::copy(pool.begin(), pool.end(), kp.begin() + r * T);
    }
    b.src(Tensor::from_i32({per_row ? B : 1, per_row ? G : 1, T}, kp));
    std::vector<int32_t> qp((size_t)n);
    for (int64_t i = 0; i < n; ++i) qp[size_t(i)] = int32_t(P + i);
    b.src(Tensor::from_i32({1, n}, qp));
}

Tensor CaseBuilder::guarded(const Shape& shape, DType dtype, Layout layout, Tensor* storage_out) {
    // Strides of the visible view inside one 1-D allocation.
    std::vector<int64_t> strides((size_t)shape.ndim);
    Shape storage = shape;
    if (layout == Layout::STRIDED && shape.ndim >= 1) storage.d[shape.ndim - 1] += 3;
    if (layout == Layout::TRANSPOSED && shape.ndim >= 2) std::swap(storage.d[shape.ndim - 1], storage.d[shape.ndim - 2]);
    int64_t st = 1;
    std::vector<int64_t> sst((size_t)shape.ndim);
    for (int i = shape.ndim - 1; i >= 0; --i) {
        sst[size_t(i)] = st;
        st *= std::max<int64_t>(storage.d[i], 1);
    }
    for (int i = 0; i < shape.ndim; ++i) strides[size_t(i)] = sst[size_t(i)];
    if (layout == Layout::TRANSPOSED && shape.ndim >= 2)
        std::swap(strides[size_t(shape.ndim - 1)], strides[size_t(shape.ndim - 2)]);
    const int64_t total = st + 2 * kGuard;
    *storage_out = Tensor::empty({total}, dtype);
    std::memset(storage_out->data_ptr(), kSentinel, storage_out->nbytes());
    return storage_out->as_strided(shape, strides, kGuard);
}

Tensor CaseBuilder::output(const Shape& shape, DType dtype, Layout layout, bool init_random, double lo, double hi) {
    dst = guarded(shape, dtype, layout, &dst_storage);
    if (init_random) dst.copy_from(random_tensor(shape, dtype, rng, lo, hi));
    call.dst = dst.view();
    return dst;
}

Tensor CaseBuilder::output2(const Shape& shape, DType dtype, bool init_random, double lo, double hi) {
    dst2 = guarded(shape, dtype, Layout::CONTIG, &dst2_storage);
    dst2.copy_from(init_random ? random_tensor(shape, dtype, rng, lo, hi) : Tensor::full(shape, dtype, -12345.0));
    call.dst2 = dst2.view();
    return dst2;
}

Tensor CaseBuilder::output3(const Shape& shape, DType dtype, bool init_random, double lo, double hi) {
    dst3 = guarded(shape, dtype, Layout::CONTIG, &dst3_storage);
    dst3.copy_from(init_random ? random_tensor(shape, dtype, rng, lo, hi) : Tensor::full(shape, dtype, -12345.0));
    call.dst3 = dst3.view();
    return dst3;
}

void CaseBuilder::src(const Tensor& t) {
    srcs.push_back(t);
    call.src[call.nsrc++] = t.view();
}

void CaseBuilder::no_src() {
    srcs.push_back(Tensor());
    call.src[call.nsrc++] = TensorView{};
}

namespace {
bool guard_intact(const Tensor& view, const Tensor& storage, const char* name, std::string* where) {
    if (!view.defined()) return true;
    const int64_t es = dtype_size(storage.dtype());
    const int64_t n = storage.numel();
    std::vector<char> covered((size_t)n, 0);
    // Mark every element of the visible view.
    const int64_t base = view.offset();
    for (int64_t e = 0; e < view.numel(); ++e) {
        int64_t rem = e, off = base;
        for (int i = view.ndim() - 1; i >= 0; --i) {
            off += (rem % view.size(i)) * view.stride(i);
            rem /= view.size(i);
        }
        covered[size_t(off)] = 1;
    }
    const unsigned char* p = static_cast<const unsigned char*>(storage.data_ptr());
    for (int64_t i = 0; i < n; ++i) {
        if (covered[size_t(i)]) continue;
        for (int64_t k = 0; k < es; ++k)
            if (p[i * es + k] != kSentinel) {
                *where = std::string(name) + ": element " + std::to_string(i) + " of the guarded allocation (view starts at " +
                         std::to_string(base) + ")";
                return false;
            }
    }
    return true;
}
}  // namespace

bool guards_intact(const CaseBuilder& b, std::string* where) {
    return guard_intact(b.dst, b.dst_storage, "dst", where) && guard_intact(b.dst2, b.dst2_storage, "dst2", where) &&
           guard_intact(b.dst3, b.dst3_storage, "dst3", where);
}

}  // namespace kv::test
