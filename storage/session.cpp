// Session: run lifecycle on the session's own connection (see session.h). Never writes events
// (SessionWriter does) and never changes a run that already reached a final status.
#include "session.h"

#include <sys/utsname.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "engine/memory/memory_tracker.h"
#include "storage/liveness.h"
#include "storage/rank_runs.h"
#include "storage/record_tables.h"
#include "storage/sample_tokens.h"

namespace kv::storage {

namespace {
const char* const kStatusNames[] = {"queued",    "running", "done",
                                    "failed",    "cancelled", "crashed", "degraded"};
static_assert(sizeof(kStatusNames) / sizeof(kStatusNames[0]) == kNumRunStatuses, "run status name table out of date");

int64_t wall_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

std::string host_json(const ProcessIdentity& me) {
    nlohmann::json h;
    h["hostname"] = me.host;
    struct utsname u {};
    if (uname(&u) == 0) h["os"] = std::string(u.sysname) + " " + u.release + " " + u.machine;
    h["cpus"] = std::thread::hardware_concurrency();
    h["pid"] = me.pid;
    return h.dump();
}

void require_json_object(const std::string& path, const std::string& text, const char* what) {
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(text);
    } catch (const std::exception& e) {
        throw SessionError(SessionErrorKind::INVALID,
                           str("session '", path, "': the ", what, " is not valid JSON: ", e.what()));
    }
    if (!j.is_object())
        throw SessionError(SessionErrorKind::INVALID,
                           str("session '", path, "': the ", what, " must be a JSON object, got ", j.type_name()));
}
}  // namespace

const char* run_status_name(RunStatus s) { return size_t(s) < kNumRunStatuses ? kStatusNames[size_t(s)] : "unknown"; }

std::string run_status_label(const RunInfo& r) {
    std::string s = run_status_name(r.status);
    if (!run_status_final(r.status) && !r.owner_alive) s += " (owner gone)";
    return s;
}

RunStatus run_status_from_name(const std::string& name) {
    for (size_t i = 0; i < kNumRunStatuses; ++i)
        if (name == kStatusNames[i]) return RunStatus(i);
    throw SessionError(
        SessionErrorKind::INVALID,
        str("unknown run status '", name, "'; expected queued, running, done, failed, cancelled, crashed or degraded"));
}

const std::string kRunColumns = tables::runs().select_list();

RunInfo run_from_row(const Stmt& s) {
    tables::RunRead row;
    tables::runs().read(s, row);
    RunInfo& r = row.info;
    r.status = RunStatus::QUEUED;
    for (size_t i = 0; i < kNumRunStatuses; ++i)
        if (row.status == kStatusNames[i]) r.status = RunStatus(i);
    if (r.status == RunStatus::RUNNING || (r.status == RunStatus::QUEUED && r.owner_pid > 0)) {
        ProcessIdentity owner{r.owner_pid, row.owner_start, row.owner_boot, r.owner_host};
        r.owner_alive = process_alive(owner);
    }
    return std::move(row.info);
}

Session::Session(std::unique_ptr<Db> db, std::string path) : db_(std::move(db)), path_(std::move(path)) {}
Session::~Session() = default;

std::unique_ptr<Session> Session::create(const std::string& path) {
    return std::unique_ptr<Session>(new Session(create_session_db(path), path));
}

std::unique_ptr<Session> Session::open(const std::string& path) {
    repair_half_created_session(path);
    std::unique_ptr<Session> s(new Session(open_session_db(path, OpenMode::READ_WRITE), path));
    s->crashed_at_open_ = s->recover_crashed_runs();
    return s;
}

std::unique_ptr<Session> Session::open_or_create(const std::string& path) {
    if (!session_file_exists(path)) {
        try {
            return create(path);
        } catch (const SessionError&) {
            // Another process created it between the check and ours: open theirs.
            if (!session_file_exists(path)) throw;
        }
    }
    return open(path);
}

std::vector<int64_t> Session::recover_crashed_runs() {
    std::lock_guard<std::mutex> lk(mu_);
    // Every unfinished state: a run queued (its owner recorded at create_run) or running whose
    // owner is gone will never move on. Queued runs of older files have no owner: left alone.
    std::vector<std::pair<int64_t, std::string>> dead;
    {
        Stmt s = db_->prepare(
            "SELECT id, owner_pid, owner_start, owner_boot, owner_host, status FROM runs WHERE status='running' OR "
            "(status='queued' AND owner_pid > 0)");
        while (s.step()) {
            ProcessIdentity owner{s.i64(1), s.i64(2), s.text(3), s.text(4)};
            if (!process_alive(owner)) dead.push_back({s.i64(0), s.text(5)});
        }
    }
    std::vector<int64_t> ids;
    if (dead.empty()) return ids;
    Transaction tx(*db_);
    Stmt u = db_->prepare("UPDATE runs SET status='crashed', finished_ms=?, error=? WHERE id=? AND status=?");
    for (const auto& [id, was] : dead) {
        const std::string why =
            was == "queued"
                ? "the process that queued it ended before it started (killed or crashed); nothing was computed"
                : "the process running it ended without finishing it (killed or crashed); events committed "
                  "before that are kept";
        u.bind(1, wall_ms()).bind(2, std::string_view(why)).bind(3, id).bind(4, std::string_view(was));
        u.run();
        ids.push_back(id);
    }
    tx.commit();
    return ids;
}

int64_t Session::create_run(const std::string& name, const std::string& config_json) {
    require_json_object(path_, config_json.empty() ? "{}" : config_json, "run configuration");
    // Bound without copying (SQLITE_STATIC): the text must outlive the statement's run.
    const std::string config = config_json.empty() ? std::string("{}") : config_json;
    std::lock_guard<std::mutex> lk(mu_);
    // The owner is recorded from the start, so a run queued by a process that dies before
    // starting it is recognised as crashed (recover_crashed_runs), not left queued forever.
    ProcessIdentity me = this_process();
    Stmt s = db_->prepare(
        "INSERT INTO runs(name, config, status, created_ms, owner_pid, owner_start, owner_boot, owner_host) "
        "VALUES(?, ?, 'queued', ?, ?, ?, ?, ?)");
    s.bind(1, std::string_view(name))
        .bind(2, std::string_view(config))
        .bind(3, wall_ms())
        .bind(4, me.pid)
        .bind(5, me.start_ticks)
        .bind(6, std::string_view(me.boot_id))
        .bind(7, std::string_view(me.host));
    s.run();
    return sqlite3_last_insert_rowid(db_->handle());
}

RunInfo Session::run_locked(int64_t id) {
    Stmt s = db_->prepare(str("SELECT ", kRunColumns, " FROM runs WHERE id=?"));
    s.bind(1, id);
    if (!s.step()) throw SessionError(SessionErrorKind::INVALID, str("session '", path_, "' has no run ", id));
    return run_from_row(s);
}

RunInfo Session::run(int64_t id) {
    std::lock_guard<std::mutex> lk(mu_);
    return run_locked(id);
}

std::vector<RunInfo> Session::runs() {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<RunInfo> out;
    Stmt s = db_->prepare(str("SELECT ", kRunColumns, " FROM runs ORDER BY id"));
    while (s.step()) out.push_back(run_from_row(s));
    return out;
}

uint64_t Session::start_run(int64_t run, const std::string& build_json) {
    require_json_object(path_, build_json.empty() ? "{}" : build_json, "build information");
    std::lock_guard<std::mutex> lk(mu_);
    RunInfo r = run_locked(run);
    if (r.status != RunStatus::QUEUED)
        throw SessionError(SessionErrorKind::INVALID,
                           str("session '", path_, "': run ", run, " is ", run_status_name(r.status),
                               "; only a queued run can be started (create a new run to run it again)"));
    ProcessIdentity me = this_process();
    const uint64_t t0 = now_ns();
    Stmt s = db_->prepare(
        "UPDATE runs SET status='running', started_ms=?, t0_ns=?, host=?, build=?, owner_pid=?, owner_start=?, "
        "owner_boot=?, owner_host=? WHERE id=?");
    std::string host = host_json(me);
    const std::string build = build_json.empty() ? std::string("{}") : build_json;
    s.bind(1, wall_ms())
        .bind(2, t0)
        .bind(3, std::string_view(host))
        .bind(4, std::string_view(build))
        .bind(5, me.pid)
        .bind(6, me.start_ticks)
        .bind(7, std::string_view(me.boot_id))
        .bind(8, std::string_view(me.host))
        .bind(9, run);
    s.run();
    return t0;
}

void Session::finish_run(int64_t run, RunStatus status, const std::string& error) {
    if (status != RunStatus::DONE && status != RunStatus::FAILED && status != RunStatus::CANCELLED &&
        status != RunStatus::DEGRADED)
        throw SessionError(SessionErrorKind::INVALID, str("finish_run: '", run_status_name(status),
                                                          "' is not a final status; expected done, degraded, "
                                                          "failed or cancelled"));
    std::lock_guard<std::mutex> lk(mu_);
    RunInfo r = run_locked(run);
    if (run_status_final(r.status))
        throw SessionError(SessionErrorKind::INVALID, str("session '", path_, "': run ", run, " is already ",
                                                          run_status_name(r.status), "; expected queued or running"));
    if (r.status == RunStatus::QUEUED && (status == RunStatus::DONE || status == RunStatus::DEGRADED))
        throw SessionError(SessionErrorKind::INVALID, str("session '", path_, "': run ", run,
                                                          " never started, so it cannot be done; expected "
                                                          "cancelled or failed"));
    Stmt s = db_->prepare("UPDATE runs SET status=?, finished_ms=?, error=? WHERE id=?");
    s.bind(1, run_status_name(status)).bind(2, wall_ms()).bind(4, run);
    if (error.empty())
        s.bind_null(3);
    else
        s.bind(3, std::string_view(error));
    s.run();
}

void Session::set_progress(int64_t run, const RunProgress& p) {
    std::lock_guard<std::mutex> lk(mu_);
    Stmt s = db_->prepare(
        "UPDATE runs SET tokens_done=?, tokens_total=?, chunks_done=?, chunks_total=?, steps_done=?, steps_total=?, "
        "progress_ms=? WHERE id=?");
    s.bind(1, p.tokens_done)
        .bind(2, p.tokens_total)
        .bind(3, p.chunks_done)
        .bind(4, p.chunks_total)
        .bind(5, p.steps_done)
        .bind(6, p.steps_total)
        .bind(7, wall_ms())
        .bind(8, run);
    s.run();
}

void Session::merge_summary(int64_t run, const std::string& json_patch) {
    require_json_object(path_, json_patch, "summary patch");
    std::lock_guard<std::mutex> lk(mu_);
    Stmt s = db_->prepare("UPDATE runs SET summary=json_patch(summary, ?) WHERE id=?");
    s.bind(1, std::string_view(json_patch)).bind(2, run);
    s.run();
    if (sqlite3_changes(db_->handle()) == 0)
        throw SessionError(SessionErrorKind::INVALID, str("session '", path_, "' has no run ", run));
}

void Session::rename_run(int64_t run, const std::string& name) {
    std::lock_guard<std::mutex> lk(mu_);
    Stmt s = db_->prepare("UPDATE runs SET name=? WHERE id=?");
    s.bind(1, std::string_view(name)).bind(2, run);
    s.run();
    if (sqlite3_changes(db_->handle()) == 0)
        throw SessionError(SessionErrorKind::INVALID, str("session '", path_, "' has no run ", run));
}

void Session::set_run_notes(int64_t run, const std::string& notes) {
    std::lock_guard<std::mutex> lk(mu_);
    run_locked(run);  // an unknown run is an error, not a silent orphan row
    if (notes.empty()) {
        Stmt s = db_->prepare("DELETE FROM run_notes WHERE run_id=?");
        s.bind(1, run);
        s.run();
        return;
    }
    Stmt s = db_->prepare("INSERT INTO run_notes(run_id, notes) VALUES(?, ?) ON CONFLICT(run_id) DO UPDATE SET notes=excluded.notes");
    s.bind(1, run).bind(2, std::string_view(notes));
    s.run();
}

namespace {
std::map<int64_t, std::string> notes_of(Db& db) {
    std::map<int64_t, std::string> out;
    Stmt s = db.prepare("SELECT run_id, notes FROM run_notes ORDER BY run_id");
    while (s.step()) out[s.i64(0)] = s.text(1);
    return out;
}
}  // namespace

std::map<int64_t, std::string> Session::run_notes() {
    std::lock_guard<std::mutex> lk(mu_);
    return notes_of(*db_);
}

std::map<int64_t, std::string> read_run_notes(const std::string& path) {
    std::unique_ptr<Db> db = open_session_db(path, OpenMode::READ_ONLY);
    return notes_of(*db);
}

void Session::delete_run(int64_t run) {
    std::lock_guard<std::mutex> lk(mu_);
    const RunInfo r = run_locked(run);
    if (is_rank_run(r))
        throw SessionError(SessionErrorKind::INVALID, str("session '", path_, "': run ", run, " is rank ", run_rank(r), " of run ",
                                                          rank_run_parent(r), "; delete run ", rank_run_parent(r), " instead"));
    if (!run_status_final(r.status))
        throw SessionError(SessionErrorKind::INVALID, str("session '", path_, "': run ", run, " is ", run_status_name(r.status),
                                                          "; cancel it and wait for it to stop before deleting it"));
    std::vector<RunInfo> all;
    {
        Stmt s = db_->prepare(str("SELECT ", kRunColumns, " FROM runs ORDER BY id"));
        while (s.step()) all.push_back(run_from_row(s));
    }
    std::vector<int64_t> ids;
    for (int64_t id : rank_runs(all, run))
        if (id != 0) ids.push_back(id);
    // Every table with a run_id column, found in the file itself: a table added by a later
    // schema is covered without a list kept here.
    std::vector<std::string> tables;
    {
        Stmt s = db_->prepare(
            "SELECT m.name FROM sqlite_master m, pragma_table_info(m.name) c WHERE m.type='table' AND c.name='run_id' "
            "ORDER BY m.name");
        while (s.step()) tables.push_back(s.text(0));
    }
    Transaction tx(*db_);
    for (int64_t id : ids) {
        for (const std::string& t : tables) {
            Stmt d = db_->prepare(str("DELETE FROM \"", t, "\" WHERE run_id=?"));
            d.bind(1, id);
            d.run();
        }
        Stmt d = db_->prepare("DELETE FROM runs WHERE id=?");
        d.bind(1, id);
        d.run();
    }
    tx.commit();
}

void Session::write_sample_tokens(int64_t run, const SampleTokensRow& row) {
    std::lock_guard<std::mutex> lk(mu_);
    insert_sample_tokens(*db_, run, row);
}

std::string Session::integrity_check() {
    std::lock_guard<std::mutex> lk(mu_);
    Stmt s = db_->prepare("PRAGMA integrity_check");
    std::string out;
    while (s.step()) {
        if (!out.empty()) out += '\n';
        out += s.text(0);
    }
    return out;
}

bool Session::checkpoint() {
    std::lock_guard<std::mutex> lk(mu_);
    int log = 0, done = 0;
    int rc = sqlite3_wal_checkpoint_v2(db_->handle(), nullptr, SQLITE_CHECKPOINT_TRUNCATE, &log, &done);
    return rc == SQLITE_OK && log == done;
}

}  // namespace kv::storage
