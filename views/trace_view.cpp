// Trace view (see trace_view.h): refresh reads spans into a compact list and rebuilds the
// model; drawing walks each visible row at the level of detail the zoom asks for.
#include "views/trace_view.h"

#include <imgui.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

#include "storage/session_reader.h"
#include "views/colormap.h"
#include "views/span_legend.h"
#include "views/view_table.h"

namespace kv::views {

void set_trace_model(TraceViewState& s, TraceModel model) {
    s.model = std::move(model);
    s.whole = trace_range_summary(s.model, s.model.t_min, s.model.t_max + 1);
    s.gpu_whole = trace_gpu_summary(s.model, s.model.t_min, s.model.t_max + 1);
    s.gpu_launched_whole = gpu_time_by_launcher(s.gpu_whole, s.model);
    s.icicle = build_icicle(s.model);
    s.gpu_icicle = build_gpu_icicle(s.model);
    s.selected = kNoParent;  // indices change with the model
    if (s.has_selection) s.selection = trace_range_summary(s.model, s.sel_t0, s.sel_t1);
    if (s.has_selection) s.gpu_selection = trace_gpu_summary(s.model, s.sel_t0, s.sel_t1);
    if (s.has_selection) s.gpu_launched_selection = gpu_time_by_launcher(s.gpu_selection, s.model);
    if (s.has_selection) s.range_icicle = build_icicle(s.model, s.sel_t0, s.sel_t1);
    if (s.has_selection) s.range_gpu_icicle = build_gpu_icicle(s.model, s.sel_t0, s.sel_t1);
    if (s.search.needle.size()) s.search = search_spans(s.model, s.search.needle);
    select_search_bin(s, s.search_bin);  // the same bin of the new model's spans
    if (s.t0_ns == 0) s.t0_ns = s.model.t_min;
    s.built_at = std::chrono::steady_clock::now();
    s.model_stale = false;
    ++s.version;
}

void select_search_bin(TraceViewState& s, int bin) {
    s.search_bin = bin >= 0 && size_t(bin) < s.search.bins.size() ? bin : -1;
    s.search_bin_matches = search_bin_spans(s.model, s.search, s.search_bin);
}

void select_trace_span(TraceViewState& s, uint32_t i) {
    s.selected = i < s.model.spans.size() ? i : kNoParent;
}

void select_trace_range(TraceViewState& s, int64_t t0, int64_t t1) {
    if (t1 < t0) std::swap(t0, t1);
    s.has_selection = t1 > t0;
    s.sel_t0 = t0, s.sel_t1 = t1;
    if (s.has_selection) s.selection = trace_range_summary(s.model, t0, t1);
    if (s.has_selection) s.gpu_selection = trace_gpu_summary(s.model, t0, t1);
    if (s.has_selection) s.gpu_launched_selection = gpu_time_by_launcher(s.gpu_selection, s.model);
    if (s.has_selection) s.range_icicle = build_icicle(s.model, t0, t1);
    if (s.has_selection) s.range_gpu_icicle = build_gpu_icicle(s.model, t0, t1);
}

bool refresh_trace_view(TraceViewState& s, storage::SessionReader& reader) {
    if (s.run == 0) return false;
    try {
        if (s.t0_ns == 0) s.t0_ns = reader.run(s.run).t0_ns;
        // Spans newer than the last one read, a page (in id order) at a time within the
        // frame's budget; the model is rebuilt once the reader has nothing more.
        constexpr size_t kPage = 200'000;
        const auto start = std::chrono::steady_clock::now();
        bool any = false, full_page = true;
        while (full_page) {
            const auto rows = reader.spans(s.run, {}, s.last_span_id, kPage);
            for (const storage::SpanRow& r : rows) {
                s.last_span_id = std::max(s.last_span_id, r.id);
                auto [it, fresh] = s.name_ids.emplace(r.name, uint32_t(s.names.size()));
                if (fresh) s.names.push_back(r.name);
                s.raw.push_back({r.start_ns, r.end_ns, it->second, r.category, r.thread, r.layer, r.chunk, r.id, r.correlation_id});
            }
            any |= !rows.empty();
            full_page = rows.size() == kPage;
            if (std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() > s.refresh_budget_ms) break;
        }
        if (any) s.model_stale = true;
        s.caught_up = !full_page;
        if (!s.caught_up) return true;  // more to read on the next refresh
        const double since = std::chrono::duration<double>(std::chrono::steady_clock::now() - s.built_at).count();
        if (!s.model_stale || (s.version > 0 && since < s.rebuild_interval_s && any)) return false;
        // GPU work (CUPTI) on lanes per device and stream, each record pointing at its launch.
        std::vector<TraceSpan> all = s.raw;
        for (const storage::GpuActivityRow& g : reader.gpu_activity(s.run)) {
            auto [it, fresh] = s.name_ids.emplace(g.name, uint32_t(s.names.size()));
            if (fresh) s.names.push_back(g.name);
            const trace::SpanCategory c = g.kind == storage::GpuActivityRow::KERNEL ? trace::SpanCategory::OTHER : trace::SpanCategory::IO;
            all.push_back({g.start_ns, g.end_ns, it->second, c, gpu_lane_thread(g.device, g.stream), -1, -1, 0, g.external_id});
        }
        set_trace_model(s, build_trace_model(std::move(all), s.names));
        s.error.clear();
        return true;
    } catch (const std::exception& e) {
        s.error = e.what();
        return false;
    }
}

namespace {

constexpr float kRowH = 15.f, kLaneGap = 6.f, kLabelW = 70.f;

Colour text_on(Colour c) {
    return colour_luminance(c) > 0.35 ? IM_COL32(15, 15, 15, 255) : IM_COL32(245, 245, 245, 255);
}

// A span's own time: its duration minus its children's (children sit in the next row).
int64_t span_self(const TraceModel& m, const TraceLane& lane, size_t depth, uint32_t i) {
    const TraceSpan& s = m.spans[i];
    int64_t self = s.end_ns - s.start_ns;
    if (depth + 1 < lane.rows.size()) {
        const auto [lo, hi] = row_window(m, lane.rows[depth + 1], s.start_ns, s.end_ns + 1);
        for (size_t k = lo; k < hi; ++k) {
            const uint32_t c = lane.rows[depth + 1].spans[k];
            if (m.parent[c] == i) self -= m.spans[c].end_ns - m.spans[c].start_ns;
        }
    }
    return self;
}

// A box's name at its left edge: whole when it fits, else the longest prefix that fits with
// ".." after it (as profilers do: a box wide enough for a few letters says what it is), nothing
// in a box narrower than that.
void draw_label(ImDrawList* dl, float a, float b, float y0, Colour col, const char* label) {
    const float room = b - a - 4;
    if (room < 24) return;
    const char* end = label + std::strlen(label);
    if (ImGui::CalcTextSize(label, end).x <= room) {
        dl->AddText(ImVec2(a + 2, y0), col, label, end);
        return;
    }
    const float dots = ImGui::CalcTextSize("..").x;
    size_t lo = 0, hi = size_t(end - label);  // the longest prefix of width <= room - dots: in [lo, hi)
    while (hi - lo > 1) {
        const size_t mid = (lo + hi) / 2;
        (ImGui::CalcTextSize(label, label + mid).x + dots <= room ? lo : hi) = mid;
    }
    if (lo < 3) return;  // a letter or two and dots say nothing
    std::string cut(label, lo);
    cut += "..";
    dl->AddText(ImVec2(a + 2, y0), col, cut.c_str());
}

// Diagonal hatching of [a, b) x [y0, y1): unattributed time.
void hatch(ImDrawList* dl, float a, float b, float y0, float y1) {
    dl->AddRectFilled(ImVec2(a, y0), ImVec2(b, y1), IM_COL32(60, 60, 66, 255));
    dl->PushClipRect(ImVec2(a, y0), ImVec2(b, y1), true);
    for (float x = a - (y1 - y0); x < b; x += 6) dl->AddLine(ImVec2(x, y1), ImVec2(x + (y1 - y0), y0), IM_COL32(120, 120, 128, 255));
    dl->PopClipRect();
}

struct Mapper {
    double x0, px_per_ns;
    int64_t t0;
    float px(int64_t t) const { return float(x0 + double(t - t0) * px_per_ns); }
};

// One row: raw spans when they are wider than the finest merge gap, else a merged level.
void draw_row(ImDrawList* dl, const TraceViewState& s, const TraceLane& lane, size_t depth, const Mapper& mp, float x0, float x1,
              float y0, float y1, int64_t w0, int64_t w1, int level) {
    const TraceModel& m = s.model;
    const TraceRow& row = lane.rows[depth];
    float pend0 = -1, pend1 = -1;
    Colour pend_col = 0;
    auto flush = [&] {
        if (pend0 >= 0) dl->AddRectFilled(ImVec2(pend0, y0), ImVec2(std::max(pend1, pend0 + 1), y1), pend_col);
        pend0 = -1;
    };
    auto box = [&](int64_t a_ns, int64_t b_ns, trace::SpanCategory c, const char* label, uint32_t name) {
        if (!is_gpu_lane(lane.thread) && span_category_hidden(s.hidden_categories, c)) return;  // the legend toggles spans
        const float a = std::max(x0, mp.px(a_ns)), b = std::min(x1, mp.px(b_ns));
        // Phases (RUN spans below the run) a shade each, as in the memory timeline; GPU work its own colours.
        const Colour col = is_gpu_lane(lane.thread) ? gpu_work_colour(c == trace::SpanCategory::OTHER)
                           : c == trace::SpanCategory::RUN && depth > 0 && name != UINT32_MAX ? phase_colour(int(name))
                                                                                              : span_category_colour(c);
        if (b - a < 3.f) {  // sub-pixel boxes coalesce into one
            if (pend0 >= 0 && (a - pend1 > 1 || col != pend_col)) flush();
            if (pend0 < 0) pend0 = a, pend_col = col;
            pend1 = std::max(pend1, b);
            return;
        }
        flush();
        // Neighbours wide enough to tell apart are separated by a 1-pixel gap, not an outline: an
        // outline is four anti-aliased strokes, which a software rasterizer (llvmpipe) pays for
        // per 4x4 block they touch -- most of a frame's cost at ten million spans.
        dl->AddRectFilled(ImVec2(a, y0), ImVec2(b - (b - a >= 6 ? 1.f : 0.f), y1), col);
        if (label) draw_label(dl, a, b, y0, text_on(col), label);
    };
    // Spans one by one while the window holds no more of them than pixels (each keeps its
    // label and colour); beyond that the merged level, at most a few boxes per pixel.
    const auto [lo, hi] = row_window(m, row, w0, w1);
    // (Levels stop once a row merges into one box: coarser ones would repeat it.)
    if (level < 0 || row.levels.empty() || double(hi - lo) <= double(x1 - x0)) {
        for (size_t k = lo; k < hi; ++k) {
            const TraceSpan& sp = m.spans[row.spans[k]];
            box(sp.start_ns, sp.end_ns, sp.category, m.names[sp.name].c_str(), sp.name);
        }
    } else {
        const auto& lv = row.levels[std::min(size_t(level), row.levels.size() - 1)];
        const auto [mlo, mhi] = merged_window(lv, w0, w1);
        for (size_t k = mlo; k < mhi; ++k) box(lv[k].start_ns, lv[k].end_ns, lv[k].category, nullptr, UINT32_MAX);
    }
    flush();
}

// Rows separated by 1-pixel lines, not alternating backgrounds: a banded row is a panel-wide
// blended rectangle, and under a software rasterizer (llvmpipe) the bands of a tall table cost
// as much as every span box of the timeline above it.
constexpr ImGuiTableFlags kTableFlags = ImGuiTableFlags_BordersInnerH | ImGuiTableFlags_ScrollY | ImGuiTableFlags_SizingStretchProp;

// `gpu` (GPU runs): device time of the records each span name launched, a column of its own.
void draw_stats_table(const storage::SpanSummary& sum, float height, const std::unordered_map<std::string, int64_t>* gpu = nullptr) {
    if (ImGui::BeginTable("##stats", gpu ? 7 : 6, kTableFlags,
                          ImVec2(0, height))) {
        ImGui::TableSetupScrollFreeze(0, 1);
        for (const char* h : {"span", "category", "count", "total", "self", "mean"}) ImGui::TableSetupColumn(h);
        if (gpu) ImGui::TableSetupColumn("GPU time launched");
        ImGui::TableHeadersRow();
        for (const auto& g : sum.spans) {
            ImGui::TableNextRow();
            ImGui::TableNextColumn();
            ImGui::TextUnformatted(g.name.c_str());
            ImGui::TableNextColumn();
            // The category in its colour where that is legible on the dark table (not the greys of run, cell).
            const Colour cc = span_category_colour(g.category);
            if (colour_luminance(cc) > 0.2)
                ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(cc), "%s", trace::span_category_name(g.category));
            else
                ImGui::TextUnformatted(trace::span_category_name(g.category));
            ImGui::TableNextColumn();
            ImGui::Text("%lld", (long long)g.count);
            ImGui::TableNextColumn();
            ImGui::TextUnformatted(format_duration_ns(double(g.total_ns)).c_str());
            ImGui::TableNextColumn();
            ImGui::TextUnformatted(format_duration_ns(double(g.self_ns)).c_str());
            ImGui::TableNextColumn();
            ImGui::TextUnformatted(format_duration_ns(g.mean_ns()).c_str());
            if (gpu) {
                ImGui::TableNextColumn();
                const auto it = gpu->find(g.name);
                if (it != gpu->end()) ImGui::TextUnformatted(format_duration_ns(double(it->second)).c_str());
            }
        }
        ImGui::EndTable();
    }
}

void draw_range_panel(TraceViewState& s, float height) {
    const storage::SpanSummary& sum = s.has_selection ? s.selection : s.whole;
    const float y_start = ImGui::GetCursorPosY();
    if (s.has_selection)
        ImGui::Text("range %s .. %s (%s)", format_duration_ns(double(s.sel_t0 - s.t0_ns)).c_str(),
                    format_duration_ns(double(s.sel_t1 - s.t0_ns)).c_str(), format_duration_ns(double(s.sel_t1 - s.sel_t0)).c_str());
    else
        ImGui::TextUnformatted("whole run (right-drag on the timeline to select a range)");
    // The phase breakdown: the phases' own time, then the unattributed rest; wrapped, so a run
    // with many phases does not run off the panel's right edge.
    std::string phases = "phases (self time):  ";
    for (const auto& p : sum.phases)
        if (p.name != "run") phases += p.name + " " + format_duration_ns(double(p.self_ns)) + "  ";
    if (sum.run_ns > 0) phases += "unattributed " + format_duration_ns(double(sum.unattributed_ns));
    ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
    ImGui::TextWrapped("%s", phases.c_str());
    ImGui::PopStyleColor();
    height -= ImGui::GetCursorPosY() - y_start;  // what the lines above took (the phases may wrap)
    const GpuSummary& gpu = s.has_selection ? s.gpu_selection : s.gpu_whole;
    const float line = ImGui::GetTextLineHeightWithSpacing();
    if (gpu.empty()) {
        draw_stats_table(sum, std::max(40.f, height - 4));
        return;
    }
    const float rest = std::max(80.f, height - line * float(1 + gpu.devices.size()) - 8);
    draw_stats_table(sum, std::min(rest * 0.5f, float(sum.spans.size() + 1) * line + 4),  // header + rows: no gap under a short table
                     s.has_selection ? &s.gpu_launched_selection : &s.gpu_launched_whole);
    // GPU runs: how busy each device was, how long launches took to reach it, and each kernel,
    // memcpy and memset under the host span that launched it.
    for (const GpuDeviceBusy& d : gpu.devices)
        ImGui::Text("cuda:%d busy %.1f%% of the %s (%s), %lld kernels, copies and sets", d.device, 100 * d.busy_share(),
                    s.has_selection ? "range" : "run", format_duration_ns(double(d.busy_ns)).c_str(), (long long)d.records);
    if (gpu.launched)
        ImGui::Text("launch overhead (device start - launching span's start): mean %s, max %s, total %s over %lld launches",
                    format_duration_ns(gpu.delay_mean_ns()).c_str(), format_duration_ns(double(gpu.delay_max_ns)).c_str(),
                    format_duration_ns(double(gpu.delay_total_ns)).c_str(), (long long)gpu.launched);
    else
        ImGui::TextDisabled("no launch recorded (no CUPTI correlation ids): no launch overhead");
    if (ImGui::BeginTable("##gpu", 6, kTableFlags,
                          ImVec2(0, std::max(line * 3, ImGui::GetContentRegionAvail().y - 4)))) {
        ImGui::TableSetupScrollFreeze(0, 1);
        for (const char* h : {"launched by", "GPU work", "count", "device time", "mean launch delay", "max launch delay"})
            ImGui::TableSetupColumn(h);
        ImGui::TableHeadersRow();
        for (const GpuLaunchGroup& g : gpu.launches) {
            const bool known = g.launcher_name != UINT32_MAX;
            ImGui::TableNextRow();
            ImGui::TableNextColumn();
            if (known) ImGui::TextUnformatted(s.model.names[g.launcher_name].c_str());
            else ImGui::TextDisabled("(launch not recorded)");
            ImGui::TableNextColumn();
            ImGui::TextUnformatted(s.model.names[g.name].c_str());
            ImGui::TableNextColumn();
            ImGui::Text("%lld", (long long)g.count);
            ImGui::TableNextColumn();
            ImGui::TextUnformatted(format_duration_ns(double(g.device_ns)).c_str());
            ImGui::TableNextColumn();
            ImGui::TextUnformatted(known ? format_duration_ns(g.delay_mean_ns()).c_str() : "-");
            ImGui::TableNextColumn();
            ImGui::TextUnformatted(known ? format_duration_ns(double(g.delay_max_ns)).c_str() : "-");
        }
        ImGui::EndTable();
    }
}

void draw_search_panel(TraceViewState& s, float height) {
    ImGui::SetNextItemWidth(220);
    if (ImGui::InputTextWithHint("##find", "find spans by name", s.search_text, sizeof s.search_text)) {
        s.search = search_spans(s.model, s.search_text);
        select_search_bin(s, -1);
    }
    const SpanSearch& f = s.search;
    ImGui::SameLine();
    if (f.count == 0) {
        ImGui::TextDisabled("%s", f.needle.empty() ? "type part of a span name" : "no span matches");
        return;
    }
    ImGui::Text("%lld spans, total %s, mean %s, min %s, median %s, p95 %s, max %s", (long long)f.count,
                format_duration_ns(double(f.total_ns)).c_str(), format_duration_ns(double(f.total_ns) / double(f.count)).c_str(),
                format_duration_ns(double(f.min_ns)).c_str(), format_duration_ns(double(f.median_ns)).c_str(),
                format_duration_ns(double(f.p95_ns)).c_str(), format_duration_ns(double(f.max_ns)).c_str());
    // Histogram of durations (log-spaced bins).
    const float w = ImGui::GetContentRegionAvail().x * 0.55f, h = std::max(40.f, height - 30);
    const ImVec2 p0 = ImGui::GetCursorScreenPos();
    ImGui::InvisibleButton("##hist", ImVec2(w, h));
    ImDrawList* dl = ImGui::GetWindowDrawList();
    dl->AddRectFilled(p0, ImVec2(p0.x + w, p0.y + h), IM_COL32(24, 24, 28, 255));
    const int64_t peak = f.bins.empty() ? 1 : std::max<int64_t>(1, *std::max_element(f.bins.begin(), f.bins.end()));
    const float bw = w / float(std::max<size_t>(1, f.bins.size())), body = h - 16;
    for (size_t b = 0; b < f.bins.size(); ++b) {
        const float bh = body * float(f.bins[b]) / float(peak);
        // The clicked bar in the selection's yellow (as a selected span's outline).
        dl->AddRectFilled(ImVec2(p0.x + bw * float(b) + 1, p0.y + body - bh), ImVec2(p0.x + bw * float(b + 1) - 1, p0.y + body),
                          int(b) == s.search_bin ? IM_COL32(255, 214, 0, 255) : span_category_colour(trace::SpanCategory::ATTENTION));
    }
    dl->AddText(ImVec2(p0.x + 2, p0.y + body), IM_COL32(200, 200, 200, 255), format_duration_ns(f.bin_edges.front()).c_str());
    const std::string hi = format_duration_ns(f.bin_edges.back());
    dl->AddText(ImVec2(p0.x + w - ImGui::CalcTextSize(hi.c_str()).x - 2, p0.y + body), IM_COL32(200, 200, 200, 255), hi.c_str());
    if (ImGui::IsItemHovered()) {
        const size_t b = std::min(f.bins.size() - 1, size_t(std::max(0.f, (ImGui::GetIO().MousePos.x - p0.x) / bw)));
        ImGui::SetTooltip("%s .. %s: %lld spans (click: list them)", format_duration_ns(f.bin_edges[b]).c_str(),
                          format_duration_ns(f.bin_edges[b + 1]).c_str(), (long long)f.bins[b]);
        if (ImGui::IsItemClicked()) select_search_bin(s, int(b) == s.search_bin ? -1 : int(b));  // a second click shows all again
    }
    ImGui::SameLine();
    // The longest matches, or the clicked bar's: click one to zoom to it.
    const std::vector<uint32_t>& list = s.search_bin >= 0 ? s.search_bin_matches : f.matches;
    if (ImGui::BeginChild("##matches", ImVec2(0, h))) {
        if (s.search_bin >= 0)
            ImGui::TextDisabled("%lld spans of %s .. %s (click the bar again for all)", (long long)f.bins[size_t(s.search_bin)],
                                format_duration_ns(f.bin_edges[size_t(s.search_bin)]).c_str(),
                                format_duration_ns(f.bin_edges[size_t(s.search_bin) + 1]).c_str());
        for (size_t k = 0; k < std::min<size_t>(list.size(), 200); ++k) {
            const TraceSpan& sp = s.model.spans[list[k]];
            char label[160];
            std::snprintf(label, sizeof label, "%s  %s  at %s (thread %d)##%zu", s.model.names[sp.name].c_str(),
                          format_duration_ns(double(sp.end_ns - sp.start_ns)).c_str(), format_duration_ns(double(sp.start_ns - s.t0_ns)).c_str(),
                          sp.thread, k);
            if (ImGui::Selectable(label)) {
                const double pad = double(sp.end_ns - sp.start_ns) * 0.25 + 1;
                s.time = {double(sp.start_ns - s.t0_ns) - pad, double(sp.end_ns - s.t0_ns) + pad};
                s.follow = false;
            }
        }
    }
    ImGui::EndChild();
}

void draw_icicle_panel(TraceViewState& s, float height) {
    const bool has_gpu = s.gpu_icicle.nodes.size() > 1;
    if (has_gpu) {  // GPU runs: host time, or device time under the spans that launched it
        if (ImGui::RadioButton("host time", !s.icicle_gpu)) s.icicle_gpu = false;
        ImGui::SameLine();
        if (ImGui::RadioButton("GPU time by launching span", s.icicle_gpu)) s.icicle_gpu = true;
        height -= ImGui::GetFrameHeightWithSpacing();
    }
    const bool gpu = has_gpu && s.icicle_gpu;
    // A selected range: its icicle (spans and device time clipped to it), as the statistics tab.
    Icicle& ic = s.has_selection ? (gpu ? s.range_gpu_icicle : s.range_icicle) : (gpu ? s.gpu_icicle : s.icicle);
    if (s.has_selection) {
        ImGui::TextDisabled("range %s .. %s (clear the range for the whole run)", format_duration_ns(double(s.sel_t0 - s.t0_ns)).c_str(),
                            format_duration_ns(double(s.sel_t1 - s.t0_ns)).c_str());
        height -= ImGui::GetTextLineHeightWithSpacing();
    }
    const ImVec2 p0 = ImGui::GetCursorScreenPos();
    const float w = ImGui::GetContentRegionAvail().x, h = std::max(30.f, height);
    ImGui::InvisibleButton("##icicle", ImVec2(w, h));
    const bool hovered = ImGui::IsItemHovered();
    ImDrawList* dl = ImGui::GetWindowDrawList();
    dl->AddRectFilled(p0, ImVec2(p0.x + w, p0.y + h), IM_COL32(20, 20, 24, 255));
    if (ic.nodes.size() <= 1) return;
    layout_icicle(ic, double(w));
    dl->PushClipRect(p0, ImVec2(p0.x + w, p0.y + h), true);
    const ImVec2 mouse = ImGui::GetIO().MousePos;
    const IcicleNode* hover = nullptr;
    for (size_t i = 1; i < ic.nodes.size(); ++i) {
        const IcicleNode& n = ic.nodes[i];
        const float a = p0.x + float(n.x0), b = p0.x + float(n.x1), y0 = p0.y + float(n.depth - 1) * kRowH, y1 = y0 + kRowH - 1;
        if (b - a < 0.5f || y0 > p0.y + h) continue;
        const Colour col = n.gpu ? gpu_work_colour(n.category == trace::SpanCategory::OTHER)
                           : span_category_hidden(s.hidden_categories, n.category) ? IM_COL32(50, 50, 55, 255)
                                                                                  : span_category_colour(n.category);
        dl->AddRectFilled(ImVec2(a, y0), ImVec2(std::max(a + 1, b), y1), col);
        if (b - a > 3) dl->AddRect(ImVec2(a, y0), ImVec2(b, y1), IM_COL32(0, 0, 0, 90));
        const char* name = s.model.names[n.name].c_str();
        draw_label(dl, a, b, y0, text_on(col), name);
        if (hovered && mouse.x >= a && mouse.x < b && mouse.y >= y0 && mouse.y < y1 + 1) hover = &n;
    }
    dl->PopClipRect();
    if (hover) {
        ImGui::BeginTooltip();
        ImGui::Text("%s (%s)", s.model.names[hover->name].c_str(),
                    hover->gpu ? (hover->category == trace::SpanCategory::OTHER ? "GPU kernel" : "GPU copy or set")
                               : trace::span_category_name(hover->category));
        if (gpu)
            ImGui::Text("device time %s (%.1f%%), %lld GPU records launched %s", format_duration_ns(double(hover->total_ns)).c_str(),
                        100.0 * double(hover->total_ns) / double(std::max<int64_t>(1, ic.nodes[0].total_ns)), (long long)hover->count,
                        hover->gpu ? "by the path above" : "on this path or below");
        else
            ImGui::Text("total %s (%.1f%%), self %s, %lld spans", format_duration_ns(double(hover->total_ns)).c_str(),
                        100.0 * double(hover->total_ns) / double(std::max<int64_t>(1, ic.nodes[0].total_ns)),
                        format_duration_ns(double(hover->self_ns)).c_str(), (long long)hover->count);
        ImGui::EndTooltip();
    }
}

}  // namespace

void DrawTraceView(TraceViewState& s, TextureHost* host, ImVec2 size) {
    (void)host;
    if (size.x <= 0 || size.y <= 0) size = ImGui::GetContentRegionAvail();
    ImGui::PushID("trace");
    if (!s.error.empty()) ImGui::TextColored(ImVec4(1, 0.4f, 0.4f, 1), "%s", s.error.c_str());
    const TraceModel& m = s.model;
    if (m.spans.empty()) {
        draw_empty_state(s.run ? "no spans recorded for this run yet" : "select a run");
        ImGui::PopID();
        return;
    }
    const float top = ImGui::GetCursorPosY();
    // ---- toolbar: fit, counts, legend ----
    if (ImGui::Button("fit")) s.follow = true;
    ImGui::SameLine();
    if (s.has_selection && ImGui::Button("clear range")) s.has_selection = false;
    if (s.has_selection) ImGui::SameLine();
    ImGui::TextDisabled("%zu spans on %zu thread%s | wheel: zoom, drag: pan, right-drag: select a range, shift+wheel: scroll lanes",
                        m.spans.size(), m.lanes.size(), m.lanes.size() == 1 ? "" : "s");
    if (s.selected != kNoParent) {  // the clicked span and what its launches link it to
        const TraceSpan& sp = m.spans[s.selected];
        std::string linked;
        if (is_gpu_lane(sp.thread)) {
            const uint32_t l = find_launcher(m, s.selected);
            linked = l == kNoParent ? "launch not recorded" : "launched by " + m.names[m.spans[l].name];
        } else if (const auto recs = find_launched(m, s.selected); !recs.empty()) {
            linked = "launched " + std::to_string(recs.size()) + " GPU record" + (recs.size() == 1 ? "" : "s");
        }
        ImGui::TextColored(ImVec4(1, 0.84f, 0, 1), "selected: %s, %s at %s%s%s", m.names[sp.name].c_str(),
                           format_duration_ns(double(sp.end_ns - sp.start_ns)).c_str(), format_duration_ns(double(sp.start_ns - s.t0_ns)).c_str(),
                           linked.empty() ? "" : " | ", linked.c_str());
        ImGui::SameLine();
        if (ImGui::SmallButton("clear")) s.selected = kNoParent;
    } else {  // the line stays, so a click does not move the lanes under the mouse
        ImGui::TextDisabled("click a span to select it: it and what its launches link it to are outlined");
    }
    {
        std::vector<trace::SpanCategory> present;
        for (const auto& c : s.whole.categories) present.push_back(c.category);
        std::sort(present.begin(), present.end());
        draw_span_legend(s.hidden_categories, present);
    }
    const double ext_lo = double(m.t_min - s.t0_ns), ext_hi = double(std::max(m.t_max, m.t_min + 1) - s.t0_ns);
    if (s.follow) s.time = {ext_lo, ext_hi};

    // ---- timeline ----
    const float used = ImGui::GetCursorPosY() - top;
    const float rest = std::max(120.f, size.y - used);
    float lanes_h = 0;
    for (const auto& l : m.lanes) lanes_h += float(l.rows.size()) * kRowH + kLaneGap;
    const AxisSpec xs{AxisUnit::NANOSECONDS, "time since run start"};
    PlotMargins margins = plot_margins(&xs, nullptr, nullptr, rest);
    margins.left = kLabelW;
    const float timeline_h = std::min(rest * 0.6f, lanes_h + margins.bottom + 4);
    const PlotFrame f = begin_plot_frame("##timeline", ImVec2(size.x, timeline_h), margins);
    // Lanes taller than the frame scroll with Shift+wheel (the plain wheel zooms time).
    const float overflow = std::max(0.f, lanes_h - f.height());
    if (f.hovered && ImGui::GetIO().KeyShift && ImGui::GetIO().MouseWheel != 0) {
        s.scroll_y -= ImGui::GetIO().MouseWheel * kRowH * 3;
        ImGui::GetIO().MouseWheel = 0;
    }
    s.scroll_y = std::clamp(s.scroll_y, 0.f, overflow);
    if (plot_zoom_pan(f, s.time, ext_lo, ext_hi)) s.follow = false;
    ImDrawList* dl = ImGui::GetWindowDrawList();
    // No background fill of its own: the host clears to the same dark grey, and a frame-sized
    // blended rectangle is a large share of what a software rasterizer shades per frame.
    const int64_t w0 = s.t0_ns + int64_t(s.time.lo), w1 = s.t0_ns + int64_t(s.time.hi) + 1;
    const Mapper mp{double(f.p0.x), double(f.width()) / std::max(1.0, s.time.span()), w0};
    const int level = pick_lod_level(s.time.span() / std::max(1.f, f.width()));
    dl->PushClipRect(ImVec2(f.outer0.x, f.p0.y), f.p1, true);
    float y = f.p0.y - s.scroll_y;
    const TraceSpan* hover = nullptr;
    const TraceLane* hover_lane = nullptr;
    size_t hover_depth = 0;
    bool hover_unattributed = false;
    std::vector<float> lane_top;  // screen y of each lane's first row (the launch arrow's ends)
    lane_top.reserve(m.lanes.size());
    for (const TraceLane& lane : m.lanes) {
        lane_top.push_back(y);
        char label[40];
        if (is_gpu_lane(lane.thread))
            std::snprintf(label, sizeof label, "cuda:%d s%d", (lane.thread - kGpuLaneBase) / 4096, (lane.thread - kGpuLaneBase) % 4096);
        else
            std::snprintf(label, sizeof label, "thread %d", lane.thread);
        dl->AddText(ImVec2(f.outer0.x + 4, y), IM_COL32(220, 220, 220, 255), label);
        for (size_t d = 0; d < lane.rows.size(); ++d) {
            const float y0 = y + float(d) * kRowH, y1 = y0 + kRowH - 1;
            if (y0 > f.p1.y) break;
            if (y1 < f.p0.y) continue;  // scrolled above the frame
            if (d == 1) {  // unattributed time of the run, under the phases
                const bool raw = level < 0 || lane.unattributed_levels.empty();
                const auto& boxes = raw ? lane.unattributed
                                        : lane.unattributed_levels[std::min(size_t(level), lane.unattributed_levels.size() - 1)];
                const auto [lo, hi] = merged_window(boxes, w0, w1);
                for (size_t k = lo; k < hi; ++k) {
                    const float a = std::max(f.p0.x, mp.px(boxes[k].start_ns)), b = std::min(f.p1.x, mp.px(boxes[k].end_ns));
                    hatch(dl, a, std::max(a + 1, b), y0, y1);
                    if (b - a > 80) dl->AddText(ImVec2(a + 2, y0), IM_COL32(220, 220, 220, 255), "unattributed");
                    if (f.hovered && f.mouse.y >= y0 && f.mouse.y < y1 + 1 && f.mouse.x >= a && f.mouse.x < std::max(a + 1, b))
                        hover_unattributed = true;
                }
            }
            draw_row(dl, s, lane, d, mp, f.p0.x, f.p1.x, y0, y1, w0, w1, level);
            if (f.hovered && f.mouse.y >= y0 && f.mouse.y < y1 + 1) {
                const int64_t t = w0 + int64_t((f.mouse.x - f.p0.x) / mp.px_per_ns);
                const int64_t slack = int64_t(1.0 / mp.px_per_ns);
                const auto [lo, hi] = row_window(m, lane.rows[d], t - slack, t + slack + 1);
                for (size_t k = lo; k < hi; ++k) {
                    const TraceSpan& sp = m.spans[lane.rows[d].spans[k]];
                    if (!is_gpu_lane(lane.thread) && span_category_hidden(s.hidden_categories, sp.category)) continue;
                    hover = &sp, hover_lane = &lane, hover_depth = d;
                    break;
                }
            }
        }
        y += float(lane.rows.size()) * kRowH + kLaneGap;
        dl->AddLine(ImVec2(f.outer0.x, y - kLaneGap / 2), ImVec2(f.p1.x, y - kLaneGap / 2), IM_COL32(70, 70, 80, 255));
    }
    // Range selection: right-drag; shaded while shown.
    if (f.hovered && ImGui::IsMouseClicked(ImGuiMouseButton_Right)) s.drag_from_x = f.mouse.x;
    if (s.drag_from_x >= 0) {
        const float a = std::min(s.drag_from_x, ImGui::GetIO().MousePos.x), b = std::max(s.drag_from_x, ImGui::GetIO().MousePos.x);
        dl->AddRectFilled(ImVec2(a, f.p0.y), ImVec2(b, f.p1.y), IM_COL32(255, 255, 255, 40));
        if (!ImGui::IsMouseDown(ImGuiMouseButton_Right)) {
            if (b - a >= 3)
                select_trace_range(s, w0 + int64_t((a - f.p0.x) / mp.px_per_ns), w0 + int64_t((b - f.p0.x) / mp.px_per_ns));
            s.drag_from_x = -1;
            s.panel = TracePanel::RANGE;
        }
    } else if (s.has_selection) {
        const float a = std::max(f.p0.x, mp.px(s.sel_t0)), b = std::min(f.p1.x, mp.px(s.sel_t1));
        if (b > a) {
            dl->AddRectFilled(ImVec2(a, f.p0.y), ImVec2(b, f.p1.y), IM_COL32(255, 255, 255, 30));
            dl->AddRect(ImVec2(a, f.p0.y), ImVec2(b, f.p1.y), IM_COL32(255, 255, 255, 140));
        }
    }
    dl->PopClipRect();
    if (overflow > 0) {  // where the shown lanes sit among all of them
        const float h = f.height(), thumb = std::max(12.f, h * h / lanes_h), top_y = f.p0.y + (h - thumb) * (s.scroll_y / overflow);
        dl->AddRectFilled(ImVec2(f.p1.x - 4, f.p0.y), ImVec2(f.p1.x, f.p1.y), IM_COL32(40, 40, 46, 255));
        dl->AddRectFilled(ImVec2(f.p1.x - 4, top_y), ImVec2(f.p1.x, top_y + thumb), IM_COL32(150, 150, 160, 255));
    }
    // Launches (CUPTI correlation): the host span and the GPU record it launched outlined, with
    // an arrow from the launch to the record, so the kernel reads as nested under its launch.
    // For a hovered GPU record, and for the clicked span: its launcher, or every record it launched.
    s.drawn_links = 0;
    {
        auto lane_of = [&](int32_t thread) -> size_t {
            for (size_t li = 0; li < m.lanes.size(); ++li)
                if (m.lanes[li].thread == thread) return li;
            return m.lanes.size();
        };
        auto outline = [&](uint32_t i, ImU32 c) -> ImVec2 {  // the span's box; returns its top-left corner
            const TraceSpan& sp = m.spans[i];
            const size_t li = lane_of(sp.thread);
            const float y0 = lane_top[li] + float(span_depth(m, i)) * kRowH;
            const float a = std::clamp(mp.px(sp.start_ns), f.p0.x, f.p1.x);
            dl->AddRect(ImVec2(a, y0), ImVec2(std::min(f.p1.x, std::max(mp.px(sp.end_ns), a + 2)), y0 + kRowH - 1), c, 0, 0, 1.5f);
            return ImVec2(a, y0);
        };
        auto link = [&](uint32_t launch, uint32_t record, ImU32 c) {
            const ImVec2 h = outline(launch, c), k = outline(record, c);
            const ImVec2 from(h.x, h.y + kRowH - 1), to(k.x, k.y);
            dl->AddLine(from, to, c, 1.5f);
            const float dir = to.y >= from.y ? 1.f : -1.f;  // the head points along the arrow
            dl->AddTriangleFilled(to, ImVec2(to.x - 4, to.y - 7 * dir), ImVec2(to.x + 4, to.y - 7 * dir), c);
            ++s.drawn_links;
        };
        dl->PushClipRect(ImVec2(f.outer0.x, f.p0.y), f.p1, true);
        if (s.selected != kNoParent) {
            const ImU32 c = IM_COL32(255, 214, 0, 255);  // the selection's colour: no span or GPU colour is this yellow
            outline(s.selected, c);
            if (is_gpu_lane(m.spans[s.selected].thread)) {
                const uint32_t launch = find_launcher(m, s.selected);
                if (launch != kNoParent) link(launch, s.selected, c);
            } else {
                // Every record it launched that the window shows, up to a frame's worth of arrows
                // (a span that launched thousands draws the first 512 in view; zoom in for the rest).
                constexpr size_t kMaxArrows = 512;
                for (uint32_t r : find_launched(m, s.selected))
                    if (m.spans[r].end_ns >= w0 && m.spans[r].start_ns < w1 && s.drawn_links < kMaxArrows) link(s.selected, r, c);
            }
        }
        if (hover && is_gpu_lane(hover->thread)) {
            const uint32_t idx = uint32_t(hover - m.spans.data()), launch = find_launcher(m, idx);
            if (launch != kNoParent && idx != s.selected) link(launch, idx, IM_COL32(255, 255, 255, 220));
        }
        dl->PopClipRect();
    }
    // A click (press and release without dragging) selects the span under the mouse, or clears.
    if (f.hovered && ImGui::IsMouseReleased(ImGuiMouseButton_Left) && ImGui::GetIO().MouseDragMaxDistanceSqr[0] < 9.f)
        select_trace_span(s, hover ? uint32_t(hover - m.spans.data()) : kNoParent);
    draw_x_axis(dl, f, s.time, xs);
    if (hover) {
        ImGui::BeginTooltip();
        const char* kind = is_gpu_lane(hover->thread) ? (hover->category == trace::SpanCategory::OTHER ? "GPU kernel" : "GPU copy or set")
                                                      : trace::span_category_name(hover->category);
        if (m.names[hover->name] == kind)  // "layer", "chunk", "cell": the name says the category
            ImGui::TextUnformatted(kind);
        else
            ImGui::Text("%s (%s)", m.names[hover->name].c_str(), kind);
        const uint32_t idx = uint32_t(hover - m.spans.data());
        ImGui::Text("%s, self %s, from %s", format_duration_ns(double(hover->end_ns - hover->start_ns)).c_str(),
                    format_duration_ns(double(span_self(m, *hover_lane, hover_depth, idx))).c_str(),
                    format_duration_ns(double(hover->start_ns - s.t0_ns)).c_str());
        if (is_gpu_lane(hover->thread)) {
            const uint32_t launch = find_launcher(m, idx);
            if (launch != kNoParent)
                ImGui::Text("launched by %s at %s (thread %d)", m.names[m.spans[launch].name].c_str(),
                            format_duration_ns(double(m.spans[launch].start_ns - s.t0_ns)).c_str(), m.spans[launch].thread);
            else
                ImGui::TextDisabled("launch not recorded");
        } else {
            // Only the tags the span has (a layer's span has no chunk).
            std::string where;
            if (hover->layer >= 0) where += "layer " + std::to_string(hover->layer) + "  ";
            if (hover->chunk >= 0) where += "chunk " + std::to_string(hover->chunk) + "  ";
            ImGui::Text("%sthread %d", where.c_str(), hover->thread);
            const auto recs = find_launched(m, idx);
            if (!recs.empty()) {
                int64_t dev = 0;
                for (uint32_t r : recs) dev += m.spans[r].end_ns - m.spans[r].start_ns;
                ImGui::Text("launched %zu GPU record%s, device time %s (click: show them)", recs.size(), recs.size() == 1 ? "" : "s",
                            format_duration_ns(double(dev)).c_str());
            }
        }
        ImGui::EndTooltip();
    } else if (hover_unattributed) {
        ImGui::SetTooltip("unattributed: time in the run that no phase span covers");
    }

    // ---- panels: range statistics, search, icicle ----
    const float panel_h = std::max(60.f, size.y - (ImGui::GetCursorPosY() - top) - 30);
    if (ImGui::BeginTabBar("##panels")) {
        // Switch tabs only when asked (a range was just selected, or the host set panel).
        const bool asked = s.panel != s.drawn_panel;
        const TracePanel want = s.panel;
        auto tab = [&](const char* name, TracePanel p) {
            const bool open = ImGui::BeginTabItem(name, nullptr, asked && want == p ? ImGuiTabItemFlags_SetSelected : 0);
            if (open) s.panel = s.drawn_panel = p;
            return open;
        };
        if (tab("statistics", TracePanel::RANGE)) {
            draw_range_panel(s, panel_h);
            ImGui::EndTabItem();
        }
        if (tab("find", TracePanel::SEARCH)) {
            draw_search_panel(s, panel_h);
            ImGui::EndTabItem();
        }
        if (tab("icicle", TracePanel::ICICLE)) {
            draw_icicle_panel(s, panel_h);
            ImGui::EndTabItem();
        }
        ImGui::EndTabBar();
    }
    ImGui::PopID();
}

// ---- its entry in the view table -----------------------------------------------------------

namespace {
class TraceSlot final : public StateSlot<TraceViewState> {
   public:
    void select(const ViewSelection& sel) override {
        state = {};
        state.run = sel.runs.empty() ? 0 : sel.runs.front();
    }
    bool refresh(storage::SessionReader& r) override { return refresh_trace_view(state, r); }
    void draw(TextureHost* t, ImVec2 size) override { DrawTraceView(state, t, size); }
};
}  // namespace

ViewEntry trace_view_entry() {
    return {.name = "trace", .make = []() -> std::unique_ptr<ViewSlot> { return std::make_unique<TraceSlot>(); }};
}

}  // namespace kv::views
