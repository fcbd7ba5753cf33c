// Renderings of a QueryResult (see query_result.h).
#include "query_result.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

namespace kv::storage {

bool result_format_from_name(const std::string& name, ResultFormat& out) {
    if (name == "table")
        out = ResultFormat::TABLE;
    else if (name == "md")
        out = ResultFormat::MARKDOWN;
    else if (name == "csv")
        out = ResultFormat::CSV;
    else if (name == "json")
        out = ResultFormat::JSON;
    else
        return false;
    return true;
}

namespace {
std::string real_text(double v, const char* fmt) {
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    char buf[64];
    std::snprintf(buf, sizeof buf, fmt, v);
    return buf;
}

// Exact text of a cell for machine formats: reals with 17 significant digits.
std::string exact_text(const QueryValue& v) {
    if (const double* d = std::get_if<double>(&v)) return real_text(*d, "%.17g");
    return query_value_text(v);
}

std::string csv_field(const std::string& s) {
    if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
    std::string out = "\"";
    for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
    return out + "\"";
}

bool numeric(const QueryValue& v) {
    return std::holds_alternative<int64_t>(v) || std::holds_alternative<double>(v);
}
}  // namespace

std::string query_value_text(const QueryValue& v) {
    if (const int64_t* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
    if (const double* d = std::get_if<double>(&v)) return real_text(*d, "%.6g");
    if (const std::string* s = std::get_if<std::string>(&v)) return *s;
    return "";
}

std::string format_query_result(const QueryResult& r, ResultFormat f) {
    std::string out;
    const size_t n = r.columns.size();
    if (f == ResultFormat::JSON) {
        nlohmann::ordered_json rows = nlohmann::ordered_json::array();
        for (const auto& row : r.rows) {
            nlohmann::ordered_json j = nlohmann::ordered_json::object();
            for (size_t c = 0; c < n; ++c) {
                const QueryValue& v = row[c];
                if (const int64_t* i = std::get_if<int64_t>(&v))
                    j[r.columns[c]] = *i;
                else if (const double* d = std::get_if<double>(&v))
                    j[r.columns[c]] =
                        std::isfinite(*d) ? nlohmann::ordered_json(*d) : nlohmann::ordered_json(real_text(*d, "%g"));
                else if (const std::string* s = std::get_if<std::string>(&v))
                    j[r.columns[c]] = *s;
                else
                    j[r.columns[c]] = nullptr;
            }
            rows.push_back(std::move(j));
        }
        // Invalid UTF-8 in a text cell is replaced rather than aborting the whole output.
        return rows.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
    }
    if (f == ResultFormat::CSV) {
        for (size_t c = 0; c < n; ++c) {
            if (c) out += ',';
            out += csv_field(r.columns[c]);
        }
        out += "\n";
        for (const auto& row : r.rows) {
            for (size_t c = 0; c < n; ++c) {
                if (c) out += ',';
                out += csv_field(exact_text(row[c]));
            }
            out += "\n";
        }
        return out;
    }
    // Text table and Markdown: columns padded to their widest cell, numbers right-aligned.
    std::vector<std::vector<std::string>> cells;
    std::vector<size_t> width(n);
    std::vector<bool> right(n, true);
    for (size_t c = 0; c < n; ++c) width[c] = r.columns[c].size();
    for (const auto& row : r.rows) {
        cells.emplace_back();
        for (size_t c = 0; c < n; ++c) {
            std::string t = query_value_text(row[c]);
            if (f == ResultFormat::MARKDOWN) {
                std::string e;
                for (char ch : t) {
                    if (ch == '|') e += '\\';
                    e += ch == '\n' ? ' ' : ch;
                }
                t = e;
            }
            if (!numeric(row[c]) && !std::holds_alternative<std::monostate>(row[c])) right[c] = false;
            width[c] = std::max(width[c], t.size());
            cells.back().push_back(std::move(t));
        }
    }
    auto pad = [&](const std::string& s, size_t c) {
        std::string out(width[c] - std::min(width[c], s.size()), ' ');
        if (right[c])
            out += s;
        else
            out.insert(0, s);
        return out;
    };
    const char* sep = f == ResultFormat::MARKDOWN ? " | " : "  ";
    auto line = [&](const std::vector<std::string>& row) {
        std::string l = f == ResultFormat::MARKDOWN ? "| " : "";
        for (size_t c = 0; c < n; ++c) {
            if (c) l += sep;
            l += pad(row[c], c);
        }
        if (f == ResultFormat::MARKDOWN) l += " |";
        while (!l.empty() && l.back() == ' ') l.pop_back();
        return l + "\n";
    };
    out += line(r.columns);
    std::vector<std::string> rule(n);
    for (size_t c = 0; c < n; ++c)
        rule[c] = f == ResultFormat::MARKDOWN ? std::string(width[c] > 0 ? width[c] - 1 : 0, '-') + (right[c] ? ":" : "-")
                                              : std::string(width[c], '-');
    out += line(rule);
    for (const auto& row : cells) out += line(row);
    return out;
}

}  // namespace kv::storage
