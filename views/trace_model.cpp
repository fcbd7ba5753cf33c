// The trace view's model (see trace_model.h): nesting by one preorder stack pass per thread,
// rows per depth, merged levels of detail, unattributed time, icicle, search, range summaries.
#include "views/trace_model.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <numeric>
#include <string_view>
#include <tuple>
#include <unordered_map>

namespace kv::views {

int64_t lod_gap_ns(size_t level) {
    return int64_t(1000) << (2 * level);
}

int pick_lod_level(double ns_per_px) {
    int level = -1;
    for (size_t k = 0; k < kTraceLodLevels; ++k)
        if (double(lod_gap_ns(k)) <= ns_per_px) level = int(k);
    return level;
}

namespace {
// Merges neighbours of `in` closer than `gap`; the merged box takes the category of its longest part.
std::vector<TraceMerged> merge_level(const std::vector<TraceMerged>& in, int64_t gap) {
    std::vector<TraceMerged> out;
    int64_t longest = -1;
    for (const TraceMerged& b : in) {
        if (!out.empty() && b.start_ns - out.back().end_ns < gap) {
            TraceMerged& m = out.back();
            m.end_ns = std::max(m.end_ns, b.end_ns);
            m.count += b.count;
            if (b.end_ns - b.start_ns > longest) longest = b.end_ns - b.start_ns, m.category = b.category;
            continue;
        }
        out.push_back(b);
        longest = b.end_ns - b.start_ns;
    }
    return out;
}

std::vector<std::vector<TraceMerged>> build_levels(std::vector<TraceMerged> base) {
    std::vector<std::vector<TraceMerged>> levels;
    for (size_t k = 0; k < kTraceLodLevels; ++k) {
        base = merge_level(base, lod_gap_ns(k));
        levels.push_back(base);
        if (base.size() <= 1) break;  // coarser levels would be the same one box
    }
    return levels;
}
}  // namespace

TraceModel build_trace_model(std::vector<TraceSpan> spans, std::vector<std::string> names) {
    TraceModel m;
    // Thread first, then preorder (start ascending, end descending, the later-written outer
    // first): each thread one stretch, each span after its ancestors.
    std::sort(spans.begin(), spans.end(), [](const TraceSpan& x, const TraceSpan& y) {
        return std::make_tuple(x.thread, x.start_ns, -x.end_ns, -x.id) < std::make_tuple(y.thread, y.start_ns, -y.end_ns, -y.id);
    });
    m.spans = std::move(spans);
    m.names = std::move(names);
    m.parent.assign(m.spans.size(), kNoParent);
    if (!m.spans.empty()) m.t_min = m.spans.front().start_ns, m.t_max = m.spans.front().end_ns;
    std::vector<uint32_t> stack;
    for (uint32_t i = 0; i < m.spans.size(); ++i) {
        const TraceSpan& s = m.spans[i];
        m.t_min = std::min(m.t_min, s.start_ns);
        m.t_max = std::max(m.t_max, s.end_ns);
        if (m.lanes.empty() || m.lanes.back().thread != s.thread) {
            m.lanes.push_back({});
            m.lanes.back().thread = s.thread;
            stack.clear();
        }
        while (!stack.empty() && m.spans[stack.back()].end_ns < s.end_ns) stack.pop_back();
        if (!stack.empty()) m.parent[i] = stack.back();
        TraceLane& lane = m.lanes.back();
        if (s.correlation && !is_gpu_lane(s.thread)) m.launchers.emplace(s.correlation, i);
        if (lane.rows.size() <= stack.size()) lane.rows.resize(stack.size() + 1);
        lane.rows[stack.size()].spans.push_back(i);
        stack.push_back(i);
    }
    for (TraceLane& lane : m.lanes) {
        for (TraceRow& row : lane.rows) {
            std::vector<TraceMerged> base;
            base.reserve(row.spans.size());
            for (uint32_t i : row.spans) base.push_back({m.spans[i].start_ns, m.spans[i].end_ns, 1, m.spans[i].category});
            row.levels = build_levels(std::move(base));
        }
        // Unattributed: inside a "run" root, the stretches no depth-1 span covers.
        if (lane.rows.size() >= 1) {
            const std::vector<uint32_t>& roots = lane.rows[0].spans;
            static const std::vector<uint32_t> kNone;
            const std::vector<uint32_t>& kids = lane.rows.size() >= 2 ? lane.rows[1].spans : kNone;
            size_t k = 0;
            for (uint32_t r : roots) {
                const TraceSpan& root = m.spans[r];
                if (root.category != trace::SpanCategory::RUN) continue;
                // Skip the children of earlier roots (they start before this one, or at its start on a touching root).
                while (k < kids.size() && m.parent[kids[k]] != r && m.spans[kids[k]].start_ns <= root.start_ns) ++k;
                int64_t at = root.start_ns;
                for (; k < kids.size() && m.parent[kids[k]] == r; ++k) {
                    const TraceSpan& c = m.spans[kids[k]];
                    if (c.start_ns > at) lane.unattributed.push_back({at, c.start_ns, 1, trace::SpanCategory::RUN});
                    at = std::max(at, c.end_ns);
                }
                if (root.end_ns > at) lane.unattributed.push_back({at, root.end_ns, 1, trace::SpanCategory::RUN});
            }
            lane.unattributed_levels = build_levels(lane.unattributed);
        }
    }
    // Launch links the other way (host span -> its GPU records), counted then filled.
    if (!m.launchers.empty()) {
        std::vector<uint32_t> of(m.spans.size(), kNoParent);
        size_t linked = 0;
        for (uint32_t i = 0; i < m.spans.size(); ++i)
            if ((of[i] = find_launcher(m, i)) != kNoParent) ++linked;
        if (linked) {
            m.launched_at.assign(m.spans.size() + 1, 0);
            for (uint32_t l : of)
                if (l != kNoParent) ++m.launched_at[l + 1];
            for (size_t i = 0; i < m.spans.size(); ++i) m.launched_at[i + 1] += m.launched_at[i];
            m.launched.resize(linked);
            std::vector<uint32_t> at(m.launched_at.begin(), m.launched_at.end() - 1);
            for (uint32_t i = 0; i < m.spans.size(); ++i)
                if (of[i] != kNoParent) m.launched[at[of[i]]++] = i;
            // Spans are in (lane, time) order, so a launcher's records are in lane-major order: sort each by time.
            for (size_t i = 0; i < m.spans.size(); ++i)
                std::sort(m.launched.begin() + long(m.launched_at[i]), m.launched.begin() + long(m.launched_at[i + 1]),
                          [&](uint32_t a, uint32_t b) { return m.spans[a].start_ns < m.spans[b].start_ns; });
        }
    }
    return m;
}

std::span<const uint32_t> find_launched(const TraceModel& m, uint32_t i) {
    if (m.launched_at.empty() || i >= m.spans.size()) return {};
    return {m.launched.data() + m.launched_at[i], m.launched.data() + m.launched_at[i + 1]};
}

size_t span_depth(const TraceModel& m, uint32_t i) {
    size_t d = 0;
    for (uint32_t p = i < m.parent.size() ? m.parent[i] : kNoParent; p != kNoParent; p = m.parent[p]) ++d;
    return d;
}

uint32_t find_launcher(const TraceModel& m, uint32_t i) {
    if (i >= m.spans.size() || !is_gpu_lane(m.spans[i].thread) || !m.spans[i].correlation) return kNoParent;
    const auto it = m.launchers.find(m.spans[i].correlation);
    return it == m.launchers.end() ? kNoParent : it->second;
}

std::pair<size_t, size_t> row_window(const TraceModel& m, const TraceRow& row, int64_t t0, int64_t t1) {
    // A row's spans are disjoint, so ends ascend with starts.
    const auto lo = std::partition_point(row.spans.begin(), row.spans.end(), [&](uint32_t i) { return m.spans[i].end_ns < t0; });
    const auto hi = std::partition_point(lo, row.spans.end(), [&](uint32_t i) { return m.spans[i].start_ns < t1; });
    return {size_t(lo - row.spans.begin()), size_t(hi - row.spans.begin())};
}

std::pair<size_t, size_t> merged_window(const std::vector<TraceMerged>& level, int64_t t0, int64_t t1) {
    const auto lo = std::partition_point(level.begin(), level.end(), [&](const TraceMerged& b) { return b.end_ns < t0; });
    const auto hi = std::partition_point(lo, level.end(), [&](const TraceMerged& b) { return b.start_ns < t1; });
    return {size_t(lo - level.begin()), size_t(hi - level.begin())};
}

std::vector<storage::SpanRow> trace_span_rows(const TraceModel& m) {
    std::vector<storage::SpanRow> out;
    out.reserve(m.spans.size());
    for (const TraceSpan& s : m.spans) {
        if (is_gpu_lane(s.thread)) continue;
        storage::SpanRow r;
        r.id = s.id;
        r.start_ns = s.start_ns;
        r.end_ns = s.end_ns;
        r.name = m.names[s.name];
        r.category = s.category;
        r.layer = s.layer;
        r.chunk = s.chunk;
        r.thread = s.thread;
        r.correlation_id = s.correlation;
        out.push_back(std::move(r));
    }
    return out;
}

namespace {
void add_stat(storage::SpanStats& g, int64_t d, int64_t self) {
    if (g.count == 0) g.min_ns = g.max_ns = d;
    ++g.count;
    g.total_ns += d;
    g.self_ns += self;
    g.min_ns = std::min(g.min_ns, d);
    g.max_ns = std::max(g.max_ns, d);
}
bool by_self_desc(const storage::SpanStats& a, const storage::SpanStats& b) { return a.self_ns > b.self_ns; }
}  // namespace

storage::SpanSummary trace_range_summary(const TraceModel& m, int64_t t0, int64_t t1) {
    const size_t n = m.spans.size();
    // Clipped durations; -1 marks a span outside the range (storage's rule: a zero-length span
    // counts where it lies).
    std::vector<int64_t> dur(n), self(n);
    std::unordered_map<uint32_t, int64_t> run_self;  // RUN spans only: phases nest among themselves
    for (size_t i = 0; i < n; ++i) {
        const TraceSpan& s = m.spans[i];
        const int64_t a = std::max(s.start_ns, t0), b = std::min(s.end_ns, t1);
        const bool inside = (a < b || (s.start_ns == s.end_ns && s.start_ns >= t0 && s.start_ns < t1)) && !is_gpu_lane(s.thread);
        dur[i] = inside ? std::max<int64_t>(0, b - a) : -1;
    }
    // Self: minus the clipped children (a child inside the range has its parent inside too).
    for (size_t i = 0; i < n; ++i) {
        if (dur[i] < 0) continue;
        self[i] += dur[i];
        if (m.parent[i] != kNoParent) self[m.parent[i]] -= dur[i];
        if (m.spans[i].category == trace::SpanCategory::RUN) {
            run_self[uint32_t(i)] += dur[i];
            uint32_t p = m.parent[i];
            while (p != kNoParent && m.spans[p].category != trace::SpanCategory::RUN) p = m.parent[p];
            if (p != kNoParent) run_self[p] -= dur[i];
        }
    }
    // Flat tables indexed by (name, category) and by layer: no hashing per span.
    const size_t kCats = trace::kNumSpanCategories;
    std::vector<storage::SpanStats> by_id(m.names.size() * kCats);
    std::vector<storage::SpanStats> layers;
    std::map<std::pair<std::string_view, int>, storage::SpanStats> phases;
    for (size_t i = 0; i < n; ++i) {
        if (dur[i] < 0) continue;
        const TraceSpan& s = m.spans[i];
        add_stat(by_id[size_t(s.name) * kCats + size_t(s.category) % kCats], dur[i], self[i]);
        if (s.layer >= 0) {
            if (size_t(s.layer) >= layers.size()) layers.resize(size_t(s.layer) + 1);
            add_stat(layers[size_t(s.layer)], dur[i], self[i]);
        }
        if (s.category == trace::SpanCategory::RUN) {
            auto& p = phases[{m.names[s.name], int(s.category)}];
            p.name = m.names[s.name];
            p.category = s.category;
            add_stat(p, dur[i], run_self[uint32_t(i)]);
        }
    }
    auto merge = [](storage::SpanStats& into, const storage::SpanStats& g) {
        if (into.count == 0) into.min_ns = g.min_ns, into.max_ns = g.max_ns;
        into.count += g.count;
        into.total_ns += g.total_ns;
        into.self_ns += g.self_ns;
        into.min_ns = std::min(into.min_ns, g.min_ns);
        into.max_ns = std::max(into.max_ns, g.max_ns);
    };
    std::map<std::pair<std::string_view, int>, storage::SpanStats> by_key;
    for (size_t k = 0; k < by_id.size(); ++k) {
        if (by_id[k].count == 0) continue;
        const auto cat = trace::SpanCategory(k % kCats);
        auto& e = by_key[{m.names[k / kCats], int(cat)}];  // two ids may share a name
        e.name = m.names[k / kCats];
        e.category = cat;
        merge(e, by_id[k]);
    }
    storage::SpanSummary out;
    std::map<int, storage::SpanStats> categories;
    for (auto& [key, g] : by_key) {
        auto& c = categories[int(g.category)];
        c.category = g.category;
        merge(c, g);
        out.spans.push_back(std::move(g));
    }
    std::stable_sort(out.spans.begin(), out.spans.end(), by_self_desc);
    for (auto& [key, c] : categories) out.categories.push_back(c);
    std::sort(out.categories.begin(), out.categories.end(), [](const storage::SpanStats& a, const storage::SpanStats& b) {
        return a.self_ns != b.self_ns ? a.self_ns > b.self_ns
                                      : std::string_view(trace::span_category_name(a.category)) <
                                            std::string_view(trace::span_category_name(b.category));
    });
    for (size_t l = 0; l < layers.size(); ++l)
        if (layers[l].count) {
            layers[l].layer = int32_t(l);
            out.layers.push_back(layers[l]);
        }
    for (auto& [key, p] : phases) out.phases.push_back(std::move(p));
    std::stable_sort(out.phases.begin(), out.phases.end(), by_self_desc);
    for (const auto& p : out.phases)
        if (p.name == "run") out.run_ns += p.total_ns, out.unattributed_ns += p.self_ns;
    return out;
}

namespace {
// Span i's duration clipped to [t0, t1), or -1 when it lies outside (trace_range_summary's rule:
// a zero-length span counts where it lies).
int64_t clipped(const TraceSpan& s, int64_t t0, int64_t t1) {
    const int64_t a = std::max(s.start_ns, t0), b = std::min(s.end_ns, t1);
    if (a < b) return b - a;
    return s.start_ns == s.end_ns && s.start_ns >= t0 && s.start_ns < t1 ? 0 : -1;
}

// The host icicle of [t0, t1), and the node of every host span (0 for GPU spans; a span outside
// the range has its nearest counted ancestor's node, so its counted descendants hang there).
Icicle host_icicle(const TraceModel& m, std::vector<int32_t>& node_of, int64_t t0, int64_t t1) {
    Icicle ic;
    ic.nodes.push_back({});  // the root
    ic.nodes[0].name = UINT32_MAX;
    node_of.assign(m.spans.size(), 0);
    std::unordered_map<uint64_t, int32_t> child;  // (parent node, name, category) -> node
    child.reserve(1024);
    // Preorder: a span's parent has its node before it.
    for (size_t i = 0; i < m.spans.size(); ++i) {
        const TraceSpan& s = m.spans[i];
        if (is_gpu_lane(s.thread)) continue;  // GPU work is not a span: its lanes are drawn, not summed
        const int32_t pn = m.parent[i] == kNoParent ? 0 : node_of[m.parent[i]];
        const int64_t d = clipped(s, t0, t1);
        if (d < 0) {
            node_of[i] = pn;
            continue;
        }
        const uint64_t key = uint64_t(uint32_t(pn)) << 32 | uint64_t(s.name) << 8 | uint64_t(s.category);
        auto [it, fresh] = child.emplace(key, int32_t(ic.nodes.size()));
        if (fresh) {
            IcicleNode n;
            n.name = s.name;
            n.category = s.category;
            n.parent = pn;
            n.depth = ic.nodes[size_t(pn)].depth + 1;
            ic.nodes.push_back(n);
            ic.nodes[size_t(pn)].children.push_back(it->second);
        }
        IcicleNode& n = ic.nodes[size_t(it->second)];
        n.total_ns += d;
        n.self_ns += d;
        ++n.count;
        node_of[i] = it->second;
    }
    for (size_t i = 1; i < ic.nodes.size(); ++i) {
        ic.nodes[size_t(ic.nodes[i].parent)].self_ns -= ic.nodes[i].total_ns;
        if (ic.nodes[i].parent == 0) ic.nodes[0].total_ns += ic.nodes[i].total_ns;
    }
    ic.nodes[0].self_ns = 0;
    return ic;
}

void sort_children(Icicle& ic) {
    for (IcicleNode& n : ic.nodes)
        std::stable_sort(n.children.begin(), n.children.end(),
                         [&](int32_t a, int32_t b) { return ic.nodes[size_t(a)].total_ns > ic.nodes[size_t(b)].total_ns; });
}
}  // namespace

Icicle build_icicle(const TraceModel& m, int64_t t0, int64_t t1) {
    std::vector<int32_t> node_of;
    Icicle ic = host_icicle(m, node_of, t0, t1);
    sort_children(ic);
    return ic;
}

Icicle build_gpu_icicle(const TraceModel& m, int64_t t0, int64_t t1) {
    Icicle out;
    out.nodes.push_back({});
    out.nodes[0].name = UINT32_MAX;
    bool any = false;
    for (const TraceLane& lane : m.lanes) any |= is_gpu_lane(lane.thread);
    if (!any) return out;
    // The launching paths come from the whole run: a span that launched before the range still
    // names the path of the work it launched inside it.
    std::vector<int32_t> node_of;
    const Icicle host = host_icicle(m, node_of, INT64_MIN, INT64_MAX);
    // Host node -> its copy in `out`, made (with its ancestors) on the first record under it.
    std::vector<int32_t> copy(host.nodes.size(), -1);
    copy[0] = 0;
    auto ensure = [&](auto&& self, int32_t hn) -> int32_t {
        if (copy[size_t(hn)] >= 0) return copy[size_t(hn)];
        const int32_t p = self(self, host.nodes[size_t(hn)].parent);
        IcicleNode n;
        n.name = host.nodes[size_t(hn)].name;
        n.category = host.nodes[size_t(hn)].category;
        n.parent = p;
        n.depth = out.nodes[size_t(p)].depth + 1;
        copy[size_t(hn)] = int32_t(out.nodes.size());
        out.nodes[size_t(p)].children.push_back(int32_t(out.nodes.size()));
        out.nodes.push_back(std::move(n));
        return copy[size_t(hn)];
    };
    std::unordered_map<uint64_t, int32_t> leaf;  // (node, name, category) -> leaf
    for (uint32_t i = 0; i < m.spans.size(); ++i) {
        const TraceSpan& s = m.spans[i];
        if (!is_gpu_lane(s.thread)) continue;
        const int64_t d = clipped(s, t0, t1);
        if (d < 0) continue;
        const uint32_t launch = find_launcher(m, i);
        const int32_t at = launch == kNoParent ? 0 : ensure(ensure, node_of[launch]);
        const uint64_t key = uint64_t(uint32_t(at)) << 32 | uint64_t(s.name) << 8 | uint64_t(s.category);
        auto [it, fresh] = leaf.emplace(key, int32_t(out.nodes.size()));
        if (fresh) {
            IcicleNode n;
            n.name = s.name;
            n.category = s.category;
            n.parent = at;
            n.depth = out.nodes[size_t(at)].depth + 1;
            n.gpu = true;
            out.nodes[size_t(at)].children.push_back(it->second);
            out.nodes.push_back(std::move(n));
        }
        IcicleNode& n = out.nodes[size_t(it->second)];
        n.total_ns += d;
        n.self_ns += d;
        ++n.count;
    }
    // A parent is made before its children: add totals and counts upwards from the last node.
    for (size_t i = out.nodes.size(); i-- > 1;) {
        IcicleNode& p = out.nodes[size_t(out.nodes[i].parent)];
        p.total_ns += out.nodes[i].total_ns;
        p.count += out.nodes[i].count;
    }
    sort_children(out);
    return out;
}

void layout_icicle(Icicle& ic, double width) {
    if (ic.nodes.empty()) return;
    const double scale = ic.nodes[0].total_ns > 0 ? width / double(ic.nodes[0].total_ns) : 0.0;
    ic.nodes[0].x0 = 0;
    ic.nodes[0].x1 = width;
    // Parents come before their children in node order (created in preorder).
    for (IcicleNode& n : ic.nodes) {
        double at = n.x0;
        for (int32_t c : n.children) {
            IcicleNode& k = ic.nodes[size_t(c)];
            k.x0 = at;
            k.x1 = at + double(k.total_ns) * scale;
            at = k.x1;
        }
    }
}

SpanSearch search_spans(const TraceModel& m, const std::string& needle, int bins) {
    SpanSearch out;
    out.needle = needle;
    auto lower = [](std::string s) {
        for (char& c : s) c = char(std::tolower((unsigned char)c));
        return s;
    };
    const std::string want = lower(needle);
    out.name_matches.resize(m.names.size());
    for (size_t i = 0; i < m.names.size(); ++i) out.name_matches[i] = !want.empty() && lower(m.names[i]).find(want) != std::string::npos;
    std::vector<int64_t> durations;
    for (uint32_t i = 0; i < m.spans.size(); ++i)
        if (out.name_matches[m.spans[i].name]) {
            durations.push_back(m.spans[i].end_ns - m.spans[i].start_ns);
            out.matches.push_back(i);
        }
    out.count = int64_t(durations.size());
    if (durations.empty() || bins < 1) return out;
    out.min_ns = *std::min_element(durations.begin(), durations.end());
    out.max_ns = *std::max_element(durations.begin(), durations.end());
    out.total_ns = std::accumulate(durations.begin(), durations.end(), int64_t(0));
    // Nearest rank: the smallest duration with at least q of the matches at or below it.
    auto rank = [&](double q) {
        const size_t k = size_t(std::max<int64_t>(1, int64_t(std::ceil(q * double(durations.size()) - 1e-9)))) - 1;
        std::nth_element(durations.begin(), durations.begin() + long(k), durations.end());
        return durations[k];
    };
    out.median_ns = rank(0.5);
    out.p95_ns = rank(0.95);
    // Log-spaced edges from max(min, 1 ns) to max: durations of ops span decades.
    out.log_lo = std::log(double(std::max<int64_t>(out.min_ns, 1)));
    out.log_hi = std::log(double(std::max<int64_t>(out.max_ns, 1)) * 1.000001 + 1e-9);
    out.bins.assign(size_t(bins), 0);
    for (int b = 0; b <= bins; ++b) out.bin_edges.push_back(std::exp(out.log_lo + (out.log_hi - out.log_lo) * b / bins));
    for (int64_t d : durations) out.bins[size_t(search_bin(out, d))]++;
    std::stable_sort(out.matches.begin(), out.matches.end(), [&](uint32_t a, uint32_t b) {
        return m.spans[a].end_ns - m.spans[a].start_ns > m.spans[b].end_ns - m.spans[b].start_ns;
    });
    if (out.matches.size() > 1000) out.matches.resize(1000);
    return out;
}

int search_bin(const SpanSearch& f, int64_t duration_ns) {
    const int bins = int(f.bins.size());
    if (bins == 0) return -1;
    const double x = std::log(double(std::max<int64_t>(duration_ns, 1)));
    const int b = f.log_hi > f.log_lo ? int((x - f.log_lo) / (f.log_hi - f.log_lo) * bins) : 0;
    return std::clamp(b, 0, bins - 1);
}

std::vector<uint32_t> search_bin_spans(const TraceModel& m, const SpanSearch& f, int bin, size_t limit) {
    std::vector<uint32_t> out;
    if (bin < 0 || size_t(bin) >= f.bins.size() || f.name_matches.size() != m.names.size()) return out;
    for (uint32_t i = 0; i < m.spans.size(); ++i)
        if (f.name_matches[m.spans[i].name] && search_bin(f, m.spans[i].end_ns - m.spans[i].start_ns) == bin) out.push_back(i);
    std::stable_sort(out.begin(), out.end(), [&](uint32_t a, uint32_t b) {
        return m.spans[a].end_ns - m.spans[a].start_ns > m.spans[b].end_ns - m.spans[b].start_ns;
    });
    if (out.size() > limit) out.resize(limit);
    return out;
}

}  // namespace kv::views
