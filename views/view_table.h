// The one table of views. Each view file describes itself in a ViewEntry (its name, how many
// runs it shows, and a factory for its slot: the view's state behind the calls the canvas
// makes); view_table.cpp lists the entries once, in tab order. The canvas, the app's tab bar,
// the settings and the tests all read this table, so a new view is its own two files and one
// line there (docs/ARCHITECTURE.md, "Add a view").
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "imgui.h"
#include "views/canvas.h"

namespace kv::storage {
class SessionReader;
}

namespace kv::views {

// What a view is told when the selection changes.
struct ViewSelection {
    const std::vector<int64_t>& runs;  // the selected runs, in order (1..8)
    int64_t reference = 0;             // the run comparisons are measured against
    TextureHost* textures = nullptr;
};

// A view's state and the calls the canvas makes on it. A view implements it once, over its
// own state struct (StateSlot<State>), in its own .cpp.
class ViewSlot {
   public:
    virtual ~ViewSlot() = default;
    // A new selection (or session): release what was uploaded and reset what it shows.
    virtual void select(const ViewSelection& sel) = 0;
    // The reference run changed, the selection did not (compare re-measures against it).
    virtual void set_reference(const ViewSelection& sel) { (void)sel; }
    // A new session: forget everything, including state kept across selections.
    virtual void clear(TextureHost* textures) { release(textures); }
    // Reads rows newer than what the state holds; true when anything arrived.
    virtual bool refresh(storage::SessionReader& reader) = 0;
    // Draws from the state only (no queries on the draw path).
    virtual void draw(TextureHost* textures, ImVec2 size) = 0;
    virtual void release(TextureHost* textures) { (void)textures; }
    // Reads a frame asked for but could not draw from memory (zoomed windows, hover details).
    virtual bool has_requests() const { return false; }
    virtual bool serve_requests(storage::SessionReader& reader) {
        (void)reader;
        return false;
    }
    // A run the user picked inside the view, for the host to select; 0 when none (clears it).
    virtual int64_t take_requested_run() { return 0; }
};

template <class State>
class StateSlot : public ViewSlot {
   public:
    State state{};
};

struct ViewEntry {
    const char* name = "";      // the tab's label and the name hosts and settings use
    int min_runs = 1;           // with fewer runs selected the view is hidden (compare: 2)
    bool several_runs = false;  // shows every selected run (else one run, and says so)
    // Selecting several runs keeps this view active; from the others the canvas moves to the
    // view with min_runs 2 (compare).
    bool keeps_several = false;
    std::unique_ptr<ViewSlot> (*make)() = nullptr;
};

// Every view, in tab order; the first is the default.
const std::vector<ViewEntry>& view_table();
const ViewEntry& view_entry(ViewKind k);

}  // namespace kv::views
