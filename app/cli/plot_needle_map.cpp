// The needle-in-a-haystack heat map of a session (see plot_commands.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "engine/core/error.h"
#include "engine/data/ruler.h"
#include "plot_commands.h"
#include "sessions/sweep_results.h"
#include "storage/session_reader.h"

namespace kv::cli {

namespace {

std::string label(double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", v);
    return b;
}

}  // namespace

plot::Heatmap needle_heatmap(const std::string& session_path, const std::vector<int64_t>& runs, const std::string& by,
                             const std::vector<std::pair<std::string, std::string>>& where) {
    storage::SessionReader rd(session_path);
    struct Sum {
        double s = 0;
        int n = 0;
    };
    std::map<std::string, std::map<std::pair<double, int64_t>, Sum>> cells;  // panel -> (depth, T) -> correct
    std::vector<std::string> panels;
    std::set<double> depths;
    std::set<int64_t> lengths;
    for (const auto& r : rd.runs()) {
        if (r.status != storage::RunStatus::DONE) continue;
        if (!runs.empty() && std::find(runs.begin(), runs.end(), r.id) == runs.end()) continue;
        RunConfig cfg;
        try {
            cfg = run_config_from_json(r.config, "run");
        } catch (const Error&) {
            continue;
        }
        const bool needle_task = cfg.data.name == "needle" || cfg.data.name == "passkey" || is_ruler_task(cfg.data.name);
        if (!needle_task || cfg.data.depths.empty() || !sessions::run_matches_where(cfg, where)) continue;
        const std::string panel = by.empty() ? "" : sessions::run_option_value(cfg, by);
        for (const auto& m : rd.metrics(r.id, "sample_correct")) {
            if (m.step < 0) continue;
            const double d = cfg.data.depths[size_t(m.step) % cfg.data.depths.size()];
            Sum& c = cells[panel][{d, cfg.data.seq_length}];
            c.s += m.value;
            c.n += 1;
            depths.insert(d);
            lengths.insert(cfg.data.seq_length);
            if (std::find(panels.begin(), panels.end(), panel) == panels.end()) panels.push_back(panel);
        }
    }
    if (panels.empty())
        throw Error(str("no done run in ", session_path,
                        " answers needles at set depths; expected runs of --data needle (passkey, or a RULER one-needle task such as niah_single) with --data.depths, e.g. kvlab sweep "
                        "MODEL --data needle --data.depths 0,0.25,0.5,0.75,1 --data.num_samples 10 --data.seq_length 1024,2048 --session ",
                        session_path));
    plot::Heatmap h;
    h.x_title = "sequence length (tokens)";
    h.y_title = "needle depth (0 = start of the context)";
    h.value_title = "needles found (mean of samples)";
    for (int64_t T : lengths) h.x_labels.push_back(std::to_string(T));
    for (double d : depths) h.y_labels.push_back(label(d));
    for (const auto& p : panels) {
        plot::HeatmapPanel hp;
        hp.title = by.empty() ? "" : p;
        for (double d : depths) {
            std::vector<double> row;
            for (int64_t T : lengths) {
                const auto it = cells[p].find({d, T});
                row.push_back(it == cells[p].end() || it->second.n == 0 ? NAN : it->second.s / double(it->second.n));
            }
            hp.values.push_back(std::move(row));
        }
        h.panels.push_back(std::move(hp));
    }
    return h;
}

}  // namespace kv::cli
