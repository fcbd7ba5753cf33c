// The small text files calibrations write (duo's gates, Q-Filters). Each is a magic line
// "<magic> <version>", a header of "key value" lines ending at a line that names the body, then
// rows of numbers, and nothing after them. Lines are read one at a time, blank lines and '#'
// comments skipped, surrounding whitespace trimmed, the line number kept for messages. A file's
// own parser names its keys and checks its values; the framing and its messages are shared.
#pragma once

#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace kv {

class CalibrationLines {
   public:
    explicit CalibrationLines(const std::string& text) : in_(text) {}
    // The next line with content; false at the end.
    bool next(std::string& out) {
        while (std::getline(in_, out)) {
            ++lineno_;
            const size_t a = out.find_first_not_of(" \t\r");
            if (a == std::string::npos || out[a] == '#') continue;
            out = out.substr(a);
            while (!out.empty() && (out.back() == '\r' || out.back() == ' ' || out.back() == '\t')) out.pop_back();
            return true;
        }
        return false;
    }
    int lineno() const { return lineno_; }

   private:
    std::istringstream in_;
    int lineno_ = 0;
};

// What one kind of calibration file is, for its framing and messages.
struct CalibrationFormat {
    const char* magic;     // "kvlab-qfilter"
    int version;           // the one version this kvlab reads
    const char* kind;      // "a Q-Filter file"
    const char* body;      // the line that ends the header: "filters"
    const char* keys;      // the header keys, for the message about an unknown one
    const char* expected;  // how to make a good file: "expected a filter file written by ..."
};

// Checks the magic line, then reads header lines up to the body line: `model` takes the rest of
// its line (returned), every other key a whole number >= 0 given to set(key, value), which
// returns false for a key the format does not have.
std::string read_calibration_header(CalibrationLines& lines, const CalibrationFormat& f, const std::string& what,
                                    const std::function<bool(const std::string&, int64_t)>& set);

// The numbers of the line just read; false if something on it is not a number.
bool parse_calibration_row(const std::string& line, std::vector<double>& out);

// Throws if anything but blank lines and comments follows the body.
void expect_calibration_end(CalibrationLines& lines, const std::string& what, const std::string& after);

// Reads the whole file for `option` (the command-line option naming it, for messages).
std::string read_calibration_file(const std::string& path, const std::string& option, const CalibrationFormat& f);

// Writes `text` to a sibling temporary file and renames it over `path`: a reader never sees a
// half-written file.
void write_calibration_file(const std::string& path, const std::string& text, const std::string& what);

}  // namespace kv
