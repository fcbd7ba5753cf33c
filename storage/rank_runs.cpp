// Rank runs of data-parallel runs (see rank_runs.h).
#include "storage/rank_runs.h"

#include <nlohmann/json.hpp>

#include <map>

#include "storage/session_file.h"
#include "storage/sqlite_util.h"

namespace kv::storage {

namespace {

std::vector<std::string> columns_of(Db& db, const std::string& table) {
    std::vector<std::string> out;
    Stmt q(db, "SELECT name FROM pragma_table_info(?) ORDER BY cid");
    q.bind(1, table);
    while (q.step()) out.push_back(q.text(0));
    return out;
}

// The target's columns of `table`, and what to select for each: `over`'s expression, else the
// source row's column of that name.
std::pair<std::string, std::string> column_lists(Db& db, const std::string& table, const std::map<std::string, std::string>& over) {
    std::string cols, values;
    for (const std::string& c : columns_of(db, table)) {
        if (!cols.empty()) cols.append(","), values.append(",");
        cols.append("\"").append(c).append("\"");
        auto it = over.find(c);
        if (it != over.end()) values.append(it->second);
        else values.append("s.\"").append(c).append("\"");
    }
    return {cols, values};
}

// INSERT INTO main.T(cols) SELECT <override or s.col> FROM src.T s WHERE s.run_id = ?1 ORDER BY
// rowid: every column the target has, so tables other sessions (or later kvlab) extended copy
// whole. `over` replaces a column's value with an SQL expression (parameters ?1 = source run,
// ?2 = new run, ?3 = id offset).
int64_t copy_rows(Db& db, const std::string& table, const std::map<std::string, std::string>& over, int64_t src_run,
                  int64_t new_run, int64_t id_offset) {
    const auto [cols, values] = column_lists(db, table, over);
    Stmt q(db, str("INSERT INTO main.", table, "(", cols, ") SELECT ", values, " FROM src.", table, " s WHERE s.run_id = ?1 ORDER BY s.rowid"));
    // Unused parameters are fine to bind only when they exist in the statement.
    const int n = sqlite3_bind_parameter_count(q.handle());
    if (n >= 1) q.bind(1, src_run);
    if (n >= 2) q.bind(2, new_run);
    if (n >= 3) q.bind(3, id_offset);
    q.run();
    return sqlite3_changes(db.handle());
}

}  // namespace

RankImport import_rank_run(const std::string& dst_path, int64_t parent_run, int rank, const std::string& src_path,
                           int64_t src_run) {
    // Validates (and migrates) the rank's file before anything is written to the target.
    open_session_db(src_path, OpenMode::READ_WRITE).reset();
    std::unique_ptr<Db> db = open_session_db(dst_path, OpenMode::READ_WRITE, true);
    {
        Stmt a(*db, "ATTACH DATABASE ? AS src");
        a.bind(1, src_path);
        a.run();
    }
    RankImport out;
    {
        Transaction txn(*db);
        std::string name, config, status, error;
        {
            Stmt q(*db, "SELECT name, config, status, error FROM src.runs WHERE id = ?");
            q.bind(1, src_run);
            if (!q.step())
                throw SessionError(SessionErrorKind::INVALID, str("rank ", rank, "'s session ", src_path, " has no run ", src_run));
            name = q.text(0), config = q.text(1), status = q.text(2), error = q.text(3);
        }
        std::string parent_name;
        {
            Stmt q(*db, "SELECT name FROM main.runs WHERE id = ?");
            q.bind(1, parent_run);
            if (!q.step()) throw SessionError(SessionErrorKind::INVALID, str("session ", dst_path, " has no run ", parent_run));
            parent_name = q.text(0);
        }
        nlohmann::json cfg = nlohmann::json::parse(config, nullptr, false);
        if (!cfg.is_object()) cfg = nlohmann::json::object();
        cfg["dist"]["rank"] = rank;
        cfg["dist"]["rank_of"] = parent_run;
        // A rank that died mid-run left its run `running` (or queued): it will never finish.
        const bool unfinished = status == "running" || status == "queued";
        if (unfinished && error.empty()) error = str("rank ", rank, " stopped before its run finished");
        const std::string patched = cfg.dump();
        const std::string rank_name = str(parent_name, " · rank ", rank);
        std::map<std::string, std::string> run_over = {
            {"id", "NULL"},
            {"name", "?4"},
            {"config", "?5"},
            {"status", unfinished ? "'crashed'" : "s.status"},
            {"error", "?6"},
            {"owner_pid", "NULL"},
            {"owner_start", "NULL"},
            {"owner_boot", "NULL"},
            {"owner_host", "NULL"},
        };
        {
            const auto [cols, values] = column_lists(*db, "runs", run_over);
            Stmt q(*db, str("INSERT INTO main.runs(", cols, ") SELECT ", values, " FROM src.runs s WHERE s.id = ?1"));
            q.bind(1, src_run).bind(4, rank_name).bind(5, patched).bind(6, error);
            q.run();
            out.run = sqlite3_last_insert_rowid(db->handle());
        }
        db->exec("INSERT OR IGNORE INTO main.StringIds(value) SELECT value FROM src.StringIds", "importing a rank's strings");
        auto remap = [](const char* col) {
            return str("(SELECT m.id FROM main.StringIds m WHERE m.value = (SELECT x.value FROM src.StringIds x WHERE x.id = s.", col, "))");
        };
        // Event ids move up by the target's largest id, so the block index's id ranges move with
        // them (blocks of one run stay in id order).
        const int64_t span_off = db->query_int("SELECT coalesce(max(id), 0) FROM main.spans", 0, "rank import");
        const int64_t mem_off = db->query_int("SELECT coalesce(max(id), 0) FROM main.memory_events", 0, "rank import");
        out.spans = copy_rows(*db, "spans", {{"id", "s.id + ?3"}, {"run_id", "?2"}, {"name_id", remap("name_id")}}, src_run, out.run, span_off);
        copy_rows(*db, "span_blocks", {{"run_id", "?2"}, {"first_id", "s.first_id + ?3"}, {"last_id", "s.last_id + ?3"}}, src_run, out.run,
                  span_off);
        out.memory_events = copy_rows(*db, "memory_events", {{"id", "s.id + ?3"}, {"run_id", "?2"}, {"label_id", remap("label_id")}},
                                      src_run, out.run, mem_off);
        copy_rows(*db, "memory_blocks", {{"run_id", "?2"}, {"first_id", "s.first_id + ?3"}, {"last_id", "s.last_id + ?3"}}, src_run, out.run,
                  mem_off);
        out.metrics = copy_rows(*db, "metrics", {{"id", "NULL"}, {"run_id", "?2"}}, src_run, out.run, 0);
        for (const char* t : {"logs", "cells"}) copy_rows(*db, t, {{"id", "NULL"}, {"run_id", "?2"}}, src_run, out.run, 0);
        txn.commit();
    }
    db->exec("DETACH DATABASE src", "importing a rank's run");
    return out;
}

int run_rank(const RunInfo& r) {
    const auto j = nlohmann::json::parse(r.config.empty() ? "{}" : r.config, nullptr, false);
    if (!j.is_object() || !j.contains("dist") || !j["dist"].is_object()) return 0;
    const auto& d = j["dist"];
    return d.contains("rank") && d["rank"].is_number_integer() ? d["rank"].get<int>() : 0;
}

int64_t rank_run_parent(const RunInfo& r) {
    if (r.config.find("rank_of") == std::string::npos) return 0;  // cheap: most runs are not ranks
    const auto j = nlohmann::json::parse(r.config, nullptr, false);
    if (!j.is_object() || !j.contains("dist") || !j["dist"].is_object()) return 0;
    const auto& d = j["dist"];
    return d.contains("rank_of") && d["rank_of"].is_number_integer() ? d["rank_of"].get<int64_t>() : 0;
}

std::vector<int64_t> rank_runs(const std::vector<RunInfo>& runs, int64_t run) {
    std::vector<int64_t> out{run};
    for (const RunInfo& r : runs) {
        if (r.id == run) {
            // Ranks whose telemetry never arrived still count (0 ids).
            const auto j = nlohmann::json::parse(r.config.empty() ? "{}" : r.config, nullptr, false);
            if (j.is_object() && j.contains("dist") && j["dist"].is_object() && j["dist"].contains("ranks") &&
                j["dist"]["ranks"].is_number_integer()) {
                const int64_t n = j["dist"]["ranks"].get<int64_t>();
                if (n > int64_t(out.size()) && n <= 4096) out.resize(size_t(n), 0);
            }
        }
        if (rank_run_parent(r) != run) continue;
        const int k = run_rank(r);
        if (k <= 0 || k > 4096) continue;
        if (out.size() <= size_t(k)) out.resize(size_t(k) + 1, 0);
        out[size_t(k)] = r.id;
    }
    return out;
}

}  // namespace kv::storage
