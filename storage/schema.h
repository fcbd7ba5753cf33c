// The session file format: magic and version (meta table, PRAGMA application_id/user_version),
// the tables and indexes, the checks that run before anything is written to an existing file,
// and forward migrations. A file from a newer schema, a foreign SQLite file, an empty,
// truncated or garbage file gets a named SessionError -- never a silent misread, never a write.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "storage/sqlite_util.h"

namespace kv::storage {

// 'KVLB' in the SQLite header (PRAGMA application_id): identifies the file without a query.
constexpr int kApplicationId = 0x4B564C42;
constexpr const char* kMagic = "kvlab-session";
// Version of the schema this build writes. Bump it and add a Migration for every change.
constexpr int kSchemaVersion = 5;
constexpr int kPageSize = 16384;

// One forward step turning a version-`from` file into version `from + 1`: SQL, then (when set)
// code for what SQL cannot express, in the same transaction.
struct Migration {
    int from = 0;
    std::string sql;
    std::function<void(Db&)> run;
};
// This build's migrations, ordered by `from`.
const std::vector<Migration>& schema_migrations();

// Creates every table and index and the meta rows of a new, empty database (in a transaction).
void schema_create(Db& db);

// Checks that `db` is a kvlab session this build can read: SQLite header, application id,
// magic, version not newer than `max_version`, file not shorter than its header says.
// Reads only. Returns the file's schema version.
int schema_validate(Db& db, int max_version = kSchemaVersion);

// Applies `migrations` (from the file's version up to `target`) in one transaction.
// Used on read-write opens of older files; tests pass their own migration lists.
void schema_migrate(Db& db, int target, const std::vector<Migration>& migrations);

// Connection settings shared by all connections (busy timeout, foreign keys off, ...).
void configure_connection(Db& db, bool writer);

}  // namespace kv::storage
