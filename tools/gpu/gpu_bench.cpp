// kvlab_gpu_bench: the GPU benchmarks of the GPU kit (scripts/gpu/run.sh, docs/GPU.md), each a
// ratio of our CUDA backend to a baseline measured in the same process:
//   matmul          ops::matmul_ on the GPU vs raw cublasGemmEx with the same types and compute type
//   sdpa weights    ops::sdpa_ with attention-weight sums vs without (the h2o family's extra cost)
//   prefill         tokens/s of a whole-sequence forward vs FLOPs / raw cuBLAS rate at the MLP shape
//   decode          tokens/s at a filled dense cache vs bytes per token / device-to-device copy rate
// The SDPA shapes and our times go to the JSON too: tools/gpu/torch_sdpa.py times PyTorch's
// scaled_dot_product_attention on the same shapes from that file.
// Exit codes: 0 ran (pass/fail is in the rows), 77 no usable CUDA backend (SKIPPED), 1 error.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "engine/backend/backend_registry.h"
#include "engine/core/error.h"
#include "engine/kv/kv_cache.h"
#include "engine/model/attention.h"
#include "engine/model/model_loader.h"
#include "engine/ops/ops.h"

namespace {

using namespace kv;

struct Row {
    std::string key, name, unit, basis;  // key: the summary line's name after "bench."
    double ours = 0, baseline = 0, target = 0;
    bool higher_is_better = true;  // ours/baseline >= target; else ours/baseline <= target
    double ratio() const { return baseline > 0 ? ours / baseline : 0; }
    bool pass() const { return higher_is_better ? ratio() >= target : ratio() <= target; }
};

void check_cuda(cudaError_t e, const char* what) {
    if (e != cudaSuccess) throw Error(str("CUDA: ", what, " failed: ", cudaGetErrorString(e)));
}
void check_cublas(cublasStatus_t s, const char* what) {
    if (s != CUBLAS_STATUS_SUCCESS) throw Error(str("cuBLAS: ", what, " failed with status ", int(s)));
}
void sync() { check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

// Best time of repeated calls (each synchronized), after one warm-up, for at least min_s.
double time_best(const std::function<void()>& fn, double min_s) {
    fn();
    sync();
    double best = 1e30, total = 0;
    int n = 0;
    while (total < min_s || n < 3) {
        auto t0 = std::chrono::steady_clock::now();
        fn();
        sync();
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        best = std::min(best, s);
        total += s;
        ++n;
    }
    return best;
}

Tensor device_random(const Shape& shape, DType dtype, Device dev, uint32_t seed) {
    std::vector<float> v(size_t(shape.numel()));
    uint32_t x = seed * 2654435761u + 1;
    for (float& f : v) {
        x = x * 1664525u + 1013904223u;
        f = float(x >> 8) / float(1 << 24) - 0.5f;
    }
    TensorOptions o;
    o.device = dev;
    return Tensor::from_f32(shape, v, dtype, o);
}

cudaDataType_t cuda_type(DType d) { return d == DType::BF16 ? CUDA_R_16BF : d == DType::F16 ? CUDA_R_16F : CUDA_R_32F; }

// Raw cuBLAS: row-major out(M,N) f32 = a(M,K) b(K,N), the call our backend makes for
// contiguous operands (column-major view: out^T = b^T a^T), COMPUTE_32F, default algorithm.
struct RawGemm {
    cublasHandle_t h{};
    Tensor a, b, out;
    int64_t M, N, K;
    RawGemm(int64_t m, int64_t n, int64_t k, DType dt, Device dev) : M(m), N(n), K(k) {
        check_cublas(cublasCreate(&h), "cublasCreate");
        a = device_random({m, k}, dt, dev, 1);
        b = device_random({k, n}, dt, dev, 2);
        TensorOptions o;
        o.device = dev;
        out = Tensor::zeros({m, n}, DType::F32, o);
    }
    ~RawGemm() { cublasDestroy(h); }
    void run() {
        const float one = 1.0f, zero = 0.0f;
        check_cublas(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, int(N), int(M), int(K), &one, b.data_ptr(), cuda_type(b.dtype()),
                                  int(N), a.data_ptr(), cuda_type(a.dtype()), int(K), &zero, out.data_ptr(), CUDA_R_32F, int(N),
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     "cublasGemmEx");
    }
    double flops() const { return 2.0 * double(M) * double(N) * double(K); }
};

// Device-to-device copy rate counting bytes read plus bytes written (what a decode step's
// weight and cache reads are compared with).
double d2d_bytes_per_s(double min_s) {
    const size_t n = size_t(1) << 30;
    void *src = nullptr, *dst = nullptr;
    check_cuda(cudaMalloc(&src, n), "cudaMalloc");
    check_cuda(cudaMalloc(&dst, n), "cudaMalloc");
    check_cuda(cudaMemset(src, 1, n), "cudaMemset");
    double t = time_best([&] { check_cuda(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToDevice), "cudaMemcpy"); }, min_s);
    cudaFree(src);
    cudaFree(dst);
    return 2.0 * double(n) / t;
}

std::string dtype_name(DType d) { return d == DType::BF16 ? "bf16" : "f32"; }

void json_str(std::ostream& o, const std::string& s) {
    o << '"';
    for (char c : s) {
        if (c == '"' || c == '\\') o << '\\';
        o << c;
    }
    o << '"';
}

int run(int argc, char** argv) {
    std::string json_path, model = "qwen2.5-0.5b";
    bool quick = false;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--quick") quick = true;
        else if (a == "--json" && i + 1 < argc) json_path = argv[++i];
        else if (a == "--model" && i + 1 < argc) model = argv[++i];
        else {
            std::fprintf(stderr, "kvlab_gpu_bench: unknown argument '%s'; expected --json FILE, --model NAME, --quick\n", a.c_str());
            return 2;
        }
    }
    if (json_path.empty()) {
        std::fprintf(stderr, "kvlab_gpu_bench: missing --json FILE (where the rows go)\n");
        return 2;
    }
    if (!cuda_available()) {
        std::printf("SKIPPED: CUDA backend unavailable: %s\n", cuda_status().c_str());
        return 77;
    }
    const Device gpu{DeviceType::CUDA, 0};
    TensorOptions on_gpu;
    on_gpu.device = gpu;
    const double min_s = quick ? 0.05 : 0.3;
    std::vector<Row> rows;

    // ---- matmul vs raw cuBLAS
    try {
        const int64_t S = quick ? 1024 : 4096;
        for (DType dt : {DType::F32, DType::BF16}) {
            RawGemm raw(S, S, S, dt, gpu);
            const double t_raw = time_best([&] { raw.run(); }, min_s);
            Tensor out = Tensor::zeros({S, S}, DType::F32, on_gpu);
            const double t_ours = time_best([&] { ops::matmul_(out, raw.a, raw.b); }, min_s);
            rows.push_back({str("matmul_", dtype_name(dt)), str("matmul ", dtype_name(dt), " ", S, "^3"), "TFLOP/s", "raw cublasGemmEx, same types, COMPUTE_32F",
                            raw.flops() / t_ours / 1e12, raw.flops() / t_raw / 1e12, 0.9, true});
        }
    } catch (const std::exception& e) {
        // A failure here is a finding: record it as a failing row and go on with the others.
        rows.push_back({"matmul_error", "matmul: error", "", e.what(), 0, 1, 1, true});
    }

    // ---- SDPA: a chunk of queries over a filled cache (qwen2.5-0.5b heads: 14 query, 2 kv, 64 wide)
    struct SdpaShape {
        int64_t nh, g, n, T, hs;
        DType dt;
        double ms_without = 0, ms_with = 0;
    };
    std::vector<SdpaShape> shapes;
    for (DType dt : {DType::F32, DType::BF16}) {
        shapes.push_back({14, 2, quick ? 128 : 512, quick ? 1024 : 4096, 64, dt, 0, 0});
        shapes.push_back({14, 2, 1, quick ? 1024 : 4096, 64, dt, 0, 0});  // decode: one query
    }
    try {
        for (SdpaShape& s : shapes) {
            Tensor q = device_random({1, s.nh, s.n, s.hs}, s.dt, gpu, 3);
            Tensor k = device_random({1, s.g, s.T, s.hs}, s.dt, gpu, 4);
            Tensor v = device_random({1, s.g, s.T, s.hs}, s.dt, gpu, 5);
            std::vector<int32_t> kp(size_t(s.T)), qp(size_t(s.n));
            for (int64_t j = 0; j < s.T; ++j) kp[size_t(j)] = int32_t(j);
            for (int64_t i = 0; i < s.n; ++i) qp[size_t(i)] = int32_t(s.T - s.n + i);
            Tensor kpos = Tensor::from_i32({1, 1, s.T}, kp, on_gpu), qpos = Tensor::from_i32({1, s.n}, qp, on_gpu);
            Tensor y = Tensor::zeros({1, s.nh, s.n, s.hs}, s.dt, on_gpu);
            Tensor w = Tensor::zeros({1, s.g, s.T}, DType::F32, on_gpu);
            const float scale = 1.0f / std::sqrt(float(s.hs));
            s.ms_without = 1e3 * time_best([&] { ops::sdpa_(y, q, k, v, kpos, qpos, scale); }, min_s);
            s.ms_with = 1e3 * time_best([&] { ops::sdpa_(y, q, k, v, kpos, qpos, scale, 0, &w); }, min_s);
            rows.push_back({str("sdpa_weights_", dtype_name(s.dt), "_", s.n, "x", s.T),
                            str("sdpa ", dtype_name(s.dt), " ", s.n, " queries over ", s.T, ": with weights / without"), "ms",
                            "the same call without attention-weight sums", s.ms_with, s.ms_without, 1.15, false});
        }
    } catch (const std::exception& e) {
        // A failure here is a finding: record it as a failing row and go on with the others.
        rows.push_back({"sdpa_error", "sdpa: error", "", e.what(), 0, 1, 1, true});
    }

    // ---- prefill and decode of a model on the GPU vs its floors
    try {
        const double d2d = d2d_bytes_per_s(min_s);
        for (DType dt : {DType::F32, DType::BF16}) {
            ModelOptions mo;
            mo.dtype = dt;
            mo.device = gpu;
            LoadedModel lm = load_model(model, mo, 0);
            const ModelConfig& c = lm.config;
            const int64_t T = quick ? 256 : 2048, ctx = quick ? 512 : 4096, steps = quick ? 4 : 16;
            RawGemm raw(T, c.intermediate_size, c.hidden_size, dt, gpu);
            const double mm_rate = raw.flops() / time_best([&] { raw.run(); }, min_s);
            std::vector<int32_t> idv(static_cast<size_t>(T));
            for (int64_t i = 0; i < T; ++i) idv[size_t(i)] = int32_t((i * 7919) % std::min<int64_t>(c.vocab_size, 30000));
            Tensor ids = Tensor::from_i32({1, T}, idv, on_gpu);
            lm.model->set_context_width(std::max(ctx + 1 + 2 * steps, T));
            const double t_pre = time_best(
                [&] {
                    PlainAttention att;
                    Tensor x = lm.model->embed(ids);
                    for (int l = 0; l < int(c.num_layers); ++l) x = lm.model->block(l, x, 0, att);
                    lm.model->lm_head(lm.model->final_norm(x.slice(1, T - 1, T)));
                },
                min_s);
            const double E = double(c.hidden_size), I = double(c.intermediate_size), Q = double(c.q_dim()), K = double(c.kv_dim());
            const double per_layer = E * (Q + 2 * K) + Q * E + 3 * E * I;
            const double flops = 2.0 * double(T) * (double(c.num_layers) * per_layer + E * double(c.vocab_size)) +
                                 double(c.num_layers) * 2.0 * double(T) * double(T) * double(c.head_dim) * double(c.num_heads);
            rows.push_back({str("prefill_", dtype_name(dt)), str("prefill ", T, " tokens ", model, " ", dtype_name(dt)), "tokens/s",
                            str(flops / 1e12, " TFLOP at ", mm_rate / 1e12, " TFLOP/s (raw cuBLAS ", T, "x", c.hidden_size, "x",
                                c.intermediate_size, ")"),
                            double(T) / t_pre, mm_rate / flops * double(T), 0.6, true});

            KVCacheConfig kc;
            kc.dtype = dt;
            KVCache cache(kc, c, gpu, dt, ctx + 1 + 2 * steps);
            Tensor kf = Tensor::full({1, c.num_kv_heads, ctx, c.head_dim}, dt, 0.01, on_gpu);
            for (int l = 0; l < int(c.num_layers); ++l) cache.layer(l).prefill_without_attention(kf, kf);
            Tensor one = Tensor::from_i32({1, 1}, {42}, on_gpu);
            auto step = [&](int64_t pos) {
                Tensor x = lm.model->embed(one);
                for (int l = 0; l < int(c.num_layers); ++l) x = lm.model->block(l, x, pos, cache);
                lm.model->lm_head(lm.model->final_norm(x));
            };
            step(ctx);
            sync();
            double dec = 1e30;
            for (int64_t pass = 0; pass < 2; ++pass) {
                auto t0 = std::chrono::steady_clock::now();
                for (int64_t i = 0; i < steps; ++i) step(ctx + 1 + pass * steps + i);
                sync();
                dec = std::min(dec, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
            }
            const double wbytes = double(c.num_layers) * (per_layer + 2 * E) + E * double(c.vocab_size) + E;
            const double bytes = (wbytes + double(c.num_layers) * 2.0 * double(ctx) * K) * (dt == DType::BF16 ? 2 : 4);
            rows.push_back({str("decode_", dtype_name(dt)), str("decode at ", ctx, " context ", model, " ", dtype_name(dt)), "tokens/s",
                            str(bytes / 1e9, " GB per token at ", d2d / 1e9, " GB/s (device-to-device copy, read + write)"),
                            double(steps) / dec, d2d / bytes, 0.5, true});
        }
    } catch (const std::exception& e) {
        // A failure here is a finding: record it as a failing row and go on with the others.
        rows.push_back({"model_error", "model: error", "", e.what(), 0, 1, 1, true});
    }

    int failed = 0;
    std::printf("%-56s %12s %12s %8s %7s  %s\n", "benchmark", "ours", "baseline", "ratio", "target", "baseline");
    for (const Row& r : rows) {
        std::printf("%-56s %12.3f %12.3f %7.3fx %s%5.2fx  %s [%s]%s\n", r.name.c_str(), r.ours, r.baseline, r.ratio(),
                    r.higher_is_better ? ">=" : "<=", r.target, r.basis.c_str(), r.unit.c_str(), r.pass() ? "" : "  << FAIL");
        failed += !r.pass();
    }
    std::ofstream f(json_path);
    if (!f) throw Error(str("--json: cannot write '", json_path, "'"));
    f << "{\"device\": ";
    cudaDeviceProp prop{};
    check_cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    json_str(f, prop.name);
    f << ", \"rows\": [\n";
    for (size_t i = 0; i < rows.size(); ++i) {
        const Row& r = rows[i];
        f << "  {\"key\": ";
        json_str(f, r.key);
        f << ", \"name\": ";
        json_str(f, r.name);
        f << ", \"unit\": ";
        json_str(f, r.unit);
        f << ", \"basis\": ";
        json_str(f, r.basis);
        f << ", \"ours\": " << r.ours << ", \"baseline\": " << r.baseline << ", \"ratio\": " << r.ratio()
          << ", \"target\": " << r.target << ", \"higher_is_better\": " << (r.higher_is_better ? "true" : "false")
          << ", \"pass\": " << (r.pass() ? "true" : "false") << "}" << (i + 1 < rows.size() ? ",\n" : "\n");
    }
    f << "], \"sdpa_shapes\": [\n";
    for (size_t i = 0; i < shapes.size(); ++i) {
        const SdpaShape& s = shapes[i];
        f << "  {\"heads\": " << s.nh << ", \"kv_heads\": " << s.g << ", \"queries\": " << s.n << ", \"keys\": " << s.T
          << ", \"head_dim\": " << s.hs << ", \"dtype\": \"" << dtype_name(s.dt) << "\", \"ours_ms\": " << s.ms_without << "}"
          << (i + 1 < shapes.size() ? ",\n" : "\n");
    }
    f << "]}\n";
    std::printf("%d of %zu benchmarks meet their target\n", int(rows.size()) - failed, rows.size());
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "kvlab_gpu_bench: error: %s\n", e.what());
        return 1;
    }
}
