// Command-line parsing for `kvlab`: positional words plus `--dotted.name value`,
// `--dotted.name=value` and boolean flags, checked against a table of known options so every
// mistake becomes one message naming the option and what was expected.
#pragma once

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace kv::cli {

enum class OptKind { FLAG, INT, FLOAT, STRING, SIZE };

struct OptionSpec {
    std::string name;  // without the leading "--"
    OptKind kind = OptKind::STRING;
    std::string def;   // default shown in --help ("" = none)
    std::string help;
};

// Thrown for usage errors (exit code 2).
struct UsageError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

class Args {
   public:
    // Parses argv[first..argc) against `specs`; throws UsageError for unknown options,
    // missing values and flags given values.
    Args(int argc, char** argv, int first, const std::vector<OptionSpec>& specs);

    const std::vector<std::string>& positional() const { return positional_; }
    bool has(const std::string& name) const { return values_.count(name) > 0; }
    bool flag(const std::string& name) const;
    std::string str(const std::string& name, const std::string& def = "") const;
    long long integer(const std::string& name, long long def, long long lo, long long hi) const;
    double real(const std::string& name, double def, double lo, double hi) const;
    long long size(const std::string& name, long long def) const;  // "8GiB" etc.

   private:
    std::vector<std::string> positional_;
    std::map<std::string, std::string> values_;
    std::vector<OptionSpec> specs_;
};

// "  --threads N   worker threads (default: 0 = all cores)" lines for --help.
std::string format_options(const std::vector<OptionSpec>& specs);

}  // namespace kv::cli
