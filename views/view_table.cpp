// The view table: one line per view, in tab order (the first is the default view).
#include "views/view_table.h"

#include "views/cell_grid.h"
#include "views/compare_view.h"
#include "views/diff_view.h"
#include "views/eviction_map.h"
#include "views/fidelity_view.h"
#include "views/memory_timeline.h"
#include "views/metrics_view.h"
#include "views/scores_view.h"
#include "views/sweep_view.h"
#include "views/trace_view.h"

namespace kv::views {

const std::vector<ViewEntry>& view_table() {
    static const std::vector<ViewEntry> kViews = {
        eviction_map_view_entry(), scores_view_entry(),  memory_timeline_view_entry(), trace_view_entry(),
        cell_grid_view_entry(),    metrics_view_entry(), compare_view_entry(),         diff_view_entry(),
        fidelity_view_entry(),     sweep_view_entry(),
    };
    return kViews;
}

}  // namespace kv::views
