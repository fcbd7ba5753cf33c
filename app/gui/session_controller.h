// The open session as the GUI sees it: a RunManager (runs execute on its worker thread) whose
// callbacks are posted to the GUI thread as signals, and the runs model it keeps current from a
// SessionReader plus those events. Read-only files open without a RunManager (browse, export).
// Never blocks the GUI thread on a run; never touches widgets.
#pragma once

#include <QObject>
#include <QString>
#include <QTimer>

#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/run/run_config.h"
#include "models/runs_model.h"

namespace kv::sessions {
class RunManager;
}
namespace kv::storage {
class SessionReader;
}

namespace kv::gui {

class SessionController : public QObject {
    Q_OBJECT
   public:
    explicit SessionController(RunsModel* model, QObject* parent = nullptr);
    ~SessionController() override;  // cancels running work and waits for the worker

    // Opens (creating when absent) a session file; throws kv::Error / storage::SessionError.
    void openSession(const QString& path);
    void closeSession();
    bool isOpen() const { return !path_.isEmpty(); }
    bool readOnly() const { return !manager_; }
    const QString& path() const { return path_; }
    std::vector<int64_t> crashedAtOpen() const;

    // Validates (throws kv::Error with the CLI's message) and queues a run; returns its id.
    int64_t submit(const RunConfig& cfg);
    void cancel(int64_t run);
    void cancelAll();
    bool anyActive() const { return model_->activeRuns() > 0; }
    // Re-reads every run's row from the session file.
    void reload();

    // Run management (writable sessions; each throws kv::Error / storage::SessionError with the
    // reason, e.g. a read-only file or a run still running). The table follows at once.
    // A new name: trimmed, not empty, unique in the session ("… #2" is added when taken).
    QString renameRun(int64_t run, const QString& name);
    void setRunNotes(int64_t run, const QString& notes);
    // Deletes finished runs with everything recorded for them; other runs are untouched.
    void deleteRuns(const std::vector<int64_t>& runs);

   Q_SIGNALS:
    void sessionChanged(const QString& path);
    void runStatusChanged(qint64 run, int status, const QString& message);
    void runProgress(qint64 run, qint64 done, qint64 total, const QString& what);
    void runOutput(qint64 run, const QString& text);
    void activeChanged(bool active);

   private:
    struct PendingProgress {
        int64_t done = 0, total = 0;
        std::string what;
    };
    void onStatus(uint64_t generation, int64_t run, int status, const QString& message);
    void flushProgress(uint64_t generation);

    RunsModel* model_;
    QString path_;
    std::unique_ptr<sessions::RunManager> manager_;
    std::unique_ptr<storage::SessionReader> reader_;  // feeds the runs model
    std::vector<int64_t> crashed_;
    // Session generation: events posted by a previous session's worker are dropped.
    uint64_t generation_ = 0;
    // Progress arrives per chunk on the worker; coalesced to one queued flush at a time.
    std::mutex progress_mu_;
    std::map<int64_t, PendingProgress> progress_;
    bool progress_posted_ = false;
    void requireWritable(const char* what) const;
    std::map<int64_t, QString> notes_;  // run notes: read at open, then kept with each edit
    QTimer reload_timer_;  // picks up runs written by other processes while any run is active
    bool was_active_ = false;
};

}  // namespace kv::gui
