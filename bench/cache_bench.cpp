// Cache costs as ratios (see cache_bench.h).
#include "cache_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "ceilings.h"
#include "engine/core/error.h"
#include "engine/driver/long_context.h"
#include "engine/kv/buffers/kv_buffer.h"
#include "engine/kv/kv_cache.h"
#include "engine/kv/policies/policy_registry.h"
#include "engine/run/run_config.h"
#include "engine/model/attention.h"
#include "engine/model/model_loader.h"
#include "engine/ops/ops.h"

namespace kv::bench {

namespace {
Tensor uniform(const Shape& s, uint32_t seed) {
    Tensor t = Tensor::empty(s, DType::F32, {Device{}, MemCategory::WORKSPACE, "bench input"});
    float* p = t.data<float>();
    uint32_t x = seed * 2654435761u + 1;
    for (int64_t i = 0; i < t.numel(); ++i) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        p[i] = float(x & 0xffff) / 32768.0f - 1.0f;
    }
    return t;
}

// Seconds per chunk of `chunk` tokens through every layer with a full cache.
double chunk_seconds(Transformer& m, const std::string& name, const CacheBenchOptions& o, bool offload = false) {
    const ModelConfig& c = m.config();
    KVCacheConfig kc;
    kc.name = name;
    kc.cpu_offload = offload;
    kc.cache_length = o.cache_length;
    kc.max_chunk_size = o.chunk;
    kc.dtype = m.act_dtype();
    KVCache cache(kc, c, Device{}, m.act_dtype(), o.context);
    Tensor kf = uniform({1, c.num_kv_heads, o.cache_length, c.head_dim}, 3);
    for (int l = 0; l < int(c.num_layers); ++l) cache.layer(l).prefill_without_attention(kf, kf);
    std::vector<int32_t> idv((size_t)o.chunk);
    for (int64_t i = 0; i < o.chunk; ++i) idv[size_t(i)] = int32_t((i * 131) % 200);
    Tensor ids = Tensor::from_i32({1, o.chunk}, idv);
    int64_t P = o.cache_length;
    auto step = [&] {
        Tensor x = m.embed(ids);
        for (int l = 0; l < int(c.num_layers); ++l) x = m.block(l, x, P, cache);
        P += o.chunk;
    };
    step();  // the keep-initial chunk (score policies), and warm-up
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < o.chunks_timed; ++i) step();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / o.chunks_timed;
}
}  // namespace

std::vector<CacheBenchRow> run_cache_bench(const CacheBenchOptions& o, const std::function<void(int, int, const std::string&)>& progress) {
    std::vector<CacheBenchRow> rows;
    LoadedModel lm = load_model(o.model, ModelOptions{}, 0);
    Transformer& m = *lm.model;
    const ModelConfig& c = lm.config;
    m.set_context_width(std::max(o.context, c.max_position_embeddings));
    const int total = 12;
    int done = 0;

    // 1. SDPA of one chunk over a full cache, with and without weight sums.
    progress(done++, total, "sdpa with / without weights");
    {
        Tensor q = uniform({1, c.num_heads, o.chunk, c.head_dim}, 1);
        Tensor k = uniform({1, c.num_kv_heads, o.cache_length, c.head_dim}, 2), v = uniform(k.shape(), 3);
        std::vector<int32_t> kp((size_t)o.cache_length), qp((size_t)o.chunk);
        for (int64_t j = 0; j < o.cache_length; ++j) kp[size_t(j)] = int32_t(j * (o.context / o.cache_length));  // spread out
        for (int64_t i = 0; i < o.chunk; ++i) qp[size_t(i)] = int32_t(o.context - o.chunk + i);
        Tensor kpos = Tensor::from_i32({1, 1, o.cache_length}, kp), qpos = Tensor::from_i32({1, o.chunk}, qp);
        Tensor y = Tensor::empty(q.shape(), DType::F32), w = Tensor::empty({1, c.num_kv_heads, o.cache_length}, DType::F32);
        const float scale = 1.0f / std::sqrt(float(c.head_dim));
        double t_no = 1e30, t_w = 1e30;
        for (int r = 0; r < 2; ++r) {
            t_no = std::min(t_no, time_best([&] { ops::sdpa_(y, q, k, v, kpos, qpos, scale); }, o.min_seconds));
            t_w = std::min(t_w, time_best([&] { ops::sdpa_(y, q, k, v, kpos, qpos, scale, 0, &w); }, o.min_seconds));
        }
        rows.push_back({str("sdpa chunk ", o.chunk, " over ", o.cache_length, ": with weights / without"), t_w * 1e3, t_no * 1e3, "ms",
                        t_w / t_no, 1.3, true});
    }
    // 2-4. End-to-end chunk throughput.
    progress(done++, total, "lastrec-default chunks");
    const double t_lastrec = chunk_seconds(m, "lastrec-default", o);
    progress(done++, total, "h2o-default chunks");
    const double t_h2o = chunk_seconds(m, "h2o-default", o);
    rows.push_back({"chunk throughput h2o / lastrec", double(o.chunk) / t_h2o, double(o.chunk) / t_lastrec, "tokens/s", t_lastrec / t_h2o,
                    0.8, false});
    for (std::string b : {"q8", "q4", "fp8_e4m3", "nvfp4", "k8v4", "turboquant"}) {
        progress(done++, total, "lastrec-" + b + " chunks");
        const double t = chunk_seconds(m, "lastrec-" + b, o);
        rows.push_back({"chunk throughput " + b + " / default (lastrec)", double(o.chunk) / t, double(o.chunk) / t_lastrec, "tokens/s",
                        t_lastrec / t, 0.8, false});
    }
    // Offloaded layers (parked in host memory, the next layer prefetched on a copy thread).
    {
        progress(done++, total, "lastrec-q8 chunks");
        const double t_q8 = chunk_seconds(m, "lastrec-q8", o);
        progress(done++, total, "lastrec-q8 offloaded chunks");
        const double t_off = chunk_seconds(m, "lastrec-q8", o, true);
        rows.push_back({"chunk throughput offloaded / resident (lastrec-q8)", double(o.chunk) / t_off, double(o.chunk) / t_q8,
                        "tokens/s", t_q8 / t_off, 0.8, false});
    }
    // 5. KV bytes per token per buffer (all layers, K and V), exact, vs bf16.
    progress(done++, total, "bytes per token");
    auto bytes_per_token = [&](const std::string& buf) {
        KVCacheConfig kc;
        kc.name = "lastrec-" + buf;
        kc.cache_length = 64;
        kc.dtype = DType::F32;
        KVCache cache(kc, c, Device{}, DType::F32, 128);
        Tensor kf = uniform({1, c.num_kv_heads, 64, c.head_dim}, 5);
        for (int l = 0; l < int(c.num_layers); ++l) cache.layer(l).prefill_without_attention(kf, kf);
        return double(cache.buffer_bytes() - cache.working_bytes()) / 64.0;
    };
    const double bf16 = bytes_per_token("bf16");
    for (std::string b : {"f32", "bf16", "f16", "q8", "q4", "nf4", "q8_0", "q4_0", "fp8_e4m3", "fp8_e5m2", "nvfp4", "mxfp4", "k8v4",
                          "k8v4_0", "kfp8vfp4", "turboquant"}) {
        KVCacheConfig probe;  // block formats need a head (or all heads) to be whole blocks
        probe.name = "lastrec-" + b;
        probe.cache_length = 64;
        try {
            validate_kv_config(probe, c.num_layers, c.head_dim, c.num_kv_heads);
        } catch (const Error&) {
            continue;
        }
        const double bt = bytes_per_token(b);
        rows.push_back({"KV bytes per token, " + b + " / bf16", bt, bf16, "bytes", bt / bf16, 0, true});
    }
    progress(total, total, "");
    return rows;
}

std::vector<KiviBenchRow> run_kivi_bench(const KiviBenchOptions& o, const std::function<void(int, int, const std::string&)>& progress) {
    std::vector<KiviBenchRow> rows;
    const int64_t NH = o.heads, G = o.kv_heads, D = o.head_dim;
    const float scale = 1.0f / std::sqrt(float(D));
    int done = 0;
    const int total = int(o.contexts.size());
    for (int64_t T : o.contexts) {
        progress(done++, total, str("context ", T));
        Tensor q = uniform({1, NH, 1, D}, 1);
        Tensor k = uniform({1, G, T, D}, 2), v = uniform({1, G, T, D}, 3);
        std::vector<int32_t> kp((size_t)T);
        for (int64_t j = 0; j < T; ++j) kp[size_t(j)] = int32_t(j);
        Tensor kpos = Tensor::from_i32({1, 1, T}, kp), qpos = Tensor::from_i32({1, 1}, {int32_t(T)});
        Tensor y = Tensor::empty(q.shape(), DType::F32);
        // The same K, V packed by the buffer's own prefill (the last R tokens stay f32).
        KVCacheConfig kc;
        kc.name = str("dense-kivi", o.bits);
        kc.kivi_group_size = o.group;
        kc.kivi_residual = o.residual;
        BufferParams bp;
        bp.L = T, bp.G = G, bp.D = D;
        std::unique_ptr<KVBuffer> buf = make_buffer(kc, bp, nullptr);
        buf->prefill(k, v);
        double t_def = 1e30, t_kivi = 1e30;
        std::vector<double> ratios;  // per round: the two timed back to back, so load hits both alike
        for (int r = 0; r < std::max(1, o.rounds); ++r) {
            const double td = time_best([&] { ops::sdpa_(y, q, k, v, kpos, qpos, scale); }, o.min_seconds);
            const double tk = time_best([&] { buf->attend(y, q, T, kpos, qpos, scale, nullptr); }, o.min_seconds);
            t_def = std::min(t_def, td);
            t_kivi = std::min(t_kivi, tk);
            ratios.push_back(tk / td);
        }
        std::sort(ratios.begin(), ratios.end());
        const double r_min = ratios.front(), r_med = ratios[ratios.size() / 2];
        // Bytes a decode step reads: all of K and V (f32), or the packed codes and scales of the
        // T slots plus the residual blocks in use (the whole pool, an upper bound).
        const double b_def = double(2 * G * T * D * 4);
        const double b_kivi = double(buf->bytes());
        rows.push_back({str("decode sdpa kivi", o.bits), T, b_kivi, b_def, t_kivi * 1e3, t_def * 1e3, r_min, r_med, int(ratios.size()),
                        T == o.contexts.back() ? 0.5 : 0.0});
        for (const std::string& f : o.formats) {
            KVCacheConfig fc;
            fc.name = "dense-" + f;
            BufferParams fp;
            fp.L = T, fp.G = G, fp.D = D;
            auto sh = make_buffer_shared(fc, T, G, D, Device{}, DType::F32);
            std::unique_ptr<KVBuffer> a = make_buffer(fc, fp, sh);
            fp.layer = 1;
            std::unique_ptr<KVBuffer> b2 = make_buffer(fc, fp, sh);
            a->prefill(k, v);
            b2->prefill(k, v);
            SlotPlan one;
            one.n = 1;
            one.rows = 1;
            one.targets = {int32_t(T - 1)};
            const Tensor k1 = k.slice(2, T - 1, T).contiguous(), v1 = v.slice(2, T - 1, T).contiguous();
            // Buffers that attend over their codes (fp8, nvfp4, mxfp4, turboquant) read nothing else.
            const bool fused = a->fused_attention();
            auto step = [&](KVBuffer& x) {
                x.write(one, k1, v1);
                if (fused) {
                    x.attend(y, q, T, kpos, qpos, scale, nullptr);
                    return;
                }
                auto [K, V] = x.read(T);
                ops::sdpa_(y, q, K, V, kpos, qpos, scale);
            };
            double t_f = 1e30, t_d = 1e30;
            std::vector<double> fr;  // per round: f32 and the format back to back, so load hits both alike
            for (int r = 0; r < std::max(1, o.rounds); ++r) {
                const double td = time_best([&] { ops::sdpa_(y, q, k, v, kpos, qpos, scale); }, o.min_seconds);
                const double tf = time_best([&] { step(*a), step(*b2); }, o.min_seconds) / 2.0;
                t_d = std::min(t_d, td);
                t_f = std::min(t_f, tf);
                fr.push_back(tf / td);
            }
            std::sort(fr.begin(), fr.end());
            // Bytes a step reads: the layer's codes and scales, plus (without attention over the
            // codes) the f32 copy they are dequantized into, which SDPA reads; the f32 buffer reads
            // its K and V once. Time target (issue 43) where attention reads the codes: <= 1.25x
            // f32 (>= 0.8x its speed) at the shortest context.
            const double b_def = double(2 * G * T * D * 4), b_f = double(a->bytes()) + (fused ? 0.0 : b_def);
            rows.push_back({str("decode step ", f), T, b_f, b_def, t_f * 1e3, t_d * 1e3, fr.front(), fr[fr.size() / 2], int(fr.size()),
                            fused && T == o.contexts.front() ? 1.25 : 0.0});
        }
    }
    progress(total, total, "");
    return rows;
}

void fill_ab_table(BenchTable& t, const std::vector<CacheBenchRow>& rows) {
    t.columns = {{"measurement", true}, {"a"}, {"b"}, {"a/b"}, {"target"}, {"unit", true}, {"", true}};
    for (const auto& r : rows)
        t.add_row({r.name, cell(r.a, 3), cell(r.b, 3), cell(r.ratio, 3) + "x", r.target > 0 ? str(r.at_most ? "<= " : ">= ", r.target) : "",
                   r.unit, r.pass() ? "" : "<< misses target"});
}

void fill_kivi_table(BenchTable& t, const std::vector<KiviBenchRow>& rows) {
    t.columns = {{"measurement", true}, {"context"}, {"KV bytes read / f32"}, {"ms"}, {"f32 ms"}, {"best-time ratio"},
                 {"per-round ratio min | median"}, {"target"}, {"", true}};
    for (const auto& r : rows)
        t.add_row({r.what + " / f32", str(r.context), cell(r.bytes / r.f32_bytes, 3) + "x", cell(r.ms, 3), cell(r.f32_ms, 3),
                   cell(r.ms / r.f32_ms, 3) + "x", cell(r.round_min, 3) + " | " + cell(r.round_median, 3) + "x",
                   r.target > 0 ? str("<= ", r.target) : "", r.pass() ? "" : "<< misses target"});
    if (!rows.empty()) t.notes.push_back(str("per-round ratio: the format and f32 timed back to back in each of ", rows.front().rounds,
                                             " rounds; a target applies to the median."));
}

}  // namespace kv::bench
