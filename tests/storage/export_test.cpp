// Exports: CSV parses back to exactly the stored rows; the Chrome trace is JSON whose memory
// counters add up to the allocator's device total at every event and whose spans are complete
// events on thread tracks; the PyTorch snapshot loads with Python's pickle and its device trace
// replays to the allocator's totals. Plus the export guard rails (bad combinations, never
// overwriting a session).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "engine/core/tensor.h"
#include "engine/telemetry/alloc_sink.h"
#include "engine/telemetry/trace.h"
#include "storage/exports.h"
#include "storage/pickle_writer.h"
#include "storage/session.h"
#include "storage/session_reader.h"
#include "storage/session_writer.h"
#include "storage_test_util.h"

namespace kv {
namespace {

using storage::ExportFormat;
using storage::ExportWhat;
using storage::SessionReader;
using trace::SpanCategory;

// A run with nested spans on two threads, KV/activation/checkpoint allocations stamped with
// layer/chunk, and metrics; `final_total` receives the allocator's total at the end.
struct ExportFixture {
    test::ScratchDir dir;
    std::string path = dir.file("e.kvlab");
    int64_t run = 0;
    int64_t final_total = 0;
    int64_t peak_total = 0;
    ExportFixture() {
        auto s = storage::Session::create(path);
        run = s->create_run("h2o, \"quoted\" run", R"({"kv_cache":{"name":"h2o-q8"}})");
        s->start_run(run);
        trace::Recorder rec;
        MemoryTracker tracker;
        std::vector<Tensor> kept;
        {
            storage::SessionWriter w(path);
            w.attach(run, rec);
            {
                trace::RecorderAllocSink sink(rec, tracker);
                MemoryTrackerScope ms(tracker);
                trace::RecorderScope scope(rec);
                static const trace::Name kChunk("chunk"), kLayer("layer"), kAttn("attention, with comma");
                for (int chunk = 0; chunk < 4; ++chunk) {
                    auto c = trace::span(SpanCategory::CHUNK, kChunk, {.chunk = chunk});
                    for (int layer = 0; layer < 3; ++layer) {
                        auto l = trace::span(SpanCategory::LAYER, kLayer, {.layer = layer, .chunk = chunk});
                        kept.push_back(Tensor::empty(
                            {128}, DType::F32, {Device{}, MemCategory::KV_CACHE, str("layer ", layer, " K buffer")}));
                        {
                            auto a = trace::span(SpanCategory::ATTENTION, kAttn, {.layer = layer, .chunk = chunk});
                            Tensor act = Tensor::empty({1000 + 10 * layer}, DType::F32,
                                                       {Device{}, MemCategory::ACTIVATIONS, "attention scores"});
                        }
                        if (layer == 1)
                            kept.push_back(
                                Tensor::empty({32}, DType::F64, {Device{}, MemCategory::KV_CHECKPOINT, "ckpt"}));
                    }
                    trace::metric("loss", chunk, 2.0 / (chunk + 1));
                }
                std::thread other([&] {
                    trace::RecorderScope s2(rec);
                    static const trace::Name kIo("load batch");
                    auto io = trace::span(SpanCategory::IO, kIo);
                });
                other.join();
                kept.erase(kept.begin(), kept.begin() + 2);  // two frees at the end
                final_total = tracker.current_total(Device{});
                peak_total = tracker.peak_total(Device{});
            }
            w.detach(run);
        }
        s->finish_run(run, storage::RunStatus::DONE);
    }
};

// Minimal RFC 4180 parser (quoted fields, doubled quotes).
std::vector<std::vector<std::string>> parse_csv(const std::string& text) {
    std::vector<std::vector<std::string>> rows;
    std::vector<std::string> row;
    std::string field;
    bool quoted = false;
    for (size_t i = 0; i < text.size(); ++i) {
        char c = text[i];
        if (quoted) {
            if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') {
                field += '"';
                ++i;
            } else if (c == '"') {
                quoted = false;
            } else {
                field += c;
            }
        } else if (c == '"') {
            quoted = true;
        } else if (c == ',') {
            row.push_back(field);
            field.clear();
        } else if (c == '\n') {
            row.push_back(field);
            field.clear();
            rows.push_back(row);
            row.clear();
        } else {
            field += c;
        }
    }
    return rows;
}

TEST(Export, CsvRoundTripsEveryStoredRow) {
    ExportFixture f;
    SessionReader r(f.path);
    std::ostringstream mem, spans, metrics;
    EXPECT_EQ(storage::export_memory_csv(r, f.run, mem), uint64_t(r.count_rows("memory_events", f.run)));
    storage::export_spans_csv(r, f.run, spans);
    storage::export_metrics_csv(r, f.run, metrics);

    auto mrows = parse_csv(mem.str());
    ASSERT_GT(mrows.size(), 1u);
    const auto& h = mrows[0];
    auto col = [&](const std::vector<std::string>& header, const std::string& name) {
        auto it = std::find(header.begin(), header.end(), name);
        EXPECT_NE(it, header.end()) << name;
        return size_t(it - header.begin());
    };
    std::map<int64_t, storage::MemoryEventRow> by_id;
    for (auto& e : r.memory_events(f.run)) by_id[e.id] = e;
    ASSERT_EQ(mrows.size() - 1, by_id.size());
    for (size_t i = 1; i < mrows.size(); ++i) {
        const auto& row = mrows[i];
        ASSERT_EQ(row.size(), h.size()) << "row " << i;
        const auto& e = by_id.at(std::stoll(row[col(h, "id")]));
        EXPECT_EQ(std::stoll(row[col(h, "t_ns")]), e.t_ns);
        EXPECT_EQ(std::stoll(row[col(h, "bytes")]), e.bytes);
        EXPECT_EQ(row[col(h, "category")], mem_category_name(e.category));
        EXPECT_EQ(row[col(h, "device")], "cpu");
        EXPECT_EQ(std::stoll(row[col(h, "category_total")]), e.category_total);
        EXPECT_EQ(std::stoll(row[col(h, "device_total")]), e.device_total);
        EXPECT_EQ(row[col(h, "label")], e.label);
        EXPECT_EQ(std::stoull(row[col(h, "address")]), e.address);
        EXPECT_EQ(std::stoi(row[col(h, "layer")]), e.layer);
    }

    auto srows = parse_csv(spans.str());
    auto all_spans = r.spans(f.run);
    ASSERT_EQ(srows.size() - 1, all_spans.size());
    const auto& sh = srows[0];
    for (size_t i = 1; i < srows.size(); ++i) {
        const auto& s = all_spans[i - 1];  // both ordered by start time, then id
        EXPECT_EQ(std::stoll(srows[i][col(sh, "id")]), s.id);
        EXPECT_EQ(srows[i][col(sh, "name")], s.name);
        EXPECT_EQ(std::stoll(srows[i][col(sh, "dur_ns")]), s.end_ns - s.start_ns);
        EXPECT_EQ(srows[i][col(sh, "category")], trace::span_category_name(s.category));
    }
    EXPECT_NE(spans.str().find("\"attention, with comma\""), std::string::npos);

    auto xrows = parse_csv(metrics.str());
    auto all_metrics = r.metrics(f.run);
    ASSERT_EQ(xrows.size() - 1, all_metrics.size());
    for (size_t i = 1; i < xrows.size(); ++i) EXPECT_EQ(std::stod(xrows[i][3]), all_metrics[i - 1].value);  // exact
}

TEST(Export, ChromeTraceIsJsonAndCountersSumToTheAllocatorTotals) {
    ExportFixture f;
    SessionReader r(f.path);
    const std::string out = f.dir.file("trace.json");
    storage::ExportResult res = storage::export_run(r, f.run, ExportWhat::ALL, ExportFormat::CHROME_TRACE, out);
    EXPECT_GT(res.bytes, 0u);
    nlohmann::json j = nlohmann::json::parse(test::read_file_bytes(out));  // throws if not JSON
    ASSERT_TRUE(j.contains("traceEvents"));
    const auto& ev = j["traceEvents"];
    EXPECT_EQ(ev.size(), res.records);

    // Memory counters, in file order, against the stored events in time order.
    std::vector<storage::MemoryEventRow> mem;
    r.for_each_memory_event(f.run, {}, [&](const storage::MemoryEventRow& e) { mem.push_back(e); });
    size_t k = 0;
    int64_t last_sum = -1;
    for (const auto& e : ev) {
        if (e["ph"] != "C" || e["name"] != "memory cpu") continue;
        ASSERT_LT(k, mem.size());
        int64_t sum = 0;
        for (auto& [cat, v] : e["args"].items()) sum += v.get<int64_t>();
        EXPECT_EQ(sum, mem[k].device_total) << "counter " << k;
        EXPECT_EQ(e["args"][mem_category_name(mem[k].category)].get<int64_t>(), mem[k].category_total);
        EXPECT_EQ(e["args"].size(), kNumMemCategories);
        last_sum = sum;
        ++k;
    }
    EXPECT_EQ(k, mem.size());
    EXPECT_EQ(last_sum, f.final_total);

    // Spans: complete events with µs times, on named thread tracks of one process.
    size_t x = 0, named_threads = 0, metric_counters = 0;
    std::set<int> tids;
    for (const auto& e : ev) {
        if (e["ph"] == "X" && e["cat"] != "cell") {
            ++x;
            EXPECT_GE(e["dur"].get<double>(), 0.0);
            EXPECT_TRUE(e["ts"].is_number());
            tids.insert(e["tid"].get<int>());
        }
        if (e["ph"] == "M" && e["name"] == "thread_name") ++named_threads;
        if (e["ph"] == "C" && e["name"] == "metric loss") ++metric_counters;
    }
    EXPECT_EQ(x, size_t(r.count_rows("spans", f.run)));
    EXPECT_EQ(tids.size(), 2u);  // main thread and the I/O thread
    EXPECT_GE(named_threads, 2u);
    EXPECT_EQ(metric_counters, 4u);
    // Nesting on one track: an attention span lies inside its layer span.
    auto arg = [](const nlohmann::json& e, const char* k) {
        return e.contains("args") && e["args"].contains(k) ? e["args"][k].get<int>() : -1;
    };
    bool found = false;
    for (const auto& e : ev)
        if (e["ph"] == "X" && e["name"] == "attention, with comma" && arg(e, "layer") == 2 && arg(e, "chunk") == 3) {
            for (const auto& p : ev)
                if (p["ph"] == "X" && p["name"] == "layer" && arg(p, "layer") == 2 && arg(p, "chunk") == 3) {
                    EXPECT_LE(p["ts"].get<double>(), e["ts"].get<double>());
                    EXPECT_GE(p["ts"].get<double>() + p["dur"].get<double>() + 1e-3,
                              e["ts"].get<double>() + e["dur"].get<double>());
                    found = true;
                }
        }
    EXPECT_TRUE(found);
}

TEST(Export, TorchSnapshotLoadsWithPythonPickleAndReplaysToTheTotals) {
    ExportFixture f;
    SessionReader r(f.path);
    const std::string out = f.dir.file("snapshot.pickle");
    storage::export_run(r, f.run, ExportWhat::MEMORY, ExportFormat::TORCH_SNAPSHOT, out);
    const std::string bytes = test::read_file_bytes(out);
    ASSERT_GE(bytes.size(), 3u);
    EXPECT_EQ(uint8_t(bytes[0]), 0x80);
    EXPECT_EQ(uint8_t(bytes[1]), 2);
    EXPECT_EQ(bytes.back(), '.');
    if (access("/usr/bin/python3", X_OK) != 0) GTEST_SKIP() << "/usr/bin/python3 is missing; cannot check pickle.load";
    const std::string script = f.dir.file("check.py");
    test::write_file_bytes(script, R"PY(
import pickle, sys
d = pickle.load(open(sys.argv[1], "rb"))
assert set(["segments", "device_traces"]) <= set(d.keys()), d.keys()
assert len(d["device_traces"]) == 1, len(d["device_traces"])
trace = d["device_traces"][0]
live, cur, peak, allocs = {}, 0, 0, 0
for e in trace:
    assert set(["action", "addr", "size", "stream", "time_us", "frames"]) <= set(e.keys()), e
    if e["action"] == "alloc":
        assert e["addr"] not in live, "overlapping block"
        live[e["addr"]] = e["size"]; cur += e["size"]; allocs += 1
        f = e["frames"][0]
        assert set(["name", "filename", "line"]) <= set(f.keys())
    elif e["action"] == "free_completed":
        cur -= live.pop(e["addr"])
    peak = max(peak, cur)
seg_total = sum(s["total_size"] for s in d["segments"])
blocks = [b for s in d["segments"] for b in s["blocks"]]
assert all(b["state"] == "active_allocated" for b in blocks)
assert all(s["device"] == 0 and s["segment_pool_id"] == (0, 0) for s in d["segments"])
kv = [e for e in trace if e["action"] == "alloc" and "kv_cache" in e["frames"][0]["filename"]]
assert kv and "policy=h2o-q8" in kv[0]["frames"][0]["filename"] and "layer=0" in kv[0]["frames"][0]["filename"], kv[:1]
assert kv[0]["frames"][0]["name"] == "layer 0 K buffer", kv[0]["frames"][0]
print(cur, peak, seg_total, allocs, d["kvlab_devices"][0])
)PY");
    const std::string cmd = "/usr/bin/python3 " + script + " " + out + " 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string output;
    char buf[4096];
    while (fgets(buf, sizeof buf, p)) output += buf;
    int rc = pclose(p);
    ASSERT_EQ(rc, 0) << output;
    long long cur = 0, peak = 0, seg = 0, allocs = 0;
    char dev[16] = {0};
    ASSERT_EQ(std::sscanf(output.c_str(), "%lld %lld %lld %lld %15s", &cur, &peak, &seg, &allocs, dev), 5) << output;
    EXPECT_EQ(cur, f.final_total) << "replayed trace ends at the allocator's total";
    EXPECT_EQ(seg, f.final_total) << "segments hold exactly the live blocks";
    EXPECT_EQ(peak, f.peak_total);
    EXPECT_EQ(std::string(dev), "cpu");
    int64_t stored_allocs = 0;
    for (const auto& e : r.memory_events(f.run)) stored_allocs += e.bytes > 0;
    EXPECT_EQ(allocs, stored_allocs);
}

TEST(Export, PickleWriterUsesOnlyTheAllowedOpcodes) {
    std::ostringstream os;
    storage::PickleWriter p(os);
    p.begin_dict();
    p.key("small");
    p.integer(7);
    p.key("medium");
    p.integer(40000);
    p.key("negative");
    p.integer(-5);
    p.key("big");
    p.integer(int64_t(1) << 40);
    p.key("float");
    p.real(0.25);
    p.key("long text");
    p.str(std::string(300, 'x'));
    p.key("flags");
    p.begin_list();
    p.boolean(true);
    p.boolean(false);
    p.none();
    p.end_list();
    p.end_dict();
    p.finish();
    const std::string b = os.str();
    // Byte-exact prefix: PROTO 2, EMPTY_DICT, MARK, SHORT_BINUNICODE 5 "small", BININT1 7.
    const std::string expect_prefix = std::string("\x80\x02}(\x8c\x05small", 11) + "K\x07";
    EXPECT_EQ(b.substr(0, expect_prefix.size()), expect_prefix);
    EXPECT_NE(b.find(std::string("M\x40\x9c", 3)), std::string::npos);                                  // BININT2 40000
    EXPECT_NE(b.find(std::string("J\xfb\xff\xff\xff", 5)), std::string::npos);                          // BININT -5
    EXPECT_NE(b.find(std::string("\x8a\x08\x00\x00\x00\x00\x00\x01\x00\x00", 10)), std::string::npos);  // LONG1 2^40
    EXPECT_NE(b.find(std::string("G\x3f\xd0\x00\x00\x00\x00\x00\x00", 9)), std::string::npos);          // BINFLOAT 0.25
    EXPECT_NE(b.find(std::string("X\x2c\x01\x00\x00", 5)), std::string::npos);  // BINUNICODE 300
    EXPECT_EQ(b.back(), '.');
    if (access("/usr/bin/python3", X_OK) != 0) GTEST_SKIP() << "/usr/bin/python3 is missing";
    test::ScratchDir dir;
    test::write_file_bytes(dir.file("p.pickle"), b);
    std::string cmd =
        "/usr/bin/python3 -c 'import pickle,sys; d=pickle.load(open(sys.argv[1],\"rb\")); "
        "assert d[\"small\"]==7 and d[\"medium\"]==40000 and d[\"negative\"]==-5 and d[\"big\"]==2**40 "
        "and d[\"float\"]==0.25 and d[\"long text\"]==\"x\"*300 and d[\"flags\"]==[True,False,None]' " +
        dir.file("p.pickle");
    EXPECT_EQ(std::system(cmd.c_str()), 0);
}

TEST(Export, GuardRails) {
    ExportFixture f;
    SessionReader r(f.path);
    auto expect_error = [&](ExportWhat w, ExportFormat fmt, const std::string& out, const std::string& needle) {
        try {
            storage::export_run(r, f.run, w, fmt, out);
            ADD_FAILURE() << "expected an error containing '" << needle << "'";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        }
    };
    const std::string before = test::read_file_bytes(f.path);
    expect_error(ExportWhat::MEMORY, ExportFormat::CSV, f.path, "refusing to overwrite");
    EXPECT_EQ(test::read_file_bytes(f.path), before);
    expect_error(ExportWhat::ALL, ExportFormat::CSV, f.dir.file("x.csv"), "--what all cannot be one CSV");
    expect_error(ExportWhat::SPANS, ExportFormat::TORCH_SNAPSHOT, f.dir.file("x.pickle"), "memory only");
    expect_error(ExportWhat::MEMORY, ExportFormat::CSV, f.dir.file("missing/dir/x.csv"), "cannot write");
    try {
        storage::export_run(r, 999, ExportWhat::MEMORY, ExportFormat::CSV, f.dir.file("y.csv"));
        ADD_FAILURE() << "exported an unknown run";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("has no run 999"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(std::filesystem::exists(f.dir.file("y.csv")));
    EXPECT_EQ(storage::export_what_from_name("spans"), ExportWhat::SPANS);
    EXPECT_EQ(storage::export_format_from_name("chrome-trace"), ExportFormat::CHROME_TRACE);
    EXPECT_THROW(storage::export_format_from_name("xlsx"), Error);
    EXPECT_EQ(storage::csv_field("a,b"), "\"a,b\"");
    EXPECT_EQ(storage::csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
    EXPECT_EQ(storage::csv_field("plain"), "plain");
}

}  // namespace
}  // namespace kv
