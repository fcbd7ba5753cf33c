#include "bench_table.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "engine/backend/backend_registry.h"
#include "engine/core/error.h"

#ifndef KVLAB_GIT_DESCRIBE
#define KVLAB_GIT_DESCRIBE "unknown"
#endif

namespace kv::bench {

void BenchTable::add_row(std::vector<std::string> cells) {
    if (cells.size() != columns.size())
        throw Error(str("bench table '", title, "': a row of ", cells.size(), " cells; expected ", columns.size(), " (one per column)"));
    rows.push_back(std::move(cells));
}

std::string BenchTable::text() const {
    std::vector<size_t> width(columns.size());
    for (size_t c = 0; c < columns.size(); ++c) {
        width[c] = columns[c].name.size();
        for (const auto& r : rows) width[c] = std::max(width[c], r[c].size());
    }
    // The last column is padded only when right-aligned (no trailing blanks after notes).
    auto line = [&](const std::vector<std::string>& cells) {
        std::string s;
        for (size_t c = 0; c < cells.size(); ++c) {
            const size_t pad = width[c] - std::min(width[c], cells[c].size());
            if (c) s += "  ";
            if (columns[c].left) {
                s += cells[c];
                if (c + 1 < cells.size()) s.append(pad, ' ');
            } else {
                s.append(pad, ' ');
                s += cells[c];
            }
        }
        while (!s.empty() && s.back() == ' ') s.pop_back();
        s += '\n';
        return s;
    };
    std::string out;
    for (const auto& l : context) out.append(l).append("\n");
    std::vector<std::string> header;
    for (const auto& c : columns) header.push_back(c.name);
    out += line(header);
    for (const auto& r : rows) out += line(r);
    for (const auto& l : notes) out.append(l).append("\n");
    return out;
}

namespace {
std::string csv_cell(const std::string& s) {
    if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
    std::string q = "\"";
    for (char ch : s) {
        if (ch == '"') q += '"';
        q += ch;
    }
    q += '"';
    return q;
}

std::string md_cell(const std::string& s) {
    std::string out;
    for (char ch : s) {
        if (ch == '|') out += "\\|";
        else if (ch == '\n' || ch == '\r') out += ' ';
        else out += ch;
    }
    return out;
}
}  // namespace

std::string BenchTable::csv() const {
    std::string out;
    auto line = [&](const std::vector<std::string>& cells) {
        for (size_t c = 0; c < cells.size(); ++c) {
            if (c) out += ',';
            out += csv_cell(cells[c]);
        }
        out += "\n";
    };
    std::vector<std::string> header;
    for (const auto& c : columns) header.push_back(c.name);
    line(header);
    for (const auto& r : rows) line(r);
    return out;
}

std::string BenchTable::markdown(const std::string& caption) const {
    std::string out = "## ";
    out.append(title).append("\n\n");
    if (!measures.empty()) out.append(measures).append("\n\n");
    // Context lines keep their line breaks (a trailing backslash is a Markdown hard break).
    for (size_t i = 0; i < context.size(); ++i) out.append(md_cell(context[i])).append(i + 1 < context.size() ? "\\\n" : "\n\n");
    out += "|";
    for (const auto& c : columns) out.append(" ").append(md_cell(c.name)).append(" |");
    out += "\n|";
    for (const auto& c : columns) out += c.left ? "---|" : "---:|";
    out += "\n";
    for (const auto& r : rows) {
        out += "|";
        for (const auto& cellv : r) out.append(" ").append(md_cell(cellv)).append(" |");
        out += "\n";
    }
    out += "\n";
    for (size_t i = 0; i < notes.size(); ++i) out.append(md_cell(notes[i])).append(i + 1 < notes.size() ? "\\\n" : "\n\n");
    out.append("*").append(md_cell(caption)).append("*\n\n");
    return out;
}

std::string cpu_model() {
    std::string model = "unknown CPU";
    if (std::FILE* f = std::fopen("/proc/cpuinfo", "r")) {
        char line[512];
        while (std::fgets(line, sizeof line, f)) {
            if (std::strncmp(line, "model name", 10) != 0) continue;
            const char* colon = std::strchr(line, ':');
            if (!colon) continue;
            model = colon + 1;
            while (!model.empty() && (model.front() == ' ' || model.front() == '\t')) model.erase(0, 1);
            while (!model.empty() && (model.back() == '\n' || model.back() == ' ')) model.pop_back();
            break;
        }
        std::fclose(f);
    }
    return model;
}

std::string build_commit() {
    if (const char* c = std::getenv("KVLAB_COMMIT"); c && *c) return c;
    return KVLAB_GIT_DESCRIBE;
}

std::string table_caption() {
    std::string variant = cpu_variant_status();
    variant = variant.substr(0, variant.find(' '));  // the name; the reason stays in the text output
    char date[16] = "";
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    gmtime_r(&now, &tm);
    std::strftime(date, sizeof date, "%Y-%m-%d", &tm);
    return str("Measured on ", cpu_model(), ", ", hardware_threads(), " hardware threads, kernels ", variant, ", ", date,
               ", commit ", build_commit());
}

std::string cell(double v, int precision) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f", precision, v);
    return buf;
}

}  // namespace kv::bench
