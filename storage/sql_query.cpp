// Read-only statements on a session (see sql_query.h).
#include "sql_query.h"

#include <cctype>
#include <cstdlib>
#include <memory>

#include "storage/session_file.h"

namespace kv::storage {

namespace {
[[noreturn]] void invalid(const std::string& what) {
    throw SessionError(SessionErrorKind::INVALID, what);
}

std::string first_words(const std::string& sql) {
    std::string s;
    for (char c : sql) {
        if (s.size() >= 40) return s + "...";
        s += std::isspace(static_cast<unsigned char>(c)) ? ' ' : c;
    }
    return s;
}

void bind_value(sqlite3_stmt* st, int i, const std::string& v) {
    char* end = nullptr;
    const long long n = std::strtoll(v.c_str(), &end, 10);
    if (!v.empty() && *end == 0) {
        sqlite3_bind_int64(st, i, n);
        return;
    }
    const double d = std::strtod(v.c_str(), &end);
    if (!v.empty() && *end == 0) {
        sqlite3_bind_double(st, i, d);
        return;
    }
    sqlite3_bind_text(st, i, v.c_str(), int(v.size()), SQLITE_TRANSIENT);
}
}  // namespace

QueryResult session_query(const std::string& path, const std::string& sql, const QueryParams& params,
                          const std::vector<std::string>& required) {
    auto db = open_session_db(path, OpenMode::READ_ONLY);
    sqlite3_stmt* raw = nullptr;
    const char* tail = nullptr;
    const int rc = sqlite3_prepare_v2(db->handle(), sql.c_str(), int(sql.size()), &raw, &tail);
    // Owned from here, whatever happens next.
    std::unique_ptr<sqlite3_stmt, int (*)(sqlite3_stmt*)> st(raw, sqlite3_finalize);
    if (rc != SQLITE_OK)
        invalid(str("the query does not compile: ", sqlite3_errmsg(db->handle()),
                    "; expected one SQL statement "
                    "over the session's tables (docs/SESSIONS.md)"));
    if (!raw) invalid("the query is empty; expected one SQL statement, e.g. \"SELECT id, name FROM runs\"");
    for (const char* p = tail; p && *p; ++p)
        if (!std::isspace(static_cast<unsigned char>(*p)) && *p != ';')
            invalid(str("the query holds more than one statement (the second starts '", first_words(p),
                        "'); expected one statement"));
    if (!sqlite3_stmt_readonly(raw))
        invalid(str("the statement '", first_words(sql),
                    "' would change the session; kvlab sql only reads: "
                    "expected a SELECT, WITH, EXPLAIN or a reading PRAGMA"));
    for (int i = 1; i <= sqlite3_bind_parameter_count(raw); ++i) {
        const char* name = sqlite3_bind_parameter_name(raw, i);
        if (!name || !*name || name[0] == '?')
            invalid(str("the query has a positional parameter (", name && *name ? name : "?",
                        "); expected named ones (:run, :limit, ...)"));
        const std::string key = name + 1;
        auto it = params.find(key);
        if (it != params.end()) {
            bind_value(raw, i, it->second);
        } else {
            for (const auto& r : required)
                if (r == key) invalid(str("the query needs a value for :", key, "; expected --", key, " VALUE"));
        }
    }
    QueryResult out;
    const int n = sqlite3_column_count(raw);
    for (int c = 0; c < n; ++c) out.columns.push_back(sqlite3_column_name(raw, c));
    for (;;) {
        const int s = sqlite3_step(raw);
        if (s == SQLITE_DONE) break;
        if (s != SQLITE_ROW)
            throw SessionError(session_error_kind_for(s),
                               str("session '", path, "': the query failed: ", sqlite3_errmsg(db->handle())));
        auto& row = out.rows.emplace_back();
        for (int c = 0; c < n; ++c) {
            switch (sqlite3_column_type(raw, c)) {
                case SQLITE_INTEGER:
                    row.emplace_back(int64_t(sqlite3_column_int64(raw, c)));
                    break;
                case SQLITE_FLOAT:
                    row.emplace_back(sqlite3_column_double(raw, c));
                    break;
                case SQLITE_TEXT:
                    row.emplace_back(std::string(reinterpret_cast<const char*>(sqlite3_column_text(raw, c)),
                                                 size_t(sqlite3_column_bytes(raw, c))));
                    break;
                case SQLITE_BLOB:
                    row.emplace_back(str("<", sqlite3_column_bytes(raw, c), " bytes>"));
                    break;
                default:
                    row.emplace_back(std::monostate{});
                    break;
            }
        }
    }
    return out;
}

}  // namespace kv::storage
