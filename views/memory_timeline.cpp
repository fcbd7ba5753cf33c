// Memory timeline (see memory_timeline.h).
//
// Index
//   [SECTION] memory series
//   [SECTION] span lanes
//   [SECTION] refresh
//   [SECTION] drawing
#include "views/view_table.h"
#include "views/memory_timeline.h"
#include "views/memory_raster.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "storage/rank_runs.h"
#include "storage/session_reader.h"
#include "views/colormap.h"
#include "views/span_legend.h"

namespace kv::views {

// =========================================================================================
// [SECTION] memory series
// =========================================================================================
void MemorySeries::add(const storage::MemoryEventRow& e) {
    const size_t c = size_t(e.category) < kNumMemCategories ? size_t(e.category) : size_t(MemCategory::WORKSPACE);
    const std::array<int64_t, kNumMemCategories> cat_before = current;
    const int64_t total_before = total;
    if (events == 0) t_min = t_max = e.t_ns;
    t_min = std::min(t_min, e.t_ns);
    t_max = std::max(t_max, e.t_ns);
    current[c] = e.category_total;
    category_peak[c] = std::max(category_peak[c], e.category_total);
    total = e.device_total;
    if (e.flags & trace::ALLOC_FLAGS_INSTRUMENTATION) instrumentation += e.bytes;
    const int64_t own = total - instrumentation;
    own_peak = std::max(own_peak, own);
    if (events == 0 || total > peak) {
        peak = total;
        peak_t_ns = e.t_ns;
        at_peak = current;
    }
    ++events;
    if (blocks.empty() || blocks.back().events == kMemoryBlockEvents) {
        MemoryBlock b;
        b.t_first = b.t_last = e.t_ns;
        b.first_id = e.id;
        b.before = cat_before;
        b.total_before = total_before;
        blocks.push_back(b);
    }
    MemoryBlock& b = blocks.back();
    if (b.events == 0) {
        b.total_min = b.total_max = total;
        b.own_max = own;
        b.at_max = current;
    } else {
        b.total_min = std::min(b.total_min, total);
        b.own_max = std::max(b.own_max, own);
        if (total > b.total_max) b.total_max = total, b.at_max = current;
    }
    b.total_last = total;
    b.own_last = own;
    b.t_first = std::min(b.t_first, e.t_ns);
    b.t_last = std::max(b.t_last, e.t_ns);
    ++b.events;
    const size_t nb = blocks.size();  // only the newest block changes
    t_first_prefix_max.resize(nb);
    t_last_prefix_max.resize(nb);
    t_first_prefix_max[nb - 1] = nb > 1 ? std::max(t_first_prefix_max[nb - 2], b.t_first) : b.t_first;
    t_last_prefix_max[nb - 1] = nb > 1 ? std::max(t_last_prefix_max[nb - 2], b.t_last) : b.t_last;
    if (!raw_complete) return;
    if (raw.size() >= raw_limit) {  // too many to keep: the blocks and the reader take over
        raw.clear();
        raw.shrink_to_fit();
        raw_complete = false;
        return;
    }
    const MemoryPoint p{e.t_ns, e.device_total, e.category_total, e.id, uint8_t(c), instrumentation};
    auto before = [](const MemoryPoint& a, const MemoryPoint& b) { return a.t_ns != b.t_ns ? a.t_ns < b.t_ns : a.id < b.id; };
    if (raw.empty() || !before(p, raw.back())) raw.push_back(p);
    else raw.insert(std::upper_bound(raw.begin(), raw.end(), p, before), p);  // another thread's older event
}

namespace {
std::vector<storage::MemoryBucket> empty_buckets(int64_t t0, int64_t t1, int n) {
    std::vector<storage::MemoryBucket> out(size_t(std::max(1, n)));
    const int m = int(out.size());
    for (int b = 0; b < m; ++b) {
        out[size_t(b)].t0_ns = storage::bucket_start(t0, t1, m, b);
        out[size_t(b)].t1_ns = storage::bucket_start(t0, t1, m, b + 1);
    }
    return out;
}
}  // namespace

std::vector<storage::MemoryBucket> bucket_memory_points(const std::vector<MemoryPoint>& points,
                                                        const std::array<int64_t, kNumMemCategories>& cat_before,
                                                        int64_t total_before, int64_t t0, int64_t t1, int n) {
    if (t1 <= t0 || n < 1) return {};
    std::vector<storage::MemoryBucket> out = empty_buckets(t0, t1, n);
    std::array<int64_t, kNumMemCategories> cat = cat_before;
    int64_t total = total_before;
    int filled = 0;  // buckets before this index are final
    auto carry_until = [&](int b) {
        for (; filled < b; ++filled) {
            storage::MemoryBucket& m = out[size_t(filled)];
            if (m.events == 0) {
                m.total_min = m.total_max = m.total_last = total;
                m.at_max = cat;
            }
        }
    };
    size_t i = 0;
    for (; i < points.size() && points[i].t_ns < t0; ++i) {  // state at the window start
        cat[points[i].category] = points[i].category_total;
        total = points[i].device_total;
    }
    for (; i < points.size() && points[i].t_ns < t1; ++i) {
        const MemoryPoint& p = points[i];
        const int b = storage::bucket_index(p.t_ns, t0, t1, n);
        carry_until(b);
        cat[p.category] = p.category_total;
        total = p.device_total;
        storage::MemoryBucket& m = out[size_t(b)];
        if (m.events == 0) {
            m.total_min = m.total_max = total;
            m.at_max = cat;
        } else {
            m.total_min = std::min(m.total_min, total);
            if (total > m.total_max) m.total_max = total, m.at_max = cat;
        }
        m.total_last = total;
        ++m.events;
    }
    carry_until(n);
    return out;
}

std::vector<storage::MemoryBucket> memory_series_buckets(const MemorySeries& s, int64_t t0, int64_t t1, int n) {
    if (t1 <= t0 || n < 1) return {};
    if (s.raw_complete) return bucket_memory_points(s.raw, {}, 0, t0, t1, n);
    std::vector<storage::MemoryBucket> out = empty_buckets(t0, t1, n);
    std::array<int64_t, kNumMemCategories> cat{};
    int64_t total = 0;
    int filled = 0;
    auto carry_until = [&](int b) {
        for (; filled < b; ++filled) {
            storage::MemoryBucket& m = out[size_t(filled)];
            if (m.events == 0) {
                m.total_min = m.total_max = m.total_last = total;
                m.at_max = cat;
            }
        }
    };
    // Blocks: each block counts where its first event falls. Every block before `from` starts
    // before t0, so only the state after the last of them matters.
    const size_t from = size_t(std::lower_bound(s.t_first_prefix_max.begin(), s.t_first_prefix_max.end(), t0) -
                               s.t_first_prefix_max.begin());
    if (from > 0) {
        total = s.blocks[from - 1].total_last;
        cat = s.blocks[from - 1].at_max;
    }
    for (size_t i = from; i < s.blocks.size(); ++i) {
        const MemoryBlock& blk = s.blocks[i];
        if (blk.t_first < t0) {
            total = blk.total_last;
            cat = blk.at_max;
            continue;
        }
        if (blk.t_first >= t1) break;
        const int b = storage::bucket_index(blk.t_first, t0, t1, n);
        carry_until(b);
        storage::MemoryBucket& m = out[size_t(b)];
        if (m.events == 0) {
            m.total_min = blk.total_min;
            m.total_max = blk.total_max;
            m.at_max = blk.at_max;
        } else {
            m.total_min = std::min(m.total_min, blk.total_min);
            if (blk.total_max > m.total_max) m.total_max = blk.total_max, m.at_max = blk.at_max;
        }
        m.total_last = blk.total_last;
        m.events += blk.events;
        total = blk.total_last;
        cat = blk.at_max;
    }
    carry_until(n);
    return out;
}

std::vector<storage::MemoryBucket> merge_memory_buckets(const std::vector<storage::MemoryBucket>& fine, int64_t t0,
                                                        int64_t t1, int n) {
    if (t1 <= t0 || n < 1) return {};
    std::vector<storage::MemoryBucket> out = empty_buckets(t0, t1, n);
    std::vector<bool> set(out.size(), false);
    int64_t carry = 0;
    std::array<int64_t, kNumMemCategories> carry_cat{};
    for (const auto& f : fine) {
        if (f.t1_ns <= t0) {
            carry = f.total_last;
            carry_cat = f.at_max;
            continue;
        }
        if (f.t0_ns >= t1) break;
        const int b = storage::bucket_index(std::max(f.t0_ns, t0), t0, t1, n);
        storage::MemoryBucket& m = out[size_t(b)];
        if (!set[size_t(b)]) {
            m.total_min = f.total_min, m.total_max = f.total_max, m.at_max = f.at_max;
            set[size_t(b)] = true;
        } else {
            m.total_min = std::min(m.total_min, f.total_min);
            if (f.total_max > m.total_max) m.total_max = f.total_max, m.at_max = f.at_max;
        }
        m.total_last = f.total_last;
        m.events += f.events;
    }
    for (size_t b = 0; b < out.size(); ++b) {
        if (!set[b]) {
            out[b].total_min = out[b].total_max = out[b].total_last = carry;
            out[b].at_max = carry_cat;
        }
        carry = out[b].total_last;
        carry_cat = out[b].at_max;
    }
    return out;
}

// =========================================================================================
// [SECTION] span lanes
// =========================================================================================
namespace {
constexpr size_t kLaneBlock = 256;
}

void SpanLane::add(const SpanBox& b) {
    max_duration = std::max(max_duration, b.end_ns - b.start_ns);
    size_t at = spans.size();
    if (spans.empty() || b.start_ns >= spans.back().start_ns) {
        spans.push_back(b);
    } else {  // ended later than a span that started after it (nesting, other threads): keep start order
        auto it = std::upper_bound(spans.begin(), spans.end(), b.start_ns,
                                   [](int64_t t, const SpanBox& s) { return t < s.start_ns; });
        at = size_t(it - spans.begin());
        spans.insert(it, b);
    }
    // Blocks from the one containing `at` onwards are rebuilt (only the last one when appending).
    const size_t first = at / kLaneBlock;
    blocks.resize(std::min(blocks.size(), first));
    for (size_t k = first * kLaneBlock; k < spans.size(); k += kLaneBlock) {
        std::pair<int64_t, int64_t> e{spans[k].start_ns, spans[k].end_ns};
        for (size_t j = k; j < std::min(spans.size(), k + kLaneBlock); ++j) e.second = std::max(e.second, spans[j].end_ns);
        blocks.push_back(e);
    }
}

std::pair<size_t, size_t> SpanLane::overlapping(int64_t t0, int64_t t1) const {
    auto by_start = [](const SpanBox& s, int64_t t) { return s.start_ns < t; };
    const size_t lo = size_t(std::lower_bound(spans.begin(), spans.end(), t0 - max_duration, by_start) - spans.begin());
    const size_t hi = size_t(std::lower_bound(spans.begin(), spans.end(), t1, by_start) - spans.begin());
    return {lo, std::max(lo, hi)};
}

// =========================================================================================
// [SECTION] refresh
// =========================================================================================
int64_t MemoryTimelineViewState::peak_bytes(int dev) const {
    int64_t p = 0;
    for (const auto& [d, s] : series)
        if (dev < -1 || d == dev) p = std::max(p, s.peak);
    return p;
}

int MemoryTimelineViewState::active_device() const {
    if (device > -2 && series.count(device)) return device;
    int best = -1;
    int64_t peak = -1;
    for (const auto& [d, s] : series)
        if (s.peak > peak) peak = s.peak, best = d;
    return best;
}

bool memory_timeline_has_requests(const MemoryTimelineViewState& s) {
    return s.reload_requested || s.zoom_requested || (s.hover_t0 >= 0 && !s.hover_loaded);
}

bool select_memory_rank(MemoryTimelineViewState& s, int rank, TextureHost* host) {
    if (rank < 0 || size_t(rank) >= s.rank_runs.size() || s.rank_runs[size_t(rank)] == 0) return false;
    if (rank == s.rank) return true;
    release_memory_timeline_textures(s, host);
    MemoryTimelineViewState fresh;
    // What the user chose stays; what was read from the other rank goes.
    fresh.device = s.device;
    fresh.show_spans = s.show_spans, fresh.show_cells = s.show_cells;
    fresh.hidden_span_categories = s.hidden_span_categories;
    fresh.refresh_budget_ms = s.refresh_budget_ms, fresh.rows_per_read = s.rows_per_read;
    fresh.zoom_query_max_events = s.zoom_query_max_events;
    fresh.rank_runs = std::move(s.rank_runs);
    fresh.base_run = s.base_run;
    fresh.ranks_known = true;
    fresh.rank = rank;
    fresh.run = fresh.rank_runs[size_t(rank)];
    fresh.reload_requested = true;
    s = std::move(fresh);
    return true;
}

bool serve_memory_timeline_requests(MemoryTimelineViewState& s, storage::SessionReader& reader) {
    bool served = false;
    if (s.reload_requested) served |= refresh_memory_timeline(s, reader);
    try {
        if (s.zoom_requested) {
            s.zoom_requested = false;
            if (s.shown_columns > 0) memory_view_buckets(s, &reader, s.shown_columns);  // fills the zoom cache
            s.shown_columns = 0;  // the next draw recomputes its buckets, from that cache
            served = true;
        }
        if (s.hover_t0 >= 0 && !s.hover_loaded) {
            s.hover_loaded = true;
            try {
                s.hover_events = reader.memory_events(s.run, {s.hover_t0, s.hover_t1}, 0, 256);
            } catch (const std::exception&) {
                s.hover_events.clear();
            }
            s.hover_events.erase(std::remove_if(s.hover_events.begin(), s.hover_events.end(),
                                                [&](const auto& e) { return e.device != s.hover_device || e.bytes == 0; }),
                                 s.hover_events.end());
            s.hover_events_in_window = int64_t(s.hover_events.size());
            std::stable_sort(s.hover_events.begin(), s.hover_events.end(),
                             [](const auto& a, const auto& c) { return std::llabs(a.bytes) > std::llabs(c.bytes); });
            if (s.hover_events.size() > 8) s.hover_events.resize(8);
            served = true;
        }
    } catch (const std::exception& e) {
        s.error = e.what();
    }
    return served;
}

bool refresh_memory_timeline(MemoryTimelineViewState& s, storage::SessionReader& reader) {
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    auto spent_ms = [&] { return std::chrono::duration<double, std::milli>(Clock::now() - start).count(); };
    bool any = false;
    try {
        if (!s.ranks_known) {
            s.base_run = s.run;
            s.rank_runs = storage::rank_runs(reader.runs(), s.run);
            s.ranks_known = true;
        }
        if (s.reload_requested) s.reload_requested = false, any = true;
        if (!s.have_t0) {
            const storage::RunInfo info = reader.run(s.run);
            if (info.t0_ns != 0) s.t0_ns = info.t0_ns, s.have_t0 = true;
        }
        bool memory_done = false, spans_done = false;
        // Memory events in id order, a slice at a time, until caught up or out of budget.
        while (true) {
            std::vector<storage::MemoryEventRow> rows = reader.memory_events(s.run, {}, s.last_memory_id, s.rows_per_read);
            for (const auto& e : rows) {
                MemorySeries& ser = s.series[e.device];
                ser.device = e.device;
                ser.add(e);
                s.last_memory_id = std::max(s.last_memory_id, e.id);
            }
            any |= !rows.empty();
            if (rows.size() < s.rows_per_read) {
                memory_done = true;
                break;
            }
            if (spent_ms() > s.refresh_budget_ms * 0.7) break;
        }
        // Spans share what is left of the budget (one slice at least once the memory caught up).
        while (memory_done || spent_ms() < s.refresh_budget_ms) {
            std::vector<storage::SpanRow> rows = reader.spans(s.run, {}, s.last_span_id, s.rows_per_read);
            for (const auto& r : rows) {
                s.last_span_id = std::max(s.last_span_id, r.id);
                // The run's phases (engine/telemetry/run_phase.h) are a lane of their own; the
                // span of the whole run is the time axis itself.
                if (r.category == trace::SpanCategory::RUN && r.name == "run") continue;
                if (r.category == trace::SpanCategory::CELL) {
                    s.cells.push_back({r.cell_row, r.cell_col, r.start_ns, r.end_ns, -1});
                    continue;
                }
                auto [it, inserted] = s.span_name_ids.emplace(r.name, uint32_t(s.span_names.size()));
                if (inserted) s.span_names.push_back(r.name);
                SpanLane* lane = nullptr;
                for (auto& l : s.lanes)
                    if (l.category == r.category) lane = &l;
                if (!lane) {
                    SpanLane nl;
                    nl.category = r.category;
                    auto pos = std::upper_bound(s.lanes.begin(), s.lanes.end(), r.category,
                                                [](trace::SpanCategory c, const SpanLane& l) { return c < l.category; });
                    lane = &*s.lanes.insert(pos, std::move(nl));
                }
                lane->add({r.start_ns, r.end_ns, r.id, it->second, r.layer, r.chunk, r.thread});
            }
            any |= !rows.empty();
            if (rows.size() < s.rows_per_read) {
                spans_done = true;
                break;
            }
            if (spent_ms() > s.refresh_budget_ms) break;
        }
        for (const auto& c : reader.cells(s.run, s.last_cell_id)) {
            s.last_cell_id = std::max(s.last_cell_id, c.id);
            s.cells.push_back({c.row, c.col, c.start_ns, c.end_ns, c.peak_bytes});
            any = true;
        }
        // Cells finish (and arrive) in end order; bands are drawn and zoomed in start order.
        if (any) {
            std::stable_sort(s.cells.begin(), s.cells.end(), [](const CellBand& a, const CellBand& b) { return a.start_ns < b.start_ns; });
            s.cell_slots = assign_cell_slots(s.cells);
        }
        s.caught_up = memory_done && spans_done;
        if (!s.have_t0 && !s.series.empty()) {  // not started per the runs table: start at the first event
            int64_t t = s.series.begin()->second.t_min;
            for (const auto& [d, ser] : s.series) t = std::min(t, ser.t_min);
            s.t0_ns = t;
        }
        if (any) ++s.version;
        s.error.clear();
    } catch (const std::exception& e) {
        s.error = e.what();
    }
    return any;
}

int assign_cell_slots(std::vector<CellBand>& cells) {
    std::vector<int64_t> row_end;  // last end per row
    for (CellBand& c : cells) {
        size_t r = 0;
        while (r < row_end.size() && row_end[r] > c.start_ns) ++r;
        if (r == row_end.size()) row_end.push_back(c.end_ns);
        row_end[r] = c.end_ns;
        c.slot = int32_t(r);
    }
    return std::max<int>(1, int(row_end.size()));
}

namespace {
// Extent of everything recorded, relative to t0.
std::pair<double, double> data_extent(const MemoryTimelineViewState& s) {
    double lo = 0, hi = 0;
    bool any = false;
    auto take = [&](int64_t a, int64_t b) {
        const double x = double(a - s.t0_ns), y = double(b - s.t0_ns);
        if (!any) lo = x, hi = y, any = true;
        lo = std::min(lo, x), hi = std::max(hi, y);
    };
    for (const auto& [d, ser] : s.series)
        if (ser.events) take(ser.t_min, ser.t_max);
    for (const auto& l : s.lanes)
        if (!l.spans.empty()) take(l.spans.front().start_ns, l.blocks.empty() ? l.spans.back().end_ns : l.blocks.back().second);
    for (const auto& c : s.cells) take(c.start_ns, c.end_ns);
    if (!any || hi <= lo) hi = lo + 1;
    return {std::min(0.0, lo), hi + (hi - lo) * 0.01};
}
}  // namespace

std::vector<storage::MemoryBucket> memory_view_buckets(MemoryTimelineViewState& s, storage::SessionReader* reader, int n,
                                                       bool* needs_reader) {
    const int dev = s.active_device();
    auto it = s.series.find(dev);
    if (it == s.series.end() || n < 1) return {};
    const MemorySeries& ser = it->second;
    const int64_t t0 = s.t0_ns + int64_t(std::floor(s.time.lo)), t1 = s.t0_ns + int64_t(std::ceil(s.time.hi));
    if (t1 <= t0) return {};
    if (ser.raw_complete) return memory_series_buckets(ser, t0, t1, n);
    // Huge run: read the events of a padded window snapped to a grid of about a quarter of the
    // visible span (so panning and small zooms reuse it), starting at the block that holds its
    // first event, whose state before is known: exact buckets at any zoom, cost linear in the
    // window's events. Windows holding too many events (by the blocks) draw from the blocks.
    const double vis = double(t1 - t0);
    double q = 1;
    while (q * 2 <= vis * 0.25) q *= 2;
    const int64_t pt0 = int64_t(std::floor((double(t0) - vis * 0.25) / q) * q);
    const int64_t pt1 = int64_t(std::ceil((double(t1) + vis * 0.25) / q) * q);
    // Events in the padded window, from the blocks (an estimate: it stops at the first block
    // starting after the window, so a later out-of-order block may be missed).
    int64_t est = 0;
    for (size_t i = size_t(std::lower_bound(ser.t_last_prefix_max.begin(), ser.t_last_prefix_max.end(), pt0) -
                           ser.t_last_prefix_max.begin());
         i < ser.blocks.size() && ser.blocks[i].t_first < pt1 && est <= s.zoom_query_max_events; ++i)
        if (ser.blocks[i].t_last >= pt0) est += ser.blocks[i].events;
    if (est > s.zoom_query_max_events) return memory_series_buckets(ser, t0, t1, n);
    const bool covers = s.zoom_valid && s.zoom_t0 <= t0 && s.zoom_t1 >= t1 && s.zoom_version == s.version;
    if (!covers) {
        if (!reader) {  // the draw path: show the blocks' buckets until a refresh reads the window
            if (needs_reader) *needs_reader = true;
            return memory_series_buckets(ser, t0, t1, n);
        }
        auto first = std::upper_bound(ser.blocks.begin(), ser.blocks.end(), pt0,
                                      [](int64_t t, const MemoryBlock& b) { return t < b.t_first; });
        if (first != ser.blocks.begin()) --first;
        const int64_t from = first == ser.blocks.end() ? pt0 : std::min(pt0, first->t_first);
        s.zoom_cat_before = first == ser.blocks.end() ? std::array<int64_t, kNumMemCategories>{} : first->before;
        s.zoom_total_before = first == ser.blocks.end() ? 0 : first->total_before;
        s.zoom_points.clear();
        const int64_t from_id = first == ser.blocks.end() ? 0 : first->first_id;
        reader->for_each_memory_event(s.run, {from, pt1}, [&](const storage::MemoryEventRow& e) {
            if (e.device != dev || e.id < from_id) return;
            const size_t c = size_t(e.category) < kNumMemCategories ? size_t(e.category) : size_t(MemCategory::WORKSPACE);
            s.zoom_points.push_back({e.t_ns, e.device_total, e.category_total, e.id, uint8_t(c)});
        });
        s.zoom_t0 = pt0, s.zoom_t1 = pt1, s.zoom_version = s.version, s.zoom_valid = true;
    }
    return bucket_memory_points(s.zoom_points, s.zoom_cat_before, s.zoom_total_before, t0, t1, n);
}

void zoom_to_cell(MemoryTimelineViewState& s, size_t cell) {
    if (cell >= s.cells.size()) return;
    const CellBand& c = s.cells[cell];
    const double pad = std::max<double>(1, double(c.end_ns - c.start_ns) * 0.05);
    s.time = {double(c.start_ns - s.t0_ns) - pad, double(c.end_ns - s.t0_ns) + pad};
    s.follow = false;
}

// =========================================================================================
// [SECTION] drawing
// =========================================================================================
namespace {

// A lane's name: its span category's, but "phase" for the run's phases (category run).
const char* lane_label(trace::SpanCategory c) { return c == trace::SpanCategory::RUN ? "phase" : trace::span_category_name(c); }

// Span labels start right of `label_min_x` (the lane's name) and never on another label
// (spans of one category overlap when several threads run them).
void draw_lane(ImDrawList* dl, const SpanLane& lane, const MemoryTimelineViewState& s, float x0, float x1, float y0,
               float y1, int64_t t0, int64_t t1, float label_min_x) {
    float label_end = label_min_x;
    const double px_per_ns = double(x1 - x0) / double(t1 - t0);
    const Colour col = span_category_colour(lane.category);
    auto [lo, hi] = lane.overlapping(t0, t1);
    float pend0 = -1, pend1 = -1;  // coalesced run of sub-pixel spans
    auto flush = [&] {
        if (pend0 >= 0) dl->AddRectFilled(ImVec2(pend0, y0), ImVec2(std::max(pend1, pend0 + 1), y1), col);
        pend0 = pend1 = -1;
    };
    auto px = [&](int64_t t) { return float(x0 + double(t - t0) * px_per_ns); };
    size_t i = lo;
    while (i < hi) {
        const size_t blk = i / kLaneBlock;
        if (i % kLaneBlock == 0 && blk < lane.blocks.size() && (i + kLaneBlock) <= hi) {
            const auto& e = lane.blocks[blk];
            const float a = px(e.first), b = px(e.second);
            if (b - a < 2.0f) {  // the whole block is narrower than two pixels: one box
                if (pend0 >= 0 && a - pend1 > 1) flush();
                if (pend0 < 0) pend0 = a;
                pend1 = std::max(pend1, b);
                i += kLaneBlock;
                continue;
            }
        }
        const SpanBox& sp = lane.spans[i++];
        if (sp.end_ns < t0 || sp.start_ns >= t1) continue;
        const float a = std::max(x0, px(sp.start_ns)), b = std::min(x1, px(sp.end_ns));
        if (b - a < 3.0f) {
            if (pend0 >= 0 && a - pend1 > 1) flush();
            if (pend0 < 0) pend0 = a;
            pend1 = std::max(pend1, b);
            continue;
        }
        flush();
        // Phases nest (fidelity's reference inside the policy pass): a colour per phase tells them apart.
        dl->AddRectFilled(ImVec2(a, y0), ImVec2(b, y1), lane.category == trace::SpanCategory::RUN ? phase_colour(int(sp.name)) : col);
        dl->AddRect(ImVec2(a, y0), ImVec2(b, y1), IM_COL32(0, 0, 0, 80));
        const std::string& name = s.span_names[sp.name];
        const float tw = ImGui::CalcTextSize(name.c_str()).x;
        if (b - a > tw + 4 && a + 2 >= label_end) {
            dl->AddText(ImVec2(a + 2, y0), IM_COL32(10, 10, 10, 255), name.c_str());
            label_end = a + 2 + tw + 2;
        }
    }
    flush();
}

const SpanBox* span_at(const SpanLane& lane, int64_t t, int64_t slack) {
    auto [lo, hi] = lane.overlapping(t - slack, t + slack + 1);
    const SpanBox* best = nullptr;
    for (size_t i = lo; i < hi; ++i) {
        const SpanBox& sp = lane.spans[i];
        if (sp.start_ns - slack <= t && t <= sp.end_ns + slack && (!best || sp.end_ns - sp.start_ns < best->end_ns - best->start_ns))
            best = &sp;
    }
    return best;
}

}  // namespace

void release_memory_timeline_textures(MemoryTimelineViewState& s, TextureHost* host) {
    if (host && s.plot_texture) host->release(s.plot_texture);
    s.plot_texture = 0;
    s.plot_key = {};
}

void DrawMemoryTimelineView(MemoryTimelineViewState& s, TextureHost* host, ImVec2 size) {
    if (size.x <= 0 || size.y <= 0) {
        const ImVec2 avail = ImGui::GetContentRegionAvail();
        if (size.x <= 0) size.x = avail.x;
        if (size.y <= 0) size.y = avail.y;
    }
    ImGui::PushID("memory_timeline");
    ImGui::BeginGroup();
    const float top = ImGui::GetCursorPosY();
    if (!s.error.empty()) ImGui::TextColored(ImVec4(1, 0.5f, 0.4f, 1), "%s", s.error.c_str());
    s.shown_rank_selector = s.rank_runs.size() > 1;
    if (s.rank_runs.size() > 1) {
        // Data-parallel run: one rank's memory and spans at a time (each rank is its own process).
        ImGui::SetNextItemWidth(150);
        const std::string current = "rank " + std::to_string(s.rank) + " of " + std::to_string(s.rank_runs.size());
        if (ImGui::BeginCombo("rank", current.c_str())) {
            for (size_t r = 0; r < s.rank_runs.size(); ++r) {
                const bool have = s.rank_runs[r] != 0;
                const std::string label = "rank " + std::to_string(r) + (have ? "" : " (telemetry missing)");
                if (ImGui::Selectable(label.c_str(), int(r) == s.rank, have ? 0 : ImGuiSelectableFlags_Disabled))
                    select_memory_rank(s, int(r), host);
            }
            ImGui::EndCombo();
        }
        if (!s.series.empty() || !s.lanes.empty()) ImGui::SameLine();
    }
    if (s.series.empty() && s.lanes.empty()) {
        ImGui::Dummy(ImVec2(size.x, 0));
        draw_empty_state("no memory events recorded yet");
        ImGui::EndGroup();
        ImGui::PopID();
        return;
    }
    // ---- toolbar ----
    const int dev = s.active_device();
    if (s.series.size() > 1) {
        ImGui::SetNextItemWidth(110);
        if (ImGui::BeginCombo("device", trace::device_code_name(dev).c_str())) {
            for (const auto& [d, ser] : s.series)
                if (ImGui::Selectable(trace::device_code_name(d).c_str(), d == dev)) s.device = d;
            ImGui::EndCombo();
        }
        ImGui::SameLine();
    }
    ImGui::Checkbox("op spans", &s.show_spans);
    ImGui::SameLine();
    ImGui::Checkbox("cells", &s.show_cells);
    ImGui::SameLine();
    if (ImGui::Button("fit")) s.follow = true;
    ImGui::SameLine();
    const auto sit = s.series.find(dev);
    if (sit != s.series.end())
        ImGui::TextDisabled("peak %s at %s | %lld events%s", format_bytes(double(sit->second.peak)).c_str(),
                            format_duration_ns(double(sit->second.peak_t_ns - s.t0_ns)).c_str(),
                            (long long)sit->second.events, s.caught_up ? "" : " (reading...)");
    // legend: every category the device ever held, with its own peak
    for (size_t c = 0; c < kNumMemCategories; ++c) {
        if (sit == s.series.end() || sit->second.category_peak[c] == 0) continue;
        ImGui::ColorButton(mem_category_name(MemCategory(c)), ImGui::ColorConvertU32ToFloat4(mem_category_colour(MemCategory(c))),
                           ImGuiColorEditFlags_NoTooltip, ImVec2(10, 10));
        ImGui::SameLine(0, 3);
        ImGui::TextDisabled("%s (peak %s)", mem_category_name(MemCategory(c)), format_bytes(double(sit->second.category_peak[c])).c_str());
        ImGui::SameLine();
    }
    ImGui::NewLine();
    // Span lanes: a legend that hides or shows a category's lane.
    std::vector<size_t> shown_lanes;
    if (s.show_spans && !s.lanes.empty()) {
        std::vector<trace::SpanCategory> present;
        for (const SpanLane& l : s.lanes) present.push_back(l.category);
        ImGui::TextDisabled("spans:");  // apart from the memory legend above: other colours, other things
        ImGui::SameLine();
        draw_span_legend(s.hidden_span_categories, present);
        for (size_t i = 0; i < s.lanes.size(); ++i)
            if (!span_category_hidden(s.hidden_span_categories, s.lanes[i].category)) shown_lanes.push_back(i);
    }

    const auto [ext_lo, ext_hi] = data_extent(s);
    if (s.follow) s.time = {ext_lo, ext_hi};
    const float used = ImGui::GetCursorPosY() - top;
    const float rest = std::max(80.f, size.y - used - ImGui::GetStyle().ItemSpacing.y);
    constexpr int kMaxCellRows = 3;  // deeper overlaps share the last row
    const int cell_rows = std::min(s.cell_slots, kMaxCellRows);
    const float lane_h = 16, band_row_h = 18.f, band_h = s.show_cells && !s.cells.empty() ? band_row_h * float(cell_rows) : 0.f;
    const float lanes_h = s.show_spans ? std::min(rest * 0.45f, float(shown_lanes.size()) * lane_h) : 0.f;
    const float plot_h = std::max(40.f, rest - lanes_h - band_h - 4);
    ImDrawList* dl = ImGui::GetWindowDrawList();

    // ---- stacked areas ----
    // The left margin fits the labels of the whole run's range (zooming does not shift the
    // plot sideways, and the first frame already has its final layout).
    const AxisSpec xs{AxisUnit::NANOSECONDS, "time since run start"}, ys{AxisUnit::BYTES, "bytes held"};
    const AxisRange y_guess{0, std::max<double>(1, double(sit != s.series.end() ? sit->second.peak : 0) * 1.08)};
    const PlotMargins m = plot_margins(&xs, &ys, &y_guess, plot_h);
    const PlotFrame f = begin_plot_frame("##memory", ImVec2(size.x, plot_h), m);
    const PlotMargins strip{m.left, 0, m.right, 0};  // cell bands and lanes share the plot's time axis
    if (plot_zoom_pan(f, s.time, ext_lo, ext_hi)) s.follow = false;
    if (f.hovered && ImGui::IsMouseDoubleClicked(ImGuiMouseButton_Left)) s.follow = true;
    const int ncol = std::max(1, int(f.width()));
    const int64_t t0 = s.t0_ns + int64_t(std::floor(s.time.lo)), t1 = s.t0_ns + int64_t(std::ceil(s.time.hi));
    if (s.shown_t0 != t0 || s.shown_t1 != t1 || s.shown_columns != ncol || s.shown_device != dev || s.shown_version != s.version) {
        bool needs_reader = false;
        s.shown_buckets = memory_view_buckets(s, nullptr, ncol, &needs_reader);
        s.zoom_requested = needs_reader;
        ++s.shown_serial;
        s.shown_device = dev;
        s.shown_t0 = t0, s.shown_t1 = t1, s.shown_columns = ncol, s.shown_version = s.version;
        s.shown_peak = 0;
        for (const auto& b : s.shown_buckets) s.shown_peak = std::max(s.shown_peak, b.total_max);
    }
    const double ymax = std::max<double>(1, double(s.shown_peak) * 1.08);
    auto tpx = [&](int64_t t) { return float(axis_to_pixel(s.time, double(t - s.t0_ns), f.p0.x, f.p1.x)); };
    {  // background, cell bands, stacked areas and total line: one image, rebuilt on change
        const int pw = ncol, ph = std::max(1, int(f.height()));
        const MemoryTimelineViewState::PlotKey key{s.shown_t0, s.shown_t1, s.shown_serial, s.shown_device, pw, ph, s.show_cells,
                                                   s.cells.size()};
        if (key != s.plot_key || s.plot_pixels.empty()) {
            std::vector<RasterBand> bands;
            if (s.show_cells)
                for (const auto& c : s.cells) {
                    if (c.end_ns < t0 || c.start_ns >= t1) continue;
                    bands.push_back({tpx(c.start_ns) - f.p0.x, tpx(c.end_ns) - f.p0.x,
                                     (c.col & 1) ? IM_COL32(255, 255, 255, 14) : IM_COL32(120, 160, 255, 18)});
                }
            rasterize_memory_plot(s.shown_buckets, ymax, bands, pw, ph, s.plot_pixels);
            s.plot_width = pw, s.plot_height = ph, s.plot_key = key;
            ++s.plot_builds;
            if (host) s.plot_texture = host->upload_rgba(s.plot_texture, pw, ph, s.plot_pixels.data());
        }
        if (host && s.plot_texture)
            dl->AddImage(ImTextureID(uintptr_t(s.plot_texture)), f.p0, ImVec2(f.p0.x + float(pw), f.p0.y + float(ph)));
    }
    draw_x_axis(dl, f, s.time, xs);
    const AxisRange yr{0, ymax};
    draw_y_axis(dl, f, yr, ys, false);
    if (f.hovered && !s.shown_buckets.empty()) {
        const int x = std::clamp(int((f.mouse.x - f.p0.x) / f.width() * float(s.shown_buckets.size())), 0,
                                 int(s.shown_buckets.size()) - 1);
        const storage::MemoryBucket& b = s.shown_buckets[size_t(x)];
        dl->AddLine(ImVec2(f.mouse.x, f.p0.y), ImVec2(f.mouse.x, f.p1.y), IM_COL32(255, 255, 255, 90));
        if (b.t0_ns != s.hover_t0 || b.t1_ns != s.hover_t1 || dev != s.hover_device) {
            // Asked for here, read by serve_memory_timeline_requests (the host calls it after the frame).
            s.hover_t0 = b.t0_ns, s.hover_t1 = b.t1_ns, s.hover_device = dev;
            s.hover_loaded = false;
            s.hover_events.clear();
            s.hover_events_in_window = 0;
        }
        ImGui::BeginTooltip();
        ImGui::Text("%s .. %s", format_duration_ns(double(b.t0_ns - s.t0_ns)).c_str(), format_duration_ns(double(b.t1_ns - s.t0_ns)).c_str());
        ImGui::Text("total %s (max), %s (min), %lld events", format_bytes(double(b.total_max)).c_str(),
                    format_bytes(double(b.total_min)).c_str(), (long long)b.events);
        for (size_t c = 0; c < kNumMemCategories; ++c)
            if (b.at_max[c])
                ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(mem_category_colour(MemCategory(c))), "  %-22s %s",
                                   mem_category_name(MemCategory(c)), format_bytes(double(b.at_max[c])).c_str());
        if (s.hover_loaded && b.t0_ns == s.hover_t0) {
            if (!s.hover_events.empty()) ImGui::Separator();
            for (const auto& e : s.hover_events)
                ImGui::Text("%s %s  %s  %s", e.bytes > 0 ? "alloc" : "free ", format_bytes(double(std::llabs(e.bytes))).c_str(),
                            mem_category_name(e.category), e.label.c_str());
            if (s.hover_events_in_window >= 256) ImGui::TextDisabled("(largest of the first 256 events here)");
        }
        ImGui::EndTooltip();
    }

    // ---- cell bands ----
    if (band_h > 0) {
        const PlotFrame bf = begin_plot_frame("##cells", ImVec2(size.x, band_h), strip);
        if (plot_zoom_pan(bf, s.time, ext_lo, ext_hi)) s.follow = false;
        dl->AddRectFilled(bf.p0, bf.p1, IM_COL32(30, 30, 36, 255));
        dl->PushClipRect(bf.p0, bf.p1, true);
        float cell_label_end[kMaxCellRows] = {-1e30f, -1e30f, -1e30f};
        for (size_t i = 0; i < s.cells.size(); ++i) {
            const CellBand& c = s.cells[i];
            if (c.end_ns < t0 || c.start_ns >= t1) continue;
            const int row = std::min(int(c.slot), cell_rows - 1);
            const float a = tpx(c.start_ns), b = tpx(c.end_ns), y0 = bf.p0.y + band_row_h * float(row), y1 = y0 + band_row_h;
            // Cell colours: the span palette's cell grey, alternating shade by column.
            const Colour band = span_category_colour(trace::SpanCategory::CELL);
            dl->AddRectFilled(ImVec2(a, y0 + 1), ImVec2(std::max(a + 1, b), y1 - 1), (c.col & 1) ? band : with_alpha(band, 170));
            dl->AddRect(ImVec2(a, y0 + 1), ImVec2(std::max(a + 1, b), y1 - 1), IM_COL32(0, 0, 0, 90));
            char label[40];
            std::snprintf(label, sizeof label, "cell %d,%d", c.row, c.col);
            const float tw = ImGui::CalcTextSize(label).x;
            // Labels of one row never overlap: its bands are disjoint and each label stays inside its band.
            if (b - a > tw + 4 && a + 2 >= cell_label_end[row]) {
                dl->AddText(ImVec2(a + 2, y0 + 1), IM_COL32(240, 240, 240, 255), label);
                cell_label_end[row] = a + 2 + tw + 2;
            }
            if (bf.hovered && bf.mouse.y >= y0 && bf.mouse.y < y1 && bf.mouse.x >= a && bf.mouse.x < std::max(a + 1, b)) {
                ImGui::BeginTooltip();
                ImGui::Text("cell row %d, column %d", c.row, c.col);
                ImGui::Text("%s (from %s)", format_duration_ns(double(c.end_ns - c.start_ns)).c_str(),
                            format_duration_ns(double(c.start_ns - s.t0_ns)).c_str());
                if (c.peak_bytes >= 0) ImGui::Text("peak %s", format_bytes(double(c.peak_bytes)).c_str());
                ImGui::TextDisabled("click: zoom to this cell");
                ImGui::EndTooltip();
                if (ImGui::IsMouseClicked(ImGuiMouseButton_Left)) zoom_to_cell(s, i);
            }
        }
        dl->PopClipRect();
    }

    // ---- op span lanes ----
    if (lanes_h > 0) {
        const PlotFrame lf = begin_plot_frame("##lanes", ImVec2(size.x, lanes_h), strip);
        if (plot_zoom_pan(lf, s.time, ext_lo, ext_hi)) s.follow = false;
        dl->AddRectFilled(lf.p0, lf.p1, IM_COL32(20, 20, 24, 255));
        dl->PushClipRect(lf.p0, lf.p1, true);
        const int shown = std::max(1, int(lanes_h / lane_h));
        for (int li = 0; li < int(shown_lanes.size()) && li < shown; ++li) {
            const float y0 = lf.p0.y + li * lane_h, y1 = y0 + lane_h - 2;
            const SpanLane& lane = s.lanes[shown_lanes[size_t(li)]];
            const char* label = lane_label(lane.category);
            draw_lane(dl, lane, s, lf.p0.x, lf.p1.x, y0, y1, t0, t1, lf.p0.x + ImGui::CalcTextSize(label).x + 6);
            // a backing box keeps the lane's name legible over its spans' own labels
            dl->AddRectFilled(ImVec2(lf.p0.x, y0), ImVec2(lf.p0.x + ImGui::CalcTextSize(label).x + 4, y1), IM_COL32(20, 20, 24, 220));
            dl->AddText(ImVec2(lf.p0.x + 2, y0), IM_COL32(255, 255, 255, 170), label);
        }
        dl->PopClipRect();
        if (lf.hovered) {
            const int li = int((lf.mouse.y - lf.p0.y) / lane_h);
            if (li >= 0 && li < int(shown_lanes.size()) && li < shown) {
                const SpanLane& lane = s.lanes[shown_lanes[size_t(li)]];
                const int64_t t = s.t0_ns + int64_t(pixel_to_axis(s.time, lf.mouse.x, lf.p0.x, lf.p1.x));
                const int64_t slack = int64_t(s.time.span() / std::max(1.f, lf.width()));
                if (const SpanBox* sp = span_at(lane, t, slack)) {
                    ImGui::BeginTooltip();
                    ImGui::Text("%s (%s)", s.span_names[sp->name].c_str(), lane_label(lane.category));
                    ImGui::Text("%s, from %s", format_duration_ns(double(sp->end_ns - sp->start_ns)).c_str(),
                                format_duration_ns(double(sp->start_ns - s.t0_ns)).c_str());
                    if (sp->layer >= 0 || sp->chunk >= 0) ImGui::Text("layer %d  chunk %d  thread %d", sp->layer, sp->chunk, sp->thread);
                    ImGui::EndTooltip();
                }
            }
        }
    }
    ImGui::EndGroup();
    ImGui::PopID();
}

std::vector<double> memory_over_progress(const MemorySeries& s, const std::vector<ProgressKnot>& knots, double x_hi, int n) {
    std::vector<double> out(size_t(std::max(0, n)), std::nan(""));
    if (knots.size() < 2 || n < 1 || x_hi <= 0) return out;
    const size_t chunks = knots.size() - 1;
    // Each chunk's peak: the total it started with, raised by the events during it.
    std::vector<double> peak(chunks, std::nan(""));
    int64_t total = 0;
    size_t k = 0;  // chunk of the current event (events arrive in time order)
    const auto event = [&](int64_t t, int64_t max_total, int64_t last_total) {
        if (t > knots.back().t_ns) return false;
        if (t < knots.front().t_ns) {
            total = last_total;
            return true;
        }
        // Chunks passed start from the total of that moment (no event fell between).
        if (std::isnan(peak[k])) peak[k] = double(total);
        for (; k + 1 < chunks && t >= knots[k + 1].t_ns; ++k) peak[k + 1] = double(total);
        peak[k] = std::max(peak[k], double(max_total));
        total = last_total;
        return true;
    };
    // The run's own bytes: instrumentation (fidelity) measures the run and is left out, as in
    // the peak the runs table and compare's tables report.
    if (s.raw_complete) {
        for (const MemoryPoint& p : s.raw)
            if (!event(p.t_ns, p.device_total - p.instrumentation_total, p.device_total - p.instrumentation_total)) break;
    } else {
        for (const MemoryBlock& b : s.blocks)
            if (!event(b.t_first, b.own_max, b.own_last)) break;
    }
    for (size_t c = 0; c < chunks; ++c)  // chunks after the last event hold what it left
        if (std::isnan(peak[c])) peak[c] = double(total);
    const double per = double(n) / x_hi;
    for (size_t c = 0; c < chunks; ++c) {
        const double x0 = knots[c].x, x1 = knots[c + 1].x;
        if (x1 <= x0) continue;
        const int c0 = std::clamp(int(std::floor(x0 * per)), 0, n - 1), c1 = std::clamp(int(std::ceil(x1 * per - 1e-9)) - 1, c0, n - 1);
        for (int col = c0; col <= c1; ++col)
            out[size_t(col)] = std::isnan(out[size_t(col)]) ? peak[c] : std::max(out[size_t(col)], peak[c]);
    }
    return out;
}

std::vector<double> DrawMemoryOverlay(std::vector<MemoryTimelineViewState*>& states, const std::vector<std::string>& names,
                                      const std::vector<std::vector<ProgressKnot>>& knots, ImVec2 size) {
    ImGui::PushID("memory_overlay");
    std::vector<double> ends(states.size(), std::nan(""));
    double x_hi = 1;
    int64_t peak = 1;
    for (size_t i = 0; i < states.size(); ++i) {
        const auto it = states[i]->series.find(states[i]->active_device());
        if (it == states[i]->series.end()) continue;
        peak = std::max(peak, it->second.own_peak);
        if (i < knots.size() && !knots[i].empty()) x_hi = std::max(x_hi, knots[i].back().x);
    }
    // Legend in its own row above the plot: it never covers a curve. Short entries (the maps'
    // captions carry the names in the same colours) keep it to one row.
    std::vector<LegendEntry> legend;
    for (size_t i = 0; i < states.size(); ++i) {
        const bool placed = i < knots.size() && !knots[i].empty();
        // The run's own peak (what the tables say), and with fidelity's shadow cache and passes when it had them.
        const auto it = states[i]->series.find(states[i]->active_device());
        const int64_t own = it == states[i]->series.end() ? 0 : it->second.own_peak;
        const int64_t all = it == states[i]->series.end() ? 0 : it->second.peak;
        legend.push_back({series_colour(int(i)), (i < names.size() ? names[i] : std::string("run")) + "  peak " + format_bytes(double(own)) +
                                                     (all > own ? " (" + format_bytes(double(all)) + " with fidelity)" : "") +
                                                     (placed ? "" : " (no cache steps: not placed)")});
    }
    ImDrawList* dl = ImGui::GetWindowDrawList();
    const ImVec2 at = ImGui::GetCursorScreenPos();
    const float lh = legend_height(size.x, legend);
    draw_legend(dl, at, at.x + size.x, legend);
    ImGui::Dummy(ImVec2(size.x, lh));
    const AxisRange xr{0, x_hi}, yr{0, double(peak) * 1.08};
    const AxisSpec xs{AxisUnit::NUMBER, "tokens processed, all samples (runs aligned chunk by chunk, not by time)"},
        ys{AxisUnit::BYTES, "bytes held by the run (instrumentation left out)"};
    const float plot_h = std::max(40.f, size.y - lh - ImGui::GetStyle().ItemSpacing.y);
    const PlotFrame f = begin_plot_frame("##overlay", ImVec2(size.x, plot_h), plot_margins(&xs, &ys, &yr, plot_h));
    dl->AddRectFilled(f.p0, f.p1, IM_COL32(24, 24, 28, 255));
    const int n = std::max(1, int(f.width() / 2));
    std::vector<std::vector<double>> all(states.size());
    for (size_t i = 0; i < states.size(); ++i) {
        MemoryTimelineViewState* s = states[i];
        const auto it = s->series.find(s->active_device());
        if (it == s->series.end() || i >= knots.size() || knots[i].empty()) continue;
        all[i] = memory_over_progress(it->second, knots[i], x_hi, n);
        std::vector<ImVec2> pts;
        for (size_t b = 0; b < all[i].size() && !std::isnan(all[i][b]); ++b) {
            // Each column as a step from its left to its right edge (the last one ends at the run's end).
            const double x0 = double(b) * x_hi / n, x1 = std::min(double(b + 1) * x_hi / n, knots[i].back().x);
            const float y = float(axis_to_pixel(yr, all[i][b], f.p1.y, f.p0.y));
            pts.push_back(ImVec2(float(axis_to_pixel(xr, x0, f.p0.x, f.p1.x)), y));
            pts.push_back(ImVec2(float(axis_to_pixel(xr, x1, f.p0.x, f.p1.x)), y));
            ends[i] = x1;
        }
        if (pts.size() > 1) dl->AddPolyline(pts.data(), int(pts.size()), series_colour(int(i)), 0, 1.5f);
    }
    draw_x_axis(dl, f, xr, xs);
    draw_y_axis(dl, f, yr, ys, false);
    if (f.hovered) {
        const int b = std::clamp(int((f.mouse.x - f.p0.x) / f.width() * float(n)), 0, n - 1);
        ImGui::BeginTooltip();
        ImGui::Text("tokens %.0f to %.0f", double(b) * x_hi / n, double(b + 1) * x_hi / n);
        for (size_t i = 0; i < states.size(); ++i) {
            const double v = size_t(b) < all[i].size() ? all[i][size_t(b)] : std::nan("");
            ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(series_colour(int(i))), "%s: %s",
                               i < names.size() ? names[i].c_str() : "run", std::isnan(v) ? "ended before" : format_bytes(v).c_str());
        }
        ImGui::EndTooltip();
    }
    ImGui::PopID();
    return ends;
}

// ---- its entry in the view table -----------------------------------------------------------

namespace {
class MemoryTimelineSlot final : public StateSlot<MemoryTimelineViewState> {
   public:
    void select(const ViewSelection& sel) override {
        release(sel.textures);
        state = {};
        state.run = sel.runs.empty() ? 0 : sel.runs.front();
    }
    bool refresh(storage::SessionReader& r) override { return refresh_memory_timeline(state, r); }
    void draw(TextureHost* t, ImVec2 size) override {
        DrawMemoryTimelineView(state, t, size);
    }
    void release(TextureHost* t) override { release_memory_timeline_textures(state, t); }
    bool has_requests() const override { return memory_timeline_has_requests(state); }
    bool serve_requests(storage::SessionReader& r) override { return serve_memory_timeline_requests(state, r); }
};
}  // namespace

ViewEntry memory_timeline_view_entry() {
    return {.name = "memory timeline", .make = []() -> std::unique_ptr<ViewSlot> { return std::make_unique<MemoryTimelineSlot>(); }};
}

}  // namespace kv::views
