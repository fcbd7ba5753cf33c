// One read-only SQL statement against a session file (what `kvlab sql` runs): the session is
// opened read-only (SQLITE_OPEN_READONLY plus query_only, see session_file.h), a statement
// that would write is refused before it runs, and named parameters (:run, :limit, ...) are
// bound from a map. Never writes, never migrates.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "storage/query_result.h"

namespace kv::storage {

// Parameter values by name without the ':' ("run" -> "3"). Integers and reals bind as numbers,
// anything else as text. Parameters of the statement not in the map bind as NULL unless
// `required` names them (then SessionError INVALID names the missing one).
using QueryParams = std::map<std::string, std::string>;

// Throws SessionError: the session's own open errors; INVALID for SQL that does not compile
// (SQLite's message), for more than one statement, and for a statement that writes
// ("... kvlab sql only reads; expected a SELECT, WITH, EXPLAIN or a reading PRAGMA").
QueryResult session_query(const std::string& path, const std::string& sql, const QueryParams& params = {},
                          const std::vector<std::string>& required = {});

}  // namespace kv::storage
