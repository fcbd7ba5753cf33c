// Errors raised by the engine. The engine never exits the process: it throws kv::Error with a
// message naming what was wrong and what was expected, plus an optional hint with a known fix.
// The CLI and GUI turn these into one message and a non-zero exit / a dialog.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace kv {

class Error : public std::runtime_error {
   public:
    explicit Error(const std::string& what, std::string hint = {})
        : std::runtime_error(what), hint_(std::move(hint)) {}
    const std::string& hint() const { return hint_; }

   private:
    std::string hint_;
};

// An allocation that would exceed the memory budget of a device.
class BudgetError : public Error {
   public:
    using Error::Error;
};

// Concatenate anything streamable into a string: str("layer ", 3, ": ", 1.5).
template <class... Args>
std::string str(Args&&... args) {
    std::ostringstream os;
    (os << ... << std::forward<Args>(args));
    return os.str();
}

// "1.50 GiB", "512 B" — for messages and tables.
std::string format_bytes(long long bytes);

// Parse "1024", "64KiB", "1.5GiB", "2GB", "300M" into bytes; throws kv::Error naming `what`.
long long parse_bytes(const std::string& text, const std::string& what);

}  // namespace kv
