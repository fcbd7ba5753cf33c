// Machine ceilings: raw oneDNN matmul and an OpenMP streaming triad.
#include "ceilings.h"

#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sys/mman.h>
#include <vector>

#include "engine/backend/backend_registry.h"
#include "engine/core/error.h"
#include "bench_table.h"

namespace kv::bench {

double time_best(const std::function<void()>& fn, double min_seconds, int min_reps) {
    using clk = std::chrono::steady_clock;
    fn();  // warm-up (page faults, primitive creation, caches)
    double best = 1e30, total = 0;
    int reps = 0;
    while (reps < min_reps || total < min_seconds) {
        auto t0 = clk::now();
        fn();
        double s = std::chrono::duration<double>(clk::now() - t0).count();
        best = std::min(best, s);
        total += s;
        ++reps;
        if (reps > 100000) break;
    }
    return best;
}

struct RawMatmul::Impl {
    dnnl::engine eng{dnnl::engine::kind::cpu, 0};
    dnnl::stream strm{eng};
    dnnl::matmul prim;
    dnnl::memory a, b, c;
    std::string impl;
    std::string note;
};

RawMatmul::RawMatmul(int64_t M, int64_t N, int64_t K, DType in_dtype) : impl_(new Impl) {
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    dt in = in_dtype == DType::BF16 ? dt::bf16 : dt::f32;
    auto make = [&](dt d) {
        dnnl::memory::desc amd({M, K}, d, tag::ab), bmd({K, N}, d, tag::ab), cmd({M, N}, dt::f32, tag::ab);
        return dnnl::matmul::primitive_desc(dnnl::matmul::desc(amd, bmd, cmd), impl_->eng);
    };
    dnnl::matmul::primitive_desc pd;
    try {
        pd = make(in);
    } catch (const dnnl::error&) {
        // oneDNN 2.6 has no bf16 matmul without AVX-512 (avx512_core): the best it offers for
        // these operands is the f32 product, which is what our bf16 path computes there too.
        if (in != dt::bf16) throw;
        pd = make(dt::f32);
        impl_->note = "f32: oneDNN offers no bf16 matmul on this CPU";
    }
    const dnnl::memory::desc amd = pd.src_desc(), bmd = pd.weights_desc(), cmd = pd.dst_desc();
    impl_->prim = dnnl::matmul(pd);
    impl_->impl = pd.impl_info_str();
    impl_->a = dnnl::memory(amd, impl_->eng);
    impl_->b = dnnl::memory(bmd, impl_->eng);
    impl_->c = dnnl::memory(cmd, impl_->eng);
    // Non-trivial values (denormal-free) so timing is representative.
    std::memset(impl_->a.get_data_handle(), 0x3c, amd.get_size());
    std::memset(impl_->b.get_data_handle(), 0x3c, bmd.get_size());
}

RawMatmul::~RawMatmul() { delete impl_; }

void RawMatmul::run() {
    impl_->prim.execute(impl_->strm, {{DNNL_ARG_SRC, impl_->a}, {DNNL_ARG_WEIGHTS, impl_->b}, {DNNL_ARG_DST, impl_->c}});
    impl_->strm.wait();
}

std::string RawMatmul::impl() const { return impl_->impl; }
std::string RawMatmul::note() const { return impl_->note; }

std::string machine_line() {
    return str("cpu: ", cpu_model(), ", ", hardware_threads(), " hardware threads, ", num_threads(), " used; kernels ", cpu_variant_status());
}

double triad_gbps(size_t bytes_per_array, double min_seconds) {
    // Arrays get transparent huge pages like the CPU backend's large buffers (weights and KV
    // caches that decode streams), so the floor is not lowered by TLB misses ours avoid.
    const size_t huge = size_t(2) << 20;
    size_t n = (bytes_per_array + huge - 1) / huge * huge / sizeof(float);
    auto alloc = [&] {
        void* p = std::aligned_alloc(huge, n * sizeof(float));
#if defined(MADV_HUGEPAGE)
        if (p) madvise(p, n * sizeof(float), MADV_HUGEPAGE);
#endif
        return static_cast<float*>(p);
    };
    float* a = alloc();
    float* b = alloc();
    float* c = alloc();
    if (!a || !b || !c) {
        std::free(a);
        std::free(b);
        std::free(c);
        throw Error(str("bench: cannot allocate 3 x ", format_bytes((long long)bytes_per_array), " for the triad"));
    }
    // First touch in parallel so pages spread like the measured loop's.
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; ++i) {
        a[i] = 0.0f;
        b[i] = 1.0f;
        c[i] = 2.0f;
    }
    const float s = 3.0f;
    double t = time_best(
        [&] {
#pragma omp parallel for schedule(static)
            for (size_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
        },
        min_seconds, 5);
    volatile float sink = a[n / 2];
    (void)sink;
    std::free(a);
    std::free(b);
    std::free(c);
    return 3.0 * double(n) * sizeof(float) / t / 1e9;
}

}  // namespace kv::bench
