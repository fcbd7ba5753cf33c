// Scores view (see scores_view.h).
#include "views/view_table.h"
#include "views/scores_view.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "storage/session_reader.h"

namespace kv::views {

namespace {
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr Colour kProtectedColour = pack_rgba(235, 235, 240);
}  // namespace

int64_t ScoreHistogram::total() const { return std::accumulate(counts.begin(), counts.end(), int64_t(0)) + nonfinite; }

ScoreHistogram score_histogram(const float* values, size_t n, int bins) {
    ScoreHistogram h;
    bins = std::max(1, bins);
    h.counts.assign(size_t(bins), 0);
    double lo = std::numeric_limits<double>::infinity(), hi = -lo;
    for (size_t i = 0; i < n; ++i)
        if (std::isfinite(values[i])) lo = std::min(lo, double(values[i])), hi = std::max(hi, double(values[i]));
    if (lo > hi) {
        h.nonfinite = int64_t(n);
        return h;
    }
    h.lo = lo, h.hi = hi;
    const double width = hi > lo ? (hi - lo) / bins : 1.0;
    for (size_t i = 0; i < n; ++i) {
        if (!std::isfinite(values[i])) {
            ++h.nonfinite;
            continue;
        }
        const int b = std::min(bins - 1, int((double(values[i]) - lo) / width));
        ++h.counts[size_t(std::max(0, b))];
    }
    return h;
}

Colour score_colour(float normalized) {
    if (std::isnan(normalized)) return kNoDataColour;
    if (std::isinf(normalized)) return kProtectedColour;
    return colormap(normalized);
}

ScoresImage build_scores_image(const std::vector<LayerScores>& layers, const ScoresImageOptions& o) {
    ScoresImage img;
    int max_slots = 0;
    for (size_t l = 0; l < layers.size(); ++l) {
        const LayerScores& ls = layers[l];
        if (ls.values.empty()) continue;
        const int rows = ls.B * ls.G;
        const int h0 = o.head < 0 ? 0 : std::min(o.head, rows - 1), h1 = o.head < 0 ? rows : h0 + 1;
        for (int h = h0; h < h1; ++h) img.row_layer.push_back(int(l)), img.row_head.push_back(h);
        max_slots = std::max(max_slots, ls.T);
    }
    if (img.row_layer.empty() || max_slots == 0) return img;
    img.slots_per_texel = 1;
    while ((max_slots + img.slots_per_texel - 1) / img.slots_per_texel > std::max(1, o.max_width)) img.slots_per_texel *= 2;
    const int spt = img.slots_per_texel;
    img.width = (max_slots + spt - 1) / spt;
    img.height = int(img.row_layer.size());
    img.norm.assign(size_t(img.width) * size_t(img.height), kNaN);
    img.raw.assign(size_t(img.width) * size_t(img.height), kNaN);
    // Ranges of finite values: per layer, or over everything shown.
    std::vector<float> lo(layers.size(), kInf), hi(layers.size(), -kInf);
    for (int r = 0; r < img.height; ++r) {
        const LayerScores& ls = layers[size_t(img.row_layer[size_t(r)])];
        const float* v = ls.values.data() + size_t(img.row_head[size_t(r)]) * size_t(ls.T);
        for (int i = 0; i < ls.T; ++i)
            if (std::isfinite(v[i])) {
                float& a = lo[size_t(img.row_layer[size_t(r)])];
                float& b = hi[size_t(img.row_layer[size_t(r)])];
                a = std::min(a, v[i]), b = std::max(b, v[i]);
            }
    }
    if (o.shared_scale) {
        const float a = *std::min_element(lo.begin(), lo.end()), b = *std::max_element(hi.begin(), hi.end());
        std::fill(lo.begin(), lo.end(), a);
        std::fill(hi.begin(), hi.end(), b);
    }
    std::vector<float> row;
    for (int r = 0; r < img.height; ++r) {
        const int l = img.row_layer[size_t(r)];
        const LayerScores& ls = layers[size_t(l)];
        const float* v = ls.values.data() + size_t(img.row_head[size_t(r)]) * size_t(ls.T);
        row.assign(v, v + ls.T);
        // Descending, protected (+inf) first; NaN last.
        if (o.sorted)
            std::stable_sort(row.begin(), row.end(), [](float a, float b) {
                if (std::isnan(a)) return false;
                if (std::isnan(b)) return true;
                return a > b;
            });
        // Rank scale: each finite value's position among the row's finite values, in [0, 1]
        // (ties share the mean of their positions).
        std::vector<double> rank_of;
        if (o.rank) {
            std::vector<int> idx;
            for (int i = 0; i < ls.T; ++i)
                if (std::isfinite(row[size_t(i)])) idx.push_back(i);
            std::sort(idx.begin(), idx.end(), [&](int a, int b) { return row[size_t(a)] < row[size_t(b)]; });
            rank_of.assign(size_t(ls.T), 0.0);
            const double denom = idx.size() > 1 ? double(idx.size() - 1) : 1.0;
            for (size_t a = 0; a < idx.size();) {
                size_t b = a;
                while (b + 1 < idx.size() && row[size_t(idx[b + 1])] == row[size_t(idx[a])]) ++b;
                const double mid = idx.size() > 1 ? 0.5 * double(a + b) / denom : 0.5;
                for (size_t c = a; c <= b; ++c) rank_of[size_t(idx[c])] = mid;
                a = b + 1;
            }
        }
        for (int x = 0; x < img.width; ++x) {
            const int i0 = x * spt, i1 = std::min(ls.T, i0 + spt);
            double sum = 0;
            int n = 0, inf = 0;
            for (int i = i0; i < i1; ++i) {
                if (std::isfinite(row[size_t(i)])) sum += row[size_t(i)], ++n;
                else if (std::isinf(row[size_t(i)])) ++inf;
            }
            const size_t k = size_t(r) * size_t(img.width) + size_t(x);
            if (n > 0) {
                const float mean = float(sum / n);
                img.raw[k] = mean;
                const float span = hi[size_t(l)] - lo[size_t(l)];
                if (o.rank) {
                    double rsum = 0;
                    for (int i = i0; i < i1; ++i)
                        if (std::isfinite(row[size_t(i)])) rsum += rank_of[size_t(i)];
                    img.norm[k] = float(rsum / n);
                } else {
                    img.norm[k] = span > 0 ? (mean - lo[size_t(l)]) / span : 0.5f;
                }
            } else if (inf > 0) {
                img.raw[k] = img.norm[k] = kInf;
            }
        }
    }
    img.rgba.resize(img.norm.size() * 4);
    for (size_t k = 0; k < img.norm.size(); ++k) {
        const Colour c = score_colour(img.norm[k]);
        img.rgba[k * 4 + 0] = colour_r(c);
        img.rgba[k * 4 + 1] = colour_g(c);
        img.rgba[k * 4 + 2] = colour_b(c);
        img.rgba[k * 4 + 3] = colour_a(c);
    }
    return img;
}

std::vector<int> score_outlier_layers(const std::vector<LayerScores>& layers) {
    std::vector<int> out;
    for (size_t l = 0; l < layers.size(); ++l) {
        const trace::ScoreStats& st = layers[l].stats;
        if (!layers[l].values.empty() && std::isfinite(st.max) && std::isfinite(st.p99) && st.p99 > 0 && st.max > 20 * st.p99)
            out.push_back(int(l));
    }
    return out;
}

ScoresHit scores_hit_test(const ScoresImage& img, bool sorted, ImVec2 p0, ImVec2 p1, ImVec2 pt) {
    (void)sorted;
    ScoresHit h;
    if (img.width == 0 || img.height == 0 || pt.x < p0.x || pt.y < p0.y || pt.x >= p1.x || pt.y >= p1.y) return h;
    const int x = std::min(img.width - 1, int((pt.x - p0.x) / (p1.x - p0.x) * img.width));
    const int y = std::min(img.height - 1, int((pt.y - p0.y) / (p1.y - p0.y) * img.height));
    h.valid = true;
    h.layer = img.row_layer[size_t(y)];
    h.head = img.row_head[size_t(y)];
    h.slot_lo = x * img.slots_per_texel;
    h.slot_hi = h.slot_lo + img.slots_per_texel;
    h.score = img.raw[size_t(y) * size_t(img.width) + size_t(x)];
    return h;
}

namespace {
// The cache steps of every layer the scores know, newer than what `s.positions` holds.
bool refresh_positions(ScoresViewState& s, storage::SessionReader& reader) {
    bool any = false;
    if (s.positions_cursor.size() < s.layers.size()) s.positions_cursor.resize(s.layers.size(), 0);
    for (size_t l = 0; l < s.positions_cursor.size(); ++l)
        for (const auto& row : reader.cache_steps(s.run, int(l), s.positions_cursor[l])) {
            s.positions_cursor[l] = std::max(s.positions_cursor[l], row.id);
            s.positions.ingest(row);
            any = true;
        }
    s.positions_loaded = true;
    return any;
}
}  // namespace

bool scores_has_requests(const ScoresViewState& s) { return s.want_positions && !s.positions_loaded; }

bool serve_scores_requests(ScoresViewState& s, storage::SessionReader& reader) {
    if (!scores_has_requests(s)) return false;
    try {
        s.tokens.run = s.run;
        refresh_run_tokens(s.tokens, reader);
        if (!s.tokens.samples.empty()) refresh_positions(s, reader);
    } catch (const std::exception& e) {
        s.error = e.what();
    }
    s.positions_loaded = true;  // also when the run has no token text: nothing to map, ask no more
    return true;
}

const std::vector<int32_t>* scores_slot_tokens(ScoresViewState& s, int layer, int head) {
    if (layer < 0 || size_t(layer) >= s.layers.size() || s.layers[size_t(layer)].values.empty()) return nullptr;
    const int chunk = s.layers[size_t(layer)].chunk;
    for (auto& st : s.slot_tokens)
        if (st.layer == layer && st.head == head)
            if (st.chunk == chunk && st.version == s.positions.version) return st.pos.empty() ? nullptr : &st.pos;
    ScoresViewState::SlotTokens* st = nullptr;
    for (auto& x : s.slot_tokens)
        if (x.layer == layer && x.head == head) st = &x;
    if (!st) st = &s.slot_tokens.emplace_back();
    st->layer = layer, st->head = head, st->chunk = chunk, st->version = s.positions.version;
    // The shown snapshot is the newest with values: the newest sample's step `chunk`.
    st->pos = eviction_slot_tokens(s.positions, s.positions.resolve_sequence(-1), layer, head, chunk);
    return st->pos.empty() ? nullptr : &st->pos;
}

bool refresh_scores(ScoresViewState& s, storage::SessionReader& reader) {
    try {
        s.tokens.run = s.run;
        bool text = refresh_run_tokens(s.tokens, reader);
        // Once loaded (a draw request asked), the slot -> token index follows a live run; it is
        // an index of rows already there, not news of the run, so it does not count as new.
        if (s.positions_loaded && !s.tokens.samples.empty()) refresh_positions(s, reader);
        // Summaries only (no arrays): cheap even for a long run; they say which layers have a
        // newer full array.
        std::vector<storage::ScoreRow> rows = reader.score_snapshots(s.run, -1, s.last_id, false);
        if (rows.empty()) return text;
        std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
        for (const auto& r : rows) {
            s.last_id = std::max(s.last_id, r.id);
            if (r.pass != 0 || r.layer < 0 || r.layer > 4096) continue;
            const size_t l = size_t(r.layer);
            if (s.newest_with_values.size() <= l) {
                s.newest_with_values.resize(l + 1, 0);
                s.newest_stats.resize(l + 1);
            }
            s.newest_stats[l] = r.stats;
            if (r.has_values) s.newest_with_values[l] = r.id;
        }
        if (s.layers.size() < s.newest_with_values.size()) s.layers.resize(s.newest_with_values.size());
        for (size_t l = 0; l < s.newest_with_values.size(); ++l) {
            const int64_t want = s.newest_with_values[l];
            if (want == 0 || s.layers[l].id == want) continue;
            // Rows of this layer with id >= want: the wanted one (and any newer, skipped).
            for (auto& r : reader.score_snapshots(s.run, int(l), want - 1, true)) {
                if (r.id != want) continue;
                LayerScores& ls = s.layers[l];
                ls.id = r.id;
                ls.chunk = r.chunk;
                ls.t_ns = r.t_ns;
                ls.B = r.B, ls.G = r.G, ls.T = r.T;
                ls.stats = r.stats;
                if (r.values.size() == size_t(r.B) * size_t(r.G) * size_t(r.T)) ls.values = std::move(r.values);
                else ls.values.clear();
            }
        }
        ++s.version;
        s.error.clear();
        return true;
    } catch (const std::exception& e) {
        s.error = e.what();
        return false;
    }
}

void release_scores_textures(ScoresViewState& s, TextureHost* host) {
    if (host && s.texture_id) host->release(s.texture_id);
    s.texture_id = 0;
    s.image_valid = false;
}

namespace {
bool same_options(const ScoresImageOptions& a, const ScoresImageOptions& b) {
    return a.head == b.head && a.sorted == b.sorted && a.shared_scale == b.shared_scale && a.rank == b.rank &&
           a.max_width == b.max_width;
}

// "12-29" style list of layer indices.
std::string layer_ranges(const std::vector<int>& ls) {
    std::string out;
    for (size_t i = 0; i < ls.size();) {
        size_t j = i;
        while (j + 1 < ls.size() && ls[j + 1] == ls[j] + 1) ++j;
        if (!out.empty()) out.append(", ");
        out.append(std::to_string(ls[i]));
        if (j > i) out.append("-").append(std::to_string(ls[j]));
        i = j + 1;
    }
    return out;
}
}  // namespace

void DrawScoresView(ScoresViewState& s, TextureHost* host, ImVec2 size) {
    if (size.x <= 0 || size.y <= 0) {
        const ImVec2 avail = ImGui::GetContentRegionAvail();
        if (size.x <= 0) size.x = avail.x;
        if (size.y <= 0) size.y = avail.y;
    }
    ImGui::PushID("scores");
    ImGui::BeginGroup();
    const float top = ImGui::GetCursorPosY();
    if (!s.error.empty()) ImGui::TextColored(ImVec4(1, 0.5f, 0.4f, 1), "%s", s.error.c_str());
    bool any = false;
    int max_heads = 1;
    for (const auto& l : s.layers)
        if (!l.values.empty()) any = true, max_heads = std::max(max_heads, l.B * l.G);
    if (!any) {
        ImGui::Dummy(ImVec2(size.x, 0));
        draw_empty_state(s.newest_stats.empty()
                             ? "no scores recorded yet (score-based policies record them once the cache is full)"
                             : "only score summaries recorded so far; full arrays arrive at the score interval");
        ImGui::EndGroup();
        ImGui::PopID();
        return;
    }
    ScoresImageOptions& o = s.image_options;
    ImGui::Checkbox("sorted", &o.sorted);
    ImGui::SameLine();
    ImGui::Checkbox("colour by rank", &o.rank);
    if (!o.rank) {
        ImGui::SameLine();
        ImGui::Checkbox("one scale for all layers", &o.shared_scale);
    }
    if (max_heads > 1) {
        ImGui::SameLine();
        ImGui::SetNextItemWidth(140);
        ImGui::SliderInt("head (-1 = all)", &o.head, -1, max_heads - 1);
    }
    // The shown snapshots are of the newest sample: its text is what the search looks in.
    ImGui::SameLine();
    const int64_t newest = s.tokens.samples.empty() ? -1 : s.tokens.samples.back().sample;
    DrawTokenSearchBox(s.search, s.tokens, newest);
    if (s.search.active()) s.want_positions = true;  // marks need the slot -> token index
    // Why a layer can look empty: it is the data (one sink slot far above the rest), said so.
    if (const std::vector<int> outliers = score_outlier_layers(s.layers); !outliers.empty() && !o.rank)
    {
        ImGui::PushStyleColor(ImGuiCol_Text, ImVec4(1, 0.8f, 0.45f, 1));
        ImGui::PushTextWrapPos(ImGui::GetCursorPos().x + size.x);
        ImGui::TextWrapped("layer%s %s: one slot scores over 20x the layer's 99th percentile, so on this linear scale the "
                           "other slots look dark; 'colour by rank' shows them",
                           outliers.size() > 1 ? "s" : "", layer_ranges(outliers).c_str());
        ImGui::PopTextWrapPos();
        ImGui::PopStyleColor();
    }
    if (!s.image_valid || s.image_version != s.version || !same_options(o, s.image_built_with)) {
        s.image = build_scores_image(s.layers, o);
        s.image_version = s.version;
        s.image_built_with = o;
        s.image_valid = true;
        if (host) {
            if (s.image.width > 0) s.texture_id = host->upload_rgba(s.texture_id, s.image.width, s.image.height, s.image.rgba.data());
            else if (s.texture_id) host->release(s.texture_id), s.texture_id = 0;
        }
    }
    const float used = ImGui::GetCursorPosY() - top;
    const float rest = std::max(60.f, size.y - used - 2 * ImGui::GetStyle().ItemSpacing.y);
    const float heat_h = std::max(40.f, rest * 0.62f), hist_h = std::max(30.f, rest - heat_h - ImGui::GetFrameHeightWithSpacing());

    // ---- heatmap ----
    // Colour bar: real scores on one scale; per-layer scales share only "layer min .. layer max".
    double vlo = 0, vhi = 1;
    if (o.shared_scale && !o.rank) {
        vlo = 1e300, vhi = -1e300;
        for (float v : s.image.raw)
            if (std::isfinite(v)) vlo = std::min(vlo, double(v)), vhi = std::max(vhi, double(v));
        if (vlo > vhi) vlo = 0, vhi = 1;
    }
    // Per layer: 0 = that layer's lowest score, 1 = its highest.
    const char* bar_title = o.rank ? "rank in its row" : o.shared_scale ? "score" : "score / layer range";
    if (o.rank) vlo = 0, vhi = 1;
    const float bar_w = colour_bar_width(vlo, vhi, AxisUnit::NUMBER, bar_title);
    float label_w = 0;  // widest row label
    for (int l : s.image.row_layer) {
        char b[24];
        std::snprintf(b, sizeof b, "layer %d", l);
        label_w = std::max(label_w, ImGui::CalcTextSize(b).x);
    }
    const AxisSpec xs{AxisUnit::NUMBER, o.sorted ? "rank (highest score first)" : "cache slot"};
    PlotMargins hm = plot_margins(&xs, nullptr, nullptr, heat_h, bar_w);
    hm.left = label_w + 10;
    hm.top = ImGui::GetTextLineHeight() + 2;  // the colour bar's title
    const PlotFrame f = begin_plot_frame("##heat", ImVec2(size.x, heat_h), hm);
    ImDrawList* dl = ImGui::GetWindowDrawList();
    dl->AddRectFilled(f.p0, f.p1, kNoDataColour);
    if (s.texture_id) dl->AddImage(texture_id(s.texture_id), f.p0, f.p1);
    const int max_slots = s.image.width * s.image.slots_per_texel;
    draw_x_axis(dl, f, AxisRange{0, double(std::max(1, max_slots))}, xs);
    draw_colour_bar(dl, ImVec2(f.p1.x, f.p0.y), ImVec2(f.outer1.x, f.p1.y), vlo, vhi, AxisUnit::NUMBER, bar_title);
    // layer labels at the left, one per layer (skipping when rows get too thin)
    const float row_h = f.height() / std::max(1, s.image.height);
    float last_labelled = -1000;
    for (int r = 0; r < s.image.height; ++r) {
        const int l = s.image.row_layer[size_t(r)];
        if (r > 0 && s.image.row_layer[size_t(r - 1)] == l) continue;
        int rows_of_layer = 0;
        while (r + rows_of_layer < s.image.height && s.image.row_layer[size_t(r + rows_of_layer)] == l) ++rows_of_layer;
        const float y = f.p0.y + r * row_h;
        // centred on the layer's rows, never below the plot
        const float ty = std::min(f.p1.y - ImGui::GetTextLineHeight(),
                                  y + std::max(0.f, (rows_of_layer * row_h - ImGui::GetTextLineHeight()) * 0.5f));
        if (r > 0) dl->AddLine(ImVec2(f.p0.x, y), ImVec2(f.p1.x, y), IM_COL32(0, 0, 0, 90));
        if (ty < last_labelled + ImGui::GetTextLineHeight()) continue;
        last_labelled = ty;
        char b[24];
        std::snprintf(b, sizeof b, "layer %d", l);
        dl->AddText(ImVec2(f.p0.x - 6 - ImGui::CalcTextSize(b).x, ty), IM_COL32(210, 210, 210, 235), b);
    }
    // Search marks: a pink frame on every texel whose slots hold a marked position.
    if (s.search.active() && !o.sorted && !s.search.result.positions.empty() && s.image.width > 0) {
        const float col_w = f.width() / float(s.image.width);
        dl->PushClipRect(f.p0, f.p1, true);
        for (int r = 0; r < s.image.height; ++r) {
            const std::vector<int32_t>* pos = scores_slot_tokens(s, s.image.row_layer[size_t(r)], s.image.row_head[size_t(r)]);
            if (!pos) continue;
            const float y0 = f.p0.y + float(r) * row_h, y1 = std::max(y0 + 2.f, y0 + row_h);
            for (size_t slot = 0; slot < pos->size(); ++slot)
                if ((*pos)[slot] >= 0 && s.search.marked((*pos)[slot])) {
                    const float x0 = f.p0.x + float(slot / size_t(s.image.slots_per_texel)) * col_w;
                    dl->AddRect(ImVec2(x0, y0), ImVec2(std::max(x0 + 2.f, x0 + col_w), y1), kSearchMarkColour, 0, 0, 1.5f);
                }
        }
        dl->PopClipRect();
    }
    if (f.hovered) {
        const ScoresHit h = scores_hit_test(s.image, o.sorted, f.p0, f.p1, f.mouse);
        if (h.valid) {
            if (ImGui::IsMouseClicked(ImGuiMouseButton_Left)) s.histogram_layer = h.layer;
            const LayerScores& ls = s.layers[size_t(h.layer)];
            ImGui::BeginTooltip();
            ImGui::Text("layer %d  head %d  (chunk %d)", h.layer, h.head, ls.chunk);
            if (s.image.slots_per_texel == 1) ImGui::Text("%s %d", o.sorted ? "rank" : "slot", h.slot_lo);
            else ImGui::Text("%s %d..%d", o.sorted ? "ranks" : "slots", h.slot_lo, h.slot_hi - 1);
            if (std::isinf(h.score)) ImGui::Text("protected (grace ring: not evictable yet)");
            else if (std::isnan(h.score)) ImGui::TextDisabled("no score");
            else ImGui::Text("score %.6g%s", double(h.score), s.image.slots_per_texel > 1 ? " (mean)" : "");
            s.want_positions = true;
            if (o.sorted) {
                ImGui::TextDisabled("token text: by slot only (turn off 'sorted')");
            } else if (const std::vector<int32_t>* pos = scores_slot_tokens(s, h.layer, h.head)) {
                const int64_t p = size_t(h.slot_lo) < pos->size() ? (*pos)[size_t(h.slot_lo)] : -1;
                const int64_t seq = s.positions.resolve_sequence(-1);
                if (p < 0) ImGui::TextDisabled("slot %d is empty at this chunk", h.slot_lo);
                else ImGui::Text("slot %d holds token position %lld %s", h.slot_lo, (long long)p,
                                 token_label(s.tokens.sample(seq), p).c_str());
                if (p >= 0 && s.search.active() && s.search.marked(p))
                    ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(kSearchMarkColour), "matches the search");
            } else if (!s.tokens.samples.empty()) {
                ImGui::TextDisabled("reading which token each slot holds...");
            }
            ImGui::Text("layer: min %.4g  p50 %.4g  p90 %.4g  max %.4g", double(ls.stats.min), double(ls.stats.p50),
                        double(ls.stats.p90), double(ls.stats.max));
            ImGui::TextDisabled("click: histogram of this layer");
            ImGui::EndTooltip();
        }
    }

    // ---- histogram of one layer ----
    const int nl = int(s.layers.size());
    s.histogram_layer = std::clamp(s.histogram_layer, 0, std::max(0, nl - 1));
    ImGui::SetNextItemWidth(160);
    ImGui::SliderInt("histogram layer", &s.histogram_layer, 0, std::max(0, nl - 1));
    const LayerScores& hl = s.layers[size_t(s.histogram_layer)];
    if (hl.values.empty()) {
        ImGui::TextDisabled("layer %d has no full score array yet", s.histogram_layer);
    } else {
        const int rows = hl.B * hl.G;
        const int h0 = o.head < 0 ? 0 : std::min(o.head, rows - 1);
        const size_t n = o.head < 0 ? hl.values.size() : size_t(hl.T);
        const ScoreHistogram hist = score_histogram(hl.values.data() + (o.head < 0 ? 0 : size_t(h0) * size_t(hl.T)), n, s.histogram_bins);
        ImGui::SameLine();
        ImGui::TextDisabled("%lld slots, %lld protected, range [%.4g, %.4g]", (long long)n, (long long)hist.nonfinite, hist.lo, hist.hi);
        const int64_t peak = hist.counts.empty() ? 0 : *std::max_element(hist.counts.begin(), hist.counts.end());
        const AxisRange hx{hist.lo, hist.hi > hist.lo ? hist.hi : hist.lo + 1}, hy{0, double(std::max<int64_t>(1, peak)) * 1.05};
        const AxisSpec hxs{AxisUnit::NUMBER, "score"}, hys{AxisUnit::NUMBER, "slots"};
        const PlotFrame hf = begin_plot_frame("##hist", ImVec2(size.x, hist_h), plot_margins(&hxs, &hys, &hy, hist_h));
        dl->AddRectFilled(hf.p0, hf.p1, IM_COL32(30, 30, 34, 255));
        const float bw = hf.width() / std::max<size_t>(1, hist.counts.size());
        for (size_t b = 0; b < hist.counts.size(); ++b) {
            if (!hist.counts[b] || !peak) continue;
            const float y = float(axis_to_pixel(hy, double(hist.counts[b]), hf.p1.y, hf.p0.y));
            dl->AddRectFilled(ImVec2(hf.p0.x + b * bw + 1, y), ImVec2(hf.p0.x + (b + 1) * bw, hf.p1.y),
                              colormap(float(b + 0.5f) / float(hist.counts.size())));
        }
        draw_x_axis(dl, hf, hx, hxs);
        draw_y_axis(dl, hf, hy, hys, false);
        if (hf.hovered && !hist.counts.empty()) {
            const int b = std::clamp(int((hf.mouse.x - hf.p0.x) / bw), 0, int(hist.counts.size()) - 1);
            const double w = (hist.hi - hist.lo) / double(hist.counts.size());
            ImGui::SetTooltip("[%.5g, %.5g): %lld slots", hist.lo + b * w, hist.lo + (b + 1) * w, (long long)hist.counts[size_t(b)]);
        }
    }
    ImGui::EndGroup();
    ImGui::PopID();
}

// ---- its entry in the view table -----------------------------------------------------------

namespace {
class ScoresSlot final : public StateSlot<ScoresViewState> {
   public:
    void select(const ViewSelection& sel) override {
        release(sel.textures);
        state = {};
        state.run = sel.runs.empty() ? 0 : sel.runs.front();
    }
    bool refresh(storage::SessionReader& r) override { return refresh_scores(state, r); }
    void draw(TextureHost* t, ImVec2 size) override {
        DrawScoresView(state, t, size);
    }
    void release(TextureHost* t) override { release_scores_textures(state, t); }
    bool has_requests() const override { return scores_has_requests(state); }
    bool serve_requests(storage::SessionReader& r) override { return serve_scores_requests(state, r); }
};
}  // namespace

ViewEntry scores_view_entry() {
    return {.name = "scores", .make = []() -> std::unique_ptr<ViewSlot> { return std::make_unique<ScoresSlot>(); }};
}

}  // namespace kv::views
