// Chrome trace JSON export (see exports.h): {"traceEvents": [...]} with microsecond timestamps
// relative to the run start. Tracks: process 1 = the run's host threads (spans as "X" complete
// events, one tid per engine thread, cells on tid 0), memory as one "C" counter per device whose
// series are the memory categories (so at every event they add up to the allocator's device
// total), metrics as "C" counters; processes 2+ = GPU devices with one tid per CUDA stream.
// A data-parallel run has these per rank, rank r's at pid 1 + 1000 r (export_chrome_trace).
// Written by hand (not through a JSON DOM) so exports of millions of events stream.
//
// The Perfetto flavour (export_perfetto_trace) is the same JSON trace event format, shaped for
// Perfetto's importer: each thread's spans in preorder (start ascending, end descending, the
// outer of two identical intervals first) so they nest into one track per thread without
// relying on the importer's tie-breaking; tids unique across processes (Perfetto keys threads
// by tid alone); cells on a track of their own; and a flow (v1 "s"/"f" pair, "bp":"e") from
// each launching span to every GPU kernel, memcpy or memset its CUPTI correlation names.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "storage/exports.h"
#include "storage/rank_runs.h"

namespace kv::storage {

namespace {
// JSON string body: escapes quotes, backslashes and control characters; replaces invalid UTF-8
// bytes with '?' so the file always parses.
std::string json_str(const std::string& s) {
    std::string o = "\"";
    for (size_t i = 0; i < s.size();) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            o += '\\';
            o += char(c);
            ++i;
        } else if (c < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            o += buf;
            ++i;
        } else if (c < 0x80) {
            o += char(c);
            ++i;
        } else {
            size_t len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
            bool ok = len > 0 && i + len <= s.size();
            for (size_t k = 1; ok && k < len; ++k) ok = ((unsigned char)s[i + k] & 0xC0) == 0x80;
            if (ok) {
                o.append(s, i, len);
                i += len;
            } else {
                o += '?';
                ++i;
            }
        }
    }
    return o + "\"";
}

std::string us(int64_t ns) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "%.3f", double(ns) / 1000.0);
    return buf;
}

std::string num(double v) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    return buf;
}

class TraceOut {
   public:
    explicit TraceOut(std::ostream& out) : out_(out) { out_ << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n"; }
    void event(const std::string& body) {
        out_ << (first_ ? "" : ",\n") << '{' << body << '}';
        first_ = false;
        ++count_;
    }
    void close() { out_ << "\n]}\n"; }
    uint64_t count() const { return count_; }

   private:
    std::ostream& out_;
    bool first_ = true;
    uint64_t count_ = 0;
};

void meta(TraceOut& t, const char* what, int pid, int tid, const std::string& name) {
    t.event(str("\"name\":\"", what, "\",\"ph\":\"M\",\"pid\":", pid, ",\"tid\":", tid,
                ",\"args\":{\"name\":", json_str(name), "}"));
}
}  // namespace

namespace {
std::string host_name(const RunInfo& r) {
    const auto j = nlohmann::json::parse(r.host.empty() ? "{}" : r.host, nullptr, false);
    return j.is_object() && j.contains("hostname") && j["hostname"].is_string() ? j["hostname"].get<std::string>() : "";
}

// One run's (or one rank's) tracks: host process `host_pid`, GPU devices at host_pid + 1 + device.
const char* gpu_kind_name(GpuActivityRow::Kind k) {
    return k == GpuActivityRow::KERNEL ? "kernel" : k == GpuActivityRow::MEMCPY ? "memcpy" : "memset";
}

// Perfetto tids: unique across processes, the host's threads and cells under its pid, each GPU
// stream under its device's.
int64_t host_tid(int host_pid, int thread) { return int64_t(host_pid) * 100000 + 1 + thread; }
int64_t cells_tid(int host_pid) { return int64_t(host_pid) * 100000; }
int64_t stream_tid(int gpu_pid, int stream) { return int64_t(gpu_pid) * 100000 + stream; }

void export_spans_perfetto(TraceOut& t, SessionReader& reader, int64_t run, int host_pid, int64_t t0) {
    std::vector<SpanRow> spans = reader.spans(run, {}, 0, size_t(-1));
    std::sort(spans.begin(), spans.end(), [](const SpanRow& x, const SpanRow& y) {
        return std::make_tuple(x.thread, x.start_ns, -x.end_ns, -x.id) < std::make_tuple(y.thread, y.start_ns, -y.end_ns, -y.id);
    });
    std::unordered_map<int64_t, const SpanRow*> launcher;  // span correlation id -> span
    std::set<int> threads;
    for (const SpanRow& s : spans) {
        threads.insert(s.thread);
        if (s.correlation_id) launcher.emplace(s.correlation_id, &s);
        std::string args;
        auto arg = [&](const char* k, int64_t v) {
            if (v >= 0) args += str(args.empty() ? "" : ",", "\"", k, "\":", v);
        };
        arg("layer", s.layer);
        arg("chunk", s.chunk);
        arg("cell_row", s.cell_row);
        arg("cell_col", s.cell_col);
        if (s.correlation_id) arg("correlation_id", s.correlation_id);
        if (s.device >= 0) args += str(args.empty() ? "" : ",", "\"device\":\"cuda:", s.device, "\"");
        t.event(str("\"name\":", json_str(s.name), ",\"cat\":\"", trace::span_category_name(s.category),
                    "\",\"ph\":\"X\",\"ts\":", us(s.start_ns - t0), ",\"dur\":", us(s.end_ns - s.start_ns),
                    ",\"pid\":", host_pid, ",\"tid\":", host_tid(host_pid, s.thread), ",\"args\":{", args, "}"));
    }
    for (int th : threads) {
        meta(t, "thread_name", host_pid, int(host_tid(host_pid, th)), str("thread ", th));
        t.event(str("\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":", host_pid, ",\"tid\":", host_tid(host_pid, th),
                    ",\"args\":{\"sort_index\":", 1 + th, "}"));
    }
    const auto cells = reader.cells(run);
    if (!cells.empty()) meta(t, "thread_name", host_pid, int(cells_tid(host_pid)), "cells");
    for (const CellRow& c : cells)
        t.event(str("\"name\":\"cell ", c.row, ",", c.col, "\",\"cat\":\"cell\",\"ph\":\"X\",\"ts\":", us(c.start_ns - t0),
                    ",\"dur\":", us(c.end_ns - c.start_ns), ",\"pid\":", host_pid, ",\"tid\":", cells_tid(host_pid),
                    ",\"args\":{\"layers\":\"", c.layer_begin, "-", c.layer_end, "\",\"chunks\":\"", c.chunk_begin, "-",
                    c.chunk_end, "\",\"peak_bytes\":", c.peak_bytes, "}"));
    std::vector<GpuActivityRow> gpu = reader.gpu_activity(run);
    std::stable_sort(gpu.begin(), gpu.end(), [](const GpuActivityRow& x, const GpuActivityRow& y) {
        return std::make_tuple(x.device, x.stream, x.start_ns, -x.end_ns) < std::make_tuple(y.device, y.stream, y.start_ns, -y.end_ns);
    });
    std::set<std::pair<int, int>> streams;
    int64_t flow = 0;
    for (const GpuActivityRow& g : gpu) {
        const int pid = host_pid + 1 + g.device;
        const int64_t tid = stream_tid(pid, g.stream);
        streams.insert({g.device, g.stream});
        std::string args = str("\"correlation_id\":", g.correlation_id);
        if (g.external_id) args += str(",\"span_correlation_id\":", g.external_id);
        if (g.bytes) args += str(",\"bytes\":", g.bytes);
        t.event(str("\"name\":", json_str(g.name), ",\"cat\":\"", gpu_kind_name(g.kind), "\",\"ph\":\"X\",\"ts\":",
                    us(g.start_ns - t0), ",\"dur\":", us(g.end_ns - g.start_ns), ",\"pid\":", pid, ",\"tid\":", tid,
                    ",\"args\":{", args, "}"));
        // The flow starts at the launching span's start (its own slice, before any child opens)
        // and ends bound to the GPU slice that starts at the kernel's start.
        const auto it = g.external_id ? launcher.find(g.external_id) : launcher.end();
        if (it == launcher.end()) continue;
        const SpanRow& s = *it->second;
        ++flow;
        t.event(str("\"name\":\"launch\",\"cat\":\"launch\",\"ph\":\"s\",\"id\":", flow, ",\"ts\":", us(s.start_ns - t0),
                    ",\"pid\":", host_pid, ",\"tid\":", host_tid(host_pid, s.thread)));
        t.event(str("\"name\":\"launch\",\"cat\":\"launch\",\"ph\":\"f\",\"bp\":\"e\",\"id\":", flow,
                    ",\"ts\":", us(g.start_ns - t0), ",\"pid\":", pid, ",\"tid\":", tid));
    }
    std::set<int> devices;
    for (auto [dev, stream] : streams) {
        const int pid = host_pid + 1 + dev;
        if (devices.insert(dev).second) meta(t, "process_name", pid, 0, str("GPU cuda:", dev, " (CUPTI)"));
        meta(t, "thread_name", pid, int(stream_tid(pid, stream)), str("stream ", stream));
    }
}

void export_run(TraceOut& t, SessionReader& reader, const RunInfo& info, const std::string& process, int host_pid, int sort_index,
                int64_t t0, bool spans, bool memory, bool metrics, bool perfetto) {
    const int64_t run = info.id;
    meta(t, "process_name", host_pid, 0, process);
    t.event(str("\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":", host_pid, ",\"args\":{\"sort_index\":", sort_index, "}"));

    if (spans && perfetto) export_spans_perfetto(t, reader, run, host_pid, t0);
    if (spans && !perfetto) {
        std::set<int> threads;
        reader.for_each_span(run, [&](const SpanRow& s) {
            threads.insert(s.thread);
            std::string args;
            auto arg = [&](const char* k, int64_t v) {
                if (v >= 0) args += str(args.empty() ? "" : ",", "\"", k, "\":", v);
            };
            arg("layer", s.layer);
            arg("chunk", s.chunk);
            arg("cell_row", s.cell_row);
            arg("cell_col", s.cell_col);
            if (s.correlation_id) arg("correlation_id", s.correlation_id);
            if (s.device >= 0) args += str(args.empty() ? "" : ",", "\"device\":\"cuda:", s.device, "\"");
            t.event(str("\"name\":", json_str(s.name), ",\"cat\":\"", trace::span_category_name(s.category),
                        "\",\"ph\":\"X\",\"ts\":", us(s.start_ns - t0), ",\"dur\":", us(s.end_ns - s.start_ns),
                        ",\"pid\":", host_pid, ",\"tid\":", s.thread, ",\"args\":{", args, "}"));
        });
        for (int th : threads) meta(t, "thread_name", host_pid, th, str("thread ", th));
        // Cells of the gradient pipeline on a track of their own: they never overlap in time.
        auto cells = reader.cells(run);
        if (!cells.empty()) meta(t, "thread_name", host_pid, 0, "cells");
        for (const CellRow& c : cells)
            t.event(str("\"name\":\"cell ", c.row, ",", c.col, "\",\"cat\":\"cell\",\"ph\":\"X\",\"ts\":",
                        us(c.start_ns - t0), ",\"dur\":", us(c.end_ns - c.start_ns), ",\"pid\":", host_pid,
                        ",\"tid\":0,\"args\":{\"layers\":\"", c.layer_begin, "-", c.layer_end, "\",\"chunks\":\"",
                        c.chunk_begin, "-", c.chunk_end, "\",\"peak_bytes\":", c.peak_bytes, "}"));
        // GPU work per device (process) and stream (thread).
        std::set<std::pair<int, int>> streams;
        for (const GpuActivityRow& g : reader.gpu_activity(run)) {
            const int pid = host_pid + 1 + g.device;
            streams.insert({g.device, g.stream});
            std::string args = str("\"correlation_id\":", g.correlation_id);
            if (g.external_id) args += str(",\"span_correlation_id\":", g.external_id);
            if (g.bytes) args += str(",\"bytes\":", g.bytes);
            t.event(str("\"name\":", json_str(g.name), ",\"cat\":\"",
                        g.kind == GpuActivityRow::KERNEL   ? "kernel"
                        : g.kind == GpuActivityRow::MEMCPY ? "memcpy"
                                                           : "memset",
                        "\",\"ph\":\"X\",\"ts\":", us(g.start_ns - t0), ",\"dur\":", us(g.end_ns - g.start_ns),
                        ",\"pid\":", pid, ",\"tid\":", g.stream, ",\"args\":{", args, "}"));
        }
        std::set<int> devices;
        for (auto [dev, stream] : streams) {
            if (devices.insert(dev).second) meta(t, "process_name", host_pid + 1 + dev, 0, str(process, " GPU cuda:", dev, " (CUPTI)"));
            meta(t, "thread_name", host_pid + 1 + dev, stream, str("stream ", stream));
        }
    }

    if (memory) {
        // Counter per device; every event re-emits all categories so the stacked series always
        // sum to the allocator's device total at that instant.
        std::map<int, std::array<int64_t, kNumMemCategories>> state;
        reader.for_each_memory_event(run, {}, [&](const MemoryEventRow& r) {
            auto& cats = state[r.device];
            cats[size_t(r.category)] = r.category_total;
            std::string args;
            for (size_t c = 0; c < kNumMemCategories; ++c)
                args += str(c ? "," : "", "\"", mem_category_name(MemCategory(c)), "\":", cats[c]);
            t.event(str("\"name\":\"memory ", trace::device_code_name(r.device),
                        "\",\"ph\":\"C\",\"ts\":", us(r.t_ns - t0), ",\"pid\":", host_pid, ",\"args\":{", args, "}"));
        });
    }

    if (metrics) {
        for (const MetricRow& m : reader.metrics(run))
            if (std::isfinite(m.value))  // JSON has no NaN/inf
                t.event(str("\"name\":", json_str("metric " + m.name), ",\"ph\":\"C\",\"ts\":", us(m.t_ns - t0),
                            ",\"pid\":", host_pid, ",\"args\":{", json_str(m.name), ":", num(m.value), "}"));
    }
}
}  // namespace

namespace {
uint64_t export_trace(SessionReader& reader, int64_t run, bool spans, bool memory, bool metrics, bool perfetto, std::ostream& out) {
    const RunInfo info = reader.run(run);
    TraceOut t(out);
    // A data-parallel run: one process per rank (storage/rank_runs.h), rank r at pid
    // 1 + 1000 r (its GPUs above it). Ranks on rank 0's host share its engine clock
    // (CLOCK_MONOTONIC), so they are drawn against rank 0's start; ranks on other hosts against
    // their own.
    const std::vector<int64_t> ranks = rank_runs(reader.runs(), run);
    const std::string host0 = host_name(info);
    for (size_t r = 0; r < ranks.size(); ++r) {
        if (ranks[r] == 0) continue;  // that rank's telemetry never arrived
        const RunInfo ri = r == 0 ? info : reader.run(ranks[r]);
        const bool same_clock = r == 0 || (!host0.empty() && host_name(ri) == host0);
        const std::string process = ranks.size() > 1 ? str("kvlab run ", run, " rank ", r, ": ", info.name) : str("kvlab run ", run, ": ", info.name);
        export_run(t, reader, ri, process, 1 + 1000 * int(r), int(r), same_clock ? info.t0_ns : ri.t0_ns, spans, memory, metrics, perfetto);
    }
    t.close();
    return t.count();
}

}  // namespace

uint64_t export_chrome_trace(SessionReader& reader, int64_t run, bool spans, bool memory, bool metrics, std::ostream& out) {
    return export_trace(reader, run, spans, memory, metrics, false, out);
}

uint64_t export_perfetto_trace(SessionReader& reader, int64_t run, bool spans, bool memory, bool metrics, std::ostream& out) {
    return export_trace(reader, run, spans, memory, metrics, true, out);
}

}  // namespace kv::storage
