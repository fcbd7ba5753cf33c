// The small text files calibrations write (duo's gates, Q-Filters): lines read one at a time,
// blank lines and '#' comments skipped, surrounding whitespace trimmed, the line number kept
// for messages. Each file's own parser checks its magic line and fields.
#pragma once

#include <sstream>
#include <string>

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

}  // namespace kv
