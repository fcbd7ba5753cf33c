// The canvas: session, selection, the flat registry of views and the one window they draw in
// (see canvas.h for the host contract, canvas_impl.h for the state).
#include "views/canvas.h"

#include <algorithm>
#include <cstdio>

#include "storage/config_fields.h"
#include "storage/rank_runs.h"
#include "storage/session_reader.h"
#include "views/canvas_impl.h"

namespace kv::views {

const char* view_name(ViewKind k) {
    static const char* const kNames[] = {"eviction map", "scores", "memory timeline", "cell grid", "metrics", "compare", "fidelity", "sweep"};
    static_assert(sizeof(kNames) / sizeof(kNames[0]) == size_t(ViewKind::COUNT), "view names out of date with ViewKind");
    return size_t(k) < sizeof(kNames) / sizeof(kNames[0]) ? kNames[size_t(k)] : "unknown";
}

const std::vector<CanvasGesture>& canvas_gestures() {
    // What plot_zoom_pan and the views' click handlers do (keep in step with them).
    static const std::vector<CanvasGesture> kGestures = {
        {"wheel", "eviction map, memory timeline, compare", "zoom the x axis around the cursor"},
        {"Shift + wheel", "eviction map", "zoom the token-position (y) axis only"},
        {"Ctrl + wheel", "eviction map", "zoom both axes"},
        {"drag (left button)", "eviction map, memory timeline, compare", "pan"},
        {"double-click", "eviction map, memory timeline", "fit the whole run again (as the fit button)"},
        {"double-click a layer", "eviction map, all layers", "open that layer alone"},
        {"click a row", "scores", "show that layer's histogram"},
        {"click a cell band", "memory timeline", "zoom to that cell"},
        {"click a point", "sweep", "select that run"},
        {"hover", "every view", "details of what is under the cursor (token, slot, allocation, chunk)"},
    };
    return kGestures;
}

bool view_from_name(const std::string& name, ViewKind* out) {
    for (size_t k = 0; k < size_t(ViewKind::COUNT); ++k)
        if (name == view_name(ViewKind(k))) {
            if (out) *out = ViewKind(k);
            return true;
        }
    return false;
}

int64_t default_reference(storage::SessionReader* reader, const std::vector<int64_t>& runs) {
    if (runs.empty()) return 0;
    if (reader) {
        for (int64_t r : runs) try {
                if (storage::run_policy(reader->run(r).config) == "dense")
                    return r;
            } catch (const std::exception&) {
                // an unreadable run is no reference; the next one may be
            }
    }
    return runs.front();
}

namespace {
constexpr size_t kNumViews = size_t(ViewKind::COUNT);
constexpr size_t kMaxCompared = 8;
}  // namespace

void CanvasImpl::reset_views() {
    release_eviction_textures(eviction, textures);
    release_scores_textures(scores, textures);
    release_cell_grid_textures(cells, textures);
    release_compare_textures(compare, textures);
    release_memory_timeline_textures(memory, textures);
    const int64_t run = runs.empty() ? 0 : runs.front();
    eviction = {};
    scores = {};
    memory = {};
    cells = {};
    metrics = {};
    eviction.run = scores.run = memory.run = cells.run = metrics.run = run;
    // Metrics overlays the per-token loss of every selected run.
    if (runs.size() >= 2) metrics.overlay_runs.assign(runs.begin() + 1, runs.end());
    compare = {};
    compare_select(compare, runs.size() >= 2 ? runs : std::vector<int64_t>{}, reference, textures);
    fidelity_select(fidelity, runs);
    sweep.selected_run = run;
}

std::string CanvasImpl::empty_state() const {
    if (!reader) return "no session open";
    if (runs.empty()) return session_runs ? "select a run in the runs table" : "this session has no runs yet";
    // Single-run views show one run; saying "nothing recorded" here would be false.
    if (runs.size() >= 2 && view != ViewKind::COMPARE && view != ViewKind::FIDELITY && view != ViewKind::SWEEP &&
        view != ViewKind::METRICS)
        return std::to_string(runs.size()) + " runs selected: the " + view_name(view) +
               " shows one run (select one run, or use compare)";
    return "";
}

bool CanvasImpl::refresh_view(ViewKind k) {
    if (!reader || runs.empty()) return false;
    switch (k) {
        case ViewKind::EVICTION_MAP:
            return refresh_eviction_map(eviction, *reader);
        case ViewKind::SCORES:
            return refresh_scores(scores, *reader);
        case ViewKind::MEMORY_TIMELINE:
            return refresh_memory_timeline(memory, *reader);
        case ViewKind::CELL_GRID:
            return refresh_cell_grid(cells, *reader);
        case ViewKind::METRICS:
            return refresh_metrics(metrics, *reader);
        case ViewKind::COMPARE:
            if (runs.size() < 2) return false;
            return refresh_compare(compare, *reader);
        case ViewKind::FIDELITY:
            return refresh_fidelity(fidelity, *reader);
        case ViewKind::SWEEP:
            return refresh_sweep(sweep, *reader);
        case ViewKind::COUNT:
            break;
    }
    return false;
}

Canvas::Canvas(TextureHost* textures) : impl_(std::make_unique<CanvasImpl>()) { impl_->textures = textures; }

Canvas::~Canvas() {
    // Textures go back to the host (whose GL context must still be usable, as for any release).
    impl_->reset_views();
}

void Canvas::open_session(const std::string& path) {
    CanvasImpl& c = *impl_;
    c.runs.clear();
    c.reference = 0;
    c.reset_views();
    c.sweep = {};
    c.reader.reset();
    c.infos.clear();
    c.path.clear();
    c.error.clear();
    if (path.empty()) return;
    c.reader = std::make_unique<storage::SessionReader>(path);  // throws SessionError with the reason
    c.path = path;
    // Something to look at straight away: the newest run (the host may select others).
    const std::vector<storage::RunInfo> runs = c.reader->runs();
    c.session_runs = runs.size();
    // (Not a rank run: those show through their run's rank selector.)
    for (auto it = runs.rbegin(); it != runs.rend(); ++it)
        if (!storage::is_rank_run(*it)) {
            select_runs({it->id});
            break;
        }
}

const std::string& Canvas::session_path() const { return impl_->path; }

void Canvas::select_runs(const std::vector<int64_t>& runs) {
    CanvasImpl& c = *impl_;
    std::vector<int64_t> sel;
    for (int64_t r : runs)
        if (std::find(sel.begin(), sel.end(), r) == sel.end() && sel.size() < kMaxCompared) sel.push_back(r);
    c.runs = sel;
    c.reference = default_reference(c.reader.get(), sel);
    c.reset_views();
    c.infos.clear();
    c.needs_refresh = true;
    // The fidelity and sweep views show several runs themselves.
    if (sel.size() >= 2 && c.view != ViewKind::FIDELITY && c.view != ViewKind::SWEEP) c.view = ViewKind::COMPARE;
    else if (c.view == ViewKind::COMPARE && sel.size() < 2) c.view = ViewKind::EVICTION_MAP;
}

const std::vector<int64_t>& Canvas::selected_runs() const { return impl_->runs; }

int64_t Canvas::take_requested_run() {
    const int64_t r = impl_->sweep.requested_run;
    impl_->sweep.requested_run = 0;
    return r;
}

void Canvas::set_reference(int64_t run) {
    CanvasImpl& c = *impl_;
    if (std::find(c.runs.begin(), c.runs.end(), run) == c.runs.end()) return;
    c.reference = run;
    c.needs_refresh = true;
    compare_select(c.compare, c.runs.size() >= 2 ? c.runs : std::vector<int64_t>{}, run, c.textures);
}

void Canvas::set_view(ViewKind k) {
    if (impl_->view != k) impl_->needs_refresh = true;
    impl_->view = k;
}

ViewKind Canvas::view() const { return impl_->view; }

bool Canvas::refresh() {
    CanvasImpl& c = *impl_;
    c.needs_refresh = false;
    if (!c.reader || c.runs.empty()) return false;
    bool any = false;
    try {
        std::vector<storage::RunInfo> infos;
        for (int64_t r : c.runs) infos.push_back(c.reader->run(r));
        for (size_t i = 0; i < infos.size(); ++i)
            any |= i >= c.infos.size() || infos[i].status != c.infos[i].status ||
                   infos[i].progress.updated_ms != c.infos[i].progress.updated_ms;
        c.infos = std::move(infos);
        c.session_runs = std::max(c.session_runs, c.reader->runs().size());
        c.error.clear();
    } catch (const std::exception& e) {
        c.error = e.what();
    }
    const bool view_any = c.refresh_view(c.view);
    any |= view_any;
    // A view that read something may have more waiting (the eviction map stops at its time
    // budget): keep asking until a refresh finds nothing new. Live runs have the host's timer.
    bool finished = !c.infos.empty();
    for (const auto& i : c.infos) finished &= storage::run_status_final(i.status);
    c.needs_refresh = view_any && finished;
    return any;
}

bool Canvas::has_draw_requests() const {
    const CanvasImpl& c = *impl_;
    if (!c.reader) return false;
    return c.needs_refresh || (c.view == ViewKind::MEMORY_TIMELINE && memory_timeline_has_requests(c.memory)) ||
           (c.view == ViewKind::SCORES && scores_has_requests(c.scores));
}

bool Canvas::serve_draw_requests() {
    CanvasImpl& c = *impl_;
    if (!has_draw_requests()) return false;
    bool any = false;
    if (c.needs_refresh) any |= refresh();
    if (c.view == ViewKind::MEMORY_TIMELINE && memory_timeline_has_requests(c.memory))
        any |= serve_memory_timeline_requests(c.memory, *c.reader);
    if (c.view == ViewKind::SCORES && scores_has_requests(c.scores)) any |= serve_scores_requests(c.scores, *c.reader);
    return any;
}

void Canvas::draw(float width, float height) {
    CanvasImpl& c = *impl_;
    ImGui::SetNextWindowPos(ImVec2(0, 0));
    ImGui::SetNextWindowSize(ImVec2(width, height));
    const ImGuiWindowFlags flags = ImGuiWindowFlags_NoDecoration | ImGuiWindowFlags_NoMove | ImGuiWindowFlags_NoSavedSettings |
                                   ImGuiWindowFlags_NoBringToFrontOnFocus | ImGuiWindowFlags_NoScrollWithMouse |
                                   // the host clears the frame; a window background would be a
                                   // second full-frame layer of fill (~8 ms on llvmpipe)
                                   ImGuiWindowFlags_NoBackground;
    ImGui::Begin("kvlab canvas", nullptr, flags);
    if (!c.reader || c.runs.empty()) {
        draw_empty_state(c.empty_state().c_str());
        ImGui::End();
        return;
    }
    // ---- header: what is shown ----
    if (!c.error.empty()) ImGui::TextColored(ImVec4(1, 0.5f, 0.4f, 1), "%s", c.error.c_str());
    if (c.runs.size() == 1 && !c.infos.empty()) {
        const storage::RunInfo& r = c.infos.front();
        ImGui::Text("run %lld  %s  [%s]", (long long)r.id, r.name.c_str(), storage::run_status_name(r.status));
        if (r.progress.chunks_total > 0) {
            ImGui::SameLine();
            char overlay[64];
            // A run that stopped short says where it stopped, in a greyed bar (not a stuck one).
            const bool stopped = storage::run_status_final(r.status) && r.status != storage::RunStatus::DONE;
            std::snprintf(overlay, sizeof overlay, "%s%d / %d layer x chunk steps", stopped ? "stopped at " : "",
                          r.progress.chunks_done, r.progress.chunks_total);
            if (stopped) ImGui::PushStyleColor(ImGuiCol_PlotHistogram, ImVec4(0.45f, 0.45f, 0.48f, 1));
            ImGui::ProgressBar(float(r.progress.chunks_done) / float(r.progress.chunks_total), ImVec2(260, 0), overlay);
            if (stopped) ImGui::PopStyleColor();
        }
        if (!r.error.empty()) ImGui::TextColored(ImVec4(1, 0.6f, 0.4f, 1), "%s", r.error.c_str());
    } else if (c.runs.size() > 1) {
        ImGui::Text("comparing %zu runs", c.runs.size());
    }
    if (c.show_view_tabs) {
        for (size_t k = 0; k < kNumViews; ++k) {
            if (ViewKind(k) == ViewKind::COMPARE && c.runs.size() < 2) continue;
            if (k) ImGui::SameLine();
            if (ImGui::RadioButton(view_name(ViewKind(k)), c.view == ViewKind(k))) c.view = ViewKind(k);
        }
        ImGui::Separator();
    }
    const ImVec2 body = ImGui::GetContentRegionAvail();
    const ViewKind before = c.view;
    if (const std::string empty = c.empty_state(); !empty.empty()) {
        draw_empty_state(empty.c_str());
        ImGui::End();
        return;
    }
    switch (c.view) {
        case ViewKind::EVICTION_MAP:
            DrawEvictionMapView(c.eviction, c.textures, body);
            break;
        case ViewKind::SCORES:
            DrawScoresView(c.scores, c.textures, body);
            break;
        case ViewKind::MEMORY_TIMELINE:
            DrawMemoryTimelineView(c.memory, c.textures, body);
            break;
        case ViewKind::CELL_GRID:
            DrawCellGridView(c.cells, c.textures, body);
            break;
        case ViewKind::METRICS:
            DrawMetricsView(c.metrics, body);
            break;
        case ViewKind::COMPARE:
            DrawCompareView(c.compare, c.textures, body);
            break;
        case ViewKind::FIDELITY:
            DrawFidelityView(c.fidelity, body);
            break;
        case ViewKind::SWEEP:
            DrawSweepView(c.sweep, body);
            break;
        case ViewKind::COUNT:
            break;
    }
    // A click may have changed what the view shows (layer, colour, a compare link): rows it
    // needs are read after the frame.
    if (c.view != before || ImGui::IsMouseReleased(0)) c.needs_refresh = true;
    ImGui::End();
}

}  // namespace kv::views
