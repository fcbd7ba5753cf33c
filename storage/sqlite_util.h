// Thin RAII wrappers over the SQLite C API (connection, prepared statement) and the error path
// every storage call goes through: KV_CHECK_SQLITE captures file, line and expression and
// throws a SessionError naming the session file, what was being done and what SQLite said.
// No schema knowledge here; nothing in engine/ may include this.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "engine/core/error.h"

namespace kv::storage {

enum class SessionErrorKind {
    NOT_FOUND,      // no such file
    NOT_A_SESSION,  // not SQLite, not kvlab, empty
    NEWER_SCHEMA,   // written by a newer kvlab
    DAMAGED,        // truncated or corrupt
    NOT_WRITABLE,   // read-only file or directory, permissions
    BUSY,           // locked by another process for too long
    IO,             // disk full, I/O error
    INVALID,        // a request that does not fit the session (unknown run, bad status change)
};
const char* session_error_kind_name(SessionErrorKind k);

class SessionError : public Error {
   public:
    SessionError(SessionErrorKind kind, const std::string& what, std::string hint = {})
        : Error(what, std::move(hint)), kind_(kind) {}
    SessionErrorKind kind() const { return kind_; }

   private:
    SessionErrorKind kind_;
};

// Maps an SQLite result code to the error kind a user can act on.
SessionErrorKind session_error_kind_for(int rc);

// Throws SessionError for `rc`: "session 'PATH': CONTEXT failed: MESSAGE (sqlite N) [FILE:LINE EXPR]".
[[noreturn]] void throw_sqlite(sqlite3* db, const std::string& path, int rc, const char* expr, const char* file,
                               int line, std::string_view context);

class Db;

// Checks an SQLite result code; `db` is a kv::storage::Db (or anything with handle()/path()).
#define KV_CHECK_SQLITE(db, expr, context)                                                                    \
    do {                                                                                                      \
        int kv_sqlite_rc_ = (expr);                                                                           \
        if (kv_sqlite_rc_ != SQLITE_OK && kv_sqlite_rc_ != SQLITE_ROW && kv_sqlite_rc_ != SQLITE_DONE)        \
            ::kv::storage::throw_sqlite((db).handle(), (db).path(), kv_sqlite_rc_, #expr, __FILE__, __LINE__, \
                                        (context));                                                           \
    } while (0)

// A prepared statement. Bind indexes are 1-based, column indexes 0-based (as in SQLite).
class Stmt {
   public:
    Stmt() = default;
    Stmt(Db& db, std::string_view sql);
    ~Stmt();
    Stmt(Stmt&& o) noexcept : db_(o.db_), s_(std::exchange(o.s_, nullptr)) {}
    Stmt& operator=(Stmt&& o) noexcept;
    Stmt(const Stmt&) = delete;
    Stmt& operator=(const Stmt&) = delete;

    Stmt& bind(int i, int64_t v) { return check_bind(sqlite3_bind_int64(s_, i, v)); }
    Stmt& bind(int i, int v) { return check_bind(sqlite3_bind_int64(s_, i, v)); }
    Stmt& bind(int i, uint32_t v) { return check_bind(sqlite3_bind_int64(s_, i, int64_t(v))); }
    Stmt& bind(int i, uint64_t v) { return check_bind(sqlite3_bind_int64(s_, i, int64_t(v))); }
    Stmt& bind(int i, double v) { return check_bind(sqlite3_bind_double(s_, i, v)); }
    // Text and blobs are bound without copying: they must stay alive until the next reset().
    Stmt& bind(int i, std::string_view v) {
        return check_bind(sqlite3_bind_text(s_, i, v.data(), int(v.size()), SQLITE_STATIC));
    }
    Stmt& bind(int i, const char* v) { return bind(i, std::string_view(v)); }
    Stmt& bind_blob(int i, const void* data, size_t bytes) {
        return check_bind(bytes ? sqlite3_bind_blob64(s_, i, data, bytes, SQLITE_STATIC)
                                : sqlite3_bind_zeroblob(s_, i, 0));
    }
    Stmt& bind_null(int i) { return check_bind(sqlite3_bind_null(s_, i)); }

    // True while a row is available; false when done. Throws on errors.
    bool step();
    // Runs a statement that returns no rows, then resets it (and clears its bindings).
    void run();
    // Hot-path insert: step to completion and reset, keeping bindings (every column is rebound
    // for the next row anyway).
    void insert() {
        int rc = sqlite3_step(s_);
        sqlite3_reset(s_);
        if (rc != SQLITE_DONE) fail_insert(rc);
    }
    void reset();

    int64_t i64(int col) const { return sqlite3_column_int64(s_, col); }
    int i32(int col) const { return int(sqlite3_column_int64(s_, col)); }
    double f64(int col) const { return sqlite3_column_double(s_, col); }
    bool is_null(int col) const { return sqlite3_column_type(s_, col) == SQLITE_NULL; }
    std::string text(int col) const;
    const void* blob(int col) const { return sqlite3_column_blob(s_, col); }
    size_t bytes(int col) const { return size_t(sqlite3_column_bytes(s_, col)); }

    sqlite3_stmt* handle() const { return s_; }

   private:
    Stmt& check_bind(int rc);
    [[noreturn]] void fail_insert(int rc);
    Db* db_ = nullptr;
    sqlite3_stmt* s_ = nullptr;
};

// One connection. Each thread uses its own Db (SQLite connections are not shared here).
class Db {
   public:
    // Opens `path` with sqlite3_open_v2 `flags`; throws SessionError on failure. `uri`, when
    // given, is what SQLite opens instead (a file: URI with parameters for the same file);
    // `vfs`, when given, names the SQLite VFS to open it through (space_reserve.h).
    Db(const std::string& path, int flags, const std::string& uri = "", const char* vfs = nullptr);
    ~Db();
    Db(const Db&) = delete;
    Db& operator=(const Db&) = delete;

    sqlite3* handle() const { return h_; }
    const std::string& path() const { return path_; }

    // Runs one or more statements without results.
    void exec(std::string_view sql, std::string_view context);
    Stmt prepare(std::string_view sql) { return Stmt(*this, sql); }
    // First column of the first row as integer / text (`def` when there is no row).
    int64_t query_int(std::string_view sql, int64_t def, std::string_view context);
    std::string query_text(std::string_view sql, const std::string& def, std::string_view context);
    bool table_exists(const std::string& name);

   private:
    sqlite3* h_ = nullptr;
    std::string path_;
};

// RAII transaction: BEGIN IMMEDIATE (or DEFERRED for readers) ... COMMIT; rolls back when
// destroyed without commit() (an exception in between).
class Transaction {
   public:
    explicit Transaction(Db& db, bool immediate = true);
    ~Transaction();
    void commit();
    Transaction(const Transaction&) = delete;
    Transaction& operator=(const Transaction&) = delete;

   private:
    Db& db_;
    bool open_ = false;
};

}  // namespace kv::storage
