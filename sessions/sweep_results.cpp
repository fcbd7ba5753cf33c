// Sweep results from a session (see sweep_results.h).
#include "sweep_results.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>

#include "engine/core/error.h"
#include "storage/run_experiment.h"
#include "storage/session.h"

namespace kv::sessions {

namespace {

std::string num(double x, int digits = 6) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*g", digits, x);
    return buf;
}

std::string signed_num(double x, int digits) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%+.*g", digits, x);
    return buf;
}

std::string percent(double x) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%+.2f", x);
    return buf;
}

std::string csv_field(const std::string& s) {
    if (s.find_first_of(",\"\n") == std::string::npos) return s;
    std::string q = "\"";
    for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
}

bool summary_number(const std::string& summary, const std::string& key, double* out) {
    nlohmann::json j = nlohmann::json::parse(summary.empty() ? "{}" : summary, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains(key) || !j[key].is_number()) return false;
    *out = j[key].get<double>();
    return true;
}

}  // namespace

std::map<std::string, std::vector<int64_t>> all_done_runs_by_identity(storage::Session& session) {
    std::map<std::string, std::vector<int64_t>> out;
    for (const auto& r : session.runs()) {
        if (r.status != storage::RunStatus::DONE) continue;
        try {
            out[sweep_identity(run_config_from_json(r.config, "run"))].push_back(r.id);
        } catch (const Error&) {
        }
    }
    for (auto& [k, ids] : out) std::sort(ids.begin(), ids.end());
    return out;
}

std::map<std::string, int64_t> done_runs_by_identity(storage::Session& session) {
    std::map<std::string, int64_t> out;
    for (const auto& r : session.runs()) {
        if (r.status != storage::RunStatus::DONE) continue;
        try {
            out[sweep_identity(run_config_from_json(r.config, "run"))] = r.id;  // ids grow: the newest wins
        } catch (const Error&) {
            // a run recorded by another version with options this one lacks: not a cell of ours
        }
    }
    return out;
}

std::string run_option_value(const RunConfig& cfg, const std::string& option) {
    if (option == "kv_cache.policy") return cfg.kv_cache.policy();
    if (option == "kv_cache.buffer") return cfg.kv_cache.buffer();
    if (option == "kv_cache.ratio") {
        if (cfg.kv_cache.cache_length == 0) return "1";
        return num(double(cfg.kv_cache.cache_length) / double(cfg.data.seq_length), 6);
    }
    const OptionDef* o = find_run_option(option);
    if (!o) throw Error(str("unknown option '", option, "'; expected a run option (kvlab eval_long --help), kv_cache.policy, kv_cache.buffer or kv_cache.ratio"));
    return o->get(cfg);
}

bool run_matches_where(const RunConfig& cfg, const std::vector<std::pair<std::string, std::string>>& where) {
    for (const auto& [opt, values] : where) {
        const std::string v = run_option_value(cfg, opt);
        bool any = false;
        for (size_t p = 0; p <= values.size();) {
            size_t q = values.find('|', p);
            if (q == std::string::npos) q = values.size();
            any = any || values.compare(p, q - p, v) == 0;
            p = q + 1;
        }
        if (!any) return false;
    }
    return true;
}

SweepTable make_sweep_table(const std::vector<SweepCell>& cells, const std::vector<SweepAxis>& axes, storage::Session& session,
                            const std::string& metric) {
    SweepTable t;
    t.columns.push_back("kv_cache.name");
    for (const auto& a : axes)
        if (a.values.size() > 1 && a.option != "kv_cache.name" && a.option != "kv_cache.buffer") t.columns.push_back(a.option);
    const auto done = done_runs_by_identity(session);
    std::map<int64_t, storage::RunInfo> info;
    std::map<std::string, std::string> last_status;  // identity -> status of its newest run (failed, cancelled, ...)
    for (const auto& r : session.runs()) {
        info[r.id] = r;
        try {
            last_status[sweep_identity(run_config_from_json(r.config, "run"))] = storage::run_status_name(r.status);
        } catch (const Error&) {
        }
    }

    t.metric = metric;
    if (metric == "auto") {
        t.metric = "mean_loss";
        for (const char* m : {"perplexity", "copy_token_accuracy", "accuracy"}) {
            bool any = false;
            for (const auto& c : cells) {
                double v;
                auto it = done.find(c.identity);
                if (it != done.end() && summary_number(info[it->second].summary, m, &v)) any = true;
            }
            if (any) {
                t.metric = m;
                break;
            }
        }
    }
    // The metric of a cell: the mean over all its done runs that record it.
    const auto all_done = all_done_runs_by_identity(session);
    auto cell_metric = [&](const std::string& identity) {
        std::vector<double> vs;
        auto it = all_done.find(identity);
        if (it != all_done.end())
            for (int64_t id : it->second) {
                double v;
                if (summary_number(info[id].summary, t.metric, &v)) vs.push_back(v);
            }
        return storage::mean_and_se(vs);
    };
    std::map<std::string, double> ref_value;  // reference_key -> metric
    for (const auto& c : cells) {
        if (!c.reference) continue;
        const storage::MeanSe m = cell_metric(c.identity);
        if (m.n > 0) ref_value[c.reference_key] = m.mean;
    }
    for (const auto& c : cells) {
        SweepTableRow row;
        for (const auto& col : t.columns) {
            if (col == "kv_cache.name") row.cells.push_back(c.cfg.kv_cache.name);
            else if (c.reference && is_cache_option(col)) row.cells.push_back("-");
            else row.cells.push_back(c.coords.count(col) ? c.coords.at(col) : run_option_value(c.cfg, col));
        }
        auto it = done.find(c.identity);
        row.status = last_status.count(c.identity) ? last_status.at(c.identity) : "missing";
        if (it != done.end()) {
            row.run = it->second;
            row.status = "done";
            row.runs = all_done.at(c.identity);
            const storage::MeanSe m = cell_metric(c.identity);
            row.has_value = m.n > 0;
            row.value = m.mean, row.se = m.se, row.n = m.n;
        }
        auto rv = ref_value.find(c.reference_key);
        if (rv != ref_value.end()) {
            row.reference = rv->second;
            row.has_reference = true;
        }
        t.rows.push_back(std::move(row));
    }
    return t;
}

std::string format_sweep_table(const SweepTable& t, const std::string& format) {
    if (format != "table" && format != "csv" && format != "json" && format != "md")
        throw Error(str("--format: '", format, "' is not a table format; expected table, csv, json or md"));
    const std::string dname = "delta_vs_dense", pname = "delta_percent";
    // Every row as text: the columns, run, metric, [n, s.e. when a cell ran twice], delta, delta %.
    int repeated = 0;
    for (const auto& r : t.rows) repeated += r.n > 1;
    std::vector<std::string> head = t.columns;
    head.insert(head.end(), {"run", t.metric});
    if (repeated) head.insert(head.end(), {"n", "se"});
    head.insert(head.end(), {dname, pname});
    std::vector<std::vector<std::string>> body;
    for (const auto& r : t.rows) {
        std::vector<std::string> line = r.cells;
        line.push_back(r.run ? std::to_string(r.run) : "-");
        line.push_back(r.has_value ? num(r.value) : r.status);
        if (repeated) {
            line.push_back(r.n ? std::to_string(r.n) : "");
            line.push_back(r.n > 1 ? num(r.se, 3) : "");
        }
        const bool delta = r.has_value && r.has_reference;
        line.push_back(delta ? signed_num(r.value - r.reference, 4) : "");
        line.push_back(delta && r.reference != 0 ? percent(100.0 * (r.value / r.reference - 1.0)) : "");
        body.push_back(std::move(line));
    }
    std::ostringstream os;
    if (format == "csv") {
        for (size_t i = 0; i < head.size(); ++i) os << (i ? "," : "") << csv_field(head[i]);
        os << "\n";
        for (const auto& line : body) {
            for (size_t i = 0; i < line.size(); ++i) os << (i ? "," : "") << csv_field(line[i]);
            os << "\n";
        }
    } else if (format == "json") {
        nlohmann::json j = nlohmann::json::array();
        for (size_t k = 0; k < t.rows.size(); ++k) {
            const auto& r = t.rows[k];
            nlohmann::json o;
            for (size_t i = 0; i < t.columns.size(); ++i) o[t.columns[i]] = r.cells[i];
            o["run"] = r.run ? nlohmann::json(r.run) : nlohmann::json(nullptr);
            o["status"] = r.status;
            o[t.metric] = r.has_value ? nlohmann::json(r.value) : nlohmann::json(nullptr);
            o[dname] = r.has_value && r.has_reference ? nlohmann::json(r.value - r.reference) : nlohmann::json(nullptr);
            o["n"] = r.n;
            o["se"] = r.n > 1 ? nlohmann::json(r.se) : nlohmann::json(nullptr);
            o["runs"] = r.runs;
            j.push_back(o);
        }
        os << j.dump(2) << "\n";
    } else if (format == "md") {
        head[head.size() - 2] = "Δ vs dense";
        head.back() = "Δ %";
        for (const auto& h : head) os << "| " << h << " ";
        os << "|\n";
        for (size_t i = 0; i < head.size(); ++i) os << "|---";
        os << "|\n";
        for (const auto& line : body) {
            for (const auto& c : line) os << "| " << (c.empty() ? "–" : c) << " ";
            os << "|\n";
        }
    } else {
        head[head.size() - 2] = "Δ vs dense";
        head.back() = "Δ %";
        std::vector<size_t> w(head.size(), 0);
        auto width = [](const std::string& s) {  // UTF-8 code points (Δ is two bytes)
            size_t n = 0;
            for (unsigned char c : s) n += (c & 0xC0) != 0x80;
            return n;
        };
        for (size_t i = 0; i < head.size(); ++i) w[i] = width(head[i]);
        for (const auto& line : body)
            for (size_t i = 0; i < line.size(); ++i) w[i] = std::max(w[i], width(line[i]));
        auto emit = [&](const std::vector<std::string>& line) {
            for (size_t i = 0; i < line.size(); ++i) {
                os << line[i];
                if (i + 1 < line.size()) os << std::string(w[i] - width(line[i]) + 2, ' ');
            }
            os << "\n";
        };
        emit(head);
        for (const auto& line : body) emit(line);
        if (repeated)
            os << repeated << (repeated == 1 ? " cell was" : " cells were") << " run more than once: " << t.metric
               << " is the mean of its n runs, se its standard error\n";
    }
    return os.str();
}

std::string format_sweep_leaderboard(const SweepTable& t) {
    const auto col = [&](const std::string& name) -> int {
        const auto it = std::find(t.columns.begin(), t.columns.end(), name);
        return it == t.columns.end() ? -1 : int(it - t.columns.begin());
    };
    const int mcol = col("kv_cache.name");
    // The size axis: the chunked protocol's kept ratio or cache length, compress-then-ask's
    // compression ratio (kvpress's leaderboard columns), or its score threshold (kvpress sweeps
    // DMS and KVzap by threshold; the kept size is then an outcome, not a column).
    int rcol = col("kv_cache.ratio");
    if (rcol < 0) rcol = col("kv_cache.compression_ratio");
    if (rcol < 0) rcol = col("kv_cache.cache_length");
    if (rcol < 0) rcol = col("kv_cache.score_threshold");
    if (mcol < 0 || rcol < 0)
        throw Error("--format leaderboard: the sweep has no kv_cache.name or cache-size axis; expected a sweep over --kv_cache.name and "
                    "--kv_cache.ratio (or --kv_cache.compression_ratio, --kv_cache.cache_length, --kv_cache.score_threshold)");
    // (method, size) -> task -> value; a task is every other column's value.
    std::vector<std::string> methods, sizes;
    std::map<std::string, std::map<std::string, std::map<std::string, double>>> at;
    std::map<std::string, std::map<std::string, double>> dense;  // method -> task -> value (no size)
    std::vector<std::string> tasks;
    for (const auto& r : t.rows) {
        if (!r.has_value) continue;
        std::string task;
        for (size_t c = 0; c < r.cells.size(); ++c)
            if (int(c) != mcol && int(c) != rcol) task += (task.empty() ? "" : " ") + r.cells[c];
        const std::string& m = r.cells[size_t(mcol)];
        const std::string& z = r.cells[size_t(rcol)];
        if (std::find(methods.begin(), methods.end(), m) == methods.end()) methods.push_back(m);
        if (std::find(tasks.begin(), tasks.end(), task) == tasks.end()) tasks.push_back(task);
        if (z == "-" || z.empty()) {
            dense[m][task] = r.value;
            continue;
        }
        if (std::find(sizes.begin(), sizes.end(), z) == sizes.end()) sizes.push_back(z);
        at[m][z][task] = r.value;
    }
    std::sort(sizes.begin(), sizes.end(), [](const std::string& a, const std::string& b) { return std::atof(a.c_str()) < std::atof(b.c_str()); });
    const bool ratio = t.columns[size_t(rcol)] == "kv_cache.ratio", compression = t.columns[size_t(rcol)] == "kv_cache.compression_ratio";
    const bool threshold = t.columns[size_t(rcol)] == "kv_cache.score_threshold";
    std::ostringstream os;
    os << t.metric << ": mean +- standard error over tasks (n = tasks), " << tasks.size() << " task" << (tasks.size() == 1 ? "" : "s");
    if (ratio) os << "; columns: kv_cache.ratio, the kept fraction of each sequence (kvpress's compression ratio is 1 - it)";
    if (compression) os << "; columns: kv_cache.compression_ratio r, the fraction of each context dropped (floor((1 - r) T) kept)";
    if (threshold)
        os << "; columns: kv_cache.score_threshold t, each method as dms over its scores (the context slots scoring >= t kept, "
              "the kept size an outcome)";
    os << "\n\n| method |";
    for (const auto& z : sizes) os << " " << (ratio ? "kept " : compression ? "r = " : threshold ? "t = " : "L = ") << z << " |";
    os << "\n|---|";
    for (size_t i = 0; i < sizes.size(); ++i) os << "---|";
    os << "\n";
    auto cell = [&](const std::map<std::string, double>& by_task) {
        std::vector<double> v;
        for (const auto& [task, x] : by_task) v.push_back(x);
        if (v.empty()) return std::string("-");
        const storage::MeanSe m = storage::mean_and_se(v);
        return num(m.mean, 4) + " +- " + num(m.se, 2) + " (" + std::to_string(m.n) + ")";
    };
    for (const auto& m : methods) {
        // A threshold row is kvpress's DMSPress over the method's scorer; dense has no threshold.
        os << "| " << (threshold && !dense.count(m) ? "dms(" + m + ")" : m) << " |";
        for (const auto& z : sizes) {
            if (dense.count(m)) os << " " << cell(dense[m]) << " |";
            else os << " " << (at[m].count(z) ? cell(at[m][z]) : "-") << " |";
        }
        os << "\n";
    }
    return os.str();
}

}  // namespace kv::sessions
