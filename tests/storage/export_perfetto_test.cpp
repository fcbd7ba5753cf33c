// `--format perfetto`: the JSON's nesting and flows checked against the span and GPU rows. On
// random span trees (every span named uniquely) on three threads, some spans launching GPU work
// through CUPTI correlation ids: in file order each host track must nest exactly as the
// brute-force innermost-containing-span parent search says, and every flow must join the
// launching span (its thread and start) to a GPU slice whose CUPTI record names that span.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <vector>

#include "engine/telemetry/gpu_records.h"
#include "engine/telemetry/trace.h"
#include "storage/exports.h"
#include "storage/session.h"
#include "storage/session_reader.h"
#include "storage/session_writer.h"
#include "storage_test_util.h"

namespace kv {
namespace {

using trace::SpanCategory;

struct Made {
    std::string name;
    uint32_t thread;
    uint64_t b, e, correlation;
};

struct Builder {
    std::mt19937_64 rng;
    std::vector<Made> spans;
    uint64_t next_correlation = 100;
    // Children first (as scopes close), disjoint, sometimes touching or equal to the parent.
    void tree(uint32_t thread, uint64_t b, uint64_t e, int depth) {
        std::uniform_int_distribution<int> kids(0, depth > 3 ? 0 : 3), coin(0, 9);
        uint64_t at = b;
        for (int k = 0, n = kids(rng); k < n && at < e; ++k) {
            std::uniform_int_distribution<uint64_t> len(1, std::max<uint64_t>(1, (e - at) / 2));
            uint64_t cb = coin(rng) < 3 ? at : at + len(rng) / 2, ce = std::min(e, cb + len(rng));
            if (coin(rng) == 9 && k == 0) cb = b, ce = e;
            if (cb >= e) break;
            tree(thread, cb, ce, depth + 1);
            at = ce;
        }
        const uint64_t corr = coin(rng) < 4 ? next_correlation++ : 0;
        spans.push_back({"span " + std::to_string(spans.size()), thread, b, e, corr});
    }
};

void push_span(trace::Recorder& rec, const Made& m) {
    trace::Event ev;
    ev.span = trace::SpanRecord{};
    ev.span.type = trace::EventType::SPAN;
    ev.span.category = SpanCategory::OTHER;
    ev.span.device = -1;
    ev.span.name_id = trace::intern(m.name.c_str());
    ev.span.start_ns = m.b;
    ev.span.end_ns = m.e;
    ev.span.layer = ev.span.chunk = ev.span.cell_row = ev.span.cell_col = -1;
    ev.span.thread = m.thread;
    ev.span.correlation_id = m.correlation;
    rec.push(ev);
}

// One CUPTI buffer: one kernel per correlated span (two for every third), plus a kernel whose
// launch is unknown (no flow), on two streams.
void push_gpu(trace::Recorder& rec, const std::vector<Made>& spans, std::map<uint32_t, uint64_t>& kernel_to_span) {
    auto* p = new trace::GpuBatchPayload();
    uint32_t cupti = 1;
    uint64_t t = 50'000'000;
    for (const Made& m : spans) {
        if (!m.correlation) continue;
        for (int k = 0; k < (m.correlation % 3 == 0 ? 2 : 1); ++k) {
            GpuKernel g{};
            g.start = t;
            g.end = t + 700;
            t += 1000;
            g.stream_id = 7 + (cupti % 2) * 6;
            g.correlation_id = cupti;
            g.short_name_id = g.demangled_name_id = trace::intern("kernel");
            p->kernels.push_back(g);
            p->correlations.push_back({m.correlation, cupti, 3});
            kernel_to_span[cupti++] = m.correlation;
        }
    }
    GpuKernel orphan{};
    orphan.start = t;
    orphan.end = t + 10;
    orphan.stream_id = 7;
    orphan.correlation_id = 99999;
    orphan.short_name_id = orphan.demangled_name_id = trace::intern("orphan kernel");
    p->kernels.push_back(orphan);
    trace::Event ev;
    ev.gpu = trace::GpuBatchRecord{};
    ev.gpu.type = trace::EventType::GPU_BATCH;
    ev.gpu.payload = p;
    rec.push(ev);
}

// Innermost span on the same thread containing `c` (of identical intervals, the later-written
// one is outer); "" for a root.
std::string brute_force_parent(const std::vector<storage::SpanRow>& s, size_t c) {
    long best = -1;
    for (size_t p = 0; p < s.size(); ++p) {
        if (p == c || s[p].thread != s[c].thread || s[p].start_ns > s[c].start_ns || s[p].end_ns < s[c].end_ns) continue;
        if (s[p].start_ns == s[c].start_ns && s[p].end_ns == s[c].end_ns && s[p].id < s[c].id) continue;
        const auto dur = [&](size_t i) { return s[i].end_ns - s[i].start_ns; };
        if (best < 0 || dur(p) < dur(size_t(best)) || (dur(p) == dur(size_t(best)) && s[p].id < s[size_t(best)].id)) best = long(p);
    }
    return best < 0 ? "" : s[size_t(best)].name;
}

int64_t ns_of(const nlohmann::json& v) {
    return llround(v.get<double>() * 1000.0);
}

TEST(ExportPerfetto, NestingAndFlowsMatchTheRows) {
    for (uint64_t seed = 1; seed <= 4; ++seed) {
        SCOPED_TRACE("seed " + std::to_string(seed));
        test::ScratchDir dir;
        const std::string path = dir.file("p.kvlab");
        auto session = storage::Session::create(path);
        const int64_t run = session->create_run("perfetto", R"({"mode":"eval_long"})");
        session->start_run(run);
        Builder b;
        b.rng.seed(seed);
        for (uint32_t th = 0; th < 3; ++th)
            for (int r = 0; r < 3; ++r) b.tree(th, 1'000'000 * (r + 1), 1'000'000 * (r + 1) + 800'000, 0);
        std::map<uint32_t, uint64_t> kernel_to_span;
        trace::Recorder rec;
        {
            storage::SessionWriter writer(path);
            writer.attach(run, rec);
            for (const Made& m : b.spans) push_span(rec, m);
            push_gpu(rec, b.spans, kernel_to_span);
            writer.detach(run);
        }
        session->finish_run(run, storage::RunStatus::DONE);

        storage::SessionReader reader(path);
        const auto rows = reader.spans(run);
        ASSERT_EQ(rows.size(), b.spans.size());
        const auto gpu = reader.gpu_activity(run);
        const int64_t t0 = reader.run(run).t0_ns;
        std::stringstream out;
        storage::export_perfetto_trace(reader, run, true, false, false, out);
        const auto j = nlohmann::json::parse(out.str());

        // Host slices: per track in file order, a stack gives each slice's parent.
        std::map<std::string, std::string> parent_in_json;
        std::map<std::string, std::pair<int64_t, int64_t>> track_and_start;  // span name -> (tid, start)
        std::map<int64_t, std::vector<std::tuple<int64_t, int64_t, std::string>>> stacks;
        std::map<std::pair<int64_t, int64_t>, nlohmann::json> gpu_slices;  // (tid, start) -> event
        std::set<int64_t> host_tids;
        std::map<int64_t, std::vector<nlohmann::json>> flows;
        for (const auto& e : j["traceEvents"]) {
            if (e["ph"] == "s" || e["ph"] == "f") flows[e["id"].get<int64_t>()].push_back(e);
            if (e["ph"] != "X") continue;
            const int64_t tid = e["tid"], ts = ns_of(e["ts"]), end = ts + ns_of(e["dur"]);
            if (e["pid"] != 1) {
                gpu_slices[{tid, ts}] = e;
                continue;
            }
            host_tids.insert(tid);
            auto& st = stacks[tid];
            while (!st.empty() && std::get<1>(st.back()) < end) st.pop_back();
            ASSERT_TRUE(st.empty() || std::get<0>(st.back()) <= ts) << "slice starts before its parent";
            const std::string name = e["name"];
            parent_in_json[name] = st.empty() ? "" : std::get<2>(st.back());
            track_and_start[name] = {tid, ts};
            st.emplace_back(ts, end, name);
        }
        EXPECT_EQ(host_tids.size(), 3u);
        ASSERT_EQ(parent_in_json.size(), rows.size());
        for (size_t i = 0; i < rows.size(); ++i) {
            EXPECT_EQ(parent_in_json.at(rows[i].name), brute_force_parent(rows, i)) << rows[i].name;
            EXPECT_EQ(track_and_start.at(rows[i].name).second, rows[i].start_ns - t0) << rows[i].name;
        }
        // Same thread <=> same track.
        for (const auto& x : rows)
            for (const auto& y : rows)
                EXPECT_EQ(x.thread == y.thread, track_and_start.at(x.name).first == track_and_start.at(y.name).first);
        EXPECT_EQ(gpu_slices.size(), gpu.size());

        // Flows: one per correlated GPU record, from its launching span to its slice.
        std::map<int64_t, const storage::SpanRow*> by_correlation;
        for (const auto& r : rows)
            if (r.correlation_id) by_correlation[r.correlation_id] = &r;
        size_t correlated = 0;
        for (const auto& g : gpu) correlated += by_correlation.count(g.external_id);
        EXPECT_EQ(correlated, kernel_to_span.size());
        ASSERT_EQ(flows.size(), correlated);
        for (const auto& [id, pair] : flows) {
            ASSERT_EQ(pair.size(), 2u) << "flow " << id;
            const auto& s = pair[0]["ph"] == "s" ? pair[0] : pair[1];
            const auto& f = pair[0]["ph"] == "s" ? pair[1] : pair[0];
            EXPECT_EQ(f["bp"], "e");
            const auto slice = gpu_slices.find({f["tid"].get<int64_t>(), ns_of(f["ts"])});
            ASSERT_NE(slice, gpu_slices.end()) << "flow " << id << " ends on no GPU slice";
            EXPECT_EQ(slice->second["pid"], f["pid"]);
            const uint32_t cupti = slice->second["args"]["correlation_id"];
            const auto* launcher = by_correlation.at(int64_t(kernel_to_span.at(cupti)));
            EXPECT_EQ(s["pid"], 1);
            EXPECT_EQ(s["tid"].get<int64_t>(), track_and_start.at(launcher->name).first) << launcher->name;
            EXPECT_EQ(ns_of(s["ts"]), launcher->start_ns - t0) << launcher->name;
        }
    }
}

TEST(ExportPerfetto, FormatNameParsesAndTokensAreRefused) {
    EXPECT_EQ(storage::export_format_from_name("perfetto"), storage::ExportFormat::PERFETTO);
    try {
        storage::export_format_from_name("perfeto");
        ADD_FAILURE() << "a misspelt format was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("perfetto"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace kv
