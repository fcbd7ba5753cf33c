// Fidelity: what a --fidelity run recorded against the dense cache, as layer x chunk heatmaps
// (attention output error, kept attention mass) with a chunk strip of the next-token KL, hover
// values and colour bars, and a per-layer profile (means over chunks). Several selected runs
// are drawn side by side on shared colour scales. Reads the fidelity.* metric rows
// (sessions/run_execution.h names them); live: refresh reads only rows newer than its cursor.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "storage/run_info.h"
#include "views/plot_util.h"

namespace kv::storage {
class SessionReader;
}

namespace kv::views {

enum class FidelityQuantity : uint8_t { ATTN_ERROR = 0, KEPT_MASS, NEXT_TOKEN_KL, COUNT };
const char* fidelity_quantity_title(FidelityQuantity q);

// "fidelity.attn_rel_error.layer3" -> (ATTN_ERROR, 3); "fidelity.next_token_kl" -> (KL, -1).
// False for any other name.
bool parse_fidelity_metric(const std::string& name, FidelityQuantity* q, int* layer);

// One run's fidelity: per quantity a (layers x steps) grid, NaN where nothing was recorded (a
// step is a chunk of a sample: sample * chunks per sample + chunk). The KL has one row.
struct FidelityGrid {
    int64_t run = 0;
    std::string label;  // "run 3 h2o-default L=256"
    int layers = 0;
    int64_t steps = 0;
    std::vector<double> values[size_t(FidelityQuantity::COUNT)];  // row-major: [layer * steps + step]
    int64_t last_id = 0;
    // From the run's row, read again while nothing is recorded: whether the run measures
    // fidelity at all, and whether it can still record (a live run's rows arrive per sample).
    bool fidelity_configured = false, run_final = false;
    double at(FidelityQuantity q, int layer, int64_t step) const;
    // Adds one metric row (grows the grid; a repeated (layer, step) keeps the newest value).
    void add(FidelityQuantity q, int layer, int64_t step, double value);
    // Mean over recorded steps of each layer (NaN for a layer with none).
    std::vector<double> layer_profile(FidelityQuantity q) const;
    bool empty() const { return steps == 0; }
};

struct FidelityViewState {
    std::vector<int64_t> runs;
    std::vector<FidelityGrid> grids;  // per run, same order
    uint64_t version = 0;
    std::string error;
};

void fidelity_select(FidelityViewState& s, const std::vector<int64_t>& runs);
bool refresh_fidelity(FidelityViewState& s, storage::SessionReader& reader);
void DrawFidelityView(FidelityViewState& s, ImVec2 size = ImVec2(0, 0));

// Its entry in the view table (views/view_table.h).
struct ViewEntry;
ViewEntry fidelity_view_entry();
// What the view says when no selected run has fidelity rows yet: recording (a live run launched
// with fidelity), nothing recorded (a run with fidelity that ended first), or how to get some.
std::string fidelity_empty_message(const FidelityViewState& s);

}  // namespace kv::views
