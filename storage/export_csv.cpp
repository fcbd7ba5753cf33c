// CSV exports (see exports.h): one header line, one row per record, RFC 4180 quoting, integer
// nanoseconds (plus time since the run started) so nothing is rounded away.
#include <cinttypes>
#include <cmath>
#include <cstdio>

#include "storage/exports.h"

namespace kv::storage {

std::string csv_field(const std::string& s) {
    if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
    std::string q = "\"";
    for (char c : s) {
        if (c == '"') q += '"';
        q += c;
    }
    return q + "\"";
}

namespace {
// Shortest round-tripping text of a double.
std::string num(double v) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    return buf;
}
}  // namespace

uint64_t export_memory_csv(SessionReader& reader, int64_t run, std::ostream& out) {
    const int64_t t0 = reader.run(run).t0_ns;
    out << "id,t_ns,t_rel_ns,device,category,bytes,category_total,device_total,label,alloc_id,address,layer,chunk,"
           "flags\n";
    uint64_t n = 0;
    reader.for_each_memory_event(run, {}, [&](const MemoryEventRow& r) {
        out << r.id << ',' << r.t_ns << ',' << (r.t_ns - t0) << ',' << trace::device_code_name(r.device) << ','
            << mem_category_name(r.category) << ',' << r.bytes << ',' << r.category_total << ',' << r.device_total
            << ',' << csv_field(r.label) << ',' << r.alloc_id << ',' << r.address << ',' << r.layer << ',' << r.chunk
            << ',' << int(r.flags) << '\n';
        ++n;
    });
    return n;
}

uint64_t export_spans_csv(SessionReader& reader, int64_t run, std::ostream& out) {
    const int64_t t0 = reader.run(run).t0_ns;
    out << "id,start_ns,end_ns,start_rel_ns,dur_ns,name,category,layer,chunk,cell_row,cell_col,thread,device,stream,"
           "correlation_id\n";
    uint64_t n = 0;
    reader.for_each_span(run, [&](const SpanRow& s) {
        out << s.id << ',' << s.start_ns << ',' << s.end_ns << ',' << (s.start_ns - t0) << ','
            << (s.end_ns - s.start_ns) << ',' << csv_field(s.name) << ',' << trace::span_category_name(s.category)
            << ',' << s.layer << ',' << s.chunk << ',' << s.cell_row << ',' << s.cell_col << ',' << s.thread << ','
            << trace::device_code_name(s.device) << ',' << s.stream << ',' << s.correlation_id << '\n';
        ++n;
    });
    return n;
}

uint64_t export_metrics_csv(SessionReader& reader, int64_t run, std::ostream& out) {
    const int64_t t0 = reader.run(run).t0_ns;
    out << "id,name,step,value,t_ns,t_rel_ns\n";
    uint64_t n = 0;
    for (const MetricRow& m : reader.metrics(run)) {
        out << m.id << ',' << csv_field(m.name) << ',' << m.step << ',' << num(m.value) << ',' << m.t_ns << ','
            << (m.t_ns - t0) << '\n';
        ++n;
    }
    return n;
}

uint64_t export_tokens_csv(SessionReader& reader, int64_t run, std::ostream& out) {
    out << "sample,position,token_id,piece,loss\n";
    uint64_t n = 0;
    for (const SampleTokensRow& r : reader.sample_tokens(run)) {
        for (size_t t = 0; t < r.ids.size(); ++t) {
            out << r.sample << ',' << t << ',' << r.ids[t] << ',' << csv_field(t < r.pieces.size() ? r.pieces[t] : "") << ',';
            if (t < r.loss.size() && std::isfinite(r.loss[t])) out << num(double(r.loss[t]));
            out << '\n';
            ++n;
        }
    }
    return n;
}

}  // namespace kv::storage
