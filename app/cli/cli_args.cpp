// Command-line parsing (see cli_args.h).
#include "cli_args.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "engine/core/edit_distance.h"
#include "engine/core/error.h"

namespace kv::cli {

namespace {
const OptionSpec* find_spec(const std::vector<OptionSpec>& specs, const std::string& name) {
    for (const auto& s : specs)
        if (s.name == name) return &s;
    return nullptr;
}

std::string last_component(const std::string& name) {
    const size_t dot = name.rfind('.');
    return dot == std::string::npos ? name : name.substr(dot + 1);
}

// What the user probably meant: options with the same last dotted part (--chunk_size for
// --kv_cache.chunk_size) or within a small edit distance; the full list only when it is short.
std::string unknown_option_message(const std::vector<OptionSpec>& specs, const std::string& name) {
    std::vector<std::string> close;
    for (const auto& o : specs)
        if (last_component(o.name) == last_component(name) || edit_distance(o.name, name) <= std::max<size_t>(2, name.size() / 5))
            close.push_back("--" + o.name);
    std::string msg = "unknown option --" + name;
    if (!close.empty()) {
        msg += "; did you mean ";
        for (size_t i = 0; i < close.size() && i < 4; ++i) msg += (i ? " or " : "") + close[i];
        return msg + "?";
    }
    if (specs.size() <= 12) {
        msg += "; known options:";
        for (const auto& o : specs) msg += " --" + o.name;
        return msg;
    }
    return msg + "; see --help for the options of this command";
}
}  // namespace

Args::Args(int argc, char** argv, int first, const std::vector<OptionSpec>& specs) : specs_(specs) {
    for (int i = first; i < argc; ++i) {
        std::string a = argv[i];
        if (a.rfind("--", 0) != 0 || a == "--") {
            positional_.push_back(a);
            continue;
        }
        std::string name = a.substr(2), value;
        bool has_value = false;
        auto eq = name.find('=');
        if (eq != std::string::npos) {
            value = name.substr(eq + 1);
            name = name.substr(0, eq);
            has_value = true;
        }
        const OptionSpec* spec = find_spec(specs, name);
        if (!spec) throw UsageError(unknown_option_message(specs, name));
        if (spec->kind == OptKind::FLAG) {
            if (has_value && value != "true" && value != "false" && value != "1" && value != "0")
                throw UsageError("--" + name + " is a flag; expected no value or true/false, got '" + value + "'");
            values_[name] = has_value ? value : "true";
            continue;
        }
        if (!has_value) {
            if (i + 1 >= argc) throw UsageError("--" + name + " needs a value (" + spec->help + ")");
            value = argv[++i];
        }
        values_[name] = value;
    }
}

bool Args::flag(const std::string& name) const {
    auto it = values_.find(name);
    return it != values_.end() && (it->second == "true" || it->second == "1");
}

std::string Args::str(const std::string& name, const std::string& def) const {
    auto it = values_.find(name);
    return it == values_.end() ? def : it->second;
}

long long Args::integer(const std::string& name, long long def, long long lo, long long hi) const {
    auto it = values_.find(name);
    if (it == values_.end()) return def;
    const std::string& v = it->second;
    char* end = nullptr;
    errno = 0;
    long long x = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != 0 || errno == ERANGE)
        throw UsageError(kv::str("--", name, ": '", v, "' is not an integer; expected a whole number in [", lo, ", ", hi, "]"));
    if (x < lo || x > hi) throw UsageError(kv::str("--", name, ": ", x, " is out of range; expected a whole number in [", lo, ", ", hi, "]"));
    return x;
}

double Args::real(const std::string& name, double def, double lo, double hi) const {
    auto it = values_.find(name);
    if (it == values_.end()) return def;
    const std::string& v = it->second;
    char* end = nullptr;
    double x = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != 0 || !std::isfinite(x))
        throw UsageError(kv::str("--", name, ": '", v, "' is not a number; expected a value in [", lo, ", ", hi, "]"));
    if (x < lo || x > hi) throw UsageError(kv::str("--", name, ": ", x, " is out of range; expected a value in [", lo, ", ", hi, "]"));
    return x;
}

long long Args::size(const std::string& name, long long def) const {
    auto it = values_.find(name);
    if (it == values_.end()) return def;
    try {
        return parse_bytes(it->second, "--" + name);
    } catch (const Error& e) {
        throw UsageError(e.what());
    }
}

std::string format_options(const std::vector<OptionSpec>& specs) {
    std::ostringstream os;
    for (const auto& s : specs) {
        std::string left = "  --" + s.name;
        switch (s.kind) {
            case OptKind::INT: left += " N"; break;
            case OptKind::FLOAT: left += " X"; break;
            case OptKind::SIZE: left += " SIZE"; break;
            case OptKind::STRING: left += " VALUE"; break;
            case OptKind::FLAG: break;
        }
        if (left.size() < 30) left.resize(30, ' ');
        else left += "  ";
        os << left << s.help;
        if (!s.def.empty()) os << " (default: " << s.def << ")";
        os << "\n";
    }
    return os.str();
}

}  // namespace kv::cli
