// `kvlab bench ops`: matmul vs raw oneDNN; RMSNorm/RoPE/SwiGLU vs the triad bandwidth.
// Shapes are those of real models (Llama-3.2-1B width 2048, intermediate 8192, 32 heads
// of 64) at prefill lengths, large enough to stream from DRAM rather than sit in L3.
#include "op_bench.h"

#include <algorithm>
#include <cmath>

#include "ceilings.h"
#include "engine/core/error.h"
#include "engine/core/tensor.h"
#include "engine/ops/ops.h"

namespace kv::bench {

namespace {
Tensor random_tensor(const Shape& s, DType dt, uint32_t seed) {
    Tensor t = Tensor::empty(s, DType::F32, {Device{}, MemCategory::WORKSPACE, "bench input"});
    float* p = t.data<float>();
    uint32_t x = seed * 2654435761u + 1;
    for (int64_t i = 0; i < t.numel(); ++i) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        p[i] = float(x & 0xffff) / 32768.0f - 1.0f;
    }
    return dt == DType::F32 ? t : t.to(dt);
}
}  // namespace

std::vector<OpBenchRow> run_op_bench(const OpBenchOptions& opt,
                                     const std::function<void(int, int, const std::string&)>& progress) {
    std::vector<OpBenchRow> rows;
    const double ms = opt.min_seconds;
    struct MM {
        int64_t n;
        DType dt;
        const char* dname;
    };
    std::vector<MM> mms = opt.quick ? std::vector<MM>{{256, DType::F32, "f32"}, {256, DType::BF16, "bf16"}}
                                    : std::vector<MM>{{1024, DType::F32, "f32"},
                                                      {4096, DType::F32, "f32"},
                                                      {1024, DType::BF16, "bf16"},
                                                      {4096, DType::BF16, "bf16"}};
    const int64_t T = opt.quick ? 256 : 8192, C = opt.quick ? 256 : 2048;
    const int64_t I = opt.quick ? 512 : 8192, Tm = opt.quick ? 256 : 4096;
    const int64_t NH = opt.quick ? 4 : 32, HS = 64;
    const int total = int(mms.size()) + 5;
    int done = 0;

    for (const MM& m : mms) {
        std::string name = str("matmul ", m.dname, " ", m.n, "^3");
        progress(done++, total, name);
        Tensor a = random_tensor({m.n, m.n}, m.dt, 1), b = random_tensor({m.n, m.n}, m.dt, 2);
        Tensor c = Tensor::empty({m.n, m.n}, DType::F32, {Device{}, MemCategory::WORKSPACE, "bench output"});
        RawMatmul raw(m.n, m.n, m.n, m.dt);
        // Interleave ours/raw twice and keep each one's best, so drift hits both.
        double t_ours = 1e30, t_raw = 1e30;
        for (int round = 0; round < 2; ++round) {
            t_ours = std::min(t_ours, time_best([&] { ops::matmul_(c, a, b); }, ms));
            t_raw = std::min(t_raw, time_best([&] { raw.run(); }, ms));
        }
        double flops = 2.0 * double(m.n) * double(m.n) * double(m.n);
        const std::string basis = raw.note().empty() ? "raw oneDNN (" + raw.impl() + ")" : "raw oneDNN " + raw.note() + " (" + raw.impl() + ")";
        rows.push_back({name, "GFLOP/s", flops / t_ours / 1e9, flops / t_raw / 1e9, basis, 0.9});
    }

    // The triad is re-measured next to every memory-bound op (best of before/after), so
    // bandwidth drift on a shared machine moves ceiling and measurement together.
    const size_t triad_bytes = opt.quick ? (size_t(32) << 20) : (size_t(256) << 20);
    progress(done++, total, "triad bandwidth");
    double triad = triad_gbps(triad_bytes, ms);
    auto mem_row = [&](const std::string& name, double bytes, const std::function<void()>& fn) {
        progress(done++, total, name);
        double t = time_best(fn, ms);
        double after = triad_gbps(triad_bytes, ms);
        double ceiling = std::max(triad, after);
        triad = after;
        rows.push_back({name, "GB/s", bytes / t / 1e9, ceiling, "streaming triad", 0.6});
    };
    {
        Tensor x = random_tensor({T, C}, DType::F32, 3), w = random_tensor({C}, DType::F32, 4);
        Tensor y = Tensor::empty({T, C}, DType::F32, {Device{}, MemCategory::WORKSPACE, "bench output"});
        mem_row(str("rmsnorm f32 (", T, ", ", C, ")"), 2.0 * double(x.nbytes()), [&] { ops::rmsnorm_(y, x, w, 1e-6f); });
    }
    {
        Tensor x = random_tensor({1, NH, T, HS}, DType::F32, 5);
        Tensor y = Tensor::empty(x.shape(), DType::F32, {Device{}, MemCategory::WORKSPACE, "bench output"});
        std::vector<int32_t> pv((size_t)T);
        for (int64_t i = 0; i < T; ++i) pv[size_t(i)] = int32_t(i);
        Tensor pos = Tensor::from_i32({1, T}, pv);
        Tensor cs = random_tensor({T, HS / 2}, DType::F32, 6), sn = random_tensor({T, HS / 2}, DType::F32, 7);
        double bytes = 2.0 * double(x.nbytes()) + double(cs.nbytes() + sn.nbytes());
        mem_row(str("rope f32 (1, ", NH, ", ", T, ", ", HS, ")"), bytes, [&] { ops::rope_(y, x, pos, cs, sn); });
    }
    {
        Tensor g = random_tensor({Tm, I}, DType::F32, 8), u = random_tensor({Tm, I}, DType::F32, 9);
        Tensor y = Tensor::empty({Tm, I}, DType::F32, {Device{}, MemCategory::WORKSPACE, "bench output"});
        mem_row(str("swiglu f32 (", Tm, ", ", I, ")"), 3.0 * double(g.nbytes()), [&] { ops::swiglu_(y, g, u); });
    }
    {
        Tensor x = random_tensor({T, C}, DType::BF16, 10), w = random_tensor({C}, DType::F32, 11);
        Tensor y = Tensor::empty({T, C}, DType::BF16, {Device{}, MemCategory::WORKSPACE, "bench output"});
        mem_row(str("rmsnorm bf16 (", T, ", ", C, ")"), 2.0 * double(x.nbytes()), [&] { ops::rmsnorm_(y, x, w, 1e-6f); });
    }
    progress(done, total, "");
    return rows;
}

}  // namespace kv::bench
