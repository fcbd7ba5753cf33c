// Figures of a session's runs (`kvlab plot`, and the figure `kvlab sweep` writes).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/run/run_config.h"
#include "plot/figure.h"
#include "plot/heatmap.h"

namespace kv::storage {
class Session;
}

namespace kv::cli {

// The figure of `y` (a summary metric) against option `x`, one series per value of option
// `by`, one panel per value of option `facet` ("" = one panel). Done runs only (`runs` empty:
// all of them). When x is a cache option, dense runs become a horizontal reference line.
// Throws kv::Error when nothing can be drawn (no run has y, x is not numeric).
// `where`: (option, values) a run must match, values separated by "|", e.g. {"data.seed", "7|99"}.
plot::Figure session_figure(storage::Session& session, const std::vector<int64_t>& runs, const std::string& x,
                            const std::string& y, const std::string& by, const std::string& facet,
                            const std::vector<std::pair<std::string, std::string>>& where = {});

// Whether a figure of these runs' configurations takes the KV bytes the buffers store
// (kv_physical_bytes: codes and scales of all layers, without the shared working buffer) as its
// x axis by default: when the compressing runs differ in their buffer or widths (key_bits,
// value_bits) or any of them sets its length by a byte budget, since slots of different buffers
// hold different bytes.
bool figure_x_is_bytes(const std::vector<RunConfig>& configs);

// session_figure + render; false with the reason in *message instead of throwing.
bool write_session_figure(storage::Session& session, const std::vector<int64_t>& runs, const std::string& x, const std::string& y,
                          const std::string& by, const std::string& facet, const std::string& path, std::string* message);

// The needle-in-a-haystack map of a session (`kvlab plot --heatmap needle`): done runs of a
// depth task (--data needle or passkey) with --data.depths; sample i sits at depth
// depths[i % n] (engine/run/evaluate.cpp), so each cell (depth, data.seq_length) is the mean of
// the samples' sample_correct there, over every matching run; one panel per value of `by`.
// Throws kv::Error when no run qualifies.
plot::Heatmap needle_heatmap(const std::string& session_path, const std::vector<int64_t>& runs, const std::string& by,
                             const std::vector<std::pair<std::string, std::string>>& where = {});

int cmd_plot(int argc, char** argv, int first);

}  // namespace kv::cli
