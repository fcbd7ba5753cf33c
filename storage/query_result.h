// A table of values read from a session (what `kvlab sql` and `kvlab diff` print): column
// names and rows of SQLite-typed cells, and its renderings as an aligned text table, Markdown,
// CSV and JSON. Value types and text only; reading lives in sql_query.h.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

namespace kv::storage {

// NULL, INTEGER, REAL or TEXT (a BLOB is shown as "<N bytes>" text).
using QueryValue = std::variant<std::monostate, int64_t, double, std::string>;

struct QueryResult {
    std::vector<std::string> columns;
    std::vector<std::vector<QueryValue>> rows;  // each of columns.size()
};

enum class ResultFormat { TABLE, MARKDOWN, CSV, JSON };
// "table", "md", "csv", "json"; false for anything else.
bool result_format_from_name(const std::string& name, ResultFormat& out);

// A cell as text: "" for NULL, integers exactly, reals with up to 6 significant decimals
// (%.6g; JSON and CSV print reals round-trip exact instead).
std::string query_value_text(const QueryValue& v);
std::string format_query_result(const QueryResult& r, ResultFormat f);

}  // namespace kv::storage
