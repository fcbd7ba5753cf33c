// Run diffs (see run_diff.h).
#include "run_diff.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

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
}  // namespace

RunDiff run_diff(const SpanSummary& a, const SpanSummary& b, const std::string& summary_a, const std::string& summary_b) {
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
    std::vector<RunDiffRow> span_rows;
    for (auto& [k, r] : spans) {
        // A span only one run has counts as 0 ms in the other: the difference is all of it.
        if (std::isnan(r.a)) r.a = 0;
        if (std::isnan(r.b)) r.b = 0;
        span_rows.push_back(r);
    }
    std::stable_sort(span_rows.begin(), span_rows.end(), [](const RunDiffRow& x, const RunDiffRow& y) {
        return std::fabs(x.b_minus_a()) > std::fabs(y.b_minus_a());
    });
    d.rows = span_rows;
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
    const RunInfo a = session.run(run_a), b = session.run(run_b);
    RunDiff d = run_diff(span_summary(session, run_a), span_summary(session, run_b), a.summary, b.summary);
    d.run_a = run_a;
    d.run_b = run_b;
    return d;
}

QueryResult run_diff_table(const RunDiff& d) {
    QueryResult t;
    t.columns = {"section", "name", "detail", "measure", "count_a", "count_b", "a", "b", "b_minus_a", "b_over_a"};
    auto num = [](double v) { return std::isnan(v) ? QueryValue{} : QueryValue{v}; };
    for (const auto& r : d.rows) {
        const bool counted = r.section == "spans" || r.section == "phases";
        t.rows.push_back({r.section, r.name, r.detail, r.measure, counted ? QueryValue{r.count_a} : QueryValue{},
                          counted ? QueryValue{r.count_b} : QueryValue{}, num(r.a), num(r.b), num(r.b_minus_a()),
                          num(r.b_over_a())});
    }
    return t;
}

}  // namespace kv::storage
