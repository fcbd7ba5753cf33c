// The session browser's table model: one row per run (name, notes, mode, task, tokens per
// sample, policy, buffer, cache length, chunk size, status, progress, the task's score, the
// fidelity means, loss/accuracy, peak memory, tokens/s), then one column per number any run's
// summary records (the browser hides those until asked). Rows are value types
// built from storage::RunInfo; the model is fed by the session controller (bulk merges from
// the database plus live status/progress from RunManager events). No widgets, no engine.
#pragma once

#include <QAbstractTableModel>
#include <QString>

#include <cmath>
#include <cstdint>
#include <map>
#include <vector>

#include "storage/run_info.h"

namespace kv::gui {

struct RunRow {
    int64_t id = 0;
    QString name, mode, policy, buffer;
    QString task;                              // data.name: what was evaluated
    int64_t tokens = -1;                       // data.seq_length (-1: not in the config)
    int64_t cacheLength = -1, chunkSize = -1;  // -1: not in the config
    storage::RunStatus status = storage::RunStatus::QUEUED;
    int64_t done = 0, total = 0;  // progress units (tokens / chunks / steps)
    QString progressWhat;
    bool liveProgress = false;  // progress came from this process's RunManager events
    int64_t startedMs = 0;      // wall clock the run started (0: not yet), for the time left
    double loss = NAN, accuracy = NAN, tokensPerS = NAN;
    int64_t peakBytes = -1;
    int64_t ranks = 1;  // data-parallel ranks (issue 23)
    QString error;
    QString config;  // JSON
    QString notes;   // a person's notes (the session's run_notes table)
    // The task's own score: copied tokens (repeat), answer tokens right (RULER tasks), else
    // accuracy, else perplexity -- the first the summary records; scoreName says which.
    double score = NAN;
    QString scoreName;
    double fidelityKl = NAN, fidelityKeptMass = NAN;  // fidelity means (NaN: not measured)
    std::map<QString, double> metrics;                 // every number of the summary, dotted path -> value
};

// Decodes config and summary JSON (never throws; missing fields stay unset).
RunRow runRowFromInfo(const storage::RunInfo& info);

class RunsModel : public QAbstractTableModel {
    Q_OBJECT
   public:
    enum Columns {
        COLUMN_ID,
        COLUMN_NAME,
        COLUMN_NOTES,
        COLUMN_MODE,
        COLUMN_TASK,    // data.name: runs of different tasks told apart at a glance
        COLUMN_TOKENS,  // data.seq_length
        COLUMN_POLICY,
        COLUMN_BUFFER,
        COLUMN_CACHE_LENGTH,
        COLUMN_CHUNK_SIZE,
        COLUMN_STATUS,
        COLUMN_PROGRESS,
        COLUMN_SCORE,        // RunRow::score (tooltip: which metric)
        COLUMN_FIDELITY_KL,  // next-token KL against the dense model
        COLUMN_KEPT_MASS,    // attention mass on the kept tokens
        COLUMN_LOSS,
        COLUMN_ACCURACY,
        COLUMN_PEAK_MEMORY,
        COLUMN_TOKENS_PER_S,
        COLUMN_RANKS,  // data-parallel processes (config dist.ranks; 1 otherwise)
        NUM_COLUMNS  // then one column per metricNames() entry
    };
    enum Roles {
        SortRole = Qt::UserRole,  // numbers as numbers (peak memory in bytes, ...)
        RunIdRole,
        ProgressRole,  // fraction in [0, 1], or -1 when unknown
        StatusRole,    // int(storage::RunStatus)
        WarningRole,   // bool: its numbers or recording cannot be trusted (degraded, failed, crashed)
    };

    explicit RunsModel(QObject* parent = nullptr);

    int rowCount(const QModelIndex& parent = {}) const override;
    int columnCount(const QModelIndex& parent = {}) const override;
    QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
    QVariant headerData(int section, Qt::Orientation orientation, int role = Qt::DisplayRole) const override;
    // Name and notes are editable: setData does not change the row but asks (editRequested) the
    // owner to store the edit; the row changes when the stored value comes back.
    Qt::ItemFlags flags(const QModelIndex& index) const override;
    bool setData(const QModelIndex& index, const QVariant& value, int role = Qt::EditRole) override;

    // Merges a full snapshot by id: changed rows Q_EMIT dataChanged, new ones are inserted, gone
    // ones removed, so views keep their selection. Live progress of active runs is kept.
    void setRuns(std::vector<RunRow> rows);
    void clear();
    void setStatus(int64_t run, storage::RunStatus status, const QString& message);
    void setProgress(int64_t run, int64_t done, int64_t total, const QString& what);

    int rowOfRun(int64_t run) const;  // -1 if absent
    const RunRow* run(int64_t run) const;
    const std::vector<RunRow>& rows() const { return rows_; }
    int activeRuns() const;  // queued or running
    // The summary numbers shown as columns NUM_COLUMNS.. (every name any row recorded; a name
    // once seen keeps its column until clear()).
    const std::vector<QString>& metricNames() const { return metric_names_; }

   Q_SIGNALS:
    void editRequested(qint64 run, int column, const QString& text);

   private:
    void emitRowChanged(int row);
    std::vector<RunRow> rows_;  // ascending id
    std::vector<QString> metric_names_;
};

// `base` when no name in `taken` equals it, else "base #2", "base #3", ... (the first free one).
QString uniqueRunName(const QString& base, const std::vector<QString>& taken);
// The summary key of RunRow::score's metric and how a person calls it, in the order they are
// looked for: copy_token_accuracy "copied tokens", answer_token_accuracy "answer tokens right",
// accuracy, perplexity.
const std::vector<std::pair<const char*, const char*>>& taskScoreMetrics();

QString formatBytes(int64_t bytes);
// The progress column's text: "42%" while running, "42% · 1 min 20 s left" once the time left is
// known (eta_seconds >= 0); a stopped run names how it stopped and where ("cancelled at 77%"),
// so it never reads as a run that is stuck; fraction < 0: unknown.
QString progressText(storage::RunStatus status, double fraction, double eta_seconds = -1);
// Seconds a running run has left at `now_ms`, from its elapsed time and the share done (its
// progress counts every phase of the run); -1 while unknown: not running, under 2% done or
// under 2 s in.
double runSecondsLeft(const RunRow& r, int64_t now_ms);

}  // namespace kv::gui
