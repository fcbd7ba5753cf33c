// One benchmark's result as a table: the aligned text the `kvlab bench` commands print, the CSV
// of --csv and the Markdown section of --md (docs/PERFORMANCE.md is assembled from these by
// scripts/performance.sh), so the three never drift apart.
#pragma once

#include <string>
#include <vector>

namespace kv::bench {

struct BenchColumn {
    std::string name;
    bool left = false;  // text columns (names, notes) align left, numbers right
};

struct BenchTable {
    std::string title;                 // Markdown heading: "Ops vs this machine's ceilings (`kvlab bench ops`)"
    std::string measures;              // one line: what is measured and the target
    std::vector<std::string> context;  // lines printed before the table (model, shapes, machine)
    std::vector<BenchColumn> columns;
    std::vector<std::vector<std::string>> rows;
    std::vector<std::string> notes;  // lines printed after the table (units, totals)

    // Throws Error naming the table when the row's cell count differs from the columns'.
    void add_row(std::vector<std::string> cells);

    // The console form: context lines, a header and rows padded to each column's widest cell,
    // then the notes.
    std::string text() const;
    // Header and rows, RFC 4180 quoting (cells with a comma, quote or line break are quoted).
    std::string csv() const;
    // "## title", the measures line, the context, the table ('|' escaped), the notes and the
    // caption line in italics.
    std::string markdown(const std::string& caption) const;
};

// "Measured on <CPU model>, kernels <variant>, <YYYY-MM-DD>, commit <describe>": the caption
// under every generated table (the ratios depend on the CPU and the kernel variant).
std::string table_caption();
// The build's `git describe --always --dirty` (KVLAB_COMMIT in the environment overrides it,
// so a regenerating script names the commit it measured even if the build was configured earlier).
std::string build_commit();
// The CPU model name from /proc/cpuinfo ("unknown CPU" where there is none).
std::string cpu_model();

// Fixed-precision number for a cell ("12.35" for (12.345, 2)).
std::string cell(double v, int precision);

}  // namespace kv::bench
