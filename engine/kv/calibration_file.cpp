// Framing shared by the calibration files (see calibration_file.h).
#include "engine/kv/calibration_file.h"

#include "engine/core/error.h"
#include "formats/io/file_util.h"

namespace kv {

std::string read_calibration_header(CalibrationLines& lines, const CalibrationFormat& f, const std::string& what,
                                    const std::function<bool(const std::string&, int64_t)>& set) {
    std::string line;
    if (!lines.next(line)) throw Error(str(what, " is empty; ", f.expected));
    {
        std::istringstream h(line);
        std::string magic;
        int version = 0;
        if (!(h >> magic >> version) || magic != f.magic)
            throw Error(str(what, " is not ", f.kind, " (first line '", line.substr(0, 60), "'; expected '", f.magic, " ", f.version, "'); ",
                            f.expected));
        if (version != f.version) throw Error(str(what, " has file version ", version, "; this kvlab reads version ", f.version));
    }
    std::string model;
    for (;;) {
        if (!lines.next(line)) throw Error(str(what, " ends before its '", f.body, "' line; ", f.expected));
        if (line == f.body) return model;
        std::istringstream kvs(line);
        std::string key;
        kvs >> key;
        if (key == "model") {
            std::getline(kvs >> std::ws, model);
            continue;
        }
        int64_t v = -1;
        if (!(kvs >> v) || v < 0) throw Error(str(what, " line ", lines.lineno(), ": '", line, "' needs a whole number >= 0"));
        if (!set(key, v))
            throw Error(str(what, " line ", lines.lineno(), ": unknown key '", key, "'; expected ", f.keys, " or ", f.body));
    }
}

bool parse_calibration_row(const std::string& line, std::vector<double>& out) {
    out.clear();
    std::istringstream row(line);
    double x;
    while (row >> x) out.push_back(x);
    return row.eof();
}

void expect_calibration_end(CalibrationLines& lines, const std::string& what, const std::string& after) {
    std::string line;
    if (lines.next(line)) throw Error(str(what, " line ", lines.lineno(), ": unexpected '", line.substr(0, 60), "' after ", after));
}

std::string read_calibration_file(const std::string& path, const std::string& option, const CalibrationFormat& f) {
    if (!is_regular_file(path)) throw Error(str(option, ": cannot read '", path, "'; ", f.expected));
    return read_text_file(path, str(option, " file"));
}

void write_calibration_file(const std::string& path, const std::string& text, const std::string& what) {
    try {
        write_file_atomic(path, text);
    } catch (const Error& e) {
        throw Error(str("cannot write the ", what, " '", path, "': ", e.what()));
    }
}

}  // namespace kv
