// bench/bench_table.h: the CSV and Markdown a table writes, checked against hand-written
// expected text (RFC 4180 quoting, GitHub-flavoured Markdown pipe tables).
#include <gtest/gtest.h>

#include "bench/bench_table.h"
#include "engine/core/error.h"

namespace kv::bench {
namespace {

BenchTable sample() {
    BenchTable t;
    t.title = "Sample";
    t.measures = "What a row measures; target >= 0.9x.";
    t.context = {"model tiny", "chunk 64"};
    t.columns = {{"name", true}, {"value"}, {"note", true}};
    t.add_row({"a|b", "1.50", "x, y"});
    t.add_row({"plain", "12.00", "say \"hi\""});
    t.notes = {"units: GB/s"};
    return t;
}

TEST(BenchTable, CsvQuotesCommasQuotesAndLineBreaks) {
    BenchTable t = sample();
    t.add_row({"two\nlines", "3.00", ""});
    EXPECT_EQ(t.csv(),
              "name,value,note\n"
              "a|b,1.50,\"x, y\"\n"
              "plain,12.00,\"say \"\"hi\"\"\"\n"
              "\"two\nlines\",3.00,\n");
}

TEST(BenchTable, MarkdownEscapesPipesAndCarriesTheCaption) {
    const std::string md = sample().markdown("Measured on CPU X, kernels avx2, 2026-01-01, commit abc");
    EXPECT_EQ(md,
              "## Sample\n\n"
              "What a row measures; target >= 0.9x.\n\n"
              "model tiny\\\n"
              "chunk 64\n\n"
              "| name | value | note |\n"
              "|---|---:|---|\n"
              "| a\\|b | 1.50 | x, y |\n"
              "| plain | 12.00 | say \"hi\" |\n\n"
              "units: GB/s\n\n"
              "*Measured on CPU X, kernels avx2, 2026-01-01, commit abc*\n\n");
}

TEST(BenchTable, EveryMarkdownRowHasOneCellPerColumn) {
    const std::string md = sample().markdown("c");
    // Count unescaped pipes per table line: columns + 1.
    size_t table_lines = 0;
    for (size_t p = 0; p < md.size();) {
        const size_t q = md.find('\n', p);
        const std::string line = md.substr(p, q - p);
        p = q + 1;
        if (line.empty() || line[0] != '|') continue;
        ++table_lines;
        int pipes = 0;
        for (size_t i = 0; i < line.size(); ++i) pipes += line[i] == '|' && (i == 0 || line[i - 1] != '\\');
        EXPECT_EQ(pipes, 4) << line;
    }
    EXPECT_EQ(table_lines, 4u);  // header, separator, two rows
}

TEST(BenchTable, RowWithWrongCellCountIsRefused) {
    BenchTable t = sample();
    try {
        t.add_row({"only", "two"});
        FAIL() << "a short row was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("a row of 2 cells; expected 3"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("Sample"), std::string::npos) << e.what();
    }
    EXPECT_EQ(t.rows.size(), 2u);
}

TEST(BenchTable, TextAlignsColumnsToTheWidestCell) {
    const std::string txt = sample().text();
    EXPECT_EQ(txt,
              "model tiny\n"
              "chunk 64\n"
              "name   value  note\n"
              "a|b     1.50  x, y\n"
              "plain  12.00  say \"hi\"\n"
              "units: GB/s\n");
}

TEST(BenchTable, CaptionNamesCpuKernelsDateAndCommit) {
    setenv("KVLAB_COMMIT", "v9-test", 1);
    const std::string c = table_caption();
    unsetenv("KVLAB_COMMIT");
    EXPECT_EQ(c.rfind("Measured on " + cpu_model() + ", ", 0), 0u) << c;
    EXPECT_NE(c.find(", kernels "), std::string::npos) << c;
    EXPECT_NE(c.find(", commit v9-test"), std::string::npos) << c;
    // An ISO date: ", 20YY-MM-DD,".
    const size_t d = c.find(", 20");
    ASSERT_NE(d, std::string::npos) << c;
    EXPECT_EQ(c[d + 6], '-');
    EXPECT_EQ(c[d + 9], '-');
}

TEST(BenchTable, CellRoundsToThePrecision) {
    EXPECT_EQ(cell(12.345, 2), "12.35");
    EXPECT_EQ(cell(2.0, 0), "2");
}

}  // namespace
}  // namespace kv::bench
