// `kvlab runs` and `kvlab export`: the CLI commands that read session files (storage/).
// Declared apart from commands.h so the storage library stays optional for the rest of the CLI;
// main.cpp dispatches to them.
#pragma once

#include "cli_args.h"

namespace kv::cli {

// kvlab runs FILE [--json]: the session's runs as a table (or JSON).
int cmd_runs(int argc, char** argv, int first);
// kvlab export FILE --run N --what memory|spans|metrics|all --format csv|chrome-trace|torch-snapshot -o PATH
int cmd_export(int argc, char** argv, int first);
// kvlab sql FILE QUERY|NAME [--run N] [--format table|md|csv|json]; kvlab sql --list (cmd_sql.cpp)
int cmd_sql(int argc, char** argv, int first);
// kvlab diff FILE RUN_A RUN_B [--format table|md|csv|json] (cmd_diff.cpp)
int cmd_diff(int argc, char** argv, int first);

}  // namespace kv::cli
