// `kvlab bench dist` (issue 23): all-reduce bandwidth of the current setup (MPI over shared
// memory or TCP, NCCL between GPUs) at a few message sizes, and the share of a data-parallel
// fine-tuning step spent in the gradient all-reduce. Run it under mpirun:
//   mpirun -np 2 kvlab bench dist [--sizes 64KiB,1MiB,16MiB] [--model tiny --mode lora|full]
// Bus bandwidth is NCCL-tests' convention: algorithm bandwidth (bytes / time) x 2(N-1)/N, the
// bytes each rank's link carries in a ring all-reduce, comparable across N.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>

#include "bench_commands.h"
#include "app/cli/cli_args.h"
#include "app/cli/dist_setup.h"
#include "engine/core/error.h"
#include "engine/core/split.h"
#include "engine/dist/communicator.h"
#include "sessions/run_execution.h"

namespace kv::cli {

namespace {
double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

int64_t parse_bytes(const std::string& s) {
    size_t i = 0;
    double v = 0;
    try {
        v = std::stod(s, &i);
    } catch (const std::exception&) {
        throw UsageError(str("--sizes: '", s, "' is not a size; expected e.g. 64KiB, 1MiB, 16MiB"));
    }
    const std::string u = s.substr(i);
    const double m = u.empty() || u == "B" ? 1 : u == "KiB" ? 1024.0 : u == "MiB" ? 1048576.0 : u == "GiB" ? 1073741824.0 : -1;
    if (m < 0 || v <= 0) throw UsageError(str("--sizes: '", s, "' is not a size; expected a positive number with B, KiB, MiB or GiB"));
    return int64_t(v * m);
}

}  // namespace

int bench_dist(const Args& args) {
    RunConfig cfg;
    cfg.dist.backend = args.str("backend", "auto");
    const DistSetup ds = setup_dist(cfg, "bench dist", true);
    dist::Communicator* comm = dist::process_communicator();
    const int N = ds.ranks;
    const bool root = ds.rank == 0;
    bench::BenchTable table;
    table.title = "Data-parallel communication (`kvlab bench dist`)";
    table.measures = "All-reduce bandwidth per message size (algbw = bytes / time, busbw = algbw x 2(N-1)/N), then the all-reduce "
                     "share of a data-parallel fine-tuning step and the overlap of the bucket all-reduces with the backward.";
    table.context = {str("bench dist: ", N, " rank", N > 1 ? "s" : "", ", backend ", ds.backend,
                         ds.active ? "" : " (one process: nothing to reduce; run under mpirun -np N)")};
    table.columns = {{"bytes"}, {"iters"}, {"time (us)"}, {"algbw (GB/s)"}, {"busbw (GB/s)"}};

    // ---- all-reduce bandwidth ----
    std::vector<int64_t> sizes;
    for (const auto& s : split(args.str("sizes", "64KiB,1MiB,16MiB,64MiB"))) sizes.push_back(parse_bytes(s));
    const double min_s = args.real("min_seconds", 0.3, 0.001, 60);
    for (int64_t bytes : sizes) {
        std::vector<float> buf(size_t(std::max<int64_t>(1, bytes / 4)));
        if (!comm) break;
        // Correctness once: every rank adds rank+1, so each element becomes N(N+1)/2.
        std::fill(buf.begin(), buf.end(), float(ds.rank + 1));
        comm->allreduce_sum(buf.data(), buf.size(), dist::ReduceType::F32, "bench");
        const float want = float(N * (N + 1) / 2);
        for (float x : buf)
            if (x != want) throw Error(str("bench dist: the all-reduce of ", bytes, " bytes gave ", x, " where every element should be ", want));
        // Iterations: rank 0 times a few and tells everyone how many fill min_seconds.
        comm->barrier("bench");
        double t0 = now_s();
        for (int i = 0; i < 3; ++i) comm->allreduce_sum(buf.data(), buf.size(), dist::ReduceType::F32, "bench");
        uint64_t iters = uint64_t(std::clamp(min_s / std::max((now_s() - t0) / 3, 1e-7), 3.0, 100000.0));
        comm->broadcast(&iters, sizeof iters, 0, "bench iterations");
        comm->barrier("bench");
        t0 = now_s();
        for (uint64_t i = 0; i < iters; ++i) comm->allreduce_sum(buf.data(), buf.size(), dist::ReduceType::F32, "bench");
        comm->barrier("bench");
        const double t = (now_s() - t0) / double(iters);
        const double nbytes = double(buf.size() * 4);
        const double alg = nbytes / t / 1e9, bus = alg * 2.0 * (N - 1) / std::max(N, 1);
        table.add_row({bench::cell(nbytes, 0), str(iters), bench::cell(t * 1e6, 1), bench::cell(alg, 3), bench::cell(bus, 3)});
    }

    // ---- communication share of a data-parallel fine-tuning step ----
    RunConfig t;
    t.mode = args.str("mode", "lora") == "full" ? "finetune_long_full" : "finetune_long_lora";
    t.model = args.str("model", "tiny");
    t.threads = args.integer("threads", 0, 0, 1024);
    t.data.seq_length = args.integer("tokens", 256, 16, int64_t(1) << 24);
    t.data.num_samples = 4 * N + 2;
    t.data.val_split_fraction = 0.1;
    t.kv_cache.name = args.str("cache", "h2o-default");
    t.kv_cache.cache_length = std::min<int64_t>(args.integer("cache_length", 64, 1, int64_t(1) << 24), t.data.seq_length);
    t.driver.chunk_size = std::min<int64_t>(args.integer("chunk", 16, 1, int64_t(1) << 20), t.kv_cache.cache_length);
    t.train.micro_batch_size = 1;
    t.train.global_batch_size = 2 * N;
    t.train.max_steps = args.integer("steps", 3, 1, 1000);
    t.train.eval_interval = 0;
    t.telemetry.enabled = false;
    t.dist = cfg.dist;
    // Overlap of the bucket all-reduces with the backward (grad_sync.h), off and on, alternated
    // twice so a change in the machine's load hits both alike; the step time is the mean over
    // ranks and steps.
    auto step_seconds = [](const nlohmann::json& sum, int64_t steps) {
        double total = 0;
        size_t n = 0;
        if (sum.contains("dist"))
            for (const auto& v : sum["dist"]["rank_step_seconds"]) total += v.get<double>(), ++n;
        return n && steps ? total / double(n) / double(steps) : 0.0;
    };
    sessions::RunHooks hooks;
    double t_off = 0, t_on = 0;
    nlohmann::json s;
    for (int round = 0; round < 2; ++round)
        for (bool overlap : {false, true}) {
            t.dist.overlap = overlap;
            const sessions::RunOutcome out = sessions::execute_run(t, hooks);
            const nlohmann::json sum = nlohmann::json::parse(out.summary_json);
            (overlap ? t_on : t_off) += step_seconds(sum, t.train.max_steps) / 2;
            if (overlap) s = sum;
        }
    if (root) {
        table.notes.push_back(str(t.mode, " ", t.model, ", ", t.data.seq_length, " tokens, global batch ", t.train.global_batch_size,
                                  " (2 per rank), ", t.train.max_steps, " steps: ", bench::cell(s.value("tokens_per_s", 0.0), 1), " tokens/s"));
        if (s.contains("dist")) {
            const auto& d = s["dist"];
            std::string per_rank;
            const auto& c = d["rank_allreduce_seconds"];
            const auto& st = d["rank_step_seconds"];
            for (size_t r = 0; r < c.size() && r < st.size(); ++r)
                per_rank += str(" ", r, ": ", bench::cell(st[r].get<double>() > 0 ? 100.0 * c[r].get<double>() / st[r].get<double>() : 0.0, 2), "%");
            table.notes.push_back(str("gradient all-reduce: ", bench::cell(double(d.value("allreduce_bytes_per_step", 0LL)) / 1048576.0, 3),
                                      " MiB per step in ", d.value("allreduce_buckets", 0LL), " bucket(s); share of step time ",
                                      bench::cell(100.0 * d.value("allreduce_share", 0.0), 2), "% (per rank:", per_rank, ")"));
            table.notes.push_back(str("overlap of the bucket all-reduces with the backward: step ", bench::cell(1e3 * t_off, 2), " ms without, ",
                                      bench::cell(1e3 * t_on, 2), " ms with (ratio ", bench::cell(t_off > 0 ? t_on / t_off : 0.0, 3), "; ",
                                      d.value("allreduce_overlapped_buckets", 0LL), " of ", d.value("allreduce_buckets", 0LL),
                                      " bucket(s) started during the backward)"));
        } else {
            table.notes.push_back("gradient all-reduce: none (one process); share of step time 0%");
        }
        emit_bench_table(args, table);
    }
    return 0;
}

}  // namespace kv::cli
