// Run diffs (see run_diff.h).
#include "run_diff.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

namespace kv::storage {

namespace {
using Json = nlohmann::json;

Json parse_object(const std::string& text) {
    Json j = Json::parse(text.empty() ? "{}" : text, nullptr, false);
    return j.is_object() ? j : Json::object();
}

// Numeric leaves of a summary by dotted path ("phase_seconds.load"), memory maps left out (the
// memory section has them).
void numeric_leaves(const Json& j, const std::string& prefix, std::map<std::string, double>& out) {
    for (auto it = j.begin(); it != j.end(); ++it) {
        const std::string key = prefix.empty() ? it.key() : prefix + "." + it.key();
        if (prefix.empty() && key.rfind("peak_bytes", 0) == 0) continue;
        if (it->is_object())
            numeric_leaves(*it, key, out);
        else if (it->is_number())
            out[key] = it->get<double>();
    }
}

// {device: {category: bytes}} under `key` of a summary, as (device, category) -> bytes.
std::map<std::pair<std::string, std::string>, double> memory_map(const Json& s, const char* key) {
    std::map<std::pair<std::string, std::string>, double> out;
    if (!s.contains(key) || !s[key].is_object()) return out;
    for (auto dev = s[key].begin(); dev != s[key].end(); ++dev) {
        if (!dev->is_object()) continue;
        for (auto cat = dev->begin(); cat != dev->end(); ++cat)
            if (cat->is_number()) out[{dev.key(), cat.key()}] = cat->get<double>();
    }
    return out;
}

double ms(int64_t ns) {
    return double(ns) / 1e6;
}
// Rows only one run has count as 0 in the other (the difference is all of it); by |B - A|.
std::vector<RunDiffRow> by_difference(std::map<std::pair<std::string, int>, RunDiffRow>& rows) {
    std::vector<RunDiffRow> out;
    for (auto& [k, r] : rows) {
        if (std::isnan(r.a)) r.a = 0;
        if (std::isnan(r.b)) r.b = 0;
        out.push_back(r);
    }
    std::stable_sort(out.begin(), out.end(), [](const RunDiffRow& x, const RunDiffRow& y) {
        return std::fabs(x.b_minus_a()) > std::fabs(y.b_minus_a());
    });
    return out;
}

const char* gpu_kind_name(GpuActivityRow::Kind k) {
    switch (k) {
        case GpuActivityRow::KERNEL: return "kernel";
        case GpuActivityRow::MEMCPY: return "memcpy";
        case GpuActivityRow::MEMSET: return "memset";
    }
    return "gpu";
}
}  // namespace

void ChunkPeakAccumulator::add(const MemoryEventRow& e) {
    if (e.chunk < 0) return;
    int64_t& p = peak_[{e.device, int(e.category), e.chunk}];
    p = std::max(p, e.category_total);
}

std::vector<ChunkMemoryPeak> ChunkPeakAccumulator::peaks() const {
    std::vector<ChunkMemoryPeak> out;
    for (const auto& [k, v] : peak_) out.push_back({std::get<0>(k), MemCategory(std::get<1>(k)), std::get<2>(k), v});
    return out;
}

std::vector<ChunkMemoryPeak> chunk_memory_peaks(const std::vector<MemoryEventRow>& events) {
    ChunkPeakAccumulator acc;
    for (const auto& e : events) acc.add(e);
    return acc.peaks();
}

RunDiffInput read_run_diff_input(SessionReader& session, int64_t run) {
    RunDiffInput in;
    in.summary = session.run(run).summary;
    in.spans = span_summary(session, run);
    in.gpu = session.gpu_activity(run);
    ChunkPeakAccumulator peaks;  // streamed: a long run has millions of events
    session.for_each_memory_event(run, {}, [&](const MemoryEventRow& e) { peaks.add(e); });
    in.chunk_memory = peaks.peaks();
    in.cache_steps = session.cache_steps(run, -1, 0, size_t(1) << 26);
    return in;
}

RunDiff run_diff(const SpanSummary& a, const SpanSummary& b, const std::string& summary_a, const std::string& summary_b) {
    RunDiffInput ia, ib;
    ia.spans = a, ib.spans = b;
    ia.summary = summary_a, ib.summary = summary_b;
    return run_diff(ia, ib);
}

RunDiff run_diff(const RunDiffInput& in_a, const RunDiffInput& in_b) {
    const SpanSummary &a = in_a.spans, &b = in_b.spans;
    const std::string &summary_a = in_a.summary, &summary_b = in_b.summary;
    RunDiff d;
    // ---- spans: total time and count per (name, category), by |B - A| ----
    std::map<std::pair<std::string, int>, RunDiffRow> spans;
    auto add_span = [&](const SpanStats& s, bool is_b) {
        RunDiffRow& r = spans[{s.name, int(s.category)}];
        r.section = "spans";
        r.name = s.name;
        r.detail = trace::span_category_name(s.category);
        r.measure = "total_ms";
        (is_b ? r.count_b : r.count_a) = s.count;
        (is_b ? r.b : r.a) = ms(s.total_ns);
    };
    for (const auto& s : a.spans) add_span(s, false);
    for (const auto& s : b.spans) add_span(s, true);
    d.rows = by_difference(spans);
    // ---- kernels, memcpys and memsets: total time and count per (name, kind), by |B - A| ----
    std::map<std::pair<std::string, int>, RunDiffRow> kernels;
    auto add_gpu = [&](const GpuActivityRow& g, bool is_b) {
        RunDiffRow& r = kernels[{g.name, int(g.kind)}];
        r.section = "kernels";
        r.name = g.name;
        r.detail = gpu_kind_name(g.kind);
        r.measure = "total_ms";
        ++(is_b ? r.count_b : r.count_a);
        double& v = is_b ? r.b : r.a;
        v = (std::isnan(v) ? 0.0 : v) + ms(g.end_ns - g.start_ns);
    };
    for (const auto& g : in_a.gpu) add_gpu(g, false);
    for (const auto& g : in_b.gpu) add_gpu(g, true);
    for (auto& r : by_difference(kernels)) d.rows.push_back(r);
    // ---- phases: self time per phase; the run span's self time is the unattributed time ----
    std::map<std::string, RunDiffRow> phases;
    std::vector<std::string> order;
    auto add_phase = [&](const SpanStats& s, bool is_b) {
        const std::string name = s.name == "run" ? "(unattributed)" : s.name;
        if (!phases.count(name)) order.push_back(name);
        RunDiffRow& r = phases[name];
        r.section = "phases";
        r.name = name;
        r.detail = "run";
        r.measure = "self_ms";
        (is_b ? r.count_b : r.count_a) = s.count;
        (is_b ? r.b : r.a) = ms(s.self_ns);
    };
    for (const auto& s : a.phases) add_phase(s, false);
    for (const auto& s : b.phases) add_phase(s, true);
    for (const auto& name : order) {
        RunDiffRow r = phases[name];
        if (std::isnan(r.a)) r.a = 0;
        if (std::isnan(r.b)) r.b = 0;
        d.rows.push_back(r);
    }
    // ---- memory: peak bytes per category from the summaries ----
    const Json ja = parse_object(summary_a), jb = parse_object(summary_b);
    for (const auto& [key, suffix] : {std::pair<const char*, const char*>{"peak_bytes_by_category_without_instrumentation", ""},
                                      {"peak_bytes_by_category", " + instrumentation"}}) {
        const auto ma = memory_map(ja, key), mb = memory_map(jb, key);
        std::set<std::pair<std::string, std::string>> keys;
        for (const auto& [k, v] : ma) keys.insert(k);
        for (const auto& [k, v] : mb) keys.insert(k);
        for (const auto& k : keys) {
            RunDiffRow r;
            r.section = "memory";
            r.name = k.second;
            r.detail = k.first + suffix;
            r.measure = "bytes";
            if (ma.count(k)) r.a = ma.at(k);
            if (mb.count(k)) r.b = mb.at(k);
            d.rows.push_back(r);
        }
    }
    // ---- memory per category over chunks ----
    std::map<std::tuple<int32_t, int, int32_t>, RunDiffRow> chunks;
    auto add_chunk = [&](const ChunkMemoryPeak& c, bool is_b) {
        RunDiffRow& r = chunks[{c.device, int(c.category), c.chunk}];
        r.section = "memory_chunks";
        r.name = mem_category_name(c.category);
        r.detail = trace::device_code_name(c.device) + " chunk " + std::to_string(c.chunk);
        r.measure = "peak_bytes";
        (is_b ? r.b : r.a) = double(c.peak_bytes);
    };
    for (const auto& c : in_a.chunk_memory) add_chunk(c, false);
    for (const auto& c : in_b.chunk_memory) add_chunk(c, true);
    for (const auto& [k, r] : chunks) d.rows.push_back(r);
    // ---- kept-slot overlap per layer ----
    if (!in_a.cache_steps.empty() || !in_b.cache_steps.empty())
        for (const auto& o : kept_slot_overlap(in_a.cache_steps, in_b.cache_steps)) {
            RunDiffRow held;
            held.section = "kept_slots";
            held.name = "layer " + std::to_string(o.layer);
            held.measure = "held";
            held.count_a = held.count_b = o.steps;
            if (o.unmatched_steps)
                held.detail = std::to_string(o.unmatched_steps) + " steps end where the other run has none";
            held.a = double(o.held_a), held.b = double(o.held_b);
            d.rows.push_back(held);
            RunDiffRow both = held;
            both.measure = "kept_by_both";
            both.a = o.share_of_a(), both.b = o.share_of_b();
            d.rows.push_back(both);
        }
    // ---- summary numbers that differ (present in one run only counts as differing) ----
    std::map<std::string, double> la, lb;
    numeric_leaves(ja, "", la);
    numeric_leaves(jb, "", lb);
    std::set<std::string> keys;
    for (const auto& [k, v] : la) keys.insert(k);
    for (const auto& [k, v] : lb) keys.insert(k);
    for (const auto& k : keys) {
        RunDiffRow r;
        r.section = "summary";
        r.name = k;
        r.measure = "value";
        if (la.count(k)) r.a = la.at(k);
        if (lb.count(k)) r.b = lb.at(k);
        if (r.a == r.b) continue;
        d.rows.push_back(r);
    }
    return d;
}

RunDiff run_diff(SessionReader& session, int64_t run_a, int64_t run_b) {
    const RunDiffInput a = read_run_diff_input(session, run_a);
    RunDiff d = run_diff(a, run_b == run_a ? a : read_run_diff_input(session, run_b));
    d.run_a = run_a;
    d.run_b = run_b;
    return d;
}

QueryResult run_diff_table(const RunDiff& d) {
    QueryResult t;
    t.columns = {"section", "name", "detail", "measure", "count_a", "count_b", "a", "b", "b_minus_a", "b_over_a"};
    auto num = [](double v) { return std::isnan(v) ? QueryValue{} : QueryValue{v}; };
    for (const auto& r : d.rows) {
        const bool counted = r.section == "spans" || r.section == "kernels" || r.section == "phases" || r.section == "kept_slots";
        t.rows.push_back({r.section, r.name, r.detail, r.measure, counted ? QueryValue{r.count_a} : QueryValue{},
                          counted ? QueryValue{r.count_b} : QueryValue{}, num(r.a), num(r.b), num(r.b_minus_a()),
                          num(r.b_over_a())});
    }
    return t;
}

}  // namespace kv::storage
