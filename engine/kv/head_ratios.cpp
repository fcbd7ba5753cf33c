// Per-head ratio tables (see head_ratios.h).
#include "engine/kv/head_ratios.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "engine/core/error.h"
#include "engine/kv/kv_config.h"

namespace kv {

namespace {
const char* kOpt = "--kv_cache.head_ratios";

// Ratios separated by commas, spaces or tabs; empty fields are skipped.
std::vector<std::string> fields(const std::string& s) {
    std::vector<std::string> out(1);
    for (char c : s) {
        if (c == ',' || c == ' ' || c == '\t' || c == '\r') {
            if (!out.back().empty()) out.emplace_back();
        } else {
            out.back() += c;
        }
    }
    if (out.back().empty()) out.pop_back();
    return out;
}

std::vector<double> parse_row(const std::string& s, int64_t layer) {
    std::vector<double> out;
    for (const std::string& part : fields(s)) {
        char* end = nullptr;
        const double r = std::strtod(part.c_str(), &end);
        if (*end || !(r > 0 && r <= 1))
            throw Error(str(kOpt, ": ", layer < 0 ? str("pattern entry ", out.size()) : str("layer ", layer, ", head ", out.size()), " is '",
                            part, "'; expected a number in (0, 1] (the fraction of the layer's cache length the head keeps)"));
        out.push_back(r);
    }
    if (out.empty())
        throw Error(str(kOpt, ": ", layer < 0 ? std::string("the pattern") : str("layer ", layer), " has no ratio; expected one ratio in (0, 1] per KV head"));
    return out;
}

std::string number(double x) {
    char b[32];
    std::snprintf(b, sizeof b, "%.12g", x);
    return b;
}

std::string row_text(const std::vector<double>& r) {
    std::string s;
    for (double x : r) {
        if (!s.empty()) s += ',';
        s += number(x);
    }
    return s;
}
}  // namespace

HeadRatioTable parse_head_ratios(const std::string& text) {
    HeadRatioTable t;
    if (text.rfind("pattern:", 0) == 0) {
        t.pattern = parse_row(text.substr(8), -1);
        return t;
    }
    if (!text.empty() && text.find_first_not_of("0123456789.,;eE+- \t") == std::string::npos) {
        // a list: ';' between layers
        std::string group;
        for (size_t i = 0; i <= text.size(); ++i) {
            if (i < text.size() && text[i] != ';') {
                group += text[i];
                continue;
            }
            t.layers.push_back(parse_row(group, int64_t(t.layers.size())));
            group.clear();
        }
        return t;
    }
    // a file: one line per layer ('#' starts a comment; blank lines are skipped)
    std::ifstream f(text);
    if (!f)
        throw Error(str(kOpt, ": the file '", text, "' cannot be read"),
                    "give the ratios as a list (\"1,0.5;0.25,1\"), a pattern (\"pattern:1,0.5\") or a readable file");
    std::string line;
    while (std::getline(f, line)) {
        line = line.substr(0, line.find('#'));
        if (fields(line).empty()) continue;
        t.layers.push_back(parse_row(line, int64_t(t.layers.size())));
    }
    if (t.layers.empty())
        throw Error(str(kOpt, ": the file '", text, "' holds no ratio; expected one line of KV-head ratios in (0, 1] per layer"));
    return t;
}

std::string head_ratios_text(const HeadRatioTable& t) {
    if (!t.pattern.empty()) return "pattern:" + row_text(t.pattern);
    std::string s;
    for (size_t l = 0; l < t.layers.size(); ++l) {
        if (l) s += ';';
        s += row_text(t.layers[l]);
    }
    return s;
}

void set_head_ratios(KVCacheConfig& cfg, const std::string& text) {
    cfg.head_ratios = text.empty() ? std::string() : head_ratios_text(parse_head_ratios(text));
}

void check_head_ratios(const std::string& stored, int64_t num_layers, int64_t num_kv_heads) {
    const HeadRatioTable t = parse_head_ratios(stored);
    if (!t.pattern.empty()) return;  // fits any shape
    if (int64_t(t.layers.size()) != num_layers)
        throw Error(str(kOpt, ": the table has ", t.layers.size(), " layers for a model of ", num_layers,
                        " layers; expected one line (or ';'-separated group) of ratios per layer"));
    for (size_t l = 0; l < t.layers.size(); ++l)
        if (int64_t(t.layers[l].size()) != num_kv_heads)
            throw Error(str(kOpt, ": layer ", l, " has ", t.layers[l].size(), " ratios for a model of ", num_kv_heads,
                            " KV heads; expected one ratio per KV head"));
}

std::vector<int64_t> head_budgets(const std::string& stored, int64_t L, int64_t G, int64_t layer) {
    const HeadRatioTable t = parse_head_ratios(stored);
    std::vector<double> r;
    if (!t.pattern.empty()) {
        for (int64_t g = 0; g < G; ++g) r.push_back(t.pattern[size_t((layer * G + g) % int64_t(t.pattern.size()))]);
    } else {
        if (layer >= int64_t(t.layers.size()))
            throw Error(str(kOpt, ": the table has ", t.layers.size(), " layers; layer ", layer, " has no ratios"));
        r = t.layers[size_t(layer)];
        if (int64_t(r.size()) != G)
            throw Error(str(kOpt, ": layer ", layer, " has ", r.size(), " ratios for a model of ", G, " KV heads; expected one ratio per KV head"));
    }
    std::vector<int64_t> out;
    for (double x : r) out.push_back(std::max<int64_t>(1, std::llround(x * double(L))));
    return out;
}

}  // namespace kv
