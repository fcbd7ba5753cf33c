// Kernel lab for small-M matmuls (decode GEMV; STYLE item 7): a standalone program, not part
// of the product. Versions:
//   v1  oneDNN matmul with M = 1..4 (what kernels/cpu/matmul.cpp did before v2): JIT gemm
//       kernels tuned for large M; ~10 GB/s on a 113 MB lm_head, plus a primitive-cache
//       lookup (string key) per call
//   v2  (kernels/cpu/matmul.cpp small-M path, gemv_tile.h) W rows streamed once, one row at
//       a time (one address stream) with U = 4/M accumulators per x row, a software prefetch
//       to L2 (prefetcht1) 2 KiB ahead, bf16 widened by a shift (or vdpbf16ps when x is bf16
//       too), ~64 KiB work units run by unit_pool.h. M = 1: ~0.8-1.0x of the plain read,
//       v1 ~0.3-0.5x.
//       Tried on the way: 4 W rows per tile (M x 4 accumulators, shuffle-tree sums) ran at
//       ~0.3-0.6x of the read on 1-2 KiB rows (four interleaved short streams defeat the
//       hardware prefetchers); prefetchnta / prefetcht0 (to L1) 1-4 KiB ahead cost ~20%
//       against no prefetch at all on huge pages, prefetcht1 gained ~10-20%; with huge pages
//       one thread alone reaches about the 2-thread read. M = 4 stays at ~0.6-0.8x (x reloads
//       from L1/L2 per W vector).
// Baseline: a plain 2-thread read of the same bytes (the floor a GEMV cannot beat).
// Weights rotate through copies totalling >= 256 MiB (2 MiB-aligned with transparent huge
// pages, as the CPU backend allocates them), so every call streams from DRAM as in a real
// decode step. Each version is checked against an f64 product first.
// Usage: kvlab_lab_gemv [--quick] [--threads N]
#include <oneapi/dnnl/dnnl.hpp>
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/lab/lab_common.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/gemm_tile.h"

namespace kv::lab {

struct Shape {
    const char* name;
    int64_t N, K;  // weight [N, K] (PyTorch Linear [out, in])
};

// Copies of one weight matrix (f32 or bf16) totalling >= min_bytes, plus x and y.
struct Problem {
    int64_t M, N, K;
    DType dt;
    struct Buf {  // 2 MiB-aligned with transparent huge pages, as the CPU backend allocates weights
        char* p = nullptr;
        size_t n = 0;
        explicit Buf(size_t bytes) : n(bytes) {
            p = static_cast<char*>(std::aligned_alloc(size_t(2) << 20, (bytes + (size_t(2) << 20) - 1) / (size_t(2) << 20) * (size_t(2) << 20)));
            madvise(p, bytes, MADV_HUGEPAGE);
        }
        Buf(Buf&& o) noexcept : p(o.p), n(o.n) { o.p = nullptr; }
        ~Buf() { std::free(p); }
        char* data() { return p; }
        size_t size() const { return n; }
    };
    std::vector<Buf> w;
    std::vector<char> x, y;
    Problem(int64_t m, int64_t n, int64_t k, DType d, size_t min_bytes, uint64_t seed) : M(m), N(n), K(k), dt(d) {
        const size_t wb = size_t(N * K * dtype_size(dt));
        const size_t copies = std::max<size_t>(2, (min_bytes + wb - 1) / wb);
        std::mt19937_64 rng(seed);
        std::uniform_real_distribution<float> u(-1.f, 1.f);
        std::vector<float> tmp(size_t(N * K));
        for (float& f : tmp) f = u(rng);
        w.reserve(copies);
        for (size_t i = 0; i < copies; ++i) {
            w.emplace_back(wb);
            cpu::store_row(w.back().data(), dtype_size(dt), dt, N * K, tmp.data());
        }
        x.resize(size_t(M * K * dtype_size(dt)));
        std::vector<float> xt(size_t(M * K));
        for (float& f : xt) f = u(rng);
        cpu::store_row(x.data(), dtype_size(dt), dt, M * K, xt.data());
        y.resize(size_t(M * N * 4));
    }
    // y (M, N) f32 = x (M, K) @ W^T, W copy `i`.
    OpCall call(size_t i) {
        OpCall c;
        c.op = OpKind::MATMUL;
        c.p.alpha = 1.f;
        c.p.beta = 0.f;
        const int64_t es = dtype_size(dt);
        TensorView a, b, d;
        a.data = x.data(), a.dtype = dt, a.ndim = 2, a.ne[0] = M, a.ne[1] = K, a.nb[0] = K * es, a.nb[1] = es;
        b.data = w[i % w.size()].data(), b.dtype = dt, b.ndim = 2, b.ne[0] = K, b.ne[1] = N, b.nb[0] = es, b.nb[1] = K * es;
        d.data = y.data(), d.dtype = DType::F32, d.ndim = 2, d.ne[0] = M, d.ne[1] = N, d.nb[0] = N * 4, d.nb[1] = 4;
        c.dst = d;
        c.src[0] = a, c.src[1] = b;
        c.nsrc = 2;
        return c;
    }
    size_t weight_bytes() const { return w[0].size(); }
};

// v1: oneDNN directly (primitive created once per shape; the lookup cost of the old path is
// not counted, which favours v1).
struct OneDnn {
    dnnl::engine eng{dnnl::engine::kind::cpu, 0};
    dnnl::matmul prim;
    dnnl::memory::desc a, b, d;
    explicit OneDnn(const Problem& p) {
        const auto dt = p.dt == DType::BF16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
        a = dnnl::memory::desc({p.M, p.K}, dt, {p.K, 1});
        b = dnnl::memory::desc({p.K, p.N}, dt, {1, p.K});
        d = dnnl::memory::desc({p.M, p.N}, dnnl::memory::data_type::f32, {p.N, 1});
        prim = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, d), eng));
    }
    void run(Problem& p, size_t i) {
        dnnl::stream s(eng);
        dnnl::memory am(a, eng, p.x.data()), bm(b, eng, p.w[i % p.w.size()].data()), dm(d, eng, p.y.data());
        prim.execute(s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, dm}});
        s.wait();
    }
};

// Native-width vectors (gemm_tile.h): wider GCC vectors than the registers live on the
// stack and would lower the read floor on AVX2.
float read_all(const char* p, size_t bytes, int threads) {
    using v = cpu::vf32;
    float tot = 0;
    const size_t nv = bytes / sizeof(v);
#pragma omp parallel num_threads(threads) reduction(+ : tot)
    {
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
        v s0{}, s1{}, s2{}, s3{};
        size_t i = nv * size_t(t) / size_t(nt), e = nv * size_t(t + 1) / size_t(nt);
        for (; i + 4 <= e; i += 4) {
            v a, b, c, d;
            std::memcpy(&a, p + i * sizeof(v), sizeof(v));
            std::memcpy(&b, p + (i + 1) * sizeof(v), sizeof(v));
            std::memcpy(&c, p + (i + 2) * sizeof(v), sizeof(v));
            std::memcpy(&d, p + (i + 3) * sizeof(v), sizeof(v));
            s0 += a, s1 += b, s2 += c, s3 += d;
        }
        for (int j = 0; j < int(cpu::vec_width<float>()); ++j) tot += s0[j] + s1[j] + s2[j] + s3[j];
    }
    return tot;
}

// v1 where oneDNN offers the product on this CPU (2.6 has no bf16 matmul without AVX-512).
std::optional<OneDnn> make_onednn(const Problem& p) {
    try {
        return std::optional<OneDnn>(std::in_place, p);
    } catch (const dnnl::error&) {
        return std::nullopt;
    }
}

double max_rel_err(const Problem& p, const std::vector<double>& ref) {
    const float* y = reinterpret_cast<const float*>(p.y.data());
    double mx = 0, e = 0;
    for (size_t i = 0; i < ref.size(); ++i) mx = std::max(mx, std::fabs(ref[i]));
    for (size_t i = 0; i < ref.size(); ++i) e = std::max(e, std::fabs(double(y[i]) - ref[i]));
    return e / (mx > 0 ? mx : 1);
}

int main_impl(int argc, char** argv) {
    const LabArgs args = parse_lab_args(argc, argv, "kvlab_lab_gemv");
    if (!args.ok) return 2;
    const bool quick = args.quick;
    const int threads = args.threads;
    OpContext ctx;
    ctx.threads = threads;
    KernelBackend* product = lab_backend();
    if (!product) return 2;
    KernelBackend& be = *product;

    // ---- correctness against an f64 product (copy 0 of the weights) ------------------------
    bool ok = true;
    for (DType dt : {DType::F32, DType::BF16})
        for (int64_t M : {1, 3, 4}) {
            Problem p(M, 77, 45, dt, 0, 3);
            std::vector<float> xf(size_t(M * p.K)), wf(size_t(p.N * p.K));
            cpu::load_row(p.x.data(), dtype_size(dt), dt, M * p.K, xf.data());
            cpu::load_row(p.w[0].data(), dtype_size(dt), dt, p.N * p.K, wf.data());
            std::vector<double> ref(size_t(M * p.N), 0.0);
            for (int64_t m = 0; m < M; ++m)
                for (int64_t n = 0; n < p.N; ++n)
                    for (int64_t k = 0; k < p.K; ++k) ref[size_t(m * p.N + n)] += double(xf[size_t(m * p.K + k)]) * wf[size_t(n * p.K + k)];
            std::optional<OneDnn> v1 = make_onednn(p);
            double e1 = 0;
            if (v1) {
                v1->run(p, 0);
                e1 = max_rel_err(p, ref);
            }
            be.compute(ctx, p.call(0));
            const double e2 = max_rel_err(p, ref);
            const bool pass = e1 < 1e-5 && e2 < 1e-5;
            ok = ok && pass;
            std::printf("check %s M=%lld  v1 %s  v2 err %.2e  %s\n", dt == DType::F32 ? "f32 " : "bf16", (long long)M,
                        v1 ? ("err " + std::to_string(e1)).c_str() : "n/a (no oneDNN primitive on this CPU)", e2, pass ? "ok" : "FAIL");
        }
    if (!ok) return 1;

    // ---- speed: GB/s of weights streamed, against a plain read of the same copies ---------
    std::vector<Shape> shapes = {{"smollm2 qkv", 960, 576},          {"smollm2 gate_up", 3072, 576},
                                 {"smollm2 down", 576, 1536},        {"smollm2 lm_head", 49152, 576},
                                 {"qwen2.5-0.5b qkv", 1152, 896},    {"qwen2.5-0.5b gate_up", 9728, 896},
                                 {"qwen2.5-0.5b down", 896, 4864},   {"qwen2.5-0.5b lm_head", 151936, 896}};
    if (quick) shapes = {{"smollm2 gate_up", 3072, 576}};
    const size_t min_bytes = quick ? size_t(64) << 20 : size_t(256) << 20;
    const double min_s = quick ? 0.05 : 0.3;
    std::printf("\nthreads %d; GB/s of weights read per call (copies rotate through >= %zu MiB)\n", threads, min_bytes >> 20);
    std::printf("%-22s %-5s %2s %12s %12s %12s %8s %8s\n", "shape", "dtype", "M", "read GB/s", "v1 GB/s", "v2 GB/s", "v1/read", "v2/read");
    for (const Shape& sh : shapes)
        for (DType dt : {DType::F32, DType::BF16})
            for (int64_t M : {int64_t(1), int64_t(4)}) {
                if (quick && M == 4) continue;
                Problem p(M, sh.N, sh.K, dt, min_bytes, 5);
                std::optional<OneDnn> v1 = make_onednn(p);
                const double gb = double(p.weight_bytes()) / 1e9;
                float sink = 0;
                // Interleaved so the three see the same machine load.
                double tr = 1e30, t1 = 1e30, t2 = 1e30;
                for (int rep = 0; rep < 3; ++rep) {
                    tr = std::min(tr, seconds_per_call([&](size_t i) { sink += read_all(p.w[i % p.w.size()].data(), p.weight_bytes(), threads); }, min_s));
                    if (v1) t1 = std::min(t1, seconds_per_call([&](size_t i) { v1->run(p, i); }, min_s));
                    t2 = std::min(t2, seconds_per_call([&](size_t i) { be.compute(ctx, p.call(i)); }, min_s));
                }
                std::printf("%-22s %-5s %2lld %12.1f %12.1f %12.1f %7.2fx %7.2fx%s\n", sh.name, dt == DType::F32 ? "f32" : "bf16", (long long)M,
                            gb / tr, v1 ? gb / t1 : 0.0, gb / t2, v1 ? tr / t1 : 0.0, tr / t2, sink == 12345.f ? " " : "");
            }
    return 0;
}

}  // namespace kv::lab

int main(int argc, char** argv) { return kv::lab::main_impl(argc, argv); }
