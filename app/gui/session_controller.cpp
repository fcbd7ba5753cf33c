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
        if (!storage::is_rank_run(i)) rows.push_back(runRowFromInfo(i));  // ranks show in their run's views
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
    reload();  // shows the queued row at once
    return run;
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
