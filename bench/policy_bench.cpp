// `kvlab bench policies` (see policy_bench.h).
#include "policy_bench.h"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <unistd.h>

#include "engine/backend/backend_registry.h"
#include "engine/core/error.h"
#include "engine/driver/long_context.h"
#include "engine/kv/kv_cache.h"
#include "engine/kv/kv_config.h"
#include "engine/kv/kv_policy.h"
#include "engine/kv/kvzap_calibration.h"
#include "engine/kv/policies/policy_registry.h"
#include "engine/kv/policies/qfilter_calibration.h"
#include "engine/model/model_loader.h"
#include "engine/run/run_config.h"

namespace kv::bench {

double median_of(std::vector<double> v) {
    if (v.empty()) throw Error("median_of: no values");
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

namespace {

double process_cpu_seconds() {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

void load_average(double out[3]) {
    if (getloadavg(out, 3) != 3) out[0] = out[1] = out[2] = -1;
}

struct Timing {
    double cpu = 0, wall = 0;
    uint64_t kept = 0;  // kept_set_hash of the cache after the run
};

// FNV-1a over every layer's slot positions (and lengths) after the run: equal hashes mean the
// policy kept the same tokens in every slot of every layer, so a faster scorer can be checked
// for the same decisions on the benchmark's own run.
uint64_t kept_set_hash(const KVCache& cache) {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&h](int64_t v) {
        for (int i = 0; i < 8; ++i) h = (h ^ uint64_t((v >> (8 * i)) & 0xff)) * 1099511628211ull;
    };
    for (int l = 0; l < cache.num_layers(); ++l) {
        const KVPolicy& p = cache.layer(l).policy();
        mix(p.current_length());
        for (int32_t pos : p.token_positions()) mix(pos);
    }
    return h;
}

}  // namespace

PolicyBenchResult run_policy_bench(const PolicyBenchOptions& o, const std::function<void(int, int, const std::string&)>& progress) {
    PolicyBenchResult res;
    load_average(res.load_start);
    res.threads = num_threads();
    res.tokens = o.tokens, res.cache_length = o.cache_length, res.chunk = o.chunk, res.model = o.model;
    LoadedModel lm = load_model(o.model, ModelOptions{}, 0);
    Transformer& m = *lm.model;
    const ModelConfig& c = lm.config;
    std::vector<std::string> names = o.policies;
    if (names.empty())
        for (const PolicyInfo& p : policy_registry())
            // dense, quest keep everything: another shape; lastrec is the noise control below
            if ((p.needs_cache_length || p.name == "duo") && p.name != "lastrec") names.push_back(p.name);
    names.insert(names.begin(), "lastrec");  // the noise control: lastrec against itself
    std::vector<int32_t> idv((size_t)o.tokens);
    uint32_t x = 12345;
    for (auto& id : idv) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        id = int32_t(x % uint32_t(std::min<int64_t>(c.vocab_size, 30000)));
    }
    std::string qfilter_note, qfilter_path;  // qfilter runs with filters calibrated here, on the run's own tokens
    auto calibrated_qfilter = [&]() {
        const std::string path = str("/tmp/kvlab_bench_qfilter_", int64_t(getpid()), ".txt");
        const auto t0 = std::chrono::steady_clock::now();
        const double c0 = process_cpu_seconds();
        QFilters f = qfilters_from_moments(collect_query_moments(m, {idv}));
        const double cpu = process_cpu_seconds() - c0, wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        f.model = o.model;
        write_qfilters(path, f);
        qfilter_path = path;
        qfilter_note = str(" [filters calibrated on the run's ", o.tokens, " tokens: ", cpu, " s CPU, ", wall, " s wall]");
        res.calibration.push_back({"qfilter", cpu, wall});
        return path;
    };
    // smart-lastrec and kvzip (its calibration too) read the text through the model's tokenizer
    TextCodec codec;
    if (lm.tokenizer) {
        const Tokenizer& tok = *lm.tokenizer;
        codec = TextCodec{[&tok](const std::vector<int32_t>& v) { return tok.decode(v, true); },
                          [&tok](const std::string& s) { return tok.encode(s, false); }};
    }
    // kvzap runs with a surrogate fitted here on the run's own tokens (one window), its cost reported.
    std::string kvzap_note, kvzap_path;
    auto calibrated_kvzap = [&]() {
        const std::string path = str("/tmp/kvlab_bench_kvzap_", int64_t(getpid()), ".txt");
        const auto t0 = std::chrono::steady_clock::now();
        const double c0 = process_cpu_seconds();
        const std::vector<std::vector<int32_t>> windows = {idv};
        const CalibrationRun cr{m,        o.model, c.num_layers, c.num_kv_heads, windows,
                                [](std::string_view opt) { return opt == "ridge" ? 1e-3 : 1e-10; },
                                [](int64_t, int64_t, const std::string&) {},
                                path,     &codec};
        (void)run_kvzap_calibration(cr);
        const double cpu = process_cpu_seconds() - c0, wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        m.set_context_width(o.tokens);
        kvzap_path = path;
        kvzap_note = str(" [surrogate calibrated on the run's ", o.tokens, " tokens: ", cpu, " s CPU, ", wall, " s wall]");
        res.calibration.push_back({"kvzap", cpu, wall});
        return path;
    };
    std::vector<KVCacheConfig> cfgs;
    for (const std::string& n : names) {
        const PolicyInfo* info = find_policy(n);
        if (!info) throw Error(str("bench policies: unknown policy '", n, "'; expected one of the registered policies"));
        RunConfig rc;
        rc.kv_cache.name = CacheName{n, info->needs_quantized_buffer ? "q8" : "default"}.text();
        rc.kv_cache.cache_length = o.cache_length;
        rc.kv_cache.max_chunk_size = o.chunk;  // as the CLI sets it
        for (const auto& [opt, value] : info->required) set_run_option(rc, opt, value);
        if (n == "qfilter") set_run_option(rc, "kv_cache.qfilter", calibrated_qfilter());
        if (n == "kvzap") set_run_option(rc, "kv_cache.kvzap", calibrated_kvzap());
        if (n == "duo") {  // streaming heads keep half the cache, so the layer mixes both kinds
            set_run_option(rc, "kv_cache.duo_sinks", "16");
            set_run_option(rc, "kv_cache.duo_recent", str(std::max<int64_t>(1, o.cache_length / 2 - 16)));
        }
        rc.kv_cache.dtype = m.act_dtype();
        cfgs.push_back(rc.kv_cache);
    }
    Tensor ids = Tensor::from_i32({1, o.tokens}, idv);
    HeadSpec hs;
    hs.T = o.tokens;
    hs.token_targets.assign(size_t(o.tokens), -100);
    for (int64_t t = 0; t + 1 < o.tokens; ++t) hs.token_targets[size_t(t)] = idv[size_t(t + 1)];
    // The chunk plan a policy runs with, and lastrec with it: the plain plan (chunks of
    // o.chunk) unless the policy's layers (pyramidkv's budgets, duo's streaming heads) are
    // shorter than a chunk — then chunks of the shortest length — or of several lengths: a
    // score policy's layer must fill exactly (no chunk may straddle the point where it becomes
    // full), so the planner cuts a chunk at every distinct length. lastrec runs the same plan,
    // so the ratio is the policy's own cost, not that of more, smaller chunks.
    auto plan_for = [&](const KVCacheConfig& kc) {
        std::vector<int64_t> Ls;
        for (int64_t l = 0; l < c.num_layers; ++l) Ls.push_back(kc.length_for_layer(l, o.tokens, c.num_layers));
        policy_plan_lengths(kc, c.num_kv_heads, Ls);
        const int64_t chunk = std::min(o.chunk, *std::min_element(Ls.begin(), Ls.end()) - kc.grace_period);
        Ls.push_back(o.cache_length);  // lastrec's length is a cut too: it must fill exactly as well
        ChunkPlanOptions po;
        po.chunk_size = chunk;
        po.cell_factor = cell_factor(c);
        return plan_chunks(o.tokens, Ls, po);
    };
    auto run = [&](const KVCacheConfig& kc, const ChunkPlan& plan) {
        KVCache cache(kc, c, Device{}, m.act_dtype(), o.tokens, &codec);
        HeadResult hr;
        Timing t;
        const double c0 = process_cpu_seconds();
        const auto w0 = std::chrono::steady_clock::now();
        long_context_forward(m, cache, ids, plan, hs, hr);
        t.wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
        t.cpu = process_cpu_seconds() - c0;
        t.kept = kept_set_hash(cache);
        return t;
    };
    auto baseline_of = [&](const KVCacheConfig& kc) {
        KVCacheConfig b;
        b.name = CacheName{"lastrec", kc.buffer()}.text();
        b.cache_length = o.cache_length;
        b.max_chunk_size = o.chunk;
        b.dtype = m.act_dtype();
        return b;
    };
    const int rounds = std::max(1, o.repeats);
    const int total = 1 + 2 * rounds * int(cfgs.size());
    int done = 0;
    progress(done++, total, "warm-up (lastrec)");
    run(baseline_of(cfgs[0]), plan_for(baseline_of(cfgs[0])));  // oneDNN's kernels are built on first use: not in any round
    const size_t plain_chunks = plan_for(baseline_of(cfgs[0])).chunks.size();
    for (const KVCacheConfig& kc : cfgs) {
        PolicyBenchRow row;
        const KVCacheConfig base = baseline_of(kc);
        row.policy = kc.name;
        row.baseline = base.name;
        const ChunkPlan plan = plan_for(kc);
        row.chunks = int64_t(plan.chunks.size());
        if (plan.chunks.size() != plain_chunks) {
            const auto [lo, hi] = std::minmax_element(plan.chunks.begin() + 1, plan.chunks.end());
            row.note += str(" [", plan.chunks.size(), " chunks of ", *lo, "-", *hi, " (first ", plan.chunks[0], "), lastrec too]");
        }
        if (kc.policy() == "qfilter") row.note += qfilter_note;
        if (kc.policy() == "kvzap") row.note += kvzap_note;
        if (kc.policy() == "duo") row.note += str(" [gates pattern:10, streaming heads ", int64_t(kc.policy_option("duo_sinks")), "+",
                                                  int64_t(kc.policy_option("duo_recent")), "]");
        // A reconstruction-scored policy (kvzip) runs a second pass over every chunk: it reports
        // its own cost factor (about 0.5x), not the single-pass target. The probe has the model's
        // KV heads: a per-head calibration file (qfilter's) must match them.
        const bool two_pass = make_policy(kc, 8, c.num_kv_heads, &codec)->capabilities().reconstructs_context != nullptr;
        if (two_pass) row.note += " [+ reconstruction pass]";
        row.target = two_pass ? 0.0 : 0.9;
        std::vector<double> ratios, wall_ratios;
        for (int r = 0; r < rounds; ++r) {
            progress(done++, total, base.name + " (for " + kc.name + ")");
            const Timing tb = run(base, plan);
            progress(done++, total, kc.name);
            const Timing tp = run(kc, plan);
            row.base_cpu.push_back(tb.cpu), row.policy_cpu.push_back(tp.cpu);
            row.base_wall.push_back(tb.wall), row.policy_wall.push_back(tp.wall);
            row.kept_hash.push_back(tp.kept);
            ratios.push_back(tb.cpu / tp.cpu);
            wall_ratios.push_back(tb.wall / tp.wall);
        }
        row.cpu_ratio_median = median_of(ratios);
        row.cpu_ratio_min = *std::min_element(ratios.begin(), ratios.end());
        row.cpu_ratio_max = *std::max_element(ratios.begin(), ratios.end());
        row.wall_ratio_median = median_of(wall_ratios);
        res.rows.push_back(std::move(row));
    }
    progress(total, total, "");
    if (!qfilter_path.empty()) std::remove(qfilter_path.c_str());
    if (!kvzap_path.empty()) std::remove(kvzap_path.c_str());
    load_average(res.load_end);
    return res;
}

BenchTable policy_bench_table(const PolicyBenchResult& r) {
    BenchTable t;
    t.title = "KV policies (`kvlab bench policies`)";
    t.measures = "Eval throughput of every policy that evicts vs lastrec on the same buffer, model, sequence and chunk plan, in "
                 "process CPU time with one kernel thread; target >= 0.9x (a two-pass policy reports its own factor).";
    t.context = {str("model ", r.model, ", ", r.tokens, " tokens, cache ", r.cache_length, ", chunk ", r.chunk, ", ", r.threads,
                     " kernel thread(s), rounds of (lastrec, policy) interleaved"),
                 "cpu: process CPU time of the measured forward, median over rounds; ratio = lastrec cpu / policy cpu per round, "
                 "median [min-max]; wall: best tokens/s, ratio = median of lastrec wall / policy wall per round"};
    t.columns = {{"policy / baseline", true}, {"cpu ms"}, {"lastrec ms"}, {"cpu ratio [min-max]"}, {"wall tok/s"}, {"lastrec"},
                 {"wall"}, {"target"}, {"", true}};
    for (const PolicyBenchRow& w : r.rows) {
        const std::string name = w.policy + " / " + w.baseline + (w.policy == w.baseline ? " (noise control)" : "");
        const double bw = *std::min_element(w.base_wall.begin(), w.base_wall.end());
        const double pw = *std::min_element(w.policy_wall.begin(), w.policy_wall.end());
        std::string note = w.note;
        while (!note.empty() && note.front() == ' ') note.erase(0, 1);
        if (!w.pass()) note += note.empty() ? "<< misses target" : "  << misses target";
        t.add_row({name, cell(1e3 * median_of(w.policy_cpu), 3), cell(1e3 * median_of(w.base_cpu), 3),
                   str(cell(w.cpu_ratio_median, 3), "x [", cell(w.cpu_ratio_min, 3), "-", cell(w.cpu_ratio_max, 3), "]"),
                   cell(double(r.tokens) / pw, 1), cell(double(r.tokens) / bw, 1), cell(w.wall_ratio_median, 3) + "x",
                   w.target > 0 ? str(">= ", w.target) : "own", note});
    }
    return t;
}

std::string format_policy_load(const PolicyBenchResult& r) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "load average at start %.2f %.2f %.2f, at end %.2f %.2f %.2f\n", r.load_start[0], r.load_start[1],
                  r.load_start[2], r.load_end[0], r.load_end[1], r.load_end[2]);
    return buf;
}

std::string format_policy_rounds(const PolicyBenchResult& r) {
    std::string s = "per-round cpu ms (lastrec | policy):\n";
    char buf[64];
    for (const PolicyBenchRow& w : r.rows) {
        std::snprintf(buf, sizeof buf, "  %-50s", w.policy.c_str());
        s += buf;
        for (size_t i = 0; i < w.base_cpu.size(); ++i) {
            std::snprintf(buf, sizeof buf, " %.3f|%.3f", 1e3 * w.base_cpu[i], 1e3 * w.policy_cpu[i]);
            s += buf;
        }
        s += "\n";
    }
    s += "kept-set hash per round (every layer's slot positions after the run):\n";
    for (const PolicyBenchRow& w : r.rows) {
        s += "  kept " + w.policy;
        for (uint64_t h : w.kept_hash) {
            std::snprintf(buf, sizeof buf, " %016llx", (unsigned long long)h);
            s += buf;
        }
        s += "\n";
    }
    for (const CalibrationCost& c : r.calibration) {
        std::snprintf(buf, sizeof buf, "calibration of %s: %.3f s CPU, %.3f s wall\n", c.policy.c_str(), c.cpu, c.wall);
        s += buf;
    }
    return s;
}

std::string format_policy_bench(const PolicyBenchResult& r) {
    return format_policy_load(r) + policy_bench_table(r).text() + format_policy_rounds(r);
}

}  // namespace kv::bench
