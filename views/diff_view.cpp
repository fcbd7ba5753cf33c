// Diff view (see diff_view.h): refresh reads each run's diff input (storage/run_diff.h) and
// recomputes the diff; drawing filters and sorts the rows in memory.
#include "views/diff_view.h"

#include <imgui.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "storage/session_reader.h"
#include "views/colormap.h"
#include "views/plot_util.h"
#include "views/view_table.h"

namespace kv::views {

void diff_select(DiffViewState& s, int64_t run_a, int64_t run_b) {
    const std::string section = s.section;
    s = {};
    s.section = section;  // the section picked stays across selections
    if (run_a <= 0 || run_b <= 0) return;
    s.run_a = run_a, s.run_b = run_b;
}

struct DiffJob {
    static constexpr const char* kStages[] = {"opening the session", "reading run A", "reading run B", "computing the diff"};
    std::string path;
    int64_t run_a = 0, run_b = 0;
    std::function<void()> hook;
    std::atomic<int> stage{0};
    std::atomic<bool> cancel{false};
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;  // under mu
    // The result (written by the worker before done, read after).
    std::string name_a, name_b, error;
    storage::RunDiffInput in_a, in_b;
    storage::RunDiff diff;
    bool settled = false;
    std::thread thread;

    void run() {
        try {
            if (hook) hook();
            storage::SessionReader reader(path);
            const storage::RunInfo a = reader.run(run_a), b = reader.run(run_b);
            name_a = a.name, name_b = b.name;
            auto live = [](const storage::RunInfo& r) {
                return r.status == storage::RunStatus::QUEUED || (r.status == storage::RunStatus::RUNNING && r.owner_alive);
            };
            settled = !live(a) && !live(b);
            stage = 1;
            if (!cancel) in_a = storage::read_run_diff_input(reader, run_a);
            stage = 2;
            // A run against itself reads once (the diff is all zeros).
            if (!cancel) in_b = run_b == run_a ? in_a : storage::read_run_diff_input(reader, run_b);
            stage = 3;
            if (!cancel) {
                diff = storage::run_diff(in_a, in_b);
                diff.run_a = run_a, diff.run_b = run_b;
            }
        } catch (const std::exception& e) {
            error = e.what();
            settled = true;  // an unknown run stays unknown
        }
        std::lock_guard lock(mu);
        done = true;
        cv.notify_all();
    }
    bool wait_for(double seconds) {
        std::unique_lock lock(mu);
        return cv.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return done; });
    }
    ~DiffJob() {
        cancel = true;
        if (thread.joinable()) thread.join();
    }
};

namespace {
// Moves a finished worker's result into the state: true when it did.
bool take_result(DiffViewState& s) {
    if (!s.job) return false;
    {
        std::lock_guard lock(s.job->mu);
        if (!s.job->done) return false;
    }
    DiffJob& j = *s.job;
    s.name_a = std::move(j.name_a), s.name_b = std::move(j.name_b);
    s.error = std::move(j.error);
    s.settled = j.settled;
    if (s.error.empty()) {
        s.in_a = std::move(j.in_a), s.in_b = std::move(j.in_b);
        s.diff = std::move(j.diff);
        s.have_diff = true;
    }
    s.job.reset();
    ++s.version;
    return true;
}
}  // namespace

bool diff_pending(const DiffViewState& s) {
    return s.job != nullptr;
}

float diff_progress(const DiffViewState& s, std::string* what) {
    if (!s.job) {
        if (what) what->clear();
        return s.have_diff ? 1.f : 0.f;
    }
    const int st = std::clamp(s.job->stage.load(), 0, 3);
    if (what) *what = DiffJob::kStages[st];
    return float(st) / 4.f;
}

bool diff_wait(DiffViewState& s, double timeout_s) {
    if (!s.job || !s.job->wait_for(timeout_s)) return false;
    return take_result(s);
}

bool refresh_diff_view(DiffViewState& s, storage::SessionReader& reader) {
    if (s.run_a == 0) return false;
    if (s.job) return take_result(s);
    if (s.settled) return false;
    const auto now = std::chrono::steady_clock::now();
    if (s.have_diff && std::chrono::duration<double>(now - s.read_at).count() < s.reread_interval_s) return false;
    s.read_at = now;
    auto job = std::make_shared<DiffJob>();
    job->path = reader.path();
    job->run_a = s.run_a, job->run_b = s.run_b;
    job->hook = s.worker_hook;
    // The thread gets the job by pointer: the job outlives it (its destructor joins).
    job->thread = std::thread([j = job.get()] { j->run(); });
    s.job = std::move(job);
    return true;
}

namespace {

bool contains_nocase(const std::string& hay, const char* needle) {
    if (!*needle) return true;
    auto it = std::search(hay.begin(), hay.end(), needle, needle + std::strlen(needle),
                          [](char x, char y) { return std::tolower((unsigned char)x) == std::tolower((unsigned char)y); });
    return it != hay.end();
}

double sort_key(const storage::RunDiffRow& r, DiffColumn c) {
    switch (c) {
        case DiffColumn::COUNT_A: return double(r.count_a);
        case DiffColumn::COUNT_B: return double(r.count_b);
        case DiffColumn::A: return r.a;
        case DiffColumn::B: return r.b;
        case DiffColumn::B_MINUS_A: return std::fabs(r.b_minus_a());
        case DiffColumn::B_OVER_A: return r.b_over_a();
        default: return 0;
    }
}

}  // namespace

std::vector<uint32_t> diff_rows_shown(const DiffViewState& s) {
    std::vector<uint32_t> out;
    const auto& rows = s.diff.rows;
    for (uint32_t i = 0; i < rows.size(); ++i) {
        const auto& r = rows[i];
        if (!s.section.empty() && r.section != s.section) continue;
        if (!contains_nocase(r.name, s.filter) && !contains_nocase(r.detail, s.filter)) continue;
        out.push_back(i);
    }
    const DiffColumn c = s.sort;
    const bool desc = s.descending;
    // Sections keep the diff's order (their units differ); the column orders rows within each.
    std::vector<uint32_t> section_of(rows.size(), 0);
    for (size_t i = 1; i < rows.size(); ++i) section_of[i] = section_of[i - 1] + (rows[i].section != rows[i - 1].section);
    std::stable_sort(out.begin(), out.end(), [&](uint32_t x, uint32_t y) {
        if (section_of[x] != section_of[y]) return section_of[x] < section_of[y];
        const auto &rx = rows[x], &ry = rows[y];
        if (c == DiffColumn::NAME || c == DiffColumn::DETAIL) {
            const std::string &kx = c == DiffColumn::NAME ? rx.name : rx.detail, &ky = c == DiffColumn::NAME ? ry.name : ry.detail;
            return desc ? kx > ky : kx < ky;
        }
        const double kx = sort_key(rx, c), ky = sort_key(ry, c);
        if (std::isnan(kx) || std::isnan(ky)) return !std::isnan(kx) && std::isnan(ky);  // NaN last
        return desc ? kx > ky : kx < ky;
    });
    return out;
}

namespace {

// A value in the unit of its measure.
std::string value_text(const std::string& measure, double v) {
    if (std::isnan(v)) return "-";
    if (measure == "total_ms" || measure == "self_ms") return format_duration_ns(v * 1e6);
    if (measure == "bytes" || measure == "peak_bytes") return format_bytes(v);
    if (measure == "held") return format_count(v);
    if (measure == "kept_by_both") {
        char b[32];
        std::snprintf(b, sizeof b, "%.1f%%", 100 * v);
        return b;
    }
    char b[32];
    std::snprintf(b, sizeof b, "%.6g", v);
    return b;
}

const char* measure_label(const std::string& m) {
    if (m == "total_ms") return "total";
    if (m == "self_ms") return "self";
    if (m == "peak_bytes") return "peak";
    if (m == "kept_by_both") return "kept by both";
    return m.c_str();
}

constexpr Colour kMoreColour = pack_rgba(235, 110, 90);  // B larger: more time / memory
constexpr Colour kLessColour = pack_rgba(90, 180, 120);

}  // namespace

void DrawDiffView(DiffViewState& s, TextureHost* host, ImVec2 size) {
    (void)host;
    ImGui::PushID("diff");
    if (s.run_a == 0) {
        ImGui::TextWrapped("Select two runs (ctrl-click in the runs table) to see where their time and memory differ: "
                           "the reference run is A, the other B.");
        ImGui::PopID();
        return;
    }
    if (!s.error.empty()) ImGui::TextColored(ImVec4(1, 0.4f, 0.4f, 1), "%s", s.error.c_str());
    ImGui::Text("A: run %lld %s    B: run %lld %s", (long long)s.run_a, s.name_a.c_str(), (long long)s.run_b, s.name_b.c_str());
    std::string what;
    const float progress = diff_progress(s, &what);
    if (!s.have_diff) {  // the worker reads; frames go on
        if (s.job) {
            ImGui::ProgressBar(std::max(progress, 0.02f), ImVec2(std::min(420.f, ImGui::GetContentRegionAvail().x), 0), what.c_str());
            ImGui::TextDisabled("reading both runs on a worker thread; the table appears when they are read");
        }
        ImGui::PopID();
        return;
    }
    if (s.job) {  // a live run is re-read: the previous diff stays until the new one is ready
        ImGui::SameLine();
        ImGui::TextDisabled("(updating: %s)", what.c_str());
    }
    // Sections in the diff's order.
    std::vector<std::string> sections;
    for (const auto& r : s.diff.rows)
        if (std::find(sections.begin(), sections.end(), r.section) == sections.end()) sections.push_back(r.section);
    ImGui::SetNextItemWidth(160);
    if (ImGui::BeginCombo("section", s.section.empty() ? "all" : s.section.c_str())) {
        if (ImGui::Selectable("all", s.section.empty())) s.section.clear();
        for (const auto& sec : sections)
            if (ImGui::Selectable(sec.c_str(), s.section == sec)) s.section = sec;
        ImGui::EndCombo();
    }
    ImGui::SameLine();
    ImGui::SetNextItemWidth(220);
    ImGui::InputTextWithHint("##filter", "filter names", s.filter, sizeof s.filter);
    const std::vector<uint32_t> shown = diff_rows_shown(s);
    ImGui::SameLine();
    ImGui::Text("%zu of %zu rows", shown.size(), s.diff.rows.size());

    // The bar of B - A is scaled per measure, to the largest |B - A| of that measure shown.
    std::vector<std::pair<std::string, double>> scale;
    for (uint32_t i : shown) {
        const auto& r = s.diff.rows[i];
        const double d = std::fabs(r.b_minus_a());
        if (std::isnan(d)) continue;
        auto it = std::find_if(scale.begin(), scale.end(), [&](const auto& p) { return p.first == r.measure; });
        if (it == scale.end()) scale.emplace_back(r.measure, d);
        else it->second = std::max(it->second, d);
    }

    const float height = size.y > 0 ? std::max(60.f, size.y - ImGui::GetCursorPosY() - 8) : 0;
    const ImGuiTableFlags flags = ImGuiTableFlags_RowBg | ImGuiTableFlags_ScrollY | ImGuiTableFlags_Sortable |
                                  ImGuiTableFlags_SizingStretchProp | ImGuiTableFlags_Resizable | ImGuiTableFlags_BordersInnerV;
    if (ImGui::BeginTable("##diff", 10, flags, ImVec2(0, height))) {
        ImGui::TableSetupScrollFreeze(0, 1);
        ImGui::TableSetupColumn("section", ImGuiTableColumnFlags_NoSort, 0.9f);
        ImGui::TableSetupColumn("name", 0, 1.9f, ImGuiID(DiffColumn::NAME));
        ImGui::TableSetupColumn("detail", 0, 1.5f, ImGuiID(DiffColumn::DETAIL));  // "cpu + instrumentation" whole
        ImGui::TableSetupColumn("measure", ImGuiTableColumnFlags_NoSort, 0.8f);
        ImGui::TableSetupColumn("count A", 0, 0.6f, ImGuiID(DiffColumn::COUNT_A));
        ImGui::TableSetupColumn("count B", 0, 0.6f, ImGuiID(DiffColumn::COUNT_B));
        ImGui::TableSetupColumn("A", 0, 0.8f, ImGuiID(DiffColumn::A));
        ImGui::TableSetupColumn("B", 0, 0.8f, ImGuiID(DiffColumn::B));
        ImGui::TableSetupColumn("B - A", ImGuiTableColumnFlags_DefaultSort | ImGuiTableColumnFlags_PreferSortDescending, 1.9f,
                                ImGuiID(DiffColumn::B_MINUS_A));
        ImGui::TableSetupColumn("B / A", 0, 0.6f, ImGuiID(DiffColumn::B_OVER_A));
        ImGui::TableHeadersRow();
        if (ImGuiTableSortSpecs* specs = ImGui::TableGetSortSpecs(); specs && specs->SpecsDirty) {
            if (specs->SpecsCount > 0) {
                s.sort = DiffColumn(specs->Specs[0].ColumnUserID);
                s.descending = specs->Specs[0].SortDirection == ImGuiSortDirection_Descending;
            }
            specs->SpecsDirty = false;
        }
        ImGuiListClipper clip;
        clip.Begin(int(shown.size()));
        while (clip.Step()) {
            for (int k = clip.DisplayStart; k < clip.DisplayEnd; ++k) {
                const storage::RunDiffRow& r = s.diff.rows[shown[size_t(k)]];
                const bool counted = r.section == "spans" || r.section == "kernels" || r.section == "phases" || r.section == "kept_slots";
                ImGui::TableNextRow();
                ImGui::TableNextColumn();
                ImGui::TextUnformatted(r.section.c_str());
                ImGui::TableNextColumn();
                ImGui::TextUnformatted(r.name.c_str());
                ImGui::TableNextColumn();
                ImGui::TextUnformatted(r.detail.c_str());
                ImGui::TableNextColumn();
                ImGui::TextUnformatted(measure_label(r.measure));
                ImGui::TableNextColumn();
                if (counted) ImGui::Text("%lld", (long long)r.count_a);
                ImGui::TableNextColumn();
                if (counted) ImGui::Text("%lld", (long long)r.count_b);
                ImGui::TableNextColumn();
                ImGui::TextUnformatted(value_text(r.measure, r.a).c_str());
                ImGui::TableNextColumn();
                ImGui::TextUnformatted(value_text(r.measure, r.b).c_str());
                ImGui::TableNextColumn();
                // The difference as text, then a bar from the middle of the rest of the cell: right
                // and red when B is larger, left and green when smaller (beside the text, never
                // under it, so a long negative bar leaves the number readable).
                const double d = r.b_minus_a();
                if (!std::isnan(d)) {
                    const ImVec2 p = ImGui::GetCursorScreenPos();
                    const float w = ImGui::GetContentRegionAvail().x, h = ImGui::GetTextLineHeight();
                    const float text_w = ImGui::CalcTextSize("+999.99 MiB ").x;
                    const float bx = p.x + text_w, half = std::max(0.f, w - text_w) * 0.5f;
                    auto it = std::find_if(scale.begin(), scale.end(), [&](const auto& q) { return q.first == r.measure; });
                    const double full = it == scale.end() || it->second <= 0 ? 1.0 : it->second;
                    const float len = float(std::fabs(d) / full) * half;
                    if (half > 2) {
                        ImDrawList* dl = ImGui::GetWindowDrawList();
                        dl->AddLine(ImVec2(bx + half, p.y + 1), ImVec2(bx + half, p.y + h), IM_COL32(110, 110, 120, 255));  // zero
                        if (len > 0.5f) {
                            const float x0 = d > 0 ? bx + half : bx + half - len;
                            dl->AddRectFilled(ImVec2(x0, p.y + 2), ImVec2(x0 + len, p.y + h - 1), (d > 0 ? kMoreColour : kLessColour) & 0x90FFFFFFu);
                        }
                    }
                    ImGui::Text("%s%s", d > 0 ? "+" : "", value_text(r.measure, d).c_str());
                } else {
                    ImGui::TextUnformatted("-");
                }
                ImGui::TableNextColumn();
                const double q = r.b_over_a();
                if (std::isnan(q)) ImGui::TextUnformatted("-");
                else ImGui::Text("%.3f", q);
            }
        }
        ImGui::EndTable();
    }
    ImGui::PopID();
}

// ---- its entry in the view table -----------------------------------------------------------

namespace {
class DiffSlot final : public StateSlot<DiffViewState> {
   public:
    void select(const ViewSelection& sel) override { set_reference(sel); }
    void set_reference(const ViewSelection& sel) override {
        int64_t b = 0;
        for (int64_t r : sel.runs)
            if (r != sel.reference) {
                b = r;
                break;
            }
        const int64_t a = sel.reference ? sel.reference : (sel.runs.empty() ? 0 : sel.runs.front());
        diff_select(state, sel.runs.size() >= 2 ? a : 0, b);
    }
    bool refresh(storage::SessionReader& r) override { return refresh_diff_view(state, r); }
    void draw(TextureHost* t, ImVec2 size) override { DrawDiffView(state, t, size); }
    // While the worker runs, the host asks after each frame: wait a little for it (a frame's
    // share, so the progress bar moves without spinning), then repaint.
    bool has_requests() const override { return diff_pending(state); }
    bool serve_requests(storage::SessionReader& r) override {
        if (state.job) state.job->wait_for(state.poll_ms * 1e-3);
        refresh_diff_view(state, r);
        return true;
    }
};
}  // namespace

// Shown with one run too (it then asks for a second): the canvas moves a selection of several
// runs to the one view with min_runs 2 (compare), and this view keeps it.
ViewEntry diff_view_entry() {
    return {.name = "diff", .several_runs = true, .keeps_several = true, .make = []() -> std::unique_ptr<ViewSlot> { return std::make_unique<DiffSlot>(); }};
}

}  // namespace kv::views
