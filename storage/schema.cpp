// Session schema, validation and migrations (see schema.h).
//
// Index
//   [SECTION] DDL (tables, indexes, enum tables)
//   [SECTION] Validation (read-only checks before any write)
//   [SECTION] Migrations
#include "schema.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "engine/memory/mem_category.h"
#include "engine/telemetry/event_types.h"
#include "storage/event_blocks.h"
#include "storage/record_tables.h"
#include "storage/sample_tokens.h"

namespace kv::storage {

// =========================================================================================
// [SECTION] DDL
// =========================================================================================
// Times: *_ns columns are the engine's steady clock (kv::now_ns(); subtract runs.t0_ns for time
// since the run started); *_ms columns are wall-clock Unix milliseconds. -1 means "not
// applicable" in layer/chunk/cell columns, as in the engine API. Event tables carry no NOT NULL
// constraints: only the writer fills them, never with NULLs, and each constraint is a check per
// column per row on the hot path. Tables named after CUPTI
// activity kinds use Nsight Systems' export names and columns (plus run_id), with names as ids
// into StringIds, so nsys SQL recipes run unchanged.
// Block-range indexes of spans and memory_events (storage/event_blocks.h): a time window of
// one run is an id range per block, not a per-row B-tree entry.
// A person's notes on a run (the GUI's runs table): a table of its own, so the runs table's
// columns and every reader of them stay as they were. No row: no notes.
#define KVLAB_RUN_NOTES_SQL "CREATE TABLE IF NOT EXISTS run_notes(run_id INTEGER PRIMARY KEY, notes TEXT NOT NULL);\n"
#define KVLAB_EVENT_BLOCKS_SQL                                                                             \
    "CREATE TABLE span_blocks(run_id INTEGER, first_id INTEGER, last_id INTEGER, rows INTEGER, "        \
    "start_min INTEGER, end_max INTEGER);\n"                                                           \
    "CREATE INDEX span_blocks_run ON span_blocks(run_id, first_id);\n"                                 \
    "CREATE TABLE memory_blocks(run_id INTEGER, first_id INTEGER, last_id INTEGER, rows INTEGER, "      \
    "t_min INTEGER, t_max INTEGER, state BLOB);\n"                                                     \
    "CREATE INDEX memory_blocks_run ON memory_blocks(run_id, first_id);\n"
namespace {
const char* const kCreateSql = R"SQL(
CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);

CREATE TABLE StringIds(id INTEGER PRIMARY KEY, value TEXT NOT NULL UNIQUE);

)SQL" KVLAB_EVENT_BLOCKS_SQL KVLAB_SAMPLE_TOKENS_SQL KVLAB_RUN_NOTES_SQL R"SQL(

CREATE INDEX cache_steps_layer ON cache_steps(run_id, layer, chunk);

CREATE INDEX score_snapshots_layer ON score_snapshots(run_id, layer, chunk);

CREATE INDEX cells_run ON cells(run_id, row, col);

CREATE INDEX metrics_name ON metrics(run_id, name, step);

CREATE INDEX logs_run ON logs(run_id);

CREATE INDEX cupti_kernel_time ON CUPTI_ACTIVITY_KIND_KERNEL(run_id, start);

CREATE INDEX cupti_memcpy_time ON CUPTI_ACTIVITY_KIND_MEMCPY(run_id, start);

CREATE INDEX cupti_memset_time ON CUPTI_ACTIVITY_KIND_MEMSET(run_id, start);

CREATE INDEX cuda_memory_time ON CUDA_GPU_MEMORY_USAGE_EVENTS(run_id, start);

CREATE INDEX cupti_external_correlation ON CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION(run_id, correlationId);

CREATE TABLE ENUM_KVLAB_SPAN_CATEGORY(id INTEGER PRIMARY KEY, name TEXT NOT NULL);
CREATE TABLE ENUM_KVLAB_MEM_CATEGORY(id INTEGER PRIMARY KEY, name TEXT NOT NULL);
)SQL";

int64_t wall_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}
}  // namespace

void configure_connection(Db& db, bool writer) {
    sqlite3_busy_timeout(db.handle(), 5000);
    if (writer) {
        // NORMAL in WAL mode: commits do not fsync (checkpoints do); a crash can lose the last
        // commits of a power failure, never corrupt the file, and a killed process loses nothing
        // committed. A bigger autocheckpoint keeps checkpoint stalls out of most commits.
        db.exec(
            "PRAGMA synchronous=NORMAL; PRAGMA temp_store=MEMORY; PRAGMA cache_size=-65536;"
            "PRAGMA wal_autocheckpoint=8192;",
            "configuring the connection");
    } else {
        db.exec("PRAGMA query_only=1; PRAGMA cache_size=-32768;", "configuring a read-only connection");
    }
}

void schema_create(Db& db) {
    // 16 KiB pages: measured ~10% faster appends than 4 KiB for our row sizes, and fewer
    // B-tree levels for 10M-row tables. Must precede the first write (and WAL).
    db.exec(str("PRAGMA page_size=", kPageSize, ";"), "setting the page size");
    // WAL must be set outside a transaction; it is persistent in the file.
    std::string mode = db.query_text("PRAGMA journal_mode=WAL", "", "switching the session to WAL mode");
    if (mode != "wal")
        throw SessionError(SessionErrorKind::NOT_WRITABLE,
                           str("session '", db.path(), "': cannot switch to WAL mode (journal_mode is '", mode, "')"),
                           "put the session on a local file system that supports shared memory");
    Transaction tx(db);
    // Tables with a column table (storage/record_tables.h) first: kCreateSql indexes them.
    db.exec(tables::runs().create_sql() + tables::spans().create_sql() + tables::memory_events().create_sql() + tables::cache_steps().create_sql() + tables::score_snapshots().create_sql() + tables::cells().create_sql() + tables::cupti_kernel().create_sql() +
                tables::cupti_memcpy().create_sql() + tables::cupti_memset().create_sql() +
                tables::cuda_memory_usage().create_sql() + tables::metrics().create_sql() + tables::logs().create_sql() +
                tables::cupti_external_correlation().create_sql(),
            "creating the session tables");
    db.exec(kCreateSql, "creating the session tables");
    db.exec(str("PRAGMA application_id=", kApplicationId, "; PRAGMA user_version=", kSchemaVersion, ";"),
            "stamping the session header");
    Stmt meta = db.prepare("INSERT INTO meta(key, value) VALUES(?, ?)");
    auto put = [&](const char* k, const std::string& v) {
        meta.bind(1, k).bind(2, std::string_view(v));
        meta.run();
    };
    put("magic", kMagic);
    put("schema_version", std::to_string(kSchemaVersion));
    put("created_ms", std::to_string(wall_ms()));
    Stmt sc = db.prepare("INSERT INTO ENUM_KVLAB_SPAN_CATEGORY(id, name) VALUES(?, ?)");
    for (size_t i = 0; i < trace::kNumSpanCategories; ++i) {
        sc.bind(1, int(i)).bind(2, trace::span_category_name(trace::SpanCategory(i)));
        sc.run();
    }
    Stmt mc = db.prepare("INSERT INTO ENUM_KVLAB_MEM_CATEGORY(id, name) VALUES(?, ?)");
    for (size_t i = 0; i < kNumMemCategories; ++i) {
        mc.bind(1, int(i)).bind(2, mem_category_name(MemCategory(i)));
        mc.run();
    }
    tx.commit();
}

// =========================================================================================
// [SECTION] Validation
// =========================================================================================
namespace {
[[noreturn]] void not_a_session(const Db& db, const std::string& why) {
    throw SessionError(SessionErrorKind::NOT_A_SESSION, str("'", db.path(), "' is not a kvlab session file: ", why),
                       "choose a .kvlab session file, or a new file name to create one");
}

int64_t file_size(const std::string& path) {
    struct stat st {};
    return stat(path.c_str(), &st) == 0 ? int64_t(st.st_size) : -1;
}
}  // namespace

// Reads the 100-byte SQLite header through SQLite's own file handle. Opening the file a second
// time ourselves is not an option: closing that descriptor would drop every POSIX lock this
// process holds on the file, including those of other connections (the writer's).
namespace {
uint32_t be32(const unsigned char* p) {
    return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | p[3];
}

void check_header(Db& db) {
    sqlite3_file* f = nullptr;
    if (sqlite3_file_control(db.handle(), "main", SQLITE_FCNTL_FILE_POINTER, &f) != SQLITE_OK || !f || !f->pMethods)
        return;
    const int64_t size = file_size(db.path());
    if (size >= 0 && size < 100) {
        unsigned char head[16] = {0};
        if (size >= 16 && f->pMethods->xRead(f, head, 16, 0) == SQLITE_OK &&
            std::memcmp(head, "SQLite format 3", 16) == 0)
            throw SessionError(SessionErrorKind::DAMAGED,
                               str("session '", db.path(), "' is truncated: ", size,
                                   " bytes, shorter than the 100-byte SQLite header"),
                               "the file was cut short; restore it from a backup");
        not_a_session(db, "it is not an SQLite database (too short)");
    }
    unsigned char h[100] = {0};
    if (f->pMethods->xRead(f, h, 100, 0) != SQLITE_OK) return;  // let SQLite report it
    if (std::memcmp(h, "SQLite format 3", 16) != 0) not_a_session(db, "it is not an SQLite database");
    int64_t page_size = int64_t(h[16]) << 8 | h[17];
    if (page_size == 1) page_size = 65536;
    const uint32_t change_counter = be32(h + 24), pages = be32(h + 28), valid_for = be32(h + 92);
    // The in-header size is only meaningful when written by the same transaction as the change
    // counter; with a non-empty WAL, the newest pages may legitimately live there.
    const int64_t wal = file_size(db.path() + "-wal");
    if (pages && valid_for == change_counter && wal <= 0 && size >= 0 && size < int64_t(pages) * page_size)
        throw SessionError(SessionErrorKind::DAMAGED,
                           str("session '", db.path(), "' is truncated: its header describes ",
                               int64_t(pages) * page_size, " bytes but the file has ", size),
                           "the file was cut short (copy interrupted, disk full); restore it from a backup or try "
                           "`sqlite3 FILE .recover`");
}
}  // namespace

int schema_validate(Db& db, int max_version) {
    check_header(db);
    int64_t app_id = 0;
    try {
        app_id = db.query_int("PRAGMA application_id", 0, "reading the file header");
    } catch (const SessionError& e) {
        if (e.kind() == SessionErrorKind::NOT_A_SESSION) not_a_session(db, "it is not an SQLite database");
        if (e.kind() == SessionErrorKind::DAMAGED)
            throw SessionError(SessionErrorKind::DAMAGED, str("session '", db.path(), "' is damaged: ", e.what()),
                               e.hint());
        throw;
    }
    try {
        int64_t pages = db.query_int("PRAGMA page_count", 0, "reading the page count");
        if (pages == 0) not_a_session(db, "it is empty");
        const bool has_meta = db.table_exists("meta");
        std::string magic =
            has_meta ? db.query_text("SELECT value FROM meta WHERE key='magic'", "", "reading the magic") : "";
        if (app_id != kApplicationId || magic != kMagic) {
            char buf[32];
            std::snprintf(buf, sizeof buf, "0x%08llx", (unsigned long long)(uint32_t)app_id);
            not_a_session(db, str("it is an SQLite database of another application (application_id ", buf,
                                  magic.empty() ? ", no kvlab meta table)" : ", meta magic '" + magic + "')"));
        }
        int64_t user_version = db.query_int("PRAGMA user_version", 0, "reading the schema version");
        std::string meta_version =
            db.query_text("SELECT value FROM meta WHERE key='schema_version'", "0", "reading the schema version");
        int64_t version = std::max<int64_t>(user_version, std::atoll(meta_version.c_str()));
        if (version > max_version)
            throw SessionError(SessionErrorKind::NEWER_SCHEMA,
                               str("session '", db.path(), "' was written by a newer kvlab (schema version ", version,
                                   "); this build reads schema versions up to ", max_version),
                               "open it with the kvlab version that wrote it, or a newer one");
        if (version < 1) not_a_session(db, str("unknown schema version ", version));
        // A file shorter than its header says lost pages (copied while written, truncated). With
        // a non-empty WAL the newest pages may legitimately live there, so only check without.
        const int64_t page_size = db.query_int("PRAGMA page_size", 4096, "reading the page size");
        const int64_t size = file_size(db.path());
        const int64_t wal = file_size(db.path() + "-wal");
        if (wal <= 0 && size >= 0 && size < pages * page_size)
            throw SessionError(SessionErrorKind::DAMAGED,
                               str("session '", db.path(), "' is truncated: its header describes ", pages * page_size,
                                   " bytes but the file has ", size),
                               "the file was cut short (copy interrupted, disk full); restore it from a backup or "
                               "try `sqlite3 FILE .recover`");
        return int(version);
    } catch (const SessionError& e) {
        if (e.kind() == SessionErrorKind::DAMAGED && std::string(e.what()).find("is damaged") == std::string::npos &&
            std::string(e.what()).find("is truncated") == std::string::npos)
            throw SessionError(SessionErrorKind::DAMAGED, str("session '", db.path(), "' is damaged: ", e.what()),
                               e.hint());
        throw;
    }
}

// =========================================================================================
// [SECTION] Migrations
// =========================================================================================
const std::vector<Migration>& schema_migrations() {
    static const std::vector<Migration> migrations = {
        // 1 -> 2: the B-tree indexes of spans and memory_events give way to block-range
        // indexes, built here from the rows already in the file.
        {1,
         "DROP INDEX IF EXISTS spans_window; DROP INDEX IF EXISTS memory_events_time;\n" KVLAB_EVENT_BLOCKS_SQL,
         rebuild_event_blocks},
        // 2 -> 3: runs.status may be 'degraded' (finished, telemetry lost). SQLite cannot alter a
        // CHECK constraint, so the (small) runs table is rebuilt with the same columns.
        {2, tables::runs().create_sql("runs_v3") + "INSERT INTO runs_v3 SELECT * FROM runs; DROP TABLE runs; "
                                                   "ALTER TABLE runs_v3 RENAME TO runs;\n",
         nullptr},
        // 3 -> 4: each evaluated sample's token ids, pieces and per-position loss.
        {3, KVLAB_SAMPLE_TOKENS_SQL, nullptr},
        // 4 -> 5: notes on runs (an empty table: older files had none).
        {4, KVLAB_RUN_NOTES_SQL, nullptr},
    };
    return migrations;
}

void schema_migrate(Db& db, int target, const std::vector<Migration>& migrations) {
    int version = int(db.query_int("PRAGMA user_version", 0, "reading the schema version"));
    if (version >= target) return;
    Transaction tx(db);
    // Read again under the write lock: another process opening the same old file may have
    // migrated it while this one waited for the lock (its CREATE TABLEs would then fail here).
    version = int(db.query_int("PRAGMA user_version", 0, "reading the schema version"));
    if (version >= target) return;
    while (version < target) {
        const Migration* m = nullptr;
        for (const auto& x : migrations)
            if (x.from == version) m = &x;
        if (!m)
            throw SessionError(SessionErrorKind::INVALID,
                               str("session '", db.path(), "': no migration from schema version ", version, " to ",
                                   version + 1, " in this build"));
        db.exec(m->sql, str("migrating the session from schema version ", version, " to ", version + 1));
        if (m->run) m->run(db);
        ++version;
    }
    db.exec(str("PRAGMA user_version=", version, ";"), "recording the schema version");
    Stmt s = db.prepare("UPDATE meta SET value=? WHERE key='schema_version'");
    std::string v = std::to_string(version);
    s.bind(1, std::string_view(v));
    s.run();
    tx.commit();
}

}  // namespace kv::storage
