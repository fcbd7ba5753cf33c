// Opening and creating session files: existence and permission checks with messages a user can
// act on, validation before any write (schema.h), forward migration of older files on
// read-write opens, WAL and connection settings. Every connection in storage/ (session,
// writer, readers) is opened through here, so a bad file fails the same way everywhere.
#pragma once

#include <memory>
#include <string>

#include "storage/sqlite_util.h"

namespace kv::storage {

enum class OpenMode { READ_WRITE, READ_ONLY };

// Opens an existing session (throws SessionError: NOT_FOUND, NOT_A_SESSION, NEWER_SCHEMA,
// DAMAGED, NOT_WRITABLE). `writer` selects the writer connection settings; `vfs` names the SQLite
// VFS to write through (the telemetry writer's reserve VFS, space_reserve.h).
std::unique_ptr<Db> open_session_db(const std::string& path, OpenMode mode, bool writer = false, const char* vfs = nullptr);
// Creates a new session file; fails (INVALID) if anything exists at `path`.
std::unique_ptr<Db> create_session_db(const std::string& path);
bool session_file_exists(const std::string& path);
// Replaces an empty or table-less file at `path` (left by a creator killed mid-way) with a
// fresh session; true when it did. Anything else at `path` is left alone.
bool repair_half_created_session(const std::string& path);

}  // namespace kv::storage
