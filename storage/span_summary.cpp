// Span summaries (see span_summary.h): one stack pass per thread in preorder, then grouping.
#include "span_summary.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <string_view>
#include <tuple>

namespace kv::storage {

std::vector<int64_t> span_self_times(const std::vector<SpanRow>& spans) {
    std::vector<int64_t> self(spans.size());
    std::vector<size_t> order(spans.size());
    std::iota(order.begin(), order.end(), size_t(0));
    // Thread first, then preorder: each thread's spans are one contiguous stretch.
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        const SpanRow &x = spans[a], &y = spans[b];
        return std::make_tuple(x.thread, x.start_ns, -x.end_ns, -x.id) <
               std::make_tuple(y.thread, y.start_ns, -y.end_ns, -y.id);
    });
    std::vector<size_t> stack;  // the ancestors of the span being placed
    for (size_t k = 0; k < order.size(); ++k) {
        const SpanRow& s = spans[order[k]];
        if (k > 0 && spans[order[k - 1]].thread != s.thread) stack.clear();
        while (!stack.empty() && spans[stack.back()].end_ns < s.end_ns) stack.pop_back();
        const int64_t d = s.end_ns - s.start_ns;
        self[order[k]] += d;
        if (!stack.empty()) self[stack.back()] -= d;
        stack.push_back(order[k]);
    }
    return self;
}

namespace {
void add_to(SpanStats& g, int64_t d, int64_t self) {
    if (g.count == 0) g.min_ns = g.max_ns = d;
    ++g.count;
    g.total_ns += d;
    g.self_ns += self;
    g.min_ns = std::min(g.min_ns, d);
    g.max_ns = std::max(g.max_ns, d);
}

// Groups spans by layer (tagged spans only); layer ascending.
std::vector<SpanStats> layer_stats(const std::vector<SpanRow>& spans, const std::vector<int64_t>& self) {
    std::map<int32_t, SpanStats> by_layer;
    for (size_t i = 0; i < spans.size(); ++i) {
        if (spans[i].layer < 0) continue;
        SpanStats& g = by_layer[spans[i].layer];
        g.layer = spans[i].layer;
        add_to(g, spans[i].end_ns - spans[i].start_ns, self[i]);
    }
    std::vector<SpanStats> out;
    for (auto& [layer, g] : by_layer) out.push_back(std::move(g));
    return out;
}

// Groups spans by (name, category) with their self times; self time descending.
std::vector<SpanStats> group_stats(const std::vector<SpanRow>& spans, const std::vector<int64_t>& self) {
    std::map<std::pair<std::string, int>, SpanStats> by_key;
    for (size_t i = 0; i < spans.size(); ++i) {
        const SpanRow& s = spans[i];
        SpanStats& g = by_key[{s.name, int(s.category)}];
        if (g.count == 0) {
            g.name = s.name;
            g.category = s.category;
        }
        add_to(g, s.end_ns - s.start_ns, self[i]);
    }
    std::vector<SpanStats> out;
    for (auto& [key, g] : by_key) out.push_back(std::move(g));
    std::stable_sort(out.begin(), out.end(), [](const SpanStats& a, const SpanStats& b) { return a.self_ns > b.self_ns; });
    return out;
}
}  // namespace

SpanSummary span_summary(const std::vector<SpanRow>& all, const TimeWindow& w) {
    std::vector<SpanRow> spans;
    spans.reserve(all.size());
    for (const SpanRow& s : all) {
        // Clipped to [t0, t1); a zero-length span counts where it lies.
        SpanRow c = s;
        c.start_ns = std::max(s.start_ns, w.t0_ns);
        c.end_ns = std::min(s.end_ns, w.t1_ns);
        const bool inside = c.start_ns < c.end_ns || (s.start_ns == s.end_ns && s.start_ns >= w.t0_ns && s.start_ns < w.t1_ns);
        if (inside) spans.push_back(std::move(c));
    }
    SpanSummary out;
    const std::vector<int64_t> self = span_self_times(spans);
    out.spans = group_stats(spans, self);
    out.layers = layer_stats(spans, self);
    std::map<int, SpanStats> by_category;
    for (const SpanStats& g : out.spans) {
        SpanStats& c = by_category[int(g.category)];
        if (c.count == 0) {
            c.category = g.category;
            c.min_ns = g.min_ns;
            c.max_ns = g.max_ns;
        }
        c.count += g.count;
        c.total_ns += g.total_ns;
        c.self_ns += g.self_ns;
        c.min_ns = std::min(c.min_ns, g.min_ns);
        c.max_ns = std::max(c.max_ns, g.max_ns);
    }
    for (auto& [k, c] : by_category) out.categories.push_back(c);
    // Ties by name, as the span-categories query orders them.
    std::sort(out.categories.begin(), out.categories.end(), [](const SpanStats& a, const SpanStats& b) {
        return a.self_ns != b.self_ns ? a.self_ns > b.self_ns
                                      : std::string_view(trace::span_category_name(a.category)) <
                                            std::string_view(trace::span_category_name(b.category));
    });
    std::vector<SpanRow> run_spans;
    for (const SpanRow& s : spans)
        if (s.category == trace::SpanCategory::RUN) run_spans.push_back(s);
    out.phases = group_stats(run_spans, span_self_times(run_spans));
    for (const SpanStats& p : out.phases)
        if (p.name == "run") {
            out.run_ns += p.total_ns;
            out.unattributed_ns += p.self_ns;
        }
    return out;
}

SpanSummary span_summary(SessionReader& session, int64_t run, const TimeWindow& window) {
    session.run(run);  // an unknown run is an error, not an empty summary
    return span_summary(session.spans(run, window, 0, size_t(-1)), window);
}

}  // namespace kv::storage
