// `kvlab plot FILE --x kv_cache.cache_length --y perplexity --by kv_cache.name [--facet OPTION]
// -o fig.svg|png|pdf`: any recorded metric against any run option, from a session's done runs.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <tuple>

#include "commands.h"
#include "engine/core/error.h"
#include "engine/core/split.h"
#include "plot/render.h"
#include "plot_commands.h"
#include "sessions/sweep_grid.h"
#include "sessions/sweep_results.h"
#include "storage/run_experiment.h"
#include "storage/session.h"
#include "storage/session_reader.h"

namespace kv::cli {

namespace {

// Axis titles with units for the options and metrics people plot most; others as named.
std::string axis_title(const std::string& name) {
    static const std::map<std::string, std::string> titles = {
        {"kv_cache.cache_length", "cache length L (slots per layer)"},
        {"kv_cache.ratio", "cache size (fraction of the sequence)"},
        {"data.seq_length", "sequence length (tokens)"},
        {"kv_cache.chunk_size", "chunk size (tokens)"},
        {"data.repeat_distance", "distance between the copies (tokens)"},
        {"data.repeat_length", "passage length (tokens)"},
        {"perplexity", "perplexity (exp of mean loss per token)"},
        {"mean_loss", "mean loss (nats per token)"},
        {"accuracy", "accuracy (fraction of samples)"},
        {"copy_exact", "exact copies (fraction of samples)"},
        {"copy_prefix", "copied before the first error (fraction of the passage)"},
        {"copy_token_accuracy", "copied tokens (fraction)"},
        {"tokens_per_s", "throughput (tokens/s)"},
        {"kv_bytes", "KV cache (bytes)"},
        {"kv_bits_per_element", "KV storage (bits per element)"},
        {"seconds", "run time (s)"},
        {"fidelity_kept_mass", "kept attention mass (mean over layers and chunks)"},
        {"fidelity_attn_rel_error", "attention output error vs dense (relative L2)"},
        {"fidelity_next_token_kl", "next-token KL vs dense (nats per token)"},
        {"fidelity_oracle_mass", "oracle's kept mass (best set, same size)"},
        {"fidelity_efficiency", "efficiency: kept mass / the oracle's"},
        {"layer", "layer"},
    };
    auto it = titles.find(name);
    return it == titles.end() ? name : it->second;
}

// --x layer: per-layer fidelity means, from the fidelity_layers list of the runs' summaries
// (sessions/run_execution.cpp writes it), keyed by the quantity without "fidelity_".
constexpr const char* kLayerAxis = "layer";
const char* const kPerLayerMetrics[] = {"fidelity_attn_rel_error", "fidelity_kept_mass", "fidelity_oracle_mass", "fidelity_efficiency"};

bool is_per_layer_metric(const std::string& y) {
    return std::find(std::begin(kPerLayerMetrics), std::end(kPerLayerMetrics), y) != std::end(kPerLayerMetrics);
}

// --x step: a metric's values per step from the metrics table (a training run's loss per
// optimizer step; an evaluation's kv_logical_bytes / kv_physical_bytes per chunk, at the run's
// tokens through it). --y may name several metrics, one line each.
constexpr const char* kStepAxis = "step";

bool is_kv_bytes_metric(const std::string& y) { return y == "kv_logical_bytes" || y == "kv_physical_bytes"; }

bool parse_number(const std::string& s, double* out) {
    char* end = nullptr;
    errno = 0;
    *out = std::strtod(s.c_str(), &end);
    return !s.empty() && !*end && errno != ERANGE && std::isfinite(*out);
}

// A summary key as the runs write them (kv_bytes, seconds): lower-case letters, digits, '_'.
bool is_plain_key(const std::string& name) {
    if (name.empty()) return false;
    for (char c : name)
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
    return true;
}

bool is_run_option(const std::string& name) {
    try {
        sessions::run_option_value(RunConfig{}, name);
        return true;
    } catch (const Error&) {
        return false;
    }
}

std::vector<int64_t> parse_ids(const std::string& v) {
    std::vector<int64_t> ids;
    for (const std::string& one : split(v)) {
        char* end = nullptr;
        long long id = std::strtoll(one.c_str(), &end, 10);
        if (one.empty() || *end || id <= 0) throw UsageError("--runs: '" + one + "' is not a run id; expected numbers like 1,2,3");
        ids.push_back(id);
    }
    return ids;
}

// Byte counts of the runs' summaries: drawn in MiB, log2 scale; they place every cache
// (dense runs are references on them).
bool is_bytes_axis(const std::string& x) { return x == "kv_bytes" || x == "kv_physical_bytes" || x == "kv_logical_bytes"; }

}  // namespace

bool figure_x_is_bytes(const std::vector<RunConfig>& configs) {
    std::set<std::string> storage;
    bool budget = false;
    for (const RunConfig& c : configs) {
        if (c.kv_cache.policy() == "dense") continue;  // references: on any axis
        storage.insert(str(c.kv_cache.buffer(), "/", c.kv_cache.key_bits, "/", c.kv_cache.value_bits));
        budget = budget || c.kv_cache.budget_bytes != 0 || c.kv_cache.budget_ratio != 0.0;
    }
    return budget || storage.size() > 1;
}

plot::Figure session_figure(storage::Session& session, const std::vector<int64_t>& runs, const std::string& x, const std::string& y,
                            const std::string& by, const std::string& facet,
                            const std::vector<std::pair<std::string, std::string>>& where) {
    plot::Figure fig;
    fig.x_title = x == "kv_bytes"            ? "KV cache held (MiB, the runs' kv_bytes)"
                  : x == "kv_physical_bytes" ? "KV cache stored (MiB: codes and scales of all layers)"
                  : x == "kv_logical_bytes"  ? "KV slots kept (MiB)"
                                             : axis_title(x);
    fig.y_title = axis_title(y);
    const bool steps = x == kStepAxis;
    const std::vector<std::string> ys = steps ? split(y) : std::vector<std::string>{y};
    if (!steps && y.find(',') != std::string::npos)
        throw UsageError("--y '" + y + "': several metrics need --x step (their values per step); expected one metric");
    const bool step_bytes = steps && std::all_of(ys.begin(), ys.end(), is_kv_bytes_metric);
    if (steps) {
        fig.integer_x = true;
        fig.x_title = step_bytes ? "tokens through the chunk (the run's, over its samples)" : "step";
        fig.y_title = step_bytes ? "KV cache (MiB): kept (logical) and held (physical), all layers" : ys.size() == 1 ? axis_title(y) : y;
    }
    std::unique_ptr<storage::SessionReader> metrics;  // --x step: the runs' metrics table
    // x may also be a number of the runs' summaries (kv_bytes: the cache's real bytes, so
    // buffers of different bits per element compare by memory, not slots).
    if (x == kLayerAxis && !is_per_layer_metric(y)) {
        std::string names;
        for (const char* m : kPerLayerMetrics) names += (names.empty() ? "" : ", ") + std::string(m);
        throw UsageError("--x layer: '" + y + "' has no per-layer values; expected --y one of " + names);
    }
    if (x == kLayerAxis) fig.integer_x = true;
    const bool x_summary = !is_run_option(x) && x != kLayerAxis && !steps;
    const bool x_is_cache = sessions::is_cache_option(x) || is_bytes_axis(x);
    fig.log2_x = x == "kv_cache.cache_length" || x == "kv_cache.ratio" || x == "data.seq_length" || x == "kv_cache.chunk_size" ||
                 is_bytes_axis(x);
    // First the runs that can be drawn, then what tells them apart: runs whose configurations
    // differ in anything but the figure's own axes are separate lines (and references), never
    // one; repeated runs of one configuration are one point, their mean and standard error.
    struct Row {
        int64_t id;
        storage::FlatConfig config;
        std::string panel, series;
        bool reference;
        double x, y;
    };
    std::vector<Row> rows;
    int used = 0, x_found = 0;
    for (const auto& r : session.runs()) {
        if (r.status != storage::RunStatus::DONE) continue;
        if (!runs.empty() && std::find(runs.begin(), runs.end(), r.id) == runs.end()) continue;
        RunConfig cfg;
        try {
            cfg = run_config_from_json(r.config, "run");
        } catch (const Error&) {
            continue;
        }
        if (!sessions::run_matches_where(cfg, where)) continue;
        if (steps) {  // one point per recorded step of each metric
            if (!metrics) metrics = std::make_unique<storage::SessionReader>(session.path());
            bool any = false;
            for (const std::string& name : ys)
                for (const storage::MetricRow& m : metrics->metrics(r.id, name)) {
                    std::string series = by.empty() ? name : sessions::run_option_value(cfg, by);
                    if (ys.size() > 1) series += " | " + name;
                    rows.push_back({r.id, storage::flat_run_config(r.config), facet.empty() ? "" : sessions::run_option_value(cfg, facet),
                                    series, false, double(m.step), is_kv_bytes_metric(name) ? m.value / 1048576.0 : m.value});
                    any = true;
                }
            used += any;
            x_found += any;
            continue;
        }
        nlohmann::json s = nlohmann::json::parse(r.summary.empty() ? "{}" : r.summary, nullptr, false);
        if (s.is_discarded() || !s.contains(y) || !s[y].is_number()) continue;
        if (x == kLayerAxis && cfg.kv_cache.policy() == "dense") {  // exact in every layer: a level, not a line
            rows.push_back({r.id, storage::flat_run_config(r.config), facet.empty() ? "" : sessions::run_option_value(cfg, facet),
                            cfg.kv_cache.name == "dense-default" ? "dense" : cfg.kv_cache.name, true, 0, s[y].get<double>()});
            ++used;
            continue;
        }
        if (x == kLayerAxis) {  // one point per layer of the run's per-layer means
            const std::string key = y.substr(std::string("fidelity_").size());
            if (!s.contains("fidelity_layers") || !s["fidelity_layers"].is_array()) continue;
            bool any = false;
            for (const auto& l : s["fidelity_layers"]) {
                if (!l.contains(key) || !l[key].is_number() || !l.contains("layer")) continue;
                rows.push_back({r.id, storage::flat_run_config(r.config), facet.empty() ? "" : sessions::run_option_value(cfg, facet),
                                by.empty() ? y : sessions::run_option_value(cfg, by), false, l["layer"].get<double>(), l[key].get<double>()});
                any = true;
            }
            used += any;
            x_found += any;
            continue;
        }
        Row row{r.id, storage::flat_run_config(r.config), facet.empty() ? "" : sessions::run_option_value(cfg, facet), "", false, 0,
                s[y].get<double>()};
        ++used;
        if (x_is_cache && cfg.kv_cache.policy() == "dense") {  // the full cache: a level, not a point
            row.reference = true;
            row.series = cfg.kv_cache.name == "dense-default" ? "dense" : cfg.kv_cache.name;
            rows.push_back(std::move(row));
            continue;
        }
        if (x_summary) {
            if (!s.contains(x) || !s[x].is_number()) continue;  // a run that does not record it
            row.x = s[x].get<double>();
            if (is_bytes_axis(x)) row.x /= 1048576.0;  // MiB: byte counts make unreadable tick labels
            ++x_found;
        } else {
            const std::string xs = sessions::run_option_value(cfg, x);
            if (!parse_number(xs, &row.x)) throw Error(str("--x ", x, ": run ", r.id, " has '", xs, "', not a number; expected a numeric option"));
        }
        row.series = by.empty() ? y : sessions::run_option_value(cfg, by);
        // on bytes, caches of one series value could meet at one x: never one point
        if (is_bytes_axis(x) && by != "kv_cache.name") row.series += " | " + cfg.kv_cache.name;
        rows.push_back(std::move(row));
    }
    // The figure's axes as stored fields: derived options stand for what they are made of.
    std::vector<std::string> axes = {"mode"};
    for (const std::string& o : {x, by, facet}) {
        if (o.empty()) continue;
        axes.push_back(o);
        if (o == "data" || o == "model") axes.push_back(o + ".name");
        if (o == "kv_cache.ratio" || is_bytes_axis(o)) axes.push_back("kv_cache.cache_length");
        // bytes: the budget that chose the length (or a score threshold the kept size) is the x value, not another experiment
        if (is_bytes_axis(o)) axes.insert(axes.end(), {"kv_cache.budget_bytes", "kv_cache.budget_ratio", "kv_cache.score_threshold"});
    }
    if (x == kLayerAxis) axes.push_back("kv_cache.cache_length");  // dense runs are references there too
    if (x_is_cache || x == kLayerAxis) axes.push_back("kv_cache.name");  // dense runs are references whatever the line option
    if (steps && by == "kv_cache.name") {
        // A cache's length belongs to it: not another experiment when every line (cache) has one
        // value (dense's whole sequence beside h2o's L); when one cache has several, they stay apart.
        for (const char* f : {"kv_cache.cache_length", "kv_cache.prefill_length"}) {
            std::map<std::string, std::set<std::string>> per_line;
            for (const Row& row : rows) {
                auto it = row.config.find(f);
                per_line[row.series].insert(it == row.config.end() ? "" : it->second);
            }
            if (std::all_of(per_line.begin(), per_line.end(), [](const auto& kv) { return kv.second.size() == 1; })) axes.push_back(f);
        }
    }
    std::vector<storage::FlatConfig> configs;
    for (const Row& row : rows) configs.push_back(row.config);
    const std::vector<std::string> fields = storage::differing_fields(configs, axes);
    // (panel, series label, reference?, x) -> runs' values, in first-seen order
    std::map<std::tuple<std::string, std::string, bool, double>, std::vector<double>> cells;
    std::vector<std::tuple<std::string, std::string, bool, double>> order;
    for (const Row& row : rows) {
        const std::string exp = storage::experiment_label(row.config, fields);
        const auto key = std::make_tuple(row.panel, exp.empty() ? row.series : row.series + " | " + exp, row.reference, row.x);
        if (!cells.count(key)) order.push_back(key);
        cells[key].push_back(row.y);
    }
    std::map<std::string, size_t> panel_of;
    int repeated = 0;
    for (const auto& key : order) {
        const auto& [fv, label, reference, xv] = key;
        if (!panel_of.count(fv)) {
            panel_of[fv] = fig.panels.size();
            fig.panels.push_back({facet.empty() ? "" : facet + " = " + fv, {}, {}});
        }
        plot::Panel& panel = fig.panels[panel_of[fv]];
        const storage::MeanSe m = storage::mean_and_se(cells[key]);
        repeated += m.n > 1;
        if (reference) {
            panel.references.push_back({m.n > 1 ? label + " (mean of " + std::to_string(m.n) + ")" : label, m.mean});
            continue;
        }
        auto it = std::find_if(panel.series.begin(), panel.series.end(), [&](const plot::Series& se) { return se.label == label; });
        if (it == panel.series.end()) {
            panel.series.push_back({label, {}, {}, {}});
            it = panel.series.end() - 1;
        }
        it->x.push_back(xv);
        it->y.push_back(m.mean);
        it->se.push_back(m.se);
    }
    if (!fields.empty()) {
        std::string f;
        for (const std::string& s : fields) f += (f.empty() ? "" : ", ") + s;
        fig.notes.push_back("runs differ in " + f + ": one line each (after \"|\")");
    }
    if (repeated) fig.notes.push_back(std::to_string(repeated) + " point" + (repeated == 1 ? " is the mean" : "s are means") +
                                      " of repeated runs; bars: +-1 standard error");
    if (!used && steps)
        throw Error(str("--x step: no done run", runs.empty() ? "" : " of those selected", " in ", session.path(), " records '", y,
                        "' per step; expected metrics of the runs' metrics table (kvlab sql ", session.path(), " metrics --run N)"));
    if (!used) throw Error(str("no done run", runs.empty() ? "" : " of those selected", " in ", session.path(), " records '", y,
                               "'; expected a metric of the runs' summaries (kvlab runs ", session.path(), " --json)"));
    if (x_summary && !x_found)
        throw Error(str("--x ", x, ": no done run that records '", y, "' has it; expected a run option or a number of the runs' summaries (e.g. kv_bytes)"));
    bool any_point = false;
    for (const auto& p : fig.panels) any_point = any_point || !p.series.empty();
    if (!any_point) throw Error(str("only dense runs record '", y, "'; nothing to draw against ", x));
    return fig;
}

bool write_session_figure(storage::Session& session, const std::vector<int64_t>& runs, const std::string& x, const std::string& y,
                          const std::string& by, const std::string& facet, const std::string& path, std::string* message) {
    try {
        plot::render_figure(session_figure(session, runs, x, y, by, facet), path);
        return true;
    } catch (const std::exception& e) {
        *message = e.what();
        return false;
    }
}

int cmd_plot(int argc, char** argv, int first) {
    // A figure of recorded runs: no threads, memory budget or device to choose.
    std::vector<OptionSpec> specs = {{"help", OptKind::FLAG, "", "show help for this command"}};
    specs.push_back({"x", OptKind::STRING, "kv_physical_bytes when the runs differ in buffer or use budget_bytes, else kv_cache.cache_length",
                     "run option on the x axis, or a number of the runs' summaries such as kv_bytes (log2 scale for sizes and lengths); "
                     "'layer': the per-layer means of a --fidelity run (--y fidelity_efficiency, fidelity_kept_mass, "
                     "fidelity_oracle_mass or fidelity_attn_rel_error); 'step': a metric's values per step from the runs' "
                     "metrics table (training loss per step; kv_logical_bytes and kv_physical_bytes per chunk, at the tokens "
                     "through it)"});
    specs.push_back({"y", OptKind::STRING, "perplexity",
                     "metric from the runs' summaries on the y axis; with --x step, one or more metrics (comma-separated)"});
    specs.push_back({"by", OptKind::STRING, "kv_cache.name", "one line per value of this option"});
    specs.push_back({"facet", OptKind::STRING, "", "one panel per value of this option (e.g. kv_cache.buffer, data)"});
    specs.push_back({"runs", OptKind::STRING, "all done runs", "comma-separated run ids"});
    specs.push_back({"where", OptKind::STRING, "", "only runs with these option values: OPTION=V1[|V2...][;OPTION=...]"});
    specs.push_back({"heatmap", OptKind::STRING, "",
                     "a heat map instead of lines: 'needle' (needle depth x sequence length, colour = needles found; done runs of "
                     "--data needle, passkey or a RULER one-needle task (niah_single) with --data.depths), one panel per --by value"});
    specs.push_back({"title", OptKind::STRING, "", "figure title"});
    specs.push_back({"output", OptKind::STRING, "", "output file: .svg, .png or .pdf (also -o PATH)"});
    // "-o PATH" is the conventional spelling; the option parser only knows "--name".
    std::vector<std::string> plot_args(argv, argv + argc);
    for (size_t i = size_t(first); i < plot_args.size(); ++i)
        if (plot_args[i] == "-o") plot_args[i] = "--output";
    std::vector<char*> av;
    for (auto& s : plot_args) av.push_back(s.data());
    Args args(int(av.size()), av.data(), first, specs);
    if (args.flag("help") || args.positional().empty()) {
        std::printf("usage: kvlab plot FILE --x OPTION --y METRIC [--by OPTION] [--facet OPTION] -o fig.svg|png|pdf\n"
                    "       kvlab plot FILE --heatmap needle [--by OPTION] -o map.svg|png|pdf\n\n"
                    "Draws a metric of a session's done runs against a run option, one line per --by value; with a\n"
                    "cache option on x, dense runs are a dashed reference line. Runs whose configurations differ in\n"
                    "anything else (sequence length, samples, chunking, model, fidelity, ...) are separate lines;\n"
                    "repeated runs of one configuration are one point: their mean, with a bar of +-1 standard error.\n\n%s",
                    format_options(specs).c_str());
        return args.flag("help") ? 0 : 2;
    }
    if (args.positional().size() > 1) throw UsageError("plot: unexpected argument '" + args.positional()[1] + "'; expected one session FILE");
    const std::string out = args.str("output", "");
    if (out.empty()) throw UsageError("plot: missing -o FILE; expected e.g. -o fig.svg (or .png, .pdf)");
    if (plot::figure_format(out).empty()) throw UsageError("-o: '" + out + "' is not a figure file; expected a name ending in .svg, .png or .pdf");
    std::string x = args.str("x", ""), by = args.str("by", "kv_cache.name"), facet = args.str("facet", "");
    for (const auto& [flag, opt] : {std::pair<std::string, std::string>{"x", x}, {"by", by}, {"facet", facet}}) {
        if (opt.empty() || (flag == "x" && !is_run_option(opt) && is_plain_key(opt))) continue;  // x: a summary number
        try {
            sessions::run_option_value(RunConfig{}, opt);
        } catch (const Error& e) {
            throw UsageError("--" + flag + ": " + e.what());
        }
    }
    const std::vector<int64_t> ids = args.has("runs") ? parse_ids(args.str("runs")) : std::vector<int64_t>{};
    std::vector<std::pair<std::string, std::string>> where;
    for (std::string rest = args.str("where", ""); !rest.empty();) {
        const size_t semi = rest.find(';');
        const std::string one = rest.substr(0, semi);
        rest = semi == std::string::npos ? "" : rest.substr(semi + 1);
        const size_t eq = one.find('=');
        if (eq == std::string::npos || eq == 0)
            throw UsageError("--where: '" + one + "' is not OPTION=VALUE; expected e.g. --where data.seed=1234");
        where.push_back({one.substr(0, eq), one.substr(eq + 1)});
        try {
            sessions::run_option_value(RunConfig{}, where.back().first);
        } catch (const Error& e) {
            throw UsageError(std::string("--where: ") + e.what());
        }
    }
    if (const std::string hm = args.str("heatmap", ""); !hm.empty()) {
        if (hm != "needle") throw UsageError("--heatmap: '" + hm + "' is not a heat map; expected needle");
        plot::Heatmap h = needle_heatmap(args.positional()[0], ids, by, where);
        h.title = args.str("title", "");
        plot::render_heatmap(h, out);
        std::fprintf(stderr, "kvlab plot: wrote %s\n", out.c_str());
        return 0;
    }
    auto session = storage::Session::open(args.positional()[0]);
    if (x.empty()) {  // by default, bytes when the runs' slots hold different bytes
        std::vector<RunConfig> configs;
        for (const auto& r : session->runs()) {
            if (r.status != storage::RunStatus::DONE || (!ids.empty() && std::find(ids.begin(), ids.end(), r.id) == ids.end())) continue;
            try {
                RunConfig c = run_config_from_json(r.config, "run");
                if (sessions::run_matches_where(c, where)) configs.push_back(std::move(c));
            } catch (const Error&) {
            }
        }
        x = figure_x_is_bytes(configs) ? "kv_physical_bytes" : "kv_cache.cache_length";
        std::fprintf(stderr, "kvlab plot: x axis %s\n", x.c_str());
    }
    plot::Figure fig = session_figure(*session, ids, x, args.str("y", "perplexity"), by, facet, where);
    fig.title = args.str("title", "");
    plot::render_figure(fig, out);
    for (const std::string& n : fig.notes) std::fprintf(stderr, "kvlab plot: %s\n", n.c_str());
    std::fprintf(stderr, "kvlab plot: wrote %s\n", out.c_str());
    return 0;
}

}  // namespace kv::cli
