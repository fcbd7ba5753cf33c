// The canvas: session, selection, the flat registry of views and the one window they draw in
// (see canvas.h for the host contract, canvas_impl.h for the state).
#include "views/canvas.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "storage/config_fields.h"
#include "storage/rank_runs.h"
#include "storage/session_reader.h"
#include "views/canvas_impl.h"
#include "views/plot_util.h"
#include "views/view_table.h"

namespace kv::views {

size_t view_count() { return view_table().size(); }

const ViewEntry& view_entry(ViewKind k) { return view_table().at(k.index()); }

const char* view_name(ViewKind k) { return k.index() < view_count() ? view_entry(k).name : "unknown"; }

bool view_shows_several(ViewKind k) { return view_entry(k).several_runs; }

bool view_keeps_several(ViewKind k) { return view_entry(k).keeps_several; }

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
    for (size_t k = 0; k < view_count(); ++k)
        if (name == view_name(ViewKind(k))) {
            if (out) *out = ViewKind(k);
            return true;
        }
    return false;
}

ViewKind view_named(const char* name) {
    ViewKind k;
    if (!view_from_name(name, &k)) throw std::logic_error(std::string("no view named \"") + name + "\" in the view table");
    return k;
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
constexpr size_t kMaxCompared = 8;

// The view shown when several runs are selected and the active view shows one.
ViewKind comparison_view() {
    for (size_t k = 0; k < view_count(); ++k)
        if (view_entry(ViewKind(k)).min_runs >= 2) return ViewKind(k);
    return ViewKind(0);
}
}  // namespace

CanvasImpl::CanvasImpl() {
    for (const ViewEntry& e : view_table()) slots.push_back(e.make());
}

void CanvasImpl::reset_views() {
    const ViewSelection sel{runs, reference, textures};
    for (auto& s : slots) s->select(sel);
}

std::string CanvasImpl::empty_state() const {
    if (!reader) return "no session open";
    if (runs.empty()) return session_runs ? "select a run in the runs table" : "this session has no runs yet";
    // Single-run views show one run; saying "nothing recorded" here would be false.
    if (runs.size() >= 2 && !view_shows_several(view))
        return std::to_string(runs.size()) + " runs selected: the " + view_name(view) +
               " shows one run (select one run, or use compare)";
    return "";
}

bool CanvasImpl::refresh_view(ViewKind k) {
    if (!reader || runs.empty() || runs.size() < size_t(view_entry(k).min_runs)) return false;
    return slot(k).refresh(*reader);
}

Canvas::Canvas(TextureHost* textures) : impl_(std::make_unique<CanvasImpl>()) { impl_->textures = textures; }

Canvas::~Canvas() {
    // Textures go back to the host (whose GL context must still be usable, as for any release).
    for (auto& slot : impl_->slots) slot->release(impl_->textures);
}

void Canvas::open_session(const std::string& path) {
    CanvasImpl& c = *impl_;
    c.runs.clear();
    c.reference = 0;
    for (auto& slot : c.slots) slot->clear(c.textures);
    c.reset_views();
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
    // Views that keep several runs (fidelity, sweep) stay; the others give way to compare.
    if (sel.size() >= 2 && !view_keeps_several(c.view)) c.view = comparison_view();
    else if (sel.size() < size_t(view_entry(c.view).min_runs)) c.view = ViewKind(0);
}

const std::vector<int64_t>& Canvas::selected_runs() const { return impl_->runs; }

int64_t Canvas::take_requested_run() {
    for (auto& slot : impl_->slots)
        if (const int64_t r = slot->take_requested_run()) return r;
    return 0;
}

void Canvas::set_reference(int64_t run) {
    CanvasImpl& c = *impl_;
    if (std::find(c.runs.begin(), c.runs.end(), run) == c.runs.end()) return;
    c.reference = run;
    c.needs_refresh = true;
    const ViewSelection sel{c.runs, run, c.textures};
    for (auto& slot : c.slots) slot->set_reference(sel);
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
    return c.needs_refresh || c.slots[c.view.index()]->has_requests();
}

bool Canvas::serve_draw_requests() {
    CanvasImpl& c = *impl_;
    if (!has_draw_requests()) return false;
    bool any = false;
    if (c.needs_refresh) any |= refresh();
    ViewSlot& active = c.slot(c.view);
    if (active.has_requests()) any |= active.serve_requests(*c.reader);
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
        for (size_t k = 0; k < view_count(); ++k) {
            if (c.runs.size() < size_t(view_entry(ViewKind(k)).min_runs)) continue;
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
    c.slot(c.view).draw(c.textures, body);
    // A click may have changed what the view shows (layer, colour, a compare link): rows it
    // needs are read after the frame.
    if (c.view != before || ImGui::IsMouseReleased(0)) c.needs_refresh = true;
    ImGui::End();
}

}  // namespace kv::views
