// MATMUL on the CPU: oneDNN (f32 and bf16 inputs, f32 accumulation; ~90% of this CPU's
// peak) with a primitive cache keyed by shapes/strides/dtypes; a small-M path (M <= 4, decode)
// that streams the weights once through gemv_tile.h; and a plain row kernel for what neither
// covers (f64, f16 outputs, exotic strides).
// dst[..., M, N] = alpha * a[..., M, K] @ b[..., K, N] + beta * dst
//
// Index
//   [SECTION] oneDNN
//   [SECTION] small-M path (decode GEMV)
//   [SECTION] plain row kernel and dispatch
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <omp.h>
#include <sstream>
#include <string>
#include <unordered_map>

#include "cpu_common.h"
#include "gemv_tile.h"
#include "unit_pool.h"

namespace kv::cpu {

namespace {

// =========================================================================================
// [SECTION] oneDNN
// =========================================================================================
dnnl::engine& cpu_engine() {
    static dnnl::engine e(dnnl::engine::kind::cpu, 0);
    return e;
}

bool onednn_dtype(DType t, dnnl::memory::data_type* out) {
    switch (t) {
        case DType::F32: *out = dnnl::memory::data_type::f32; return true;
        case DType::BF16: *out = dnnl::memory::data_type::bf16; return true;
        default: return false;
    }
}

// Memory descriptor for an operand seen with the destination's batch sizes; broadcast
// batch dims (size 1 or stride 0) become size-1 dims as oneDNN expects.
bool make_md(const TensorView& v, int nd, dnnl::memory::desc* md, std::string* key) {
    dnnl::memory::data_type dt;
    if (!onednn_dtype(v.dtype, &dt)) return false;
    const int64_t es = dtype_size(v.dtype);
    dnnl::memory::dims dims((size_t)nd), strides((size_t)nd);
    // Size-1 dims (and broadcast batch dims) get the dense stride of the dims inside them,
    // so oneDNN never sees overlapping or ambiguous layouts.
    for (int i = nd - 1; i >= 0; --i) {
        int64_t ne = v.ne[i], nb = v.nb[i];
        if (nb % es != 0) return false;
        const bool bcast = i < nd - 2 && (ne == 1 || nb == 0);
        dims[size_t(i)] = bcast ? 1 : ne;
        if (bcast || ne == 1) {
            int64_t dense = 1;
            for (int k = i + 1; k < nd; ++k) dense = std::max<int64_t>(dense, strides[size_t(k)] * dims[size_t(k)]);
            strides[size_t(i)] = dense;
        } else {
            strides[size_t(i)] = nb / es;
        }
        if (strides[size_t(i)] < 0) return false;
    }
    // oneDNN's fast kernels want one unit stride among the last two dims.
    if (strides[size_t(nd - 1)] != 1 && strides[size_t(nd - 2)] != 1) return false;
    *md = dnnl::memory::desc(dims, dt, strides);
    std::ostringstream os;
    os << int(v.dtype) << ':';
    for (int i = 0; i < nd; ++i) os << dims[size_t(i)] << '/' << strides[size_t(i)] << ',';
    *key += os.str();
    *key += '|';
    return true;
}

struct Cached {
    dnnl::matmul prim;
    dnnl::memory::desc a, b, d;
    std::string impl;
};

std::mutex g_cache_mu;
std::unordered_map<std::string, std::shared_ptr<Cached>>& cache() {
    static std::unordered_map<std::string, std::shared_ptr<Cached>> c;
    return c;
}

// The cached oneDNN primitive for this call's shapes and strides, or null when oneDNN cannot
// take the call as is.
std::shared_ptr<Cached> onednn_primitive(const TensorView& a, const TensorView& b, const TensorView& d, float alpha, float beta) {
    const int nd = d.ndim;
    if (nd < 2 || nd > 6) return nullptr;
    if (!((a.dtype == DType::F32 && d.dtype == DType::F32) ||
          (a.dtype == DType::BF16 && (d.dtype == DType::F32 || d.dtype == DType::BF16))))
        return nullptr;
    dnnl::memory::desc amd, bmd, dmd;
    std::string key;
    if (!make_md(a, nd, &amd, &key) || !make_md(b, nd, &bmd, &key)) return nullptr;
    // The destination must be a real (non-broadcast) array.
    for (int i = 0; i < nd; ++i)
        if (d.ne[i] > 1 && d.nb[i] == 0) return nullptr;
    if (!make_md(d, nd, &dmd, &key)) return nullptr;
    key += std::to_string(alpha) + "|" + std::to_string(beta);

    std::shared_ptr<Cached> entry;
    {
        std::lock_guard<std::mutex> lk(g_cache_mu);
        auto it = cache().find(key);
        if (it != cache().end()) entry = it->second;
    }
    if (!entry) {
        try {
            dnnl::primitive_attr attr;
            if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
            if (beta != 0.0f) {
                dnnl::post_ops po;
                po.append_sum(beta);
                attr.set_post_ops(po);
            }
            auto pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(amd, bmd, dmd), attr, cpu_engine());
            entry = std::make_shared<Cached>();
            entry->prim = dnnl::matmul(pd);
            entry->a = amd;
            entry->b = bmd;
            entry->d = dmd;
            entry->impl = pd.impl_info_str();
        } catch (const dnnl::error&) {
            return nullptr;
        }
        std::lock_guard<std::mutex> lk(g_cache_mu);
        if (cache().size() > 1024) cache().clear();  // bounded: shapes in a run are few
        cache()[key] = entry;
    }
    return entry;
}

// Runs `entry` on the call's arrays with `threads` OpenMP threads; false when oneDNN throws.
bool onednn_execute(const Cached& entry, const TensorView& a, const TensorView& b, const TensorView& d, int threads) {
    const int nd = d.ndim;
    // Waking a thread team costs ~10 us (up to a 4 ms scheduler tick when the other core is
    // busy); below ~1M multiply-adds one thread finishes sooner. oneDNN's OpenMP runtime reads
    // the calling thread's max-threads at execution, and that is a per-thread setting: a run on
    // a worker thread (the CLI's run manager) has the OpenMP default, not --threads. So the
    // call's own thread count is set here every time. It also keeps a oneDNN call made inside
    // one thread of our own parallel region (packed prefill panels, threads = 1) from starting
    // a nested team: libgomp creates and destroys the threads of a nested team on every call
    // (37k thread creations in one 1024-token eval, seconds of system time).
    const int64_t madds = d.numel() * a.ne[nd - 1];
    const int saved_threads = omp_get_max_threads();
    const int want = madds < (int64_t(1) << 20) ? 1 : std::max(1, threads);
    const bool change = want != saved_threads;
    if (change) omp_set_num_threads(want);
    struct Restore {
        bool on;
        int n;
        ~Restore() {
            if (on) omp_set_num_threads(n);
        }
    } restore{change, saved_threads};
    try {
        dnnl::stream s(cpu_engine());
        dnnl::memory am(entry.a, cpu_engine(), a.data), bm(entry.b, cpu_engine(), b.data), dm(entry.d, cpu_engine(), d.data);
        entry.prim.execute(s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, dm}});
        s.wait();
    } catch (const dnnl::error&) {
        return false;  // fall back to the plain kernel
    }
    return true;
}

// Returns false when oneDNN cannot take this call as is. With more than one thread, the output
// columns are cut into one block per thread (multiples of 16) and each block is a
// single-threaded oneDNN call on the unit pool: an OpenMP team sleeps between calls (the CLI
// runs it PASSIVE, so every product would wake its workers), while the pool's helpers poll
// between the many short calls of a forward when the CPUs are otherwise idle.
bool matmul_onednn(const TensorView& a, const TensorView& b, const TensorView& d, float alpha, float beta, int threads) {
    const int nd = d.ndim;
    if (nd >= 2 && nd <= 6 && threads > 1 && b.ndim == nd) {
        const int64_t N = d.ne[nd - 1], madds = d.numel() * a.ne[nd - 1];
        const int64_t blk = ((N + threads - 1) / threads + 15) / 16 * 16;
        if (madds >= (int64_t(1) << 20) && N >= 32 * int64_t(threads)) {
            const int64_t blocks = (N + blk - 1) / blk;
            auto block = [&](const TensorView& v, int64_t u) {
                TensorView w = v;
                const int64_t n0 = u * blk;
                w.ne[nd - 1] = std::min(blk, N - n0);
                w.data = static_cast<char*>(v.data) + n0 * v.nb[nd - 1];
                return w;
            };
            // Every block's primitive first, on this thread: a shape oneDNN refuses falls back whole.
            const std::shared_ptr<Cached> first = onednn_primitive(a, block(b, 0), block(d, 0), alpha, beta);
            const std::shared_ptr<Cached> last = onednn_primitive(a, block(b, blocks - 1), block(d, blocks - 1), alpha, beta);
            if (first && last) {
                std::atomic<bool> ok{true};
                run_units(int(std::min<int64_t>(threads, blocks)), blocks, [&](int64_t u) {
                    const Cached& e = u == blocks - 1 ? *last : *first;
                    if (!onednn_execute(e, a, block(b, u), block(d, u), 1)) ok = false;
                });
                // Some blocks may be written (beta adds to d): no fallback can redo only the rest.
                if (!ok.load()) throw KernelError("cpu matmul: oneDNN failed on a column block of a primitive it had accepted");
                return true;
            }
        }
    }
    const std::shared_ptr<Cached> entry = onednn_primitive(a, b, d, alpha, beta);
    return entry && onednn_execute(*entry, a, b, d, threads);
}

// =========================================================================================
// [SECTION] small-M path (decode GEMV)
// =========================================================================================
// With M <= 4 rows, a matmul is bound by reading b once: M = 1 calls through oneDNN reached
// ~10 GB/s on the lm_head and cost ~10 us of primitive lookup each, so these calls stream b
// here instead. Work units are (batch, block of output columns) of ~kChunkBytes of b, run by
// unit_pool.h (the caller plus helpers; one the scheduler delays just runs fewer units); each
// output element is one unit's fixed-order sum, so results do not depend on the thread count.
constexpr int64_t kSmallM = 4;
constexpr int64_t kChunkBytes = int64_t(64) << 10;      // b bytes per work unit
constexpr int64_t kParallelBytes = int64_t(512) << 10;  // below this, one thread (a wake-up costs more)

bool small_m_dtype(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

// Returns false when the call is not a small-M call this path takes (then oneDNN runs).
bool matmul_small_m(const OpContext& ctx, const TensorView& a, const TensorView& b, const TensorView& d, float alpha, float beta) {
    const int nd = d.ndim;
    if (nd < 2) return false;
    const int64_t M = d.ne[nd - 2], N = d.ne[nd - 1], K = a.ne[nd - 1];
    if (M < 1 || M > kSmallM || N < 1 || K < 1) return false;
    if (!small_m_dtype(a.dtype) || !small_m_dtype(d.dtype) || (b.dtype != DType::F32 && b.dtype != DType::BF16)) return false;
    const int64_t wes = dtype_size(b.dtype);
    // dot: column n of b is contiguous along K (b = W^T of a PyTorch Linear weight W [N, K]);
    // axpy: row k of b is contiguous along N.
    const bool dot = b.nb[nd - 2] == wes || K == 1;
    const bool axpy = !dot && (b.nb[nd - 1] == wes || N == 1);
    if (!dot && !axpy) return false;
    const int64_t ldw = (dot ? b.nb[nd - 1] : b.nb[nd - 2]) / wes;  // elements between weight rows
    if ((dot ? b.nb[nd - 1] : b.nb[nd - 2]) % wes != 0 || ldw < 0) return false;
    for (int i = 0; i < nd; ++i)
        if (d.nb[i] < 0 || (d.ne[i] > 1 && d.nb[i] == 0)) return false;
    const int64_t batches = d.rows() / M;
    if (batches * M * K > (int64_t(1) << 24)) return false;  // not a decode-sized call

    TensorView dk = d;
    dk.ne[nd - 1] = K;
    const TensorView ab = broadcast_to(a, dk);
    TensorView dkn = d;
    dkn.ne[nd - 2] = K;
    const TensorView bb = broadcast_to(b, dkn);
    auto batch_offsets = [&](int64_t batch, int64_t* ao, int64_t* bo, int64_t* dof) {
        int64_t rem = batch;
        *ao = *bo = *dof = 0;
        for (int k = nd - 3; k >= 0; --k) {
            const int64_t idx = rem % d.ne[k];
            rem /= d.ne[k];
            *ao += idx * ab.nb[k];
            *bo += idx * bb.nb[k];
            *dof += idx * d.nb[k];
        }
    };

    // x: the rows of a as f32 (or bf16 for the vdpbf16ps kernel when a and b are both bf16),
    // in place when a already has that dtype with unit stride.
#if KV_GEMV_DOT_BF16
    const bool x16 = dot && a.dtype == DType::BF16 && b.dtype == DType::BF16;
#else
    const bool x16 = false;
#endif
    const DType xdt = x16 ? DType::BF16 : DType::F32;
    const int64_t xes = dtype_size(xdt);
    const bool x_native = a.dtype == xdt && (ab.nb[nd - 1] == xes || K == 1) && ab.nb[nd - 2] % xes == 0;
    KernelScratch xs(ctx, x_native ? 0 : size_t(batches * M * K) * size_t(xes));
    if (!x_native)
        for (int64_t bt = 0; bt < batches; ++bt) {
            int64_t ao, bo, dof;
            batch_offsets(bt, &ao, &bo, &dof);
            for (int64_t m = 0; m < M; ++m) {
                float* tmp = scratch<float>(0, K);
                load_row(ab.bytes() + ao + m * ab.nb[nd - 2], ab.nb[nd - 1], a.dtype, K, tmp);
                store_row(xs.as<char>() + (bt * M + m) * K * xes, xes, xdt, K, tmp);  // exact: a's values are xdt or f16->f32
            }
        }

    const int64_t row_bytes = K * wes;  // bytes of b per output column
    int64_t chunk = std::max<int64_t>(1, kChunkBytes / row_bytes);
    if (!dot) chunk = std::max<int64_t>(64, chunk / 64 * 64);
    chunk = std::min(chunk, N);
    const int64_t per_batch = (N + chunk - 1) / chunk, units = batches * per_batch;
    const bool acc = beta != 0.0f;

    auto run_unit = [&](int64_t u) {
        const int64_t bt = u / per_batch, n0 = (u % per_batch) * chunk, n = std::min(chunk, N - n0);
        int64_t ao, bo, dof;
        batch_offsets(bt, &ao, &bo, &dof);
        const char* xp = x_native ? ab.bytes() + ao : xs.as<char>() + bt * M * K * xes;
        const float* x = reinterpret_cast<const float*>(xp);
        const int64_t ldx = x_native ? ab.nb[nd - 2] / xes : K;
        float* y = scratch<float>(4, M * chunk);
        const char* w = bb.bytes() + bo + n0 * bb.nb[nd - 1];
        if (x16) {
#if KV_GEMV_DOT_BF16
            gemv_dot_bf16(int(M), n, K, reinterpret_cast<const uint16_t*>(xp), ldx, reinterpret_cast<const uint16_t*>(w), ldw, y, chunk);
#endif
        } else if (dot) {
            if (b.dtype == DType::F32) gemv_dot<float>(int(M), n, K, x, ldx, reinterpret_cast<const float*>(w), ldw, y, chunk);
            else gemv_dot<uint16_t>(int(M), n, K, x, ldx, reinterpret_cast<const uint16_t*>(w), ldw, y, chunk);
        } else {
            if (b.dtype == DType::F32) gemv_axpy<float>(int(M), n, K, x, ldx, reinterpret_cast<const float*>(w), ldw, y, chunk);
            else gemv_axpy<uint16_t>(int(M), n, K, x, ldx, reinterpret_cast<const uint16_t*>(w), ldw, y, chunk);
        }
        float* old = acc ? scratch<float>(5, chunk) : nullptr;
        for (int64_t m = 0; m < M; ++m) {
            float* yr = y + m * chunk;
            char* dp = d.bytes() + dof + m * d.nb[nd - 2] + n0 * d.nb[nd - 1];
            if (acc) {
                load_row(dp, d.nb[nd - 1], d.dtype, n, old);
                for (int64_t j = 0; j < n; ++j) yr[j] = alpha * yr[j] + beta * old[j];
            } else if (alpha != 1.0f) {
                for (int64_t j = 0; j < n; ++j) yr[j] *= alpha;
            }
            store_row(dp, d.nb[nd - 1], d.dtype, n, yr);
        }
    };
    const int64_t bytes = batches * N * row_bytes;
    const int nt = bytes >= kParallelBytes ? int(std::min<int64_t>(std::max(1, kernel_threads(ctx)), units)) : 1;
    run_units(nt, units, run_unit);
    return true;
}

// =========================================================================================
// [SECTION] plain row kernel and dispatch
// =========================================================================================
// Temporary buffer from the engine's workspace allocator (tracked) or malloc.
struct WsBuf {
    const OpContext& ctx;
    void* p = nullptr;
    size_t bytes = 0;
    WsBuf(const OpContext& c, size_t n) : ctx(c), bytes(n) {
        p = ctx.workspace ? ctx.workspace->alloc(n) : std::malloc(n);
        if (!p) throw KernelError("matmul: out of memory for a workspace buffer");
    }
    ~WsBuf() {
        if (ctx.workspace) ctx.workspace->free(p, bytes);
        else std::free(p);
    }
};

// Contiguous copy of `v` in dtype `dt` into `buf`; returns the new view.
TensorView pack(const TensorView& v, DType dt, void* buf) {
    TensorView r = v;
    r.data = buf;
    r.dtype = dt;
    int64_t st = dtype_size(dt);
    for (int i = v.ndim - 1; i >= 0; --i) {
        r.nb[i] = st;
        st *= v.ne[i];
    }
    int64_t rows = v.rows(), n = v.last();
    for (int64_t row = 0; row < rows; ++row) {
        float* tmp = scratch<float>(0, n);
        load_row(v.bytes() + v.row_offset(row), last_stride(v), v.dtype, n, tmp);
        store_row(r.bytes() + r.row_offset(row), last_stride(r), dt, n, tmp);
    }
    return r;
}

// Plain row kernel: for each output row, acc[N] = sum_k a[i,k] * b[k,:]. Used for f64 and
// whatever oneDNN rejects.
template <class A>
void matmul_rows(const OpContext& ctx, const TensorView& a, const TensorView& b, const TensorView& d, A alpha, A beta) {
    const int nd = d.ndim;
    const int64_t M = d.ne[nd - 2], N = d.ne[nd - 1], K = a.ne[nd - 1];
    const TensorView ab = broadcast_to(a, [&] {
        TensorView t = d;
        t.ne[nd - 1] = K;
        return t;
    }());
    const TensorView bb = broadcast_to(b, [&] {
        TensorView t = d;
        t.ne[nd - 2] = K;
        return t;
    }());
    const int64_t rows = d.rows();  // batch * M
    parallel_rows(ctx, rows, N * K, [&](int64_t r0, int64_t r1) {
        A* acc = scratch<A>(0, N);
        A* brow = scratch<A>(1, N);
        A* arow = scratch<A>(2, K);
        A* drow = scratch<A>(3, N);
        for (int64_t r = r0; r < r1; ++r) {
            int64_t batch = r / M, i = r % M;
            // batch offsets
            int64_t rem = batch, aoff = 0, boff = 0, doff = 0;
            for (int k = nd - 3; k >= 0; --k) {
                int64_t idx = rem % d.ne[k];
                rem /= d.ne[k];
                aoff += idx * ab.nb[k];
                boff += idx * bb.nb[k];
                doff += idx * d.nb[k];
            }
            load_row(ab.bytes() + aoff + i * ab.nb[nd - 2], ab.nb[nd - 1], ab.dtype, K, arow);
            for (int64_t j = 0; j < N; ++j) acc[j] = 0;
            for (int64_t k = 0; k < K; ++k) {
                load_row(bb.bytes() + boff + k * bb.nb[nd - 2], bb.nb[nd - 1], bb.dtype, N, brow);
                const A aik = arow[k];
                for (int64_t j = 0; j < N; ++j) acc[j] += aik * brow[j];
            }
            char* dp = d.bytes() + doff + i * d.nb[nd - 2];
            if (beta != A(0)) {
                load_row(dp, d.nb[nd - 1], d.dtype, N, drow);
                for (int64_t j = 0; j < N; ++j) acc[j] = alpha * acc[j] + beta * drow[j];
            } else {
                for (int64_t j = 0; j < N; ++j) acc[j] *= alpha;
            }
            store_row(dp, d.nb[nd - 1], d.dtype, N, acc);
        }
    });
}

}  // namespace

void matmul_forward(const OpContext& ctx, const OpCall& c) {
    const TensorView& d = c.dst;
    TensorView a = c.src[0], b = c.src[1];
    const int nd = d.ndim;
    if (d.numel() == 0) return;
    if (a.ne[nd - 1] == 0) {  // K == 0: dst = beta * dst
        OpCall s = c;
        s.op = OpKind::SCALE;
        s.p.alpha = c.p.beta;
        s.src[0] = d;
        s.nsrc = 1;
        scale_forward(ctx, s);
        return;
    }
    if (b.dtype == DType::U8) {  // a packed weight (packed_matmul.cpp)
        matmul_packed(ctx, c);
        return;
    }
    if (is_f64_call(c)) {
        matmul_rows<double>(ctx, a, b, d, c.p.alpha, c.p.beta);
        return;
    }
    if (matmul_small_m(ctx, a, b, d, c.p.alpha, c.p.beta)) return;
    if (matmul_onednn(a, b, d, c.p.alpha, c.p.beta, kernel_threads(ctx))) return;
    // Repack inputs oneDNN cannot read directly (f16, odd strides) as contiguous f32 and retry.
    if (d.dtype == DType::F32) {
        WsBuf pa(ctx, size_t(a.numel()) * 4), pb(ctx, size_t(b.numel()) * 4);
        TensorView a2 = pack(a, DType::F32, pa.p), b2 = pack(b, DType::F32, pb.p);
        if (matmul_onednn(a2, b2, d, c.p.alpha, c.p.beta, kernel_threads(ctx))) return;
        matmul_rows<float>(ctx, a2, b2, d, c.p.alpha, c.p.beta);
        return;
    }
    matmul_rows<float>(ctx, a, b, d, c.p.alpha, c.p.beta);
}

// For benchmarks: which oneDNN implementation served the most recent shapes.
std::string matmul_impl_info() {
    std::lock_guard<std::mutex> lk(g_cache_mu);
    std::string s;
    for (auto& [k, v] : cache()) {
        if (s.find(v->impl) == std::string::npos) s += (s.empty() ? "" : ", ") + v->impl;
    }
    return s;
}

}  // namespace kv::cpu
