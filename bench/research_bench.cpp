// Fidelity and sweep cost benchmarks (see research_bench.h).
#include "research_bench.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include <unistd.h>

#include "engine/core/error.h"
#include "engine/model/model_loader.h"
#include "engine/run/evaluate.h"

namespace kv::bench {

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

RunConfig eval_config(const ResearchBenchOptions& opt, const std::string& cache, int64_t L) {
    RunConfig c;
    c.mode = "eval_long";
    c.model = opt.model;
    c.data.name = opt.data;
    c.data.seq_length = opt.seq_length;
    c.data.num_samples = opt.num_samples;
    c.driver.chunk_size = opt.chunk;
    c.kv_cache.name = cache;
    c.kv_cache.cache_length = cache.rfind("dense", 0) == 0 ? 0 : L;
    c.telemetry.enabled = false;
    return c;
}

std::string quote(const std::string& s) {
    std::string q = "'";
    for (char ch : s) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
    return q + "'";
}

double time_command(const std::string& cmd) {
    const double t0 = now_s();
    const int rc = std::system((cmd + " >/dev/null 2>&1").c_str());
    const double t = now_s() - t0;
    if (rc != 0) throw Error(str("bench sweep: the command failed (exit status ", rc, "): ", cmd), "run it by hand to see its message");
    return t;
}

std::string join(const std::vector<std::string>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + v[i];
    return s;
}

}  // namespace

std::vector<ResearchBenchRow> run_fidelity_bench(const ResearchBenchOptions& opt, const BenchProgress& progress) {
    ModelOptions mo;
    LoadedModel lm = load_model(opt.model, mo, 0);
    std::vector<ResearchBenchRow> rows;
    const int total = int(opt.caches.size() * opt.cache_lengths.size()) * opt.repeats * 2;
    int done = 0;
    for (const std::string& cache : opt.caches)
        for (int64_t L : opt.cache_lengths) {
            ResearchBenchRow r;
            r.name = str("fidelity ", cache, " L=", L, " ", opt.data, " ", opt.seq_length, " tokens");
            r.target = 2.0;
            r.with = r.without = 1e300;
            RunConfig off = eval_config(opt, cache, L), on = off;
            on.fidelity = true;
            for (int rep = 0; rep < opt.repeats; ++rep) {
                // Alternating, so a machine that speeds up or slows down affects both alike.
                if (progress) progress(done++, total, r.name + " without");
                r.without = std::min(r.without, run_eval(off, lm).seconds);
                if (progress) progress(done++, total, r.name + " with");
                r.with = std::min(r.with, run_eval(on, lm).seconds);
            }
            rows.push_back(r);
        }
    if (progress) progress(total, total, "done");
    return rows;
}

std::vector<ResearchBenchRow> run_sweep_bench(const ResearchBenchOptions& opt, const BenchProgress& progress) {
    if (opt.kvlab.empty()) throw Error("bench sweep: no kvlab executable given");
    namespace fs = std::filesystem;
    const fs::path dir = fs::path(opt.dir) / str("kvlab_bench_sweep_", ::getpid());
    fs::create_directories(dir);
    std::ostringstream common;
    common << quote(opt.model) << " --data " << opt.data << " --data.seq_length " << opt.seq_length << " --data.num_samples "
           << opt.num_samples << " --kv_cache.chunk_size " << opt.chunk;
    std::vector<std::string> lengths;
    for (int64_t L : opt.cache_lengths) lengths.push_back(std::to_string(L));
    // The single runs: the dense reference, then every (cache, length), as the sweep orders them.
    std::vector<std::string> singles;
    singles.push_back(str("--kv_cache.name dense-default"));
    for (const std::string& c : opt.caches)
        for (int64_t L : opt.cache_lengths) singles.push_back(str("--kv_cache.name ", c, " --kv_cache.cache_length ", L));
    const std::string sweep_args = str("--kv_cache.name ", join(opt.caches), " --kv_cache.cache_length ", join(lengths));

    ResearchBenchRow r;
    r.name = str("sweep of ", singles.size(), " cells (", join(opt.caches), " x ", join(lengths), " + dense) ", opt.data, " ",
                 opt.seq_length, " tokens");
    r.target = 1.05;
    r.with = r.without = 1e300;
    const int total = opt.repeats * int(1 + singles.size());
    int done = 0;
    for (int rep = 0; rep < opt.repeats; ++rep) {
        const fs::path sweep_session = dir / str("sweep", rep, ".kvlab");
        if (progress) progress(done++, total, "kvlab sweep");
        r.with = std::min(r.with, time_command(str(quote(opt.kvlab), " sweep ", common.str(), " ", sweep_args, " --session ",
                                                   quote(sweep_session.string()))));
        double t = 0;
        for (size_t i = 0; i < singles.size(); ++i) {
            if (progress) progress(done++, total, str("kvlab eval_long ", i + 1, "/", singles.size()));
            const fs::path s = dir / str("single", rep, "_", i, ".kvlab");
            t += time_command(str(quote(opt.kvlab), " eval_long ", common.str(), " ", singles[i], " --session ", quote(s.string())));
        }
        r.without = std::min(r.without, t);
    }
    std::error_code ec;
    fs::remove_all(dir, ec);
    if (progress) progress(total, total, "done");
    return {r};
}

}  // namespace kv::bench
