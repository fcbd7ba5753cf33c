// The needle grid of a session (see needle_grid.h).
#include "needle_grid.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <set>

#include "config_fields.h"
#include "session_reader.h"

namespace kv::storage {

NeedleGrid needle_grid(SessionReader& reader, const std::function<bool(const RunInfo&)>& include,
                       const std::function<std::string(const RunInfo&)>& panel_of) {
    struct Sum {
        double s = 0;
        int n = 0;
    };
    std::map<std::string, std::map<std::pair<double, int64_t>, Sum>> cells;  // panel -> (depth, T) -> found
    std::vector<std::string> panels;
    std::set<double> depths;
    std::set<int64_t> lengths;
    for (const RunInfo& r : reader.runs()) {
        if (r.status != RunStatus::DONE || (include && !include(r))) continue;
        // data.depths as stored: the option's text, numbers separated by commas.
        std::vector<double> ds;
        const std::string text = run_config_value(r.config, "data.depths");
        for (size_t a = 0; a < text.size();) {
            const size_t b = std::min(text.find(',', a), text.size());
            char* end = nullptr;
            const std::string item = text.substr(a, b - a);
            const double d = std::strtod(item.c_str(), &end);
            if (!item.empty() && end && *end == '\0' && std::isfinite(d)) ds.push_back(d);
            a = b + 1;
        }
        if (ds.empty()) continue;
        const int64_t T = std::atoll(run_config_value(r.config, "data.seq_length").c_str());
        const std::string panel = panel_of ? panel_of(r) : "";
        for (const MetricRow& m : reader.metrics(r.id, "sample_correct")) {
            if (m.step < 0) continue;
            const double d = ds[size_t(m.step) % ds.size()];
            Sum& c = cells[panel][{d, T}];
            c.s += m.value;
            c.n += 1;
            depths.insert(d);
            lengths.insert(T);
            if (std::find(panels.begin(), panels.end(), panel) == panels.end()) panels.push_back(panel);
        }
    }
    NeedleGrid g;
    g.depths.assign(depths.begin(), depths.end());
    g.lengths.assign(lengths.begin(), lengths.end());
    for (const std::string& p : panels) {
        NeedleGridPanel gp;
        gp.title = p;
        for (double d : g.depths) {
            std::vector<double> row;
            std::vector<int> n;
            for (int64_t T : g.lengths) {
                const auto it = cells[p].find({d, T});
                const bool none = it == cells[p].end() || it->second.n == 0;
                row.push_back(none ? NAN : it->second.s / double(it->second.n));
                n.push_back(none ? 0 : it->second.n);
            }
            gp.values.push_back(std::move(row));
            gp.samples.push_back(std::move(n));
        }
        g.panels.push_back(std::move(gp));
    }
    return g;
}

}  // namespace kv::storage
