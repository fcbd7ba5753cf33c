// What a Canvas holds: the session reader, the selection and one slot per entry of the view
// table (views/view_table.h: "if active, refresh and draw"). Exposed so tests, exports and the
// bench can read what the views derived (state<CompareViewState>()) and set view options
// directly; the host normally uses only canvas.h.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "storage/run_info.h"
#include "views/canvas.h"
#include "views/view_table.h"

namespace kv::storage {
class SessionReader;
}

namespace kv::views {

// The run a comparison of `runs` is measured against: the first dense run, else the first.
int64_t default_reference(storage::SessionReader* reader, const std::vector<int64_t>& runs);

struct CanvasImpl {
    TextureHost* textures = nullptr;
    std::string path;
    std::unique_ptr<storage::SessionReader> reader;
    std::vector<int64_t> runs;
    int64_t reference = 0;
    ViewKind view{};  // the table's first view
    bool show_view_tabs = true;  // the canvas draws its own view switcher (the host may hide it)
    std::vector<storage::RunInfo> infos;  // of the selected runs, refreshed every refresh()
    std::string error;
    // The views hold nothing yet for what the selection or view now shows (or a view's refresh
    // stopped at its time budget): the host must refresh even when no run is live. Served as a
    // draw request, so a finished run opened from disk loads without a live timer.
    bool needs_refresh = false;
    size_t session_runs = 0;  // runs in the session at open/refresh (empty-state wording)

    std::vector<std::unique_ptr<ViewSlot>> slots;  // one per view_table() entry, in its order

    CanvasImpl();
    // The state of the view whose slot holds a State (each view's state type is its own).
    template <class State>
    State& state() {
        for (auto& slot : slots)
            if (auto* s = dynamic_cast<StateSlot<State>*>(slot.get())) return s->state;
        throw std::logic_error("no view in the view table holds this state type");
    }
    ViewSlot& slot(ViewKind k) { return *slots[k.index()]; }

    // What the canvas shows instead of a view ("" when a view draws): no session, no run
    // selected, or several runs in a single-run view. Never "nothing recorded" for a selection.
    std::string empty_state() const;
    // Resets every view's state for the current selection (textures released first).
    void reset_views();
    // Refreshes the state of view `k` (the active one in refresh()).
    bool refresh_view(ViewKind k);
};

}  // namespace kv::views
