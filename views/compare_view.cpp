// Compare view (see compare_view.h).
#include "views/compare_view.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "storage/session_reader.h"
#include "views/colormap.h"

namespace kv::views {

std::vector<CompareMetricRow> compare_metric_rows(const storage::Comparison& c) {
    struct Field {
        const char* name;
        double storage::ComparedRun::*value;
        double storage::ComparedRun::*relative;  // nullptr: ratio computed here
        bool difference;
    };
    static const Field kFields[] = {
        // The study's numbers first: the task's own score and the distance to the dense model.
        {"copied tokens", &storage::ComparedRun::copy_token_accuracy, nullptr, true},
        {"answer tokens right", &storage::ComparedRun::answer_token_accuracy, nullptr, true},
        {"next-token KL vs dense", &storage::ComparedRun::fidelity_kl, nullptr, false},
        {"kept attention mass", &storage::ComparedRun::fidelity_kept_mass, nullptr, true},
        {"loss", &storage::ComparedRun::loss, &storage::ComparedRun::d_loss, true},
        {"accuracy", &storage::ComparedRun::accuracy, &storage::ComparedRun::d_accuracy, true},
        {"perplexity", &storage::ComparedRun::perplexity, &storage::ComparedRun::ppl_ratio, false},
        {"tokens/s", &storage::ComparedRun::tokens_per_s, &storage::ComparedRun::speed_ratio, false},
        {"KV bytes", &storage::ComparedRun::kv_bytes, &storage::ComparedRun::kv_ratio, false},
        {"peak bytes", &storage::ComparedRun::peak_bytes, &storage::ComparedRun::peak_ratio, false},
        {"seconds", &storage::ComparedRun::seconds, nullptr, false},
        // What measuring cost (fidelity), apart from the runs' own numbers above; rows with no
        // value in any run are left out.
        {"instrumentation seconds", &storage::ComparedRun::instrumentation_seconds, nullptr, false},
        {"tokens/s with instrumentation", &storage::ComparedRun::tokens_per_s_with_instrumentation, nullptr, false},
        {"peak bytes with instrumentation", &storage::ComparedRun::peak_bytes_with_instrumentation, nullptr, false},
    };
    std::vector<CompareMetricRow> out;
    for (const Field& f : kFields) {
        CompareMetricRow r;
        r.name = f.name;
        r.difference = f.difference;
        bool any = false;
        for (const auto& run : c.runs) {
            const double v = run.*f.value;
            any |= !std::isnan(v);
            r.values.push_back(v);
            const double ref = c.runs.front().*f.value;
            r.relative.push_back(f.relative ? run.*f.relative : f.difference ? v - ref : v / ref);
        }
        if (any) out.push_back(std::move(r));
    }
    return out;
}

void compare_select(CompareViewState& s, const std::vector<int64_t>& runs, int64_t reference, TextureHost* host) {
    release_compare_textures(s, host);
    s.runs = runs;
    s.reference = reference;
    s.have_comparison = false;
    s.comparison = {};
    s.infos.clear();
    s.maps.clear();
    s.memories.clear();
    ++s.version;
}

void release_compare_textures(CompareViewState& s, TextureHost* host) {
    for (auto& m : s.maps) release_eviction_textures(m, host);
    if (host && s.difference_texture) host->release(s.difference_texture);
    s.difference_texture = 0;
    s.difference_valid = false;
}

void update_compare_difference(CompareViewState& s, TextureHost* host) {
    if (s.maps.size() < 2) return;
    const int n = int(s.maps.size());
    s.difference_a = std::clamp(s.difference_a, 0, n - 1);
    s.difference_run = std::clamp(s.difference_run, 0, n - 1);
    if (s.difference_run == s.difference_a) s.difference_run = (s.difference_a + 1) % n;
    const EvictionMapViewState &a = s.maps[size_t(s.difference_a)], &b = s.maps[size_t(s.difference_run)];
    const CompareViewState::DifferenceKey key{a.data.version, b.data.version, s.difference_a, s.difference_run,
                                              s.layer, s.head, s.sequence};
    if (s.difference_valid && key == s.difference_key) return;
    s.difference = build_difference_image(a.data, a.data.resolve_sequence(s.sequence), b.data, b.data.resolve_sequence(s.sequence),
                                          s.layer, s.head);
    s.difference_key = key;
    s.difference_valid = true;
    if (!host) return;
    if (s.difference.width > 0)
        s.difference_texture = host->upload_rgba(s.difference_texture, s.difference.width, s.difference.height, s.difference.rgba.data());
    else if (s.difference_texture)
        host->release(s.difference_texture), s.difference_texture = 0;
}

CompareGrid compare_grid(int n, float width, float height, float gap) {
    CompareGrid best;
    if (n <= 0) return best;
    double best_score = -1;
    for (int cols = 1; cols <= n; ++cols) {
        const int rows = (n + cols - 1) / cols;
        const float w = (width - gap * float(cols - 1)) / float(cols), h = (height - gap * float(rows - 1)) / float(rows);
        if (w <= 0 || h <= 0) continue;
        // A map reads best about 1.5x as wide as tall (steps across, positions down): score the
        // largest such rectangle that fits the cell.
        const double score = std::min(double(w), 1.5 * double(h));
        if (score > best_score) best_score = score, best = {cols, rows, w, h};
    }
    return best;
}

namespace {
// Compared runs in display order: reference first, then the others as selected.
std::vector<int64_t> display_order(const CompareViewState& s) {
    std::vector<int64_t> order;
    if (s.runs.empty()) return order;
    const int64_t ref = s.reference ? s.reference : s.runs.front();
    order.push_back(ref);
    for (int64_t r : s.runs)
        if (r != ref) order.push_back(r);
    return order;
}
}  // namespace

bool refresh_compare(CompareViewState& s, storage::SessionReader& reader) {
    const std::vector<int64_t> order = display_order(s);
    bool changed = false;
    std::vector<storage::RunInfo> infos;
    try {
        for (int64_t id : order) infos.push_back(reader.run(id));
        s.comparison_error.clear();
    } catch (const std::exception& e) {
        s.comparison_error = e.what();
        return false;
    }
    bool runs_changed = infos.size() != s.infos.size();
    for (size_t i = 0; !runs_changed && i < infos.size(); ++i)
        runs_changed = infos[i].status != s.infos[i].status || infos[i].summary != s.infos[i].summary ||
                       infos[i].config != s.infos[i].config || infos[i].name != s.infos[i].name;
    s.infos = std::move(infos);
    if (runs_changed || !s.have_comparison) {
        try {
            s.comparison = storage::compare_runs(reader, order, order.empty() ? 0 : order.front());
            s.have_comparison = true;
        } catch (const std::exception& e) {
            s.comparison_error = e.what();
        }
        changed = true;
    }
    if (s.maps.size() != order.size()) {
        s.maps.assign(order.size(), {});
        s.memories.assign(order.size(), {});
        for (size_t i = 0; i < order.size(); ++i) {
            s.maps[i].run = s.memories[i].run = order[i];
            s.maps[i].toolbar = false;
            s.maps[i].max_texture_width = 1024;
            s.maps[i].max_texture_height = 1024;
            s.maps[i].refresh_budget_ms = 20.0 / double(order.size());
            s.memories[i].show_spans = false;
            // Several runs share one frame's budget.
            s.memories[i].refresh_budget_ms = 20.0 / double(order.size());
        }
    }
    for (size_t i = 0; i < order.size(); ++i) {
        s.maps[i].colour = s.colour;
        s.maps[i].layer = s.layer;
        changed |= refresh_eviction_map(s.maps[i], reader);
        changed |= refresh_memory_timeline(s.memories[i], reader);
    }
    if (changed) ++s.version;
    return changed;
}

namespace {

std::string run_header(int64_t id, bool reference) { return "run " + std::to_string(id) + (reference ? " (reference)" : ""); }

// `text` cut to fit `width` pixels, "..." marking the cut.
std::string fit_text(const std::string& text, float width) {
    if (ImGui::CalcTextSize(text.c_str()).x <= width) return text;
    std::string t = text;
    while (!t.empty() && ImGui::CalcTextSize((t + "...").c_str()).x > width) t.pop_back();
    return t + "...";
}

std::string fmt_value(double v, bool bytes) {
    if (std::isnan(v)) return "-";
    if (bytes) return format_bytes(v);
    char b[32];
    std::snprintf(b, sizeof b, "%.5g", v);
    return b;
}

std::string fmt_relative(double v, bool difference) {
    if (std::isnan(v)) return "";
    char b[32];
    if (difference) std::snprintf(b, sizeof b, "%+.3g", v);
    else std::snprintf(b, sizeof b, "x%.3g", v);
    return b;
}

void draw_tables(CompareViewState& s, float height) {
    const storage::Comparison& c = s.comparison;
    ImGui::BeginChild("##tables", ImVec2(0, height), false);
    const int ncol = int(c.runs.size()) + 1;
    if (!c.differing_fields.empty() &&
        ImGui::BeginTable("##config", ncol, ImGuiTableFlags_Borders | ImGuiTableFlags_RowBg | ImGuiTableFlags_SizingStretchProp)) {
        ImGui::TableSetupColumn("differing field", ImGuiTableColumnFlags_WidthFixed);
        // Short headers that always fit: the run's name is over its map and in the legend.
        for (size_t i = 0; i < c.runs.size(); ++i) ImGui::TableSetupColumn(run_header(c.runs[i].id, i == 0).c_str());
        ImGui::TableHeadersRow();
        for (size_t f = 0; f < c.differing_fields.size(); ++f) {
            ImGui::TableNextRow();
            ImGui::TableNextColumn();
            ImGui::TextUnformatted(c.differing_fields[f].c_str());
            for (const auto& r : c.runs) {
                ImGui::TableNextColumn();
                ImGui::TextUnformatted(f < r.config_diff.size() ? r.config_diff[f].second.c_str() : "");
            }
        }
        ImGui::EndTable();
    } else if (c.differing_fields.empty()) {
        ImGui::TextDisabled("configurations are identical");
    }
    const std::vector<CompareMetricRow> rows = compare_metric_rows(c);
    if (ImGui::BeginTable("##metrics", ncol, ImGuiTableFlags_Borders | ImGuiTableFlags_RowBg | ImGuiTableFlags_SizingStretchProp)) {
        ImGui::TableSetupColumn("metric", ImGuiTableColumnFlags_WidthFixed);
        for (size_t i = 0; i < c.runs.size(); ++i)
            ImGui::TableSetupColumn((run_header(c.runs[i].id, i == 0) + " [" + c.runs[i].status + "]").c_str());
        ImGui::TableHeadersRow();
        for (const auto& r : rows) {
            ImGui::TableNextRow();
            ImGui::TableNextColumn();
            ImGui::TextUnformatted(r.name.c_str());
            const bool bytes = r.name.find("bytes") != std::string::npos;
            for (size_t i = 0; i < r.values.size(); ++i) {
                ImGui::TableNextColumn();
                ImGui::TextUnformatted(fmt_value(r.values[i], bytes).c_str());
                if (i > 0 && !std::isnan(r.relative[i])) {
                    ImGui::SameLine();
                    ImGui::TextDisabled("%s", fmt_relative(r.relative[i], r.difference).c_str());
                }
            }
        }
        ImGui::EndTable();
    }
    ImGui::EndChild();
}

void draw_difference(CompareViewState& s, TextureHost* host, ImVec2 size) {
    update_compare_difference(s, host);
    const DifferenceImage& d = s.difference;
    const auto name = [&](size_t i) {
        return i < s.infos.size() ? "run " + std::to_string(s.infos[i].id) + ": " + s.infos[i].name : std::string("run");
    };
    const size_t ai = size_t(s.difference_a), bi = size_t(s.difference_run);
    if (!d.error.empty() || d.width == 0) {
        ImGui::TextColored(ImVec4(1, 0.7f, 0.4f, 1), "difference map: %s", d.error.empty() ? "no cache steps yet" : d.error.c_str());
        ImGui::Dummy(ImVec2(size.x, std::max(0.f, size.y - ImGui::GetTextLineHeightWithSpacing())));
        return;
    }
    // Legend with the counts, one row above the map.
    const double total = double(d.counts.both + d.counts.only_a + d.counts.only_b);
    auto pct = [&](int64_t n) {
        char b[32];
        std::snprintf(b, sizeof b, " %lld (%.1f%%)", (long long)n, total > 0 ? 100.0 * double(n) / total : 0.0);
        return std::string(b);
    };
    const std::vector<LegendEntry> legend = {
        {kDiffBothColour, "held by both" + pct(d.counts.both)},
        {kDiffOnlyAColour, "only A, " + name(ai) + pct(d.counts.only_a)},
        {kDiffOnlyBColour, "only B, " + name(bi) + pct(d.counts.only_b)},
        {kNoDataColour, "neither"},
    };
    ImDrawList* dl = ImGui::GetWindowDrawList();
    const ImVec2 at = ImGui::GetCursorScreenPos();
    const float lh = legend_height(size.x, legend);
    draw_legend(dl, at, at.x + size.x, legend);
    ImGui::Dummy(ImVec2(size.x, lh));
    ImGui::TextDisabled("layer %d, head %d: (step, position) pairs held after each step; %d steps x %lld positions", s.layer, s.head,
                        d.steps, (long long)d.tokens);
    const float h = std::max(60.f, size.y - lh - ImGui::GetTextLineHeightWithSpacing() - ImGui::GetStyle().ItemSpacing.y);
    if (s.follow) s.steps_range = {0, double(d.steps)}, s.tokens_range = {0, double(d.tokens)};
    const AxisSpec xs{AxisUnit::INTEGER, "chunk step"}, ys{AxisUnit::INTEGER, "token position"};
    const PlotFrame f = begin_plot_frame("##difference", ImVec2(size.x, h), plot_margins(&xs, &ys, &s.tokens_range, h));
    if (plot_zoom_pan(f, s.steps_range, 0, double(d.steps), &s.tokens_range, 0, double(d.tokens), true)) s.follow = false;
    if (f.hovered && ImGui::IsMouseDoubleClicked(ImGuiMouseButton_Left)) s.follow = true;
    dl->AddRectFilled(f.p0, f.p1, kNoDataColour);
    if (s.difference_texture) {
        const double x1 = double(d.width) * d.steps_per_texel, y1 = double(d.height) * double(d.tokens_per_texel);
        dl->PushClipRect(f.p0, f.p1, true);
        dl->AddImage(texture_id(s.difference_texture),
                     ImVec2(float(axis_to_pixel(s.steps_range, 0, f.p0.x, f.p1.x)), float(axis_to_pixel(s.tokens_range, 0, f.p0.y, f.p1.y))),
                     ImVec2(float(axis_to_pixel(s.steps_range, x1, f.p0.x, f.p1.x)), float(axis_to_pixel(s.tokens_range, y1, f.p0.y, f.p1.y))));
        dl->PopClipRect();
    }
    draw_x_axis(dl, f, s.steps_range, xs);
    draw_y_axis(dl, f, s.tokens_range, ys, true);
    if (f.hovered) {
        const EvictionHit hit = eviction_hit_test(s.steps_range, s.tokens_range, f.p0, f.p1, f.mouse, d.steps, d.tokens);
        if (hit.valid) {
            const EvictionMapViewState &a = s.maps[ai], &b = s.maps[bi];
            const TokenAtStep ia = eviction_token_info(a.data, a.data.resolve_sequence(s.sequence), s.layer, s.head, hit.token, hit.step);
            const TokenAtStep ib = eviction_token_info(b.data, b.data.resolve_sequence(s.sequence), s.layer, s.head, hit.token, hit.step);
            ImGui::BeginTooltip();
            ImGui::Text("step %d  token position %lld", hit.step, (long long)hit.token);
            const bool unwritten = (ia.inserted_step < 0 || ia.inserted_step > hit.step) && (ib.inserted_step < 0 || ib.inserted_step > hit.step);
            ImGui::Text("%s", ia.cached && ib.cached ? "held by both"
                              : ia.cached            ? "only A holds it"
                              : ib.cached            ? "only B holds it"
                              : unwritten            ? "not written yet"
                                                     : "held by neither");
            for (const auto& [label, info] : {std::pair{"A", &ia}, std::pair{"B", &ib}}) {
                if (info->evicted_step >= 0) ImGui::Text("%s: inserted at step %d, evicted at step %d", label, info->inserted_step, info->evicted_step);
                else if (info->inserted_step >= 0) ImGui::Text("%s: inserted at step %d, never evicted", label, info->inserted_step);
            }
            ImGui::EndTooltip();
        }
    }
}

}  // namespace

void DrawCompareView(CompareViewState& s, TextureHost* host, ImVec2 size) {
    if (size.x <= 0 || size.y <= 0) {
        const ImVec2 avail = ImGui::GetContentRegionAvail();
        if (size.x <= 0) size.x = avail.x;
        if (size.y <= 0) size.y = avail.y;
    }
    ImGui::PushID("compare");
    ImGui::BeginGroup();
    const float top = ImGui::GetCursorPosY();
    if (s.runs.size() < 2) {
        ImGui::Dummy(ImVec2(size.x, 0));
        draw_empty_state("select 2 to 8 runs to compare them");
        ImGui::EndGroup();
        ImGui::PopID();
        return;
    }
    if (!s.comparison_error.empty()) ImGui::TextColored(ImVec4(1, 0.6f, 0.4f, 1), "%s", s.comparison_error.c_str());
    ImGui::Checkbox("eviction maps", &s.show_maps);
    ImGui::SameLine();
    ImGui::Checkbox("memory", &s.show_memory);
    if (s.show_maps) {
        int layers = 1, heads = 1;
        for (const auto& m : s.maps) {
            const int seq = m.data.resolve_sequence(s.sequence);
            if (seq < 0) continue;
            const auto& sq = m.data.sequences[size_t(seq)];
            layers = std::max(layers, int(sq.layers.size()));
            for (const auto& l : sq.layers) heads = std::max(heads, int(l.rows));
        }
        // The toolbar wraps instead of running off a narrow view.
        const float label_pad = ImGui::GetStyle().ItemInnerSpacing.x + ImGui::GetFrameHeight();
        auto next = [&](float width) {
            ImGui::SameLine();
            if (ImGui::GetContentRegionAvail().x < width) ImGui::NewLine();
        };
        next(140 + ImGui::CalcTextSize("layer").x + label_pad);
        ImGui::SetNextItemWidth(140);
        ImGui::SliderInt("layer", &s.layer, 0, layers - 1);
        if (heads > 1) {
            next(100 + ImGui::CalcTextSize("head").x + label_pad);
            ImGui::SetNextItemWidth(100);
            ImGui::SliderInt("head", &s.head, 0, heads - 1);
        }
        for (int c = 0; c < int(EvictionColour::COUNT); ++c) {
            next(ImGui::CalcTextSize(eviction_colour_name(EvictionColour(c))).x + label_pad);
            if (ImGui::RadioButton(eviction_colour_name(EvictionColour(c)), s.colour == EvictionColour(c))) s.colour = EvictionColour(c);
        }
        next(ImGui::CalcTextSize("fit").x + label_pad);
        if (ImGui::Button("fit")) s.follow = true;
        next(ImGui::CalcTextSize("difference map").x + label_pad);
        ImGui::Checkbox("difference map", &s.show_difference);
        if (s.show_difference && s.infos.size() > 2) {
            // Which two runs: A (default the reference) and B.
            for (int* which : {&s.difference_a, &s.difference_run}) {
                const bool is_a = which == &s.difference_a;
                next(20 + 110);
                ImGui::TextUnformatted(is_a ? "A" : "B");
                ImGui::SameLine();
                ImGui::SetNextItemWidth(110);
                const int cur = std::clamp(*which, 0, int(s.infos.size()) - 1);
                const std::string label = "run " + std::to_string(s.infos[size_t(cur)].id);
                if (ImGui::BeginCombo(is_a ? "##a" : "##b", label.c_str())) {
                    for (size_t i = 0; i < s.infos.size(); ++i)
                        if (ImGui::Selectable(("run " + std::to_string(s.infos[i].id) + ": " + s.infos[i].name).c_str(), int(i) == cur))
                            *which = int(i);
                    ImGui::EndCombo();
                }
            }
        }
    }
    const float used = ImGui::GetCursorPosY() - top;
    const float rest = std::max(120.f, size.y - used);
    // Tables as tall as their rows (headers, differing fields, metrics), at most 40% of the view.
    const float row_h = ImGui::GetTextLineHeight() + 2 * ImGui::GetStyle().CellPadding.y;
    // header + rows of each table (or the "identical" line), the gap between them and borders
    const float table_rows = float(std::max<size_t>(1, s.comparison.differing_fields.size() + 1) + compare_metric_rows(s.comparison).size() + 1);
    const float table_h = s.have_comparison ? std::min(rest * 0.4f, (row_h + 1) * table_rows + 2 * ImGui::GetStyle().ItemSpacing.y + 4) : 0.f;
    const float maps_h = s.show_maps ? (rest - table_h) * (s.show_memory ? 0.58f : 1.f) : 0.f;
    const float mem_h = s.show_memory ? rest - table_h - maps_h - 3 * ImGui::GetStyle().ItemSpacing.y : 0.f;
    if (s.have_comparison) draw_tables(s, table_h);

    if (s.show_maps && s.show_difference && s.maps.size() >= 2) {
        draw_difference(s, host, ImVec2(size.x, maps_h));
    } else if (s.show_maps && !s.maps.empty()) {
        // Every map shows the shared selection; whichever the user zoomed becomes the shared window.
        const int n = int(s.maps.size());
        const CompareGrid grid = compare_grid(n, size.x, maps_h);
        const int cols = grid.cols;
        const float w = grid.cell_w, h = grid.cell_h - ImGui::GetTextLineHeightWithSpacing();
        for (int i = 0; i < n; ++i) {
            EvictionMapViewState& m = s.maps[size_t(i)];
            m.layer = s.layer, m.head = s.head, m.colour = s.colour, m.sequence = s.sequence;
            m.steps_range = s.steps_range, m.tokens_range = s.tokens_range, m.follow = s.follow;
            if (i % cols) ImGui::SameLine(0, kCompareGap);
            ImGui::BeginGroup();
            ImGui::PushID(i);
            const std::string name = size_t(i) < s.infos.size()
                                         ? "run " + std::to_string(s.infos[size_t(i)].id) + ": " + s.infos[size_t(i)].name
                                         : std::string("run");
            ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(series_colour(i)), "%s",
                               fit_text((i == 0 ? "reference " : "") + name, std::max(40.f, w)).c_str());
            DrawEvictionMapView(m, host, ImVec2(std::max(40.f, w), std::max(40.f, h)));
            ImGui::PopID();
            ImGui::EndGroup();
            if (!(m.steps_range == s.steps_range) || !(m.tokens_range == s.tokens_range) || m.follow != s.follow) {
                s.steps_range = m.steps_range, s.tokens_range = m.tokens_range, s.follow = m.follow;
            }
        }
        // The first map fitted the shared window to its data; with follow the others take it too.
        if (s.follow && !s.maps.empty()) {
            double steps = 1, tokens = 1;
            for (const auto& m : s.maps) steps = std::max(steps, m.steps_range.hi), tokens = std::max(tokens, m.tokens_range.hi);
            s.steps_range = {0, steps}, s.tokens_range = {0, tokens};
        }
    }
    if (s.show_memory && !s.memories.empty()) {
        std::vector<MemoryTimelineViewState*> states;
        std::vector<std::string> names;
        for (size_t i = 0; i < s.memories.size(); ++i) {
            states.push_back(&s.memories[i]);
            names.push_back(i < s.infos.size() ? "run " + std::to_string(s.infos[i].id) + ": " + s.infos[i].name : "run");
        }
        DrawMemoryOverlay(states, names, ImVec2(size.x, std::max(40.f, mem_h)));
    }
    ImGui::EndGroup();
    ImGui::PopID();
}

}  // namespace kv::views
