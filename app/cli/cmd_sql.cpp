// `kvlab sql FILE "SELECT ..."` and `kvlab sql FILE NAME --run N`: one read-only query, or a
// named one from storage/named_queries.h, printed as a table, Markdown, CSV or JSON.
// `kvlab sql --list` names the library.
#include <cstdio>

#include "commands.h"
#include "commands_storage.h"
#include "engine/core/error.h"
#include "storage/named_queries.h"
#include "storage/session_reader.h"
#include "storage/sql_query.h"

namespace kv::cli {

namespace {
std::vector<OptionSpec> sql_options() {
    auto o = global_options();
    o.push_back({"format", OptKind::STRING, "table", "output: table, md, csv or json"});
    o.push_back({"list", OptKind::FLAG, "", "list the named queries"});
    o.push_back({"show", OptKind::STRING, "", "print a named query's SQL (to run it in any SQLite client)"});
    o.push_back({"run", OptKind::INT, "", "run id (the :run parameter)"});
    o.push_back({"limit", OptKind::INT, "", "at most this many rows (the :limit parameter)"});
    return o;
}

void print_list() {
    size_t w = 0;
    for (const auto& q : storage::named_queries()) w = std::max(w, q.name.size());
    for (const auto& q : storage::named_queries()) {
        std::string params;
        for (const auto& p : q.params) params += str(" ", p.required ? "" : "[", "--", p.name, p.required ? "" : "]");
        std::printf("%-*s  %s%s%s\n", int(w), q.name.c_str(), q.description.c_str(), params.empty() ? "" : ";", params.c_str());
    }
}
}  // namespace

int cmd_sql(int argc, char** argv, int first) {
    const auto specs = sql_options();
    Args args(argc, argv, first, specs);
    if (args.flag("list")) {
        print_list();
        return 0;
    }
    if (args.has("show")) {
        const storage::NamedQuery* q = storage::find_named_query(args.str("show"));
        if (!q) throw UsageError(str("--show: no named query '", args.str("show"), "'; expected a name from kvlab sql --list"));
        std::printf("%s;\n", q->sql.c_str());
        return 0;
    }
    if (args.flag("help") || args.positional().size() != 2) {
        std::printf(
            "usage: kvlab sql FILE \"SELECT ...\" [options]\n"
            "       kvlab sql FILE NAME [--run N] [--limit N]   (a named query; kvlab sql --list)\n\n"
            "Runs one read-only SQL statement on a session (tables: docs/SESSIONS.md).\n\noptions:\n%s",
            format_options(specs).c_str());
        if (args.flag("help")) return 0;
        throw UsageError(args.positional().empty()
                             ? "sql: missing the session file and the query; expected: kvlab sql FILE QUERY"
                         : args.positional().size() == 1
                             ? "sql: missing the query; expected: kvlab sql FILE \"SELECT ...\" or a name from kvlab sql --list"
                             : str("sql: expected a session file and one query, got ", args.positional().size(),
                                   " arguments (quote the SQL)"));
    }
    apply_global_options(args);
    storage::ResultFormat format;
    if (!storage::result_format_from_name(args.str("format", "table"), format))
        throw UsageError(
            str("--format: '", args.str("format"), "' is not a query output format; expected table, md, csv or json"));
    const std::string& path = args.positional()[0];
    const std::string& query = args.positional()[1];
    storage::QueryParams params;
    for (const char* p : {"run", "limit"})
        if (args.has(p)) params[p] = std::to_string(args.integer(p, 0, p == std::string("limit") ? 0 : 1, INT64_MAX));
    std::string sql = query;
    std::vector<std::string> required;
    // A query that is one word without spaces is a name from the library.
    if (query.find_first_of(" \t\n") == std::string::npos) {
        const storage::NamedQuery* q = storage::find_named_query(query);
        if (!q) {
            std::string names;
            for (const auto& n : storage::named_queries()) names += (names.empty() ? "" : ", ") + n.name;
            throw UsageError(str("sql: no named query '", query, "'; expected one of: ", names, " (or an SQL statement)"));
        }
        sql = q->sql;
        for (const auto& p : q->params) {
            if (p.required && !args.has(p.name))
                throw UsageError(str("sql ", q->name, ": --", p.name, " is required (", p.help, ")"));
            if (p.required) required.push_back(p.name);
        }
        // A run that is not there would be an empty table, which reads like "nothing recorded".
        if (args.has("run")) storage::SessionReader(path).run(args.integer("run", 0, 1, INT64_MAX));
    }
    const storage::QueryResult r = storage::session_query(path, sql, params, required);
    std::fputs(storage::format_query_result(r, format).c_str(), stdout);
    return 0;
}

}  // namespace kv::cli
