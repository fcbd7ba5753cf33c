// Run comparisons (see comparison.h).
#include "comparison.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "config_fields.h"
#include "engine/core/error.h"

namespace kv::storage {

namespace {
using Json = nlohmann::json;

void flatten(const Json& j, const std::string& prefix, std::map<std::string, std::string>& out) {
    if (j.is_object()) {
        for (auto it = j.begin(); it != j.end(); ++it) flatten(*it, prefix.empty() ? it.key() : prefix + "." + it.key(), out);
    } else {
        out[prefix] = j.is_string() ? j.get<std::string>() : j.dump();
    }
}

double num(const Json& j, const char* key) {
    auto it = j.find(key);
    return it != j.end() && it->is_number() ? it->get<double>() : NAN;
}

std::string fmt(double v, int prec = 4) {
    if (std::isnan(v)) return "-";
    char b[64];
    std::snprintf(b, sizeof b, "%.*g", prec, v);
    return b;
}

std::string fmt_bytes(double v) {
    if (std::isnan(v)) return "-";
    static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (std::fabs(v) >= 1024 && u < 4) v /= 1024, ++u;
    char b[64];
    std::snprintf(b, sizeof b, u ? "%.2f %s" : "%.0f %s", v, units[u]);
    return b;
}
}  // namespace

int64_t run_peak_bytes(const std::string& summary_json) {
    const Json s = Json::parse(summary_json.empty() ? "{}" : summary_json, nullptr, false);
    if (!s.is_object()) return -1;
    int64_t peak = -1;
    if (s.contains("peak_bytes") && s["peak_bytes"].is_object())
        for (const auto& [dev, v] : s["peak_bytes"].items())
            if (v.is_number_integer()) peak = std::max<int64_t>(peak, v.get<int64_t>());
    // The phase peaks are the same allocator's totals over part of the run: never above the
    // events' peak unless events were dropped, when they are the better lower bound.
    if (s.contains("memory") && s["memory"].is_object())
        for (const auto& [dev, d] : s["memory"].items())
            if (d.is_object() && d.contains("peak_total") && d["peak_total"].is_number_integer())
                peak = std::max<int64_t>(peak, d["peak_total"].get<int64_t>());
    return peak;
}

int64_t run_own_peak_bytes(const std::string& summary_json) {
    const Json s = Json::parse(summary_json.empty() ? "{}" : summary_json, nullptr, false);
    if (!s.is_object()) return -1;
    int64_t peak = -1;
    bool split = false;  // recorded with instrumentation told apart
    if (s.contains("peak_bytes_without_instrumentation") && s["peak_bytes_without_instrumentation"].is_object())
        for (const auto& [dev, v] : s["peak_bytes_without_instrumentation"].items())
            if (v.is_number_integer()) peak = std::max<int64_t>(peak, v.get<int64_t>()), split = true;
    if (s.contains("memory") && s["memory"].is_object())
        for (const auto& [dev, d] : s["memory"].items())
            if (d.is_object() && d.contains("peak_total_without_instrumentation") && d["peak_total_without_instrumentation"].is_number_integer())
                peak = std::max<int64_t>(peak, d["peak_total_without_instrumentation"].get<int64_t>()), split = true;
    return split ? peak : run_peak_bytes(summary_json);
}

Comparison compare_runs(SessionReader& session, const std::vector<int64_t>& ids, int64_t reference) {
    if (ids.empty()) throw Error("compare: no runs selected; expected --runs 1,2,3");
    Comparison c;
    c.reference = reference ? reference : ids.front();
    std::vector<int64_t> order = {c.reference};
    for (int64_t id : ids)
        if (id != c.reference) order.push_back(id);
    std::vector<std::map<std::string, std::string>> configs;
    std::vector<Json> summaries;
    for (int64_t id : order) {
        RunInfo r = session.run(id);  // throws for unknown ids
        ComparedRun cr;
        cr.id = id;
        cr.name = r.name;
        cr.status = run_status_label(r);  // "running (owner gone)" when its writer died
        cr.error = r.error;
        std::map<std::string, std::string> flat;
        Json cj = Json::parse(r.config.empty() ? "{}" : r.config, nullptr, false);
        if (!cj.is_discarded()) flatten(cj, "", flat);
        if (auto it = flat.find("kv_cache.name"); it != flat.end()) it->second = canonical_cache_name(it->second);  // one spelling per cache
        configs.push_back(flat);
        Json s = Json::parse(r.summary.empty() ? "{}" : r.summary, nullptr, false);
        if (s.is_discarded()) s = Json::object();
        summaries.push_back(s);
        cr.loss = num(s, "mean_loss");
        cr.accuracy = num(s, "accuracy");
        cr.perplexity = num(s, "perplexity");
        cr.tokens_per_s = num(s, "tokens_per_s");
        cr.kv_bytes = num(s, "kv_bytes");
        cr.kv_logical_bytes = num(s, "kv_logical_bytes");
        cr.kv_physical_bytes = num(s, "kv_physical_bytes");
        cr.seconds = num(s, "seconds");
        if (const int64_t peak = run_own_peak_bytes(r.summary); peak >= 0) cr.peak_bytes = double(peak);
        if (const int64_t all = run_peak_bytes(r.summary); all >= 0 && double(all) != cr.peak_bytes) cr.peak_bytes_with_instrumentation = double(all);
        cr.tokens_per_s_with_instrumentation = num(s, "tokens_per_s_with_instrumentation");
        cr.copy_token_accuracy = num(s, "copy_token_accuracy");
        cr.answer_token_accuracy = num(s, "answer_token_accuracy");
        cr.fidelity_kl = num(s, "fidelity_next_token_kl");
        cr.fidelity_kept_mass = num(s, "fidelity_kept_mass");
        cr.fidelity_attn_error = num(s, "fidelity_attn_rel_error");
        cr.fidelity_efficiency = num(s, "fidelity_efficiency");
        cr.instrumentation_seconds = num(s, "instrumentation_seconds");
        if (s.contains("phase_seconds") && s["phase_seconds"].is_object())
            for (const auto& [phase, v] : s["phase_seconds"].items())
                if (v.is_number()) cr.phase_seconds.emplace_back(phase, v.get<double>());
        // Each category's own peak over the whole run (the writer's, from every allocation
        // event), like the total; the evaluation phase's peaks only when events are missing.
        // Apart from instrumentation where the writer split it (fidelity's passes allocate
        // activations and workspace too; kv_fidelity is all instrumentation and drops out).
        const Json* cats = nullptr;
        if (s.contains("peak_bytes_by_category_without_instrumentation") && s["peak_bytes_by_category_without_instrumentation"].contains("cpu"))
            cats = &s["peak_bytes_by_category_without_instrumentation"]["cpu"];
        else if (s.contains("peak_bytes_by_category") && s["peak_bytes_by_category"].contains("cpu"))
            cats = &s["peak_bytes_by_category"]["cpu"];
        else if (s.contains("memory") && s["memory"].contains("cpu") && s["memory"]["cpu"].contains("peak"))
            cats = &s["memory"]["cpu"]["peak"];
        if (cats && cats->is_object())
            for (const auto& [cat, v] : cats->items())
                if (v.is_number() && v.get<double>() > 0) cr.peak_by_category.emplace_back(cat, v.get<double>());
        c.runs.push_back(cr);
    }
    std::set<std::string> keys;
    for (const auto& m : configs)
        for (const auto& [k, v] : m) keys.insert(k);
    for (const auto& k : keys) {
        bool differs = false;
        for (const auto& m : configs) differs = differs || (m.count(k) ? m.at(k) : "") != (configs[0].count(k) ? configs[0].at(k) : "");
        if (!differs) continue;
        c.differing_fields.push_back(k);
        for (size_t i = 0; i < c.runs.size(); ++i) c.runs[i].config_diff.push_back({k, configs[i].count(k) ? configs[i].at(k) : ""});
    }
    const ComparedRun& ref = c.runs[0];
    for (auto& r : c.runs) {
        r.d_loss = r.loss - ref.loss;
        r.d_accuracy = r.accuracy - ref.accuracy;
        r.ppl_ratio = r.perplexity / ref.perplexity;
        r.speed_ratio = r.tokens_per_s / ref.tokens_per_s;
        r.kv_ratio = r.kv_bytes / ref.kv_bytes;
        r.peak_ratio = r.peak_bytes / ref.peak_bytes;
    }
    return c;
}

std::string format_comparison(const Comparison& c) {
    std::string out;
    char line[512];
    out += "reference: run " + std::to_string(c.reference) + "\n";
    if (!c.differing_fields.empty()) {
        out += "configuration (only fields that differ):\n";
        // Columns as wide as their values (up to 32 characters), so names stay readable.
        std::vector<int> w;
        for (const auto& r : c.runs) {
            size_t n = ("run " + std::to_string(r.id)).size();
            for (const auto& kv : r.config_diff) n = std::max(n, std::min<size_t>(kv.second.size(), 32));
            w.push_back(int(n));
        }
        std::snprintf(line, sizeof line, "  %-34s", "field");
        out += line;
        for (size_t i = 0; i < c.runs.size(); ++i) {
            std::snprintf(line, sizeof line, "  %*s", w[i], ("run " + std::to_string(c.runs[i].id)).c_str());
            out += line;
        }
        out += "\n";
        for (size_t f = 0; f < c.differing_fields.size(); ++f) {
            std::snprintf(line, sizeof line, "  %-34s", c.differing_fields[f].c_str());
            out += line;
            for (size_t i = 0; i < c.runs.size(); ++i) {
                std::snprintf(line, sizeof line, "  %*s", w[i], c.runs[i].config_diff[f].second.substr(0, 32).c_str());
                out += line;
            }
            out += "\n";
        }
    }
    int sw = 9;  // status column: as wide as "running (owner gone)" when a run has it
    for (const auto& r : c.runs) sw = std::max(sw, int(r.status.size()));
    std::snprintf(line, sizeof line, "%-5s %-*s %9s %8s %9s %9s %10s %10s %10s %9s %9s\n", "run", sw, "status", "loss", "d loss",
                  "accuracy", "ppl", "tokens/s", "speed", "KV bytes", "KV ratio", "peak x");
    out += line;
    for (const auto& r : c.runs) {
        std::snprintf(line, sizeof line, "%-5lld %-*s %9s %8s %9s %9s %10s %9sx %10s %8sx %8sx\n", (long long)r.id, sw, r.status.c_str(),
                      fmt(r.loss).c_str(), fmt(r.d_loss, 3).c_str(), fmt(r.accuracy, 3).c_str(), fmt(r.perplexity).c_str(),
                      fmt(r.tokens_per_s, 5).c_str(), fmt(r.speed_ratio, 3).c_str(), fmt_bytes(r.kv_bytes).c_str(), fmt(r.kv_ratio, 3).c_str(),
                      fmt(r.peak_ratio, 3).c_str());
        out += line;
    }
    // A table of one column per run: a header row, then one row per label.
    auto run_header = [&](const char* first, int width) {
        std::snprintf(line, sizeof line, "  %-*s", width, first);
        out += line;
        for (const auto& r : c.runs) {
            std::snprintf(line, sizeof line, " %12s", ("run " + std::to_string(r.id)).c_str());
            out += line;
        }
        out += "\n";
    };
    auto run_row = [&](const std::string& label, int width, auto cell) {
        std::snprintf(line, sizeof line, "  %-*s", width, label.c_str());
        out += line;
        for (const auto& r : c.runs) {
            std::snprintf(line, sizeof line, " %12s", cell(r).c_str());
            out += line;
        }
        out += "\n";
    };
    // What the study is about, where the runs record it: the task's own score and how far each
    // run is from the dense model (fidelity means).
    const std::pair<const char*, double ComparedRun::*> study[] = {{"copied tokens", &ComparedRun::copy_token_accuracy},
                                                                  {"answer tokens right", &ComparedRun::answer_token_accuracy},
                                                                  {"next-token KL vs dense", &ComparedRun::fidelity_kl},
                                                                  {"kept attention mass", &ComparedRun::fidelity_kept_mass},
                                                                  {"efficiency vs oracle", &ComparedRun::fidelity_efficiency},
                                                                  {"attention error vs dense", &ComparedRun::fidelity_attn_error}};
    bool any_study = false;
    for (const auto& [label, field] : study)
        for (const auto& r : c.runs) any_study |= !std::isnan(r.*field);
    if (any_study) {
        out += "task and fidelity:\n";
        run_header("", 26);
        for (const auto& [label, field] : study) {
            bool any = false;
            for (const auto& r : c.runs) any |= !std::isnan(r.*field);
            if (any) run_row(label, 26, [field = field](const ComparedRun& r) { return fmt(r.*field, 4); });
        }
    }
    // Logical (slots kept) beside physical (blocks or pools held) bytes: what eviction saved
    // against what the allocator could give back.
    bool any_bytes = false;
    for (const auto& r : c.runs) any_bytes |= !std::isnan(r.kv_logical_bytes);
    if (any_bytes) {
        out += "KV memory (logical: slots kept; physical: blocks held):\n";
        run_header("", 26);
        run_row("logical bytes", 26, [](const ComparedRun& r) { return fmt_bytes(r.kv_logical_bytes); });
        run_row("physical bytes", 26, [](const ComparedRun& r) { return fmt_bytes(r.kv_physical_bytes); });
    }
    // What measuring cost, apart from the headline numbers above (which are the runs' own).
    bool instrumented = false;
    for (const auto& r : c.runs) instrumented |= !std::isnan(r.instrumentation_seconds) || !std::isnan(r.peak_bytes_with_instrumentation);
    if (instrumented) {
        out += "instrumentation (measuring the runs, not their cost; left out of the numbers above):\n";
        run_header("", 26);
        run_row("seconds measuring", 26, [](const ComparedRun& r) { return fmt(r.instrumentation_seconds, 4); });
        // Labelled by phase: fidelity's comparison per layer, the dense reference, KL heads, telemetry.
        for (const char* phase : {"fidelity attention", "fidelity reference", "KL heads", "telemetry"}) {
            bool any = false;
            for (const auto& r : c.runs)
                for (const auto& [k, v] : r.phase_seconds) any |= k == phase;
            if (!any) continue;
            run_row(str("  s ", phase), 26, [phase](const ComparedRun& r) {
                for (const auto& [k, v] : r.phase_seconds)
                    if (k == phase) return fmt(v, 4);
                return fmt(double(NAN), 4);
            });
        }
        run_row("tokens/s with it", 26, [](const ComparedRun& r) { return fmt(r.tokens_per_s_with_instrumentation, 4); });
        run_row("peak with it", 26, [](const ComparedRun& r) { return fmt_bytes(r.peak_bytes_with_instrumentation); });
    }
    // Peak memory by category: each category's own peak over the whole run (they need not
    // coincide, so they do not add up to the total, which is the run's one peak).
    std::vector<std::string> cats;
    for (const auto& r : c.runs)
        for (const auto& [cat, v] : r.peak_by_category)
            if (std::find(cats.begin(), cats.end(), cat) == cats.end()) cats.push_back(cat);
    std::sort(cats.begin(), cats.end());
    if (!cats.empty()) {
        out += "peak memory by category (whole run, each category's own peak, instrumentation left out):\n";
        run_header("category", 22);
        for (const auto& cat : cats)
            run_row(cat, 22, [&](const ComparedRun& r) {
                for (const auto& [k, v] : r.peak_by_category)
                    if (k == cat) return fmt_bytes(v);
                return fmt_bytes(double(NAN));
            });
        run_row("total (run's own peak)", 22, [](const ComparedRun& r) { return fmt_bytes(r.peak_bytes); });
    }
    // A degraded or failed run's numbers come with the reason (e.g. telemetry lost to a full disk).
    for (const auto& r : c.runs)
        if (!r.error.empty() && r.status != "done") out += str("run ", r.id, " ", r.status, ": ", r.error, "\n");
    return out;
}

}  // namespace kv::storage
