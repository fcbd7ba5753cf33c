// The needle-in-a-haystack heat map of a session (see plot_commands.h).
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "engine/core/error.h"
#include "engine/data/ruler.h"
#include "plot_commands.h"
#include "sessions/sweep_results.h"
#include "storage/needle_grid.h"
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
    // The runs: the needle tasks, those asked for, matching --where; the grid itself is the
    // one the sweep view draws (storage/needle_grid.h).
    auto config_of = [](const storage::RunInfo& r, RunConfig& cfg) {
        try {
            cfg = run_config_from_json(r.config, "run");
            return true;
        } catch (const Error&) {
            return false;
        }
    };
    const storage::NeedleGrid g = storage::needle_grid(
        rd,
        [&](const storage::RunInfo& r) {
            RunConfig cfg;
            if (!runs.empty() && std::find(runs.begin(), runs.end(), r.id) == runs.end()) return false;
            if (!config_of(r, cfg)) return false;
            const bool needle_task = cfg.data.name == "needle" || cfg.data.name == "passkey" || is_ruler_task(cfg.data.name);
            return needle_task && sessions::run_matches_where(cfg, where);
        },
        [&](const storage::RunInfo& r) {
            RunConfig cfg;
            return by.empty() || !config_of(r, cfg) ? std::string() : sessions::run_option_value(cfg, by);
        });
    if (g.panels.empty())
        throw Error(str("no done run in ", session_path,
                        " answers needles at set depths; expected runs of --data needle (passkey, or a RULER one-needle task such as niah_single) with --data.depths, e.g. kvlab sweep "
                        "MODEL --data needle --data.depths 0,0.25,0.5,0.75,1 --data.num_samples 10 --data.seq_length 1024,2048 --session ",
                        session_path));
    plot::Heatmap h;
    h.x_title = "sequence length (tokens)";
    h.y_title = "needle depth (0 = start of the context)";
    h.value_title = "needles found (mean of samples)";
    for (int64_t T : g.lengths) h.x_labels.push_back(std::to_string(T));
    for (double d : g.depths) h.y_labels.push_back(label(d));
    for (const storage::NeedleGridPanel& p : g.panels) h.panels.push_back({p.title, p.values});
    return h;
}

}  // namespace kv::cli
