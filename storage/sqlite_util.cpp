// SQLite wrappers and error mapping (see sqlite_util.h). Errors always name the session file;
// nothing here exits or swallows an SQLite error.
#include "sqlite_util.h"

#include <cstring>
#include <mutex>

namespace kv::storage {

const char* session_error_kind_name(SessionErrorKind k) {
    switch (k) {
        case SessionErrorKind::NOT_FOUND:
            return "not_found";
        case SessionErrorKind::NOT_A_SESSION:
            return "not_a_session";
        case SessionErrorKind::NEWER_SCHEMA:
            return "newer_schema";
        case SessionErrorKind::DAMAGED:
            return "damaged";
        case SessionErrorKind::NOT_WRITABLE:
            return "not_writable";
        case SessionErrorKind::BUSY:
            return "busy";
        case SessionErrorKind::IO:
            return "io";
        case SessionErrorKind::INVALID:
            return "invalid";
    }
    return "unknown";
}

SessionErrorKind session_error_kind_for(int rc) {
    switch (rc & 0xff) {
        case SQLITE_NOTADB:
            return SessionErrorKind::NOT_A_SESSION;
        case SQLITE_CORRUPT:
            return SessionErrorKind::DAMAGED;
        case SQLITE_READONLY:
        case SQLITE_PERM:
        case SQLITE_CANTOPEN:
        case SQLITE_AUTH:
            return SessionErrorKind::NOT_WRITABLE;
        case SQLITE_BUSY:
        case SQLITE_LOCKED:
            return SessionErrorKind::BUSY;
        case SQLITE_FULL:
        case SQLITE_IOERR:
        case SQLITE_NOMEM:
            return SessionErrorKind::IO;
        default:
            return SessionErrorKind::INVALID;
    }
}

namespace {
std::string hint_for(SessionErrorKind k) {
    switch (k) {
        case SessionErrorKind::NOT_A_SESSION:
            return "choose a .kvlab session file, or a new file name to create one";
        case SessionErrorKind::DAMAGED:
            return "the file is damaged (truncated or overwritten); copy it aside and try `sqlite3 FILE .recover`";
        case SessionErrorKind::NOT_WRITABLE:
            return "make the file and its directory writable (SQLite also creates FILE-wal and FILE-shm there), "
                   "or open it read-only";
        case SessionErrorKind::BUSY:
            return "another process holds the session; close it there or wait";
        case SessionErrorKind::IO:
            return "check free disk space and the device holding the session";
        default:
            return {};
    }
}
}  // namespace

void throw_sqlite(sqlite3* db, const std::string& path, int rc, const char* expr, const char* file, int line,
                  std::string_view context) {
    const char* msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    if (!msg || !*msg) msg = sqlite3_errstr(rc);
    const char* base = std::strrchr(file, '/');
    SessionErrorKind kind = session_error_kind_for(rc);
    // An I/O error's cause is in errno: "No space left on device", "File too large" (a file-size
    // limit) say what to do, SQLite's "disk I/O error" does not.
    const int sys = db && (rc & 0xff) == SQLITE_IOERR ? sqlite3_system_errno(db) : 0;
    throw SessionError(kind,
                       str("session '", path, "': ", context, " failed: ", msg, sys ? str(": ", std::strerror(sys)) : "",
                           " (sqlite error ", rc, ") [", base ? base + 1 : file, ":", line, " ", expr, "]"),
                       hint_for(kind));
}

// ---- Stmt -------------------------------------------------------------------------------
Stmt::Stmt(Db& db, std::string_view sql) : db_(&db) {
    KV_CHECK_SQLITE(
        db, sqlite3_prepare_v3(db.handle(), sql.data(), int(sql.size()), SQLITE_PREPARE_PERSISTENT, &s_, nullptr),
        str("preparing '", sql.substr(0, 60), sql.size() > 60 ? "...'" : "'"));
}

Stmt::~Stmt() {
    if (s_) sqlite3_finalize(s_);
}

Stmt& Stmt::operator=(Stmt&& o) noexcept {
    if (this != &o) {
        if (s_) sqlite3_finalize(s_);
        db_ = o.db_;
        s_ = std::exchange(o.s_, nullptr);
    }
    return *this;
}

Stmt& Stmt::check_bind(int rc) {
    if (rc != SQLITE_OK) KV_CHECK_SQLITE(*db_, rc, "binding a value");
    return *this;
}

bool Stmt::step() {
    int rc = sqlite3_step(s_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    const char* sql = sqlite3_sql(s_);
    std::string what = str("running '", std::string_view(sql ? sql : "").substr(0, 60), "'");
    sqlite3_reset(s_);
    throw_sqlite(db_->handle(), db_->path(), rc, "sqlite3_step", __FILE__, __LINE__, what);
}

void Stmt::fail_insert(int rc) {
    const char* sql = sqlite3_sql(s_);
    throw_sqlite(db_->handle(), db_->path(), rc, "sqlite3_step", __FILE__, __LINE__,
                 str("running '", std::string_view(sql ? sql : "").substr(0, 60), "'"));
}

void Stmt::run() {
    while (step()) {
    }
    reset();
}

void Stmt::reset() {
    sqlite3_reset(s_);
    sqlite3_clear_bindings(s_);
}

std::string Stmt::text(int col) const {
    const unsigned char* t = sqlite3_column_text(s_, col);
    return t ? std::string(reinterpret_cast<const char*>(t), size_t(sqlite3_column_bytes(s_, col))) : std::string();
}

// ---- Db ---------------------------------------------------------------------------------
Db::Db(const std::string& path, int flags, const std::string& uri, const char* vfs) : path_(path) {
    // Process-wide, before SQLite initializes: without memory statistics every SQLite malloc
    // skips a global mutex (~5% of the writer's time). Harmless (MISUSE) if already initialized.
    static std::once_flag once;
    std::call_once(once, [] { sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0); });
    int rc = sqlite3_open_v2(uri.empty() ? path.c_str() : uri.c_str(), &h_, flags | SQLITE_OPEN_NOMUTEX, vfs);
    if (rc != SQLITE_OK) {
        std::string msg = h_ ? sqlite3_errmsg(h_) : sqlite3_errstr(rc);
        if (h_) sqlite3_close_v2(h_);
        h_ = nullptr;
        SessionErrorKind kind = session_error_kind_for(rc);
        throw SessionError(kind, str("session '", path, "': cannot open: ", msg, " (sqlite error ", rc, ")"),
                           hint_for(kind));
    }
    sqlite3_extended_result_codes(h_, 1);
}

Db::~Db() {
    if (h_) sqlite3_close_v2(h_);
}

void Db::exec(std::string_view sql, std::string_view context) {
    std::string s(sql);
    KV_CHECK_SQLITE(*this, sqlite3_exec(h_, s.c_str(), nullptr, nullptr, nullptr), context);
}

int64_t Db::query_int(std::string_view sql, int64_t def, std::string_view context) {
    try {
        Stmt s(*this, sql);
        return s.step() ? s.i64(0) : def;
    } catch (const SessionError& e) {
        throw SessionError(e.kind(), str(e.what(), " (while ", context, ")"), e.hint());
    }
}

std::string Db::query_text(std::string_view sql, const std::string& def, std::string_view context) {
    try {
        Stmt s(*this, sql);
        return s.step() ? s.text(0) : def;
    } catch (const SessionError& e) {
        throw SessionError(e.kind(), str(e.what(), " (while ", context, ")"), e.hint());
    }
}

bool Db::table_exists(const std::string& name) {
    Stmt s(*this, "SELECT 1 FROM sqlite_master WHERE type='table' AND name=?");
    s.bind(1, std::string_view(name));
    return s.step();
}

// ---- Transaction ------------------------------------------------------------------------
Transaction::Transaction(Db& db, bool immediate) : db_(db) {
    db_.exec(immediate ? "BEGIN IMMEDIATE" : "BEGIN DEFERRED", "starting a transaction");
    open_ = true;
}

Transaction::~Transaction() {
    if (open_) sqlite3_exec(db_.handle(), "ROLLBACK", nullptr, nullptr, nullptr);
}

void Transaction::commit() {
    db_.exec("COMMIT", "committing a transaction");
    open_ = false;
}

}  // namespace kv::storage
