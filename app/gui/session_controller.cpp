// Session controller (see session_controller.h).
#include "session_controller.h"

#include <QMetaObject>

#include "engine/core/error.h"
#include "sessions/run_manager.h"
#include "storage/session.h"
#include "storage/rank_runs.h"
#include "storage/session_reader.h"

namespace kv::gui {

SessionController::SessionController(RunsModel* model, QObject* parent) : QObject(parent), model_(model) {
    reload_timer_.setInterval(1000);
    connect(&reload_timer_, &QTimer::timeout, this, &SessionController::reload);
}

SessionController::~SessionController() {
    // The model may already be gone (children are destroyed in creation order): stop the worker
    // and drop pending events without touching it.
    ++generation_;
    reload_timer_.stop();
    manager_.reset();
    reader_.reset();
}

void SessionController::closeSession() {
    ++generation_;
    manager_.reset();  // cancels running work and joins the worker: no callbacks after this
    reader_.reset();
    {
        std::lock_guard<std::mutex> lk(progress_mu_);
        progress_.clear();
        progress_posted_ = false;
    }
    crashed_.clear();
    notes_.clear();
    reload_timer_.stop();
    was_active_ = false;
    if (!path_.isEmpty()) {
        path_.clear();
        model_->clear();
        Q_EMIT sessionChanged(QString());
    }
}

void SessionController::openSession(const QString& path) {
    closeSession();
    const uint64_t gen = ++generation_;
    sessions::RunEvents ev;
    // Worker-thread callbacks: post to the GUI thread, never touch Qt objects here.
    ev.status = [this, gen](int64_t run, storage::RunStatus s, const std::string& message) {
        QMetaObject::invokeMethod(
            this, [this, gen, run, s, m = QString::fromStdString(message)] { onStatus(gen, run, int(s), m); },
            Qt::QueuedConnection);
    };
    ev.progress = [this, gen](int64_t run, int64_t done, int64_t total, const std::string& what) {
        bool post = false;
        {
            std::lock_guard<std::mutex> lk(progress_mu_);
            progress_[run] = {done, total, what};
            post = !progress_posted_;
            progress_posted_ = true;
        }
        if (post) QMetaObject::invokeMethod(this, [this, gen] { flushProgress(gen); }, Qt::QueuedConnection);
    };
    ev.output = [this, gen](int64_t run, const std::string& text) {
        QMetaObject::invokeMethod(
            this,
            [this, gen, run, t = QString::fromStdString(text)] {
                if (gen == generation_) Q_EMIT runOutput(run, t);
            },
            Qt::QueuedConnection);
    };
    const std::string p = path.toStdString();
    try {
        manager_ = std::make_unique<sessions::RunManager>(p, ev);
        crashed_ = manager_->crashed_at_open();
    } catch (const storage::SessionError& e) {
        if (e.kind() != storage::SessionErrorKind::NOT_WRITABLE) throw;  // read-only: browse and export only
    }
    // The table reads through its own read-only connection (WAL: never blocks the run's writer).
    reader_ = std::make_unique<storage::SessionReader>(p);
    for (auto& [run, text] : manager_ ? manager_->session().run_notes() : storage::read_run_notes(p))
        notes_[run] = QString::fromStdString(text);
    path_ = path;
    reload();
    Q_EMIT sessionChanged(path_);
    reload_timer_.start();
}

std::vector<int64_t> SessionController::crashedAtOpen() const { return crashed_; }

void SessionController::reload() {
    if (path_.isEmpty() || !reader_) return;
    std::vector<storage::RunInfo> infos = reader_->runs();
    std::vector<RunRow> rows;
    rows.reserve(infos.size());
    for (const auto& i : infos)
        if (!storage::is_rank_run(i)) {  // ranks show in their run's views
            rows.push_back(runRowFromInfo(i));
            if (auto it = notes_.find(i.id); it != notes_.end()) rows.back().notes = it->second;
        }
    model_->setRuns(std::move(rows));
    const bool active = anyActive();
    if (active != was_active_) {
        was_active_ = active;
        Q_EMIT activeChanged(active);
    }
}

int64_t SessionController::submit(const RunConfig& cfg) {
    if (!manager_)
        throw Error(path_.isEmpty() ? "no session is open; expected File > New session or Open session first"
                                    : str("session '", path_.toStdString(), "' is read-only; open a writable copy to launch runs"));
    const int64_t run = manager_->submit(cfg);
    // A second run of the same configuration gets "… #2": names tell runs apart in every view.
    // The manager names the run (its default name); only a name already taken is changed.
    // The file's names, not the table's: another process may have added runs since the last reload.
    std::vector<QString> taken;
    for (const auto& r : reader_->runs())
        if (r.id != run) taken.push_back(QString::fromStdString(r.name));
    const QString name = QString::fromStdString(manager_->session().run(run).name);
    if (const QString unique = uniqueRunName(name, taken); unique != name) manager_->session().rename_run(run, unique.toStdString());
    reload();  // shows the queued row at once
    return run;
}

void SessionController::requireWritable(const char* what) const {
    if (!manager_)
        throw Error(path_.isEmpty() ? str("no session is open; nothing to ", what)
                                    : str("session '", path_.toStdString(), "' is read-only; cannot ", what, " (open a writable copy)"));
}

QString SessionController::renameRun(int64_t run, const QString& name) {
    requireWritable("rename runs");
    const QString wanted = name.trimmed();
    if (wanted.isEmpty()) throw Error(str("run ", run, ": a run name cannot be empty"));
    std::vector<QString> taken;
    for (const auto& r : reader_->runs())
        if (r.id != run) taken.push_back(QString::fromStdString(r.name));
    const QString unique = uniqueRunName(wanted, taken);
    manager_->session().rename_run(run, unique.toStdString());
    reload();
    return unique;
}

void SessionController::setRunNotes(int64_t run, const QString& notes) {
    requireWritable("edit notes");
    manager_->session().set_run_notes(run, notes.toStdString());
    if (notes.isEmpty()) notes_.erase(run);
    else notes_[run] = notes;
    reload();
}

void SessionController::deleteRuns(const std::vector<int64_t>& runs) {
    requireWritable("delete runs");
    // One at a time: a run that cannot go (still running) stops the rest with its reason, and
    // the runs deleted before it stay deleted (each deletion is its own transaction).
    try {
        for (int64_t run : runs) {
            manager_->session().delete_run(run);
            notes_.erase(run);
        }
    } catch (...) {
        reload();
        throw;
    }
    reload();
}

void SessionController::cancel(int64_t run) {
    if (manager_) manager_->cancel(run);
}

void SessionController::cancelAll() {
    if (manager_) manager_->cancel_all();
}

void SessionController::onStatus(uint64_t generation, int64_t run, int status, const QString& message) {
    if (generation != generation_) return;
    const auto s = storage::RunStatus(status);
    if (storage::run_status_final(s) || s == storage::RunStatus::RUNNING) {
        reload();  // summary, error and final progress come from the database
        model_->setStatus(run, s, message);
    } else {
        model_->setStatus(run, s, message);
    }
    Q_EMIT runStatusChanged(run, status, message);
    const bool active = anyActive();
    if (active != was_active_) {
        was_active_ = active;
        Q_EMIT activeChanged(active);
    }
}

void SessionController::flushProgress(uint64_t generation) {
    std::map<int64_t, PendingProgress> batch;
    {
        std::lock_guard<std::mutex> lk(progress_mu_);
        batch.swap(progress_);
        progress_posted_ = false;
    }
    if (generation != generation_) return;
    for (const auto& [run, p] : batch) {
        const RunRow* r = model_->run(run);
        if (r && storage::run_status_final(r->status)) continue;  // a late update after the final status
        const QString what = QString::fromStdString(p.what);
        model_->setProgress(run, p.done, p.total, what);
        Q_EMIT runProgress(run, p.done, p.total, what);
    }
}

}  // namespace kv::gui
