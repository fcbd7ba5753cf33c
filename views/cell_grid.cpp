// Cell grid (see cell_grid.h).
#include "views/view_table.h"
#include "views/cell_grid.h"
#include "views/layer_label.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "storage/session_reader.h"
#include "views/colormap.h"

namespace kv::views {

GridChunk& GridSequence::at(int layer, int chunk) {
    if (int(rows.size()) <= layer) rows.resize(size_t(layer) + 1);
    auto& r = rows[size_t(layer)];
    if (int(r.size()) <= chunk) r.resize(size_t(chunk) + 1);
    layers = std::max(layers, layer + 1);
    chunks = std::max(chunks, chunk + 1);
    return r[size_t(chunk)];
}

const GridChunk* GridSequence::find(int layer, int chunk) const {
    if (layer < 0 || chunk < 0 || size_t(layer) >= rows.size() || size_t(chunk) >= rows[size_t(layer)].size()) return nullptr;
    return &rows[size_t(layer)][size_t(chunk)];
}

GridHit cell_grid_hit_test(const GridSequence& g, ImVec2 p0, ImVec2 p1, ImVec2 pt) {
    GridHit h;
    if (g.layers == 0 || g.chunks == 0 || pt.x < p0.x || pt.y < p0.y || pt.x >= p1.x || pt.y >= p1.y) return h;
    h.layer = std::min(g.layers - 1, int((pt.y - p0.y) / (p1.y - p0.y) * float(g.layers)));
    h.chunk = std::min(g.chunks - 1, int((pt.x - p0.x) / (p1.x - p0.x) * float(g.chunks)));
    h.valid = true;
    for (size_t i = 0; i < g.cells.size(); ++i) {
        const GridCell& c = g.cells[i];
        if (h.layer >= c.layer_begin && h.layer < c.layer_end && h.chunk >= c.chunk_begin && h.chunk < c.chunk_end) {
            // The gradient pipeline's cells (table) win over the forward's.
            if (h.cell < 0 || (c.from_table && !g.cells[size_t(h.cell)].from_table)) h.cell = int(i);
        }
    }
    return h;
}

GridImage build_cell_grid_image(const GridSequence& g, int max_width) {
    GridImage img;
    if (g.layers == 0 || g.chunks == 0) return img;
    int cpt = 1;
    while ((g.chunks + cpt - 1) / cpt > std::max(1, max_width)) cpt *= 2;
    img.chunks_per_texel = cpt;
    img.width = (g.chunks + cpt - 1) / cpt;
    img.height = g.layers;
    double lo = 1e300, hi = 0;
    for (const auto& r : g.rows)
        for (const auto& c : r)
            if (c.done) {
                const double d = std::max<double>(1, double(c.end_ns - c.start_ns));
                lo = std::min(lo, d), hi = std::max(hi, d);
            }
    if (hi > 0) img.time_lo_ns = lo, img.time_hi_ns = hi;
    const double llo = std::log(lo), lspan = hi > lo ? std::log(hi) - llo : 1.0;
    img.rgba.assign(size_t(img.width) * size_t(img.height) * 4, 0);
    const Colour pending = pack_rgba(40, 40, 46);
    for (int l = 0; l < img.height; ++l)
        for (int x = 0; x < img.width; ++x) {
            double sum = 0;
            int n = 0;
            for (int c = x * cpt; c < std::min(g.chunks, (x + 1) * cpt); ++c)
                if (const GridChunk* k = g.find(l, c); k && k->done) sum += std::log(std::max<double>(1, double(k->end_ns - k->start_ns))), ++n;
            const Colour col = n ? colormap(float((sum / n - llo) / lspan)) : pending;
            uint8_t* px = img.rgba.data() + (size_t(l) * size_t(img.width) + size_t(x)) * 4;
            px[0] = colour_r(col), px[1] = colour_g(col), px[2] = colour_b(col), px[3] = 255;
        }
    return img;
}

int CellGridViewState::resolve_sequence() const {
    if (sequences.empty()) return -1;
    return sequence < 0 ? int(sequences.size()) - 1 : std::min(sequence, int(sequences.size()) - 1);
}

namespace {
GridCell& span_cell(GridSequence& g, int col) {
    for (auto& c : g.cells)
        if (!c.from_table && c.col == col) return c;
    GridCell c;
    c.row = 0;
    c.col = col;
    c.layer_begin = c.chunk_begin = std::numeric_limits<int32_t>::max();
    g.cells.push_back(c);
    return g.cells.back();
}
}  // namespace

bool refresh_cell_grid(CellGridViewState& s, storage::SessionReader& reader) {
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    bool any = false;
    try {
        const storage::RunInfo info = reader.run(s.run);
        if (s.layer_kinds.empty() && !info.summary.empty()) {
            s.layer_kinds = layer_kinds_of_summary(info.summary);
            any |= !s.layer_kinds.empty();  // the labels change
        }
        s.t0_ns = info.t0_ns;
        s.progress = info.progress;
        while (true) {
            std::vector<storage::SpanRow> rows = reader.spans(s.run, {}, s.last_span_id, s.rows_per_read);
            const bool full_slice = rows.size() >= s.rows_per_read;
            // The reader returns the slice sorted by start; spans are recorded as they end (a
            // cell after its chunks), which is the order sequences and cells are built in.
            std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
            any |= !rows.empty();  // progress even when the slice held only other spans
            for (const auto& r : rows) {
                s.last_span_id = std::max(s.last_span_id, r.id);
                if (r.category == trace::SpanCategory::CHUNK && r.layer >= 0 && r.chunk >= 0 && r.layer < 4096) {
                    if (s.sequences.empty() || (r.layer == 0 && r.chunk == 0)) {
                        s.sequences.emplace_back();
                        s.sequences.back().start_ns = r.start_ns;
                    }
                    GridSequence& g = s.sequences.back();
                    GridChunk& c = g.at(r.layer, r.chunk);
                    if (!c.done) ++g.done;
                    c = {r.start_ns, r.end_ns, true, r.cell_col};
                    g.last_layer = r.layer, g.last_chunk = r.chunk;
                    if (r.cell_col >= 0) {
                        GridCell& cell = span_cell(g, r.cell_col);
                        cell.layer_begin = std::min(cell.layer_begin, r.layer);
                        cell.layer_end = std::max(cell.layer_end, r.layer + 1);
                        cell.chunk_begin = std::min(cell.chunk_begin, r.chunk);
                        cell.chunk_end = std::max(cell.chunk_end, r.chunk + 1);
                        if (!cell.finished && cell.start_ns == 0) cell.start_ns = r.start_ns;
                        cell.end_ns = std::max(cell.end_ns, r.end_ns);
                    }
                    any = true;
                } else if (r.category == trace::SpanCategory::CELL && r.cell_col >= 0 && !s.sequences.empty()) {
                    GridCell& cell = span_cell(s.sequences.back(), r.cell_col);
                    cell.row = std::max(0, r.cell_row);
                    cell.start_ns = r.start_ns;
                    cell.end_ns = r.end_ns;
                    cell.device = r.device;
                    cell.finished = true;
                    if (cell.layer_begin > cell.layer_end) cell.layer_begin = cell.layer_end = 0;
                    if (cell.chunk_begin > cell.chunk_end) cell.chunk_begin = cell.chunk_end = 0;
                    s.pending_peaks.push_back({s.sequences.size() - 1, size_t(&cell - s.sequences.back().cells.data()), r.start_ns, -1, false});
                    any = true;
                }
            }
            if (!full_slice) break;
            if (std::chrono::duration<double, std::milli>(Clock::now() - start).count() > s.refresh_budget_ms) break;
        }
        // Peaks of finished cells, from each cell's own events (an index range, read in slices so
        // a cell of a huge run never stalls a frame): the level before its first event (total
        // after it minus its bytes), then every total in it; with no events, the level the
        // previous cell ended at. At least one slice per refresh, more while the budget lasts.
        size_t finished = 0;
        bool first_slice = true;
        for (auto& pp : s.pending_peaks) {
            GridCell& cell = s.sequences[pp.sequence].cells[pp.cell];
            bool done = false;
            while (!done && (first_slice || std::chrono::duration<double, std::milli>(Clock::now() - start).count() <= s.refresh_budget_ms)) {
                first_slice = false;
                const auto rows = reader.memory_events(s.run, {pp.t_from, cell.end_ns + 1}, 0, s.rows_per_read);
                for (const auto& e : rows) {
                    if (e.device != cell.device) continue;
                    if (!pp.started) pp.peak = e.device_total - e.bytes, pp.started = true;
                    pp.peak = std::max(pp.peak, e.device_total);
                    s.last_device_total[e.device] = e.device_total;
                }
                // Done at a short slice (or a slice stuck on one timestamp: nothing further to learn).
                done = rows.size() < s.rows_per_read || rows.back().t_ns == pp.t_from;
                if (!done) pp.t_from = rows.back().t_ns;
            }
            if (!done) break;  // out of budget mid-cell: continue there next refresh
            if (!pp.started) {
                auto it = s.last_device_total.find(cell.device);
                if (it != s.last_device_total.end()) pp.peak = it->second;
            }
            cell.peak_bytes = pp.peak;
            ++finished;
            any = true;
        }
        s.pending_peaks.erase(s.pending_peaks.begin(), s.pending_peaks.begin() + std::ptrdiff_t(finished));
        any |= !s.pending_peaks.empty();  // more to read: the host should refresh again
        for (const auto& c : reader.cells(s.run, s.last_cell_id)) {
            s.last_cell_id = std::max(s.last_cell_id, c.id);
            size_t seq = 0;
            for (size_t i = 0; i < s.sequences.size(); ++i)
                if (s.sequences[i].start_ns <= c.start_ns) seq = i;
            if (s.sequences.empty()) {
                s.sequences.emplace_back();
                s.sequences.back().start_ns = c.start_ns;
            }
            GridSequence& g = s.sequences[seq];
            GridCell cell;
            cell.row = c.row, cell.col = c.col;
            cell.layer_begin = c.layer_begin, cell.layer_end = c.layer_end;
            cell.chunk_begin = c.chunk_begin, cell.chunk_end = c.chunk_end;
            cell.start_ns = c.start_ns, cell.end_ns = c.end_ns;
            cell.peak_bytes = c.peak_bytes;
            cell.device = c.device;
            cell.finished = true;
            cell.from_table = true;
            if (c.layer_end > 0 && c.chunk_end > 0) g.at(c.layer_end - 1, c.chunk_end - 1);  // make room
            g.cells.push_back(cell);
            any = true;
        }
        // The newest sequence is as wide as the run will make it when the host (or the
        // progress: chunks x layers of the current sample) says so.
        if (!s.sequences.empty()) {
            GridSequence& g = s.sequences.back();
            int expected = s.chunks_total;
            if (expected == 0 && g.layers > 0 && s.progress.chunks_total > 0) expected = s.progress.chunks_total / g.layers;
            if (expected > g.chunks && expected < (1 << 24) && g.layers > 0) g.at(0, expected - 1), any = true;
        }
        if (any) ++s.version;
        s.error.clear();
    } catch (const std::exception& e) {
        s.error = e.what();
    }
    return any;
}

void release_cell_grid_textures(CellGridViewState& s, TextureHost* host) {
    if (host && s.texture_id) host->release(s.texture_id);
    s.texture_id = 0;
    s.image_sequence = -2;
}

void DrawCellGridView(CellGridViewState& s, TextureHost* host, ImVec2 size) {
    if (size.x <= 0 || size.y <= 0) {
        const ImVec2 avail = ImGui::GetContentRegionAvail();
        if (size.x <= 0) size.x = avail.x;
        if (size.y <= 0) size.y = avail.y;
    }
    ImGui::PushID("cell_grid");
    ImGui::BeginGroup();
    const float top = ImGui::GetCursorPosY();
    if (!s.error.empty()) ImGui::TextColored(ImVec4(1, 0.5f, 0.4f, 1), "%s", s.error.c_str());
    const int seq = s.resolve_sequence();
    if (seq < 0) {
        ImGui::Dummy(ImVec2(size.x, 0));
        draw_empty_state("no chunks processed yet");
        ImGui::EndGroup();
        ImGui::PopID();
        return;
    }
    if (s.sequences.size() > 1) {
        int shown = seq;
        ImGui::SetNextItemWidth(140);
        if (ImGui::SliderInt("sample", &shown, 0, int(s.sequences.size()) - 1)) s.sequence = shown;
        ImGui::SameLine();
    }
    GridSequence& g = s.sequences[size_t(s.resolve_sequence())];
    ImGui::Text("%d layers x %d chunks, %d done (%.0f%%), %zu cells", g.layers, g.chunks, g.done,
                g.layers > 0 && g.chunks > 0 ? 100.0 * g.done / (double(g.layers) * g.chunks) : 0.0, g.cells.size());
    if (!host || s.image_version != s.version || s.image_sequence != seq || !s.texture_id) {
        s.image = build_cell_grid_image(g);
        s.image_version = s.version;
        s.image_sequence = seq;
        if (host && s.image.width > 0) s.texture_id = host->upload_rgba(s.texture_id, s.image.width, s.image.height, s.image.rgba.data());
    }
    const float used = ImGui::GetCursorPosY() - top;
    // the left margin fits the widest layer label (a layer's type makes it longer)
    float label_w = 0;
    for (int l = 0; l < std::max(1, g.layers); ++l) label_w = std::max(label_w, ImGui::CalcTextSize(layer_label(l, s.layer_kinds).c_str()).x);
    const bool timed = s.image.time_hi_ns > 0;
    const char* bar_title = "chunk time (log)";
    const float bar_w = timed ? colour_bar_width(s.image.time_lo_ns, s.image.time_hi_ns, AxisUnit::NANOSECONDS, bar_title) : 8.f;
    const AxisSpec xs{AxisUnit::INTEGER, "chunk"};
    PlotMargins m = plot_margins(&xs, nullptr, nullptr, 0, bar_w);
    m.left = label_w + 10;
    m.top = ImGui::GetTextLineHeight() + 2;  // the colour bar's title
    const ImVec2 body(size.x, std::max(30.f + m.top + m.bottom, size.y - used - ImGui::GetStyle().ItemSpacing.y));
    const PlotFrame f = begin_plot_frame("##grid", body, m);
    ImDrawList* dl = ImGui::GetWindowDrawList();
    dl->AddRectFilled(f.p0, f.p1, IM_COL32(30, 30, 34, 255));
    if (s.texture_id) dl->AddImage(texture_id(s.texture_id), f.p0, f.p1);
    if (timed)
        draw_colour_bar(dl, ImVec2(f.p1.x, f.p0.y), ImVec2(f.outer1.x, f.p1.y), s.image.time_lo_ns, s.image.time_hi_ns,
                        AxisUnit::NANOSECONDS, bar_title, true);
    const float cw = f.width() / std::max(1, g.chunks), lh = f.height() / std::max(1, g.layers);
    // cell outlines (skipped when too small to see)
    for (const auto& c : g.cells) {
        const ImVec2 a(f.p0.x + c.chunk_begin * cw, f.p0.y + c.layer_begin * lh), b(f.p0.x + c.chunk_end * cw, f.p0.y + c.layer_end * lh);
        if (b.x - a.x < 3 && g.cells.size() > 256) continue;
        dl->AddRect(a, b, c.from_table ? IM_COL32(255, 210, 90, 230) : IM_COL32(240, 240, 240, 170), 0, 0, 1.5f);
    }
    if (g.last_layer >= 0) {
        const ImVec2 a(f.p0.x + g.last_chunk * cw, f.p0.y + g.last_layer * lh);
        dl->AddRect(ImVec2(a.x - 1, a.y - 1), ImVec2(a.x + std::max(cw, 3.f) + 1, a.y + std::max(lh, 3.f) + 1), IM_COL32(255, 80, 80, 255), 0, 0, 2);
    }
    // one label per layer row, centred, every k-th when rows are thinner than a line
    const float line = ImGui::GetTextLineHeight();
    for (int l = 0; l < g.layers; l += std::max(1, int(std::ceil(line / std::max(1.f, lh))))) {
        const std::string b = layer_label(l, s.layer_kinds);
        const float y = std::min(f.p1.y - line, f.p0.y + l * lh + std::max(0.f, (lh - line) * 0.5f));
        dl->AddText(ImVec2(f.p0.x - 6 - ImGui::CalcTextSize(b.c_str()).x, y), IM_COL32(210, 210, 210, 235), b.c_str());
    }
    // x: chunk index at the centre of its column
    const AxisRange xr{-0.5, double(std::max(1, g.chunks)) - 0.5};
    draw_x_axis(dl, f, xr, xs);
    if (f.hovered) {
        const GridHit h = cell_grid_hit_test(g, f.p0, f.p1, f.mouse);
        if (h.valid) {
            ImGui::BeginTooltip();
            ImGui::Text("%s, chunk %d", layer_label(h.layer, s.layer_kinds).c_str(), h.chunk);
            const GridChunk* k = g.find(h.layer, h.chunk);
            if (k && k->done) ImGui::Text("took %s", format_duration_ns(double(k->end_ns - k->start_ns)).c_str());
            else ImGui::TextDisabled("not done yet");
            if (h.cell >= 0) {
                const GridCell& c = g.cells[size_t(h.cell)];
                ImGui::Separator();
                ImGui::Text("cell row %d, column %d: layers %d..%d, chunks %d..%d", c.row, c.col, c.layer_begin, c.layer_end - 1,
                            c.chunk_begin, c.chunk_end - 1);
                if (c.finished) ImGui::Text("time %s", format_duration_ns(double(c.end_ns - c.start_ns)).c_str());
                else ImGui::TextDisabled("running");
                if (c.peak_bytes >= 0) ImGui::Text("peak memory %s", format_bytes(double(c.peak_bytes)).c_str());
            }
            ImGui::EndTooltip();
        }
    }
    ImGui::EndGroup();
    ImGui::PopID();
}

// ---- its entry in the view table -----------------------------------------------------------

namespace {
class CellGridSlot final : public StateSlot<CellGridViewState> {
   public:
    void select(const ViewSelection& sel) override {
        release(sel.textures);
        state = {};
        state.run = sel.runs.empty() ? 0 : sel.runs.front();
    }
    bool refresh(storage::SessionReader& r) override { return refresh_cell_grid(state, r); }
    void draw(TextureHost* t, ImVec2 size) override {
        DrawCellGridView(state, t, size);
    }
    void release(TextureHost* t) override { release_cell_grid_textures(state, t); }
};
}  // namespace

ViewEntry cell_grid_view_entry() {
    return {.name = "cell grid", .make = []() -> std::unique_ptr<ViewSlot> { return std::make_unique<CellGridSlot>(); }};
}

}  // namespace kv::views
