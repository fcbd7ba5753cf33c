// Diff view: where two runs' time and memory differ, the numbers `kvlab diff` prints
// (storage/run_diff.h) as one sortable table: time and count per span name and per GPU kernel,
// memcpy and memset, self time per phase, peak bytes per memory category (whole run and per
// chunk), kept-slot overlap per layer and the summary numbers that differ. A section picker and
// a name filter narrow it; B - A is drawn as a bar scaled to the largest difference shown.
// Run A is the selection's reference, B the first other selected run.
// Reading two large runs takes seconds, so refresh hands it to a worker thread with its own
// read-only connection: frames keep drawing (a progress bar, or the previous diff while a live
// run is re-read) and the result is swapped in by a later refresh (or the slot's draw
// requests, which the host serves after each frame).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "imgui.h"
#include "storage/run_diff.h"
#include "views/canvas.h"

namespace kv::storage {
class SessionReader;
}

namespace kv::views {

struct DiffJob;  // a computation in flight (diff_view.cpp): its thread, stage and result

// Sort keys of the table's columns.
enum class DiffColumn : uint8_t { NAME = 0, DETAIL, COUNT_A, COUNT_B, A, B, B_MINUS_A, B_OVER_A };

struct DiffViewState {
    int64_t run_a = 0, run_b = 0;  // 0: fewer than two runs selected
    std::string name_a, name_b;
    storage::RunDiffInput in_a, in_b;
    storage::RunDiff diff;
    bool have_diff = false;
    bool settled = false;  // both runs had ended when last read: nothing will change
    std::chrono::steady_clock::time_point read_at{};
    double reread_interval_s = 2.0;  // a live run is re-read at most this often
    uint64_t version = 0;            // bumps when the diff is recomputed
    std::string error;
    // The worker reading both runs (null when none runs). Dropping it (a new selection) asks it
    // to stop after its current read and waits for that.
    std::shared_ptr<DiffJob> job;
    std::function<void()> worker_hook;  // tests: runs on the worker before it reads
    double poll_ms = 30;                // draw requests wait this long for the worker per frame
    // ---- interaction (host/tests may set) ----
    std::string section;  // "" = every section, else RunDiffRow::section
    char filter[96] = {0};
    DiffColumn sort = DiffColumn::B_MINUS_A;  // by |B - A| for the difference column
    bool descending = true;
};

// Points the view at runs a (reference) and b; 0 for either clears it.
void diff_select(DiffViewState& s, int64_t run_a, int64_t run_b);
// Starts reading both runs on a worker (again while either runs, at most every
// reread_interval_s), or swaps in the diff a finished worker computed. True when what the view
// draws changed (a worker started or its diff arrived); never waits for the worker.
bool refresh_diff_view(DiffViewState& s, storage::SessionReader& reader);
// Whether a worker is reading or computing.
bool diff_pending(const DiffViewState& s);
// The worker's progress in [0, 1] and what it is doing ("" when none runs).
float diff_progress(const DiffViewState& s, std::string* what = nullptr);
// Waits up to `timeout_s` for the worker and swaps in its diff: true when it did.
bool diff_wait(DiffViewState& s, double timeout_s = 600);
// Indices into s.diff.rows that the table shows: the section and filter (case-insensitive
// substring of name or detail) applied; sections in the diff's order (their units differ), rows
// within a section in the sort order (rows whose key is NaN last).
std::vector<uint32_t> diff_rows_shown(const DiffViewState& s);
// Draws from the state only.
void DrawDiffView(DiffViewState& s, TextureHost* host, ImVec2 size = ImVec2(0, 0));

struct ViewEntry;
ViewEntry diff_view_entry();

}  // namespace kv::views
