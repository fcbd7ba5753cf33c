// export_run: picks the exporter for (what, format), writes to a temporary file next to the
// target and renames it into place, so an interrupted export never leaves a partial file and
// never damages what was there (see exports.h).
#include "storage/exports.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

namespace kv::storage {

ExportWhat export_what_from_name(const std::string& name) {
    if (name == "memory") return ExportWhat::MEMORY;
    if (name == "spans") return ExportWhat::SPANS;
    if (name == "metrics") return ExportWhat::METRICS;
    if (name == "all") return ExportWhat::ALL;
    if (name == "tokens") return ExportWhat::TOKENS;
    throw Error(str("--what: '", name, "' is not something a run records; expected memory, spans, metrics, tokens or all"));
}

ExportFormat export_format_from_name(const std::string& name) {
    if (name == "csv") return ExportFormat::CSV;
    if (name == "chrome-trace" || name == "chrome") return ExportFormat::CHROME_TRACE;
    if (name == "perfetto") return ExportFormat::PERFETTO;
    if (name == "torch-snapshot" || name == "torch") return ExportFormat::TORCH_SNAPSHOT;
    throw Error(str("--format: '", name, "' is not an export format; expected csv, chrome-trace, perfetto or torch-snapshot"));
}

namespace {
// True when `path` exists and starts with the SQLite header (a session or another database).
bool is_sqlite_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    char head[16] = {0};
    if (!f.read(head, sizeof head)) return false;
    return std::memcmp(head, "SQLite format 3", 16) == 0;
}
}  // namespace

ExportResult export_run(SessionReader& reader, int64_t run, ExportWhat what, ExportFormat format,
                        const std::string& out_path) {
    if (format == ExportFormat::CSV && what == ExportWhat::ALL)
        throw Error(
            "--what all cannot be one CSV file (memory events, spans and metrics have different columns); "
            "expected --what memory, spans or metrics");
    if ((format == ExportFormat::CHROME_TRACE || format == ExportFormat::PERFETTO) && what == ExportWhat::TOKENS)
        throw Error("--what tokens is a table, not a trace; expected --format csv");
    if (format == ExportFormat::TORCH_SNAPSHOT && what != ExportWhat::MEMORY)
        throw Error("--format torch-snapshot holds memory only; expected --what memory");
    if (out_path.empty()) throw Error("export: missing output path; expected -o PATH");
    if (is_sqlite_file(out_path))
        throw Error(str("refusing to overwrite '", out_path, "': it is an SQLite database (a session file?)"),
                    "choose another output path");
    reader.run(run);  // unknown run -> clear error before any file is created

    const std::string tmp = out_path + ".tmp-kvlab-export";
    ExportResult res;
    {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        if (!out) throw Error(str("cannot write '", out_path, "': ", std::strerror(errno)), "choose a writable path");
        try {
            switch (format) {
                case ExportFormat::CSV:
                    res.records = what == ExportWhat::MEMORY   ? export_memory_csv(reader, run, out)
                                  : what == ExportWhat::SPANS  ? export_spans_csv(reader, run, out)
                                  : what == ExportWhat::TOKENS ? export_tokens_csv(reader, run, out)
                                                               : export_metrics_csv(reader, run, out);
                    break;
                case ExportFormat::CHROME_TRACE:
                    res.records = export_chrome_trace(reader, run, what == ExportWhat::SPANS || what == ExportWhat::ALL,
                                                      what == ExportWhat::MEMORY || what == ExportWhat::ALL,
                                                      what == ExportWhat::METRICS || what == ExportWhat::ALL, out);
                    break;
                case ExportFormat::PERFETTO:
                    res.records = export_perfetto_trace(reader, run, what == ExportWhat::SPANS || what == ExportWhat::ALL,
                                                        what == ExportWhat::MEMORY || what == ExportWhat::ALL,
                                                        what == ExportWhat::METRICS || what == ExportWhat::ALL, out);
                    break;
                case ExportFormat::TORCH_SNAPSHOT:
                    res.records = export_torch_snapshot(reader, run, out);
                    break;
            }
            out.flush();
            if (!out) throw Error(str("writing '", out_path, "' failed (disk full?)"));
        } catch (...) {
            out.close();
            std::remove(tmp.c_str());
            throw;
        }
    }
    if (std::rename(tmp.c_str(), out_path.c_str()) != 0) {
        int e = errno;
        std::remove(tmp.c_str());
        throw Error(str("cannot write '", out_path, "': ", std::strerror(e)));
    }
    struct stat st {};
    if (stat(out_path.c_str(), &st) == 0) res.bytes = uint64_t(st.st_size);
    return res;
}

}  // namespace kv::storage
