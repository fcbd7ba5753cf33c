// Compare view (see compare_view.h).
#include "views/view_table.h"
#include "views/compare_view.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

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
        // A divergence from dense is 0 for the dense run itself: a difference, never a ratio to 0.
        {"next-token KL vs dense", &storage::ComparedRun::fidelity_kl, nullptr, true},
        {"kept attention mass", &storage::ComparedRun::fidelity_kept_mass, nullptr, true},
        {"efficiency vs oracle", &storage::ComparedRun::fidelity_efficiency, nullptr, true},
        {"loss", &storage::ComparedRun::loss, &storage::ComparedRun::d_loss, true},
        {"accuracy", &storage::ComparedRun::accuracy, &storage::ComparedRun::d_accuracy, true},
        {"perplexity", &storage::ComparedRun::perplexity, &storage::ComparedRun::ppl_ratio, false},
        {"tokens/s", &storage::ComparedRun::tokens_per_s, &storage::ComparedRun::speed_ratio, false},
        {"KV bytes", &storage::ComparedRun::kv_bytes, &storage::ComparedRun::kv_ratio, false},
        // What eviction kept against what the buffers hold for it (whole paged blocks, pools).
        {"KV bytes kept (logical)", &storage::ComparedRun::kv_logical_bytes, nullptr, false},
        {"KV bytes held (physical)", &storage::ComparedRun::kv_physical_bytes, nullptr, false},
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
    s.difference_chosen = false;  // a pair picked among other runs means nothing here
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
    s.difference_why.clear();
    if (!s.difference_chosen) {
        std::vector<const EvictionData*> data;
        std::vector<std::string> names;
        for (size_t i = 0; i < s.maps.size(); ++i) {
            data.push_back(&s.maps[i].data);
            names.push_back(i < s.infos.size() ? "run " + std::to_string(s.infos[i].id) + " (" + s.infos[i].name + ")"
                                               : "run " + std::to_string(s.maps[i].run));
        }
        const DifferencePair p = default_difference_pair(data, names, s.sequence, s.layer);
        s.difference_a = p.a, s.difference_run = p.b, s.difference_why = p.why;
    }
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

CompareGrid compare_grid(int n, float width, float height, float gap, float min_w, float min_h) {
    CompareGrid best;
    if (n <= 0) return best;
    const int max_cols = std::clamp(int((width + gap) / (min_w + gap)), 1, n);
    bool best_fits = false;
    double best_score = -1;
    for (int cols = 1; cols <= max_cols; ++cols) {
        const int rows = (n + cols - 1) / cols;
        const float w = std::max(min_w, (width - gap * float(cols - 1)) / float(cols));
        const float h = std::max(min_h, (height - gap * float(rows - 1)) / float(rows));
        const bool fits = float(rows) * h + gap * float(rows - 1) <= height + 0.5f;
        // Score the largest square that fits the cell (a map needs height for its positions as
        // much as width for its steps). Layouts that scroll: fewer rows first.
        const double score = std::min(double(w), double(h));
        const bool better = fits ? score > best_score : rows < best.rows || (rows == best.rows && score > best_score);
        if (best.cols == 0 || (fits && !best_fits) || (fits == best_fits && better))
            best_fits = fits, best_score = score, best = {cols, rows, w, h};
    }
    return best;
}

std::vector<ProgressKnot> run_progress_knots(const EvictionData& d, int64_t t_end_ns) {
    std::vector<ProgressKnot> knots;
    double offset = 0;
    int64_t t_last = std::numeric_limits<int64_t>::min();
    for (const EvictionSequence& sq : d.sequences) {
        const EvictionLayer* first = nullptr;
        for (const EvictionLayer& l : sq.layers) {
            if (!first && l.steps() > 0) first = &l;
            if (!l.step_t_ns.empty()) t_last = std::max(t_last, l.step_t_ns.back());
        }
        if (!first) continue;
        for (int k = 0; k < first->steps() && size_t(k) < first->step_t_ns.size(); ++k) {
            // Out-of-order times (clock skew between threads) must not make x go back.
            const int64_t t = knots.empty() ? first->step_t_ns[size_t(k)] : std::max(knots.back().t_ns, first->step_t_ns[size_t(k)]);
            knots.push_back({t, offset + double(first->plans[size_t(k)].input_pos)});
        }
        offset += double(sq.tokens());
    }
    if (knots.empty()) return knots;
    knots.push_back({std::max({t_end_ns, t_last, knots.back().t_ns}), offset});
    return knots;
}

namespace {
// Why layer `layer` of a and b cannot be diffed ("" when it can): what build_difference_image requires.
std::string difference_problem(const EvictionData& a, const EvictionData& b, int sequence, int layer) {
    const auto layer_of = [&](const EvictionData& d) -> const EvictionLayer* {
        const int seq = d.resolve_sequence(sequence);
        if (seq < 0 || layer < 0 || size_t(layer) >= d.sequences[size_t(seq)].layers.size()) return nullptr;
        const EvictionLayer& l = d.sequences[size_t(seq)].layers[size_t(layer)];
        return l.steps() > 0 ? &l : nullptr;
    };
    const EvictionLayer *la = layer_of(a), *lb = layer_of(b);
    if (!la || !lb) return "no cache steps";
    if (la->steps() != lb->steps() || la->tokens != lb->tokens) return "different steps";
    return "";
}
std::string steps_text(const EvictionData& d, int sequence, int layer) {
    const int seq = d.resolve_sequence(sequence);
    if (seq < 0 || layer < 0 || size_t(layer) >= d.sequences[size_t(seq)].layers.size()) return "no cache steps yet";
    const EvictionLayer& l = d.sequences[size_t(seq)].layers[size_t(layer)];
    if (l.steps() == 0) return "no cache steps yet";
    return std::to_string(l.steps()) + (l.steps() == 1 ? " chunk step" : " chunk steps") + " over " + std::to_string(l.tokens) +
           " positions";
}
}  // namespace

DifferencePair default_difference_pair(const std::vector<const EvictionData*>& data, const std::vector<std::string>& names,
                                       int sequence, int layer) {
    DifferencePair p;
    const int n = int(data.size());
    for (int a = 0; a < n; ++a)
        for (int b = a + 1; b < n; ++b)
            if (difference_problem(*data[size_t(a)], *data[size_t(b)], sequence, layer).empty()) return {a, b, ""};
    if (n < 2) return p;
    for (const EvictionData* d : data)  // still loading: no verdict yet
        if (steps_text(*d, sequence, layer) == "no cache steps yet") return p;
    const auto name = [&](int i) { return size_t(i) < names.size() ? names[size_t(i)] : "run " + std::to_string(i + 1); };
    p.why = std::string(n == 2 ? "These two runs cannot be diffed" : "No two of these runs cut the sample the same way") +
            ": in layer " + std::to_string(layer) + ", " + name(0) + " has " + steps_text(*data[0], sequence, layer) + " and " +
            name(1) + " has " + steps_text(*data[1], sequence, layer) +
            " (a difference map needs the same data and chunk size; the maps are shown instead).";
    return p;
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
            // Which two runs: A and B (by default the first pair that can be diffed).
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
                            *which = int(i), s.difference_chosen = true;
                    ImGui::EndCombo();
                }
            }
        }
    }
    // The difference map's pair (default or chosen); when no pair can be diffed, one sentence
    // says why and the maps stay in its place.
    if (s.show_maps && s.show_difference && s.maps.size() >= 2) {
        update_compare_difference(s, host);
        if (!s.difference_why.empty()) {
            ImGui::PushTextWrapPos(ImGui::GetCursorPosX() + size.x);
            ImGui::TextColored(ImVec4(1, 0.7f, 0.4f, 1), "%s", s.difference_why.c_str());
            ImGui::PopTextWrapPos();
        }
    }
    const float used = ImGui::GetCursorPosY() - top;
    const float avail_h = std::max(120.f, size.y - used);
    const ImGuiStyle& style = ImGui::GetStyle();
    const int n = int(s.maps.size());
    const bool maps = s.show_maps && n > 0, difference = maps && s.show_difference && n >= 2 && s.difference_why.empty();

    // One colour bar for every map: presence and reads are shares on a fixed 0..1 scale; age and
    // score span every map's values, and each map is coloured over that same range.
    EvictionColourKey key;
    bool have_key = false;
    float lo = std::numeric_limits<float>::max(), hi = std::numeric_limits<float>::lowest();
    for (const auto& m : s.maps)
        if (m.main.valid && m.main.image.width > 0) {
            if (!have_key) key = eviction_colour_key(m.main.image), have_key = true;
            // The images' own values (value_min/max), not the shared range they were coloured with.
            const EvictionImage& im = m.main.image;
            if (im.value_min <= im.value_max) lo = std::min(lo, im.value_min), hi = std::max(hi, im.value_max);
        }
    const bool ranged = s.colour == EvictionColour::AGE || s.colour == EvictionColour::SCORE;
    if (have_key && ranged && lo <= hi) key.lo = lo, key.hi = hi;
    for (auto& m : s.maps) m.fixed_range = ranged && lo <= hi, m.range_lo = lo, m.range_hi = hi, m.colour_key = false;
    if (!have_key) key = eviction_colour_key(EvictionImage{});
    const float key_w = maps && !difference ? eviction_colour_key_width(key) + kCompareGap : 0.f;

    // Heights below the toolbar: the maps at least their minimum grid, the memory overlay a real
    // share (legend, plot and axis: at least ~160 px), the tables what is left up to their rows.
    // When the minimums do not fit, the region scrolls instead of shrinking them.
    const float row_h = ImGui::GetTextLineHeight() + 2 * style.CellPadding.y + 1;
    const float table_rows = float(std::max<size_t>(1, s.comparison.differing_fields.size() + 1) + compare_metric_rows(s.comparison).size() + 1);
    const float tables_natural = s.have_comparison ? row_h * table_rows + 2 * style.ItemSpacing.y + 4 : 0.f;
    struct Layout {
        CompareGrid grid;
        float tables = 0, maps = 0, memory = 0, total = 0;
    };
    const auto layout = [&](float width) {
        Layout l;
        const float spacing = style.ItemSpacing.y;
        const float mem_min = s.show_memory ? std::max(160.f, 0.25f * avail_h) : 0.f;
        const float grid_min = maps && !difference ? compare_grid(n, width - key_w, 0).height() : maps ? kCompareMinPanel + 3 * ImGui::GetTextLineHeightWithSpacing() : 0.f;
        const float tables_min = std::min(tables_natural, 4 * row_h);
        l.tables = std::clamp(avail_h - grid_min - mem_min - 3 * spacing, tables_min, std::min(tables_natural, 0.35f * avail_h));
        const float rest = avail_h - l.tables - 3 * spacing;
        l.memory = !s.show_memory ? 0.f : maps ? std::max(mem_min, 0.38f * rest) : std::max(mem_min, rest);
        l.maps = maps ? std::max(grid_min, rest - l.memory) : 0.f;
        if (maps && !difference) {
            l.grid = compare_grid(n, width - key_w, l.maps);
            l.maps = l.grid.height();
        }
        l.total = l.tables + l.maps + l.memory + 3 * spacing;
        return l;
    };
    Layout l = layout(size.x);
    const bool scrolls = l.total > avail_h + 0.5f;
    if (scrolls) l = layout(size.x - style.ScrollbarSize);  // the scrollbar takes its width
    const float inner_w = scrolls ? size.x - style.ScrollbarSize : size.x;

    s.shown = {};
    ImGui::BeginChild("##compare_body", ImVec2(size.x, avail_h), false, ImGuiWindowFlags_HorizontalScrollbar);
    const ImVec2 body0 = ImGui::GetWindowPos();
    s.shown.body = ImVec4(body0.x, body0.y, body0.x + ImGui::GetWindowSize().x, body0.y + ImGui::GetWindowSize().y);
    if (s.have_comparison) draw_tables(s, l.tables);

    if (difference) {
        draw_difference(s, host, ImVec2(inner_w, l.maps));
    } else if (maps) {
        // Every map shows the shared selection; whichever the user zoomed becomes the shared window.
        const CompareGrid& grid = l.grid;
        const float w = grid.cell_w, h = grid.cell_h - ImGui::GetTextLineHeightWithSpacing();
        const ImVec2 grid0 = ImGui::GetCursorScreenPos();
        for (int i = 0; i < n; ++i) {
            EvictionMapViewState& m = s.maps[size_t(i)];
            m.layer = s.layer, m.head = s.head, m.colour = s.colour, m.sequence = s.sequence;
            m.steps_range = s.steps_range, m.tokens_range = s.tokens_range, m.follow = s.follow;
            if (i % grid.cols) ImGui::SameLine(0, kCompareGap);
            ImGui::BeginGroup();
            ImGui::PushID(i);
            const ImVec2 p0 = ImGui::GetCursorScreenPos();
            const std::string name = size_t(i) < s.infos.size()
                                         ? "run " + std::to_string(s.infos[size_t(i)].id) + ": " + s.infos[size_t(i)].name
                                         : std::string("run");
            ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(series_colour(i)), "%s",
                               fit_text((i == 0 ? "reference " : "") + name, w).c_str());
            DrawEvictionMapView(m, host, ImVec2(w, h));
            ImGui::PopID();
            ImGui::EndGroup();
            s.shown.maps.push_back(ImVec4(p0.x, p0.y, p0.x + w, ImGui::GetItemRectMax().y));
            if (!(m.steps_range == s.steps_range) || !(m.tokens_range == s.tokens_range) || m.follow != s.follow) {
                s.steps_range = m.steps_range, s.tokens_range = m.tokens_range, s.follow = m.follow;
            }
        }
        // The shared colour bar right of the grid, as tall as a row's plot (at least a panel).
        const float line = ImGui::GetTextLineHeightWithSpacing();
        const ImVec2 k0(grid0.x + grid.width() + kCompareGap, grid0.y + 2 * line);
        draw_eviction_colour_key(ImGui::GetWindowDrawList(), key, k0,
                                 ImVec2(k0.x + key_w - kCompareGap, k0.y + std::max(kCompareMinPanel, grid.cell_h) - 4 * line));
        s.shown.colour_keys = 1;
        // The first map fitted the shared window to its data; with follow the others take it too.
        if (s.follow) {
            double steps = 1, tokens = 1;
            for (const auto& m : s.maps) steps = std::max(steps, m.steps_range.hi), tokens = std::max(tokens, m.tokens_range.hi);
            s.steps_range = {0, steps}, s.tokens_range = {0, tokens};
        }
    }
    if (s.show_memory && !s.memories.empty()) {
        std::vector<MemoryTimelineViewState*> states;
        std::vector<std::string> names;
        std::vector<std::vector<ProgressKnot>> knots;
        for (size_t i = 0; i < s.memories.size(); ++i) {
            states.push_back(&s.memories[i]);
            names.push_back(i < s.infos.size() ? "run " + std::to_string(s.infos[i].id) : "run");
            const auto it = s.memories[i].series.find(s.memories[i].active_device());
            const int64_t t_end = it == s.memories[i].series.end() ? 0 : it->second.t_max;
            knots.push_back(i < s.maps.size() ? run_progress_knots(s.maps[i].data, t_end) : std::vector<ProgressKnot>{});
        }
        s.shown.memory_height = std::max(40.f, l.memory);
        s.shown.memory_ends = DrawMemoryOverlay(states, names, knots, ImVec2(inner_w, s.shown.memory_height));
    }
    s.shown.scroll_max_x = ImGui::GetScrollMaxX();
    s.shown.scroll_max_y = ImGui::GetScrollMaxY();
    ImGui::EndChild();
    ImGui::EndGroup();
    ImGui::PopID();
}

// ---- its entry in the view table -----------------------------------------------------------

namespace {
class CompareSlot final : public StateSlot<CompareViewState> {
   public:
    void select(const ViewSelection& sel) override {
        release(sel.textures);
        state = {};
        set_reference(sel);
    }
    bool refresh(storage::SessionReader& r) override { return refresh_compare(state, r); }
    void draw(TextureHost* t, ImVec2 size) override {
        DrawCompareView(state, t, size);
    }
    void release(TextureHost* t) override { release_compare_textures(state, t); }
    void set_reference(const ViewSelection& sel) override {
        compare_select(state, sel.runs.size() >= 2 ? sel.runs : std::vector<int64_t>{}, sel.reference, sel.textures);
    }
};
}  // namespace

ViewEntry compare_view_entry() {
    return {.name = "compare", .min_runs = 2, .several_runs = true, .keeps_several = true, .make = []() -> std::unique_ptr<ViewSlot> { return std::make_unique<CompareSlot>(); }};
}

}  // namespace kv::views
