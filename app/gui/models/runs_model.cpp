// Runs table model (see runs_model.h).
#include "runs_model.h"

#include <QDateTime>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>

#include "storage/comparison.h"
#include "storage/config_fields.h"

namespace kv::gui {

namespace {
using Json = nlohmann::json;

double number(const Json& j, const char* key) {
    auto it = j.find(key);
    return it != j.end() && it->is_number() ? it->get<double>() : NAN;
}

int64_t integerOr(const std::string& text, int64_t fallback) {
    if (text.empty()) return fallback;
    char* end = nullptr;
    long long v = std::strtoll(text.c_str(), &end, 10);
    return *end ? fallback : v;
}

QString fmtNumber(double v, int precision) {
    return std::isnan(v) ? QStringLiteral("-") : QString::number(v, 'g', precision);
}

bool sameNumber(double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); }

// Every number of a JSON object, by dotted path ("peak_bytes.cpu"); booleans and text are left out.
void collectNumbers(const Json& j, const std::string& prefix, std::map<QString, double>& out) {
    for (const auto& [k, v] : j.items()) {
        const std::string path = prefix.empty() ? k : prefix + "." + k;
        if (v.is_number()) out[QString::fromStdString(path)] = v.get<double>();
        else if (v.is_object()) collectNumbers(v, path, out);
    }
}

bool sameRow(const RunRow& a, const RunRow& b) {
    return a.name == b.name && a.mode == b.mode && a.policy == b.policy && a.buffer == b.buffer &&
           a.cacheLength == b.cacheLength && a.chunkSize == b.chunkSize && a.status == b.status && a.done == b.done &&
           a.total == b.total && a.progressWhat == b.progressWhat && a.peakBytes == b.peakBytes && a.ranks == b.ranks && a.error == b.error &&
           (a.loss == b.loss || (std::isnan(a.loss) && std::isnan(b.loss))) &&
           (a.accuracy == b.accuracy || (std::isnan(a.accuracy) && std::isnan(b.accuracy))) &&
           (a.tokensPerS == b.tokensPerS || (std::isnan(a.tokensPerS) && std::isnan(b.tokensPerS))) && a.notes == b.notes &&
           a.task == b.task && a.tokens == b.tokens && a.scoreName == b.scoreName && sameNumber(a.score, b.score) &&
           sameNumber(a.fidelityKl, b.fidelityKl) && sameNumber(a.fidelityKeptMass, b.fidelityKeptMass) && a.metrics == b.metrics;
}
}  // namespace

QString formatBytes(int64_t bytes) {
    if (bytes < 0) return QStringLiteral("-");
    static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = double(bytes);
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        ++u;
    }
    return u == 0 ? QStringLiteral("%1 B").arg(bytes) : QStringLiteral("%1 %2").arg(v, 0, 'f', 2).arg(units[u]);
}

RunRow runRowFromInfo(const storage::RunInfo& info) {
    RunRow r;
    r.id = info.id;
    r.name = QString::fromStdString(info.name);
    r.config = QString::fromStdString(info.config);
    r.status = info.status;
    r.startedMs = info.started_ms;
    r.error = QString::fromStdString(info.error);
    if (const std::optional<storage::CacheName> cn = storage::run_cache_name(info.config)) {  // canonical, aliases too
        r.policy = QString::fromStdString(cn->policy);
        r.buffer = QString::fromStdString(cn->buffer);
    }
    r.mode = QString::fromStdString(storage::run_config_value(info.config, "mode"));
    r.task = QString::fromStdString(storage::run_config_value(info.config, "data.name"));
    r.tokens = integerOr(storage::run_config_value(info.config, "data.seq_length"), -1);
    r.cacheLength = integerOr(storage::run_config_value(info.config, "kv_cache.cache_length"), -1);
    r.chunkSize = integerOr(storage::run_config_value(info.config, "kv_cache.chunk_size"), -1);
    r.ranks = integerOr(storage::run_config_value(info.config, "dist.ranks"), 1);
    const auto& p = info.progress;
    if (p.tokens_total > 0) {
        r.done = p.tokens_done, r.total = p.tokens_total, r.progressWhat = QStringLiteral("tokens");
    } else if (p.chunks_total > 0) {
        r.done = p.chunks_done, r.total = p.chunks_total, r.progressWhat = QStringLiteral("chunks");
    } else if (p.steps_total > 0) {
        r.done = p.steps_done, r.total = p.steps_total, r.progressWhat = QStringLiteral("steps");
    }
    Json s = Json::parse(info.summary.empty() ? "{}" : info.summary, nullptr, false);
    if (s.is_object()) {
        r.loss = number(s, "mean_loss");
        r.accuracy = number(s, "accuracy");
        r.tokensPerS = number(s, "tokens_per_s");
        r.peakBytes = storage::run_own_peak_bytes(info.summary);  // the run's own whole-run peak (no instrumentation)
        for (const auto& [key, label] : taskScoreMetrics()) {
            const double v = number(s, key);
            if (std::isnan(v)) continue;
            r.score = v;
            r.scoreName = QString::fromLatin1(label);
            break;
        }
        r.fidelityKl = number(s, "fidelity_next_token_kl");
        r.fidelityKeptMass = number(s, "fidelity_kept_mass");
        collectNumbers(s, "", r.metrics);
    }
    if (storage::run_status_final(info.status) && info.status == storage::RunStatus::DONE && r.total == 0) r.done = r.total = 1;
    return r;
}

const std::vector<std::pair<const char*, const char*>>& taskScoreMetrics() {
    // The task's own numbers first (the same summary keys compare leads with), then the general ones.
    static const std::vector<std::pair<const char*, const char*>> metrics = {{"copy_token_accuracy", "copied tokens"},
                                                                             {"answer_token_accuracy", "answer tokens right"},
                                                                             {"accuracy", "accuracy"},
                                                                             {"perplexity", "perplexity"}};
    return metrics;
}

QString uniqueRunName(const QString& base, const std::vector<QString>& taken) {
    auto used = [&](const QString& n) { return std::find(taken.begin(), taken.end(), n) != taken.end(); };
    if (!used(base)) return base;
    for (int k = 2;; ++k)
        if (const QString n = QStringLiteral("%1 #%2").arg(base).arg(k); !used(n)) return n;
}

double runSecondsLeft(const RunRow& r, int64_t now_ms) {
    if (r.status != storage::RunStatus::RUNNING || r.startedMs <= 0 || r.total <= 0 || r.done <= 0 || r.done >= r.total) return -1;
    const double f = double(r.done) / double(r.total), elapsed = double(now_ms - r.startedMs) * 1e-3;
    if (f < 0.02 || elapsed < 2.0) return -1;
    return elapsed * (1.0 - f) / f;
}

QString progressText(storage::RunStatus status, double fraction, double eta_seconds) {
    // Floor, not round: 99.6% of a cancelled run is not "100%".
    QString pct = fraction < 0 ? QString() : QStringLiteral("%1%").arg(int(std::floor(100.0 * fraction)));
    if (status == storage::RunStatus::RUNNING && eta_seconds >= 0 && !pct.isEmpty()) {
        const long s = std::lround(eta_seconds);
        pct += s < 60 ? QString::fromUtf8(" · %1 s left").arg(s) : QString::fromUtf8(" · %1 min %2 s left").arg(s / 60).arg(s % 60);
    }
    switch (status) {
        case storage::RunStatus::CANCELLED:
        case storage::RunStatus::FAILED:
        case storage::RunStatus::CRASHED: {
            // A stopped run says so; its bar is drawn disabled (not a run that seems stuck).
            const QString name = QString::fromLatin1(storage::run_status_name(status));
            return pct.isEmpty() ? name : QStringLiteral("%1 at %2").arg(name, pct);
        }
        default: return pct.isEmpty() ? QStringLiteral("-") : pct;
    }
}

RunsModel::RunsModel(QObject* parent) : QAbstractTableModel(parent) {}

int RunsModel::rowCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : int(rows_.size()); }
int RunsModel::columnCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : NUM_COLUMNS + int(metric_names_.size()); }

QVariant RunsModel::headerData(int section, Qt::Orientation orientation, int role) const {
    if (orientation != Qt::Horizontal) return {};
    if (section >= NUM_COLUMNS && section < columnCount()) {
        const QString& m = metric_names_[size_t(section - NUM_COLUMNS)];
        if (role == Qt::DisplayRole) return m;
        if (role == Qt::ToolTipRole) return tr("%1, as the run's summary records it").arg(m);
        return {};
    }
    if (role == Qt::ToolTipRole) {
        switch (section) {
            case COLUMN_SCORE: return tr("The task's own score: copied tokens (repeat), answer tokens right (RULER tasks), else accuracy, else perplexity");
            case COLUMN_FIDELITY_KL: return tr("Fidelity: mean next-token KL divergence from the dense model (0: identical)");
            case COLUMN_KEPT_MASS: return tr("Fidelity: mean attention mass on the tokens the policy kept (1: all of it)");
            case COLUMN_NOTES: return tr("Your notes on the run (F2 or right click to edit; stored in the session)");
            default: return {};
        }
    }
    if (role != Qt::DisplayRole) return {};
    static const char* const names[] = {"id",     "name",     "notes",      "mode",    "task",      "tokens", "policy",
                                        "buffer", "cache",    "chunk",      "status",  "progress",  "task score", "KL vs dense",
                                        "kept mass", "loss",  "accuracy",   "peak memory", "tokens/s", "ranks"};
    static_assert(sizeof(names) / sizeof(names[0]) == NUM_COLUMNS, "one header per column");
    return section >= 0 && section < NUM_COLUMNS ? QString::fromLatin1(names[section]) : QVariant();
}

Qt::ItemFlags RunsModel::flags(const QModelIndex& index) const {
    Qt::ItemFlags f = QAbstractTableModel::flags(index);
    if (index.isValid() && (index.column() == COLUMN_NAME || index.column() == COLUMN_NOTES)) f |= Qt::ItemIsEditable;
    return f;
}

bool RunsModel::setData(const QModelIndex& index, const QVariant& value, int role) {
    if (role != Qt::EditRole || !index.isValid() || index.row() >= int(rows_.size())) return false;
    if (index.column() != COLUMN_NAME && index.column() != COLUMN_NOTES) return false;
    const RunRow& r = rows_[size_t(index.row())];
    const QString text = index.column() == COLUMN_NAME ? value.toString().trimmed() : value.toString();
    if (text == (index.column() == COLUMN_NAME ? r.name : r.notes)) return false;
    Q_EMIT editRequested(qint64(r.id), index.column(), text);
    return true;
}

QVariant RunsModel::data(const QModelIndex& index, int role) const {
    if (!index.isValid() || index.row() >= int(rows_.size())) return {};
    const RunRow& r = rows_[size_t(index.row())];
    const double fraction = r.total > 0 ? double(r.done) / double(r.total) : -1.0;
    if (role == RunIdRole) return qint64(r.id);
    if (role == StatusRole) return int(r.status);
    const bool warn = r.status == storage::RunStatus::DEGRADED || r.status == storage::RunStatus::FAILED ||
                      r.status == storage::RunStatus::CRASHED;
    if (role == WarningRole) return warn;
    if (role == ProgressRole) return r.status == storage::RunStatus::DONE ? 1.0 : fraction;
    if (role == Qt::EditRole && (index.column() == COLUMN_NAME || index.column() == COLUMN_NOTES))
        return index.column() == COLUMN_NAME ? r.name : r.notes;
    if (role == Qt::ToolTipRole) {
        if (index.column() == COLUMN_SCORE && !r.scoreName.isEmpty()) return r.scoreName;
        if (index.column() == COLUMN_NOTES && !r.notes.isEmpty()) return r.notes;
        if (!r.error.isEmpty()) return r.error;
        if (index.column() == COLUMN_PROGRESS && r.total > 0)
            return QStringLiteral("%1 / %2 %3").arg(r.done).arg(r.total).arg(r.progressWhat);
        return r.name;
    }
    if (role == Qt::TextAlignmentRole) {
        switch (index.column()) {
            case COLUMN_NAME:
            case COLUMN_NOTES:
            case COLUMN_MODE:
            case COLUMN_TASK:
            case COLUMN_POLICY:
            case COLUMN_BUFFER:
            case COLUMN_STATUS: return int(Qt::AlignLeft | Qt::AlignVCenter);
            default: return int(Qt::AlignRight | Qt::AlignVCenter);
        }
    }
    const bool sort = role == SortRole;
    if (role != Qt::DisplayRole && !sort) return {};
    auto numberCell = [sort](double v, int precision) {
        return sort ? QVariant(std::isnan(v) ? -1e300 : v) : QVariant(fmtNumber(v, precision));
    };
    if (index.column() >= NUM_COLUMNS) {
        const size_t m = size_t(index.column() - NUM_COLUMNS);
        if (m >= metric_names_.size()) return {};
        auto it = r.metrics.find(metric_names_[m]);
        return numberCell(it == r.metrics.end() ? NAN : it->second, 6);
    }
    switch (index.column()) {
        case COLUMN_ID: return qint64(r.id);
        case COLUMN_NAME: return r.name;
        case COLUMN_NOTES: return sort ? r.notes : QString(r.notes).replace('\n', ' ');
        case COLUMN_MODE: return r.mode;
        case COLUMN_TASK: return r.task;
        case COLUMN_TOKENS: return sort ? QVariant(qint64(r.tokens)) : QVariant(r.tokens < 0 ? QStringLiteral("-") : QString::number(r.tokens));
        case COLUMN_POLICY: return r.policy;
        case COLUMN_BUFFER: return r.buffer;
        case COLUMN_CACHE_LENGTH:
            if (sort) return qint64(r.cacheLength);
            return r.cacheLength < 0 ? QStringLiteral("-") : r.cacheLength == 0 ? QStringLiteral("all") : QString::number(r.cacheLength);
        case COLUMN_CHUNK_SIZE: return sort ? QVariant(qint64(r.chunkSize)) : QVariant(r.chunkSize < 0 ? QStringLiteral("-") : QString::number(r.chunkSize));
        case COLUMN_STATUS: {
            if (sort) return int(r.status);
            // A run whose numbers or recording cannot be trusted carries a warning sign (and, in
            // the session browser, the style's warning icon); the tooltip says why (e.g. "disk
            // full while writing session X: 720 telemetry events lost").
            const QString name = QString::fromLatin1(storage::run_status_name(r.status));
            return warn ? QString::fromUtf8("\u26A0 ") + name : name;
        }
        case COLUMN_PROGRESS:
            if (sort) return r.status == storage::RunStatus::DONE ? 1.0 : fraction;
            if (r.status == storage::RunStatus::DONE) return QStringLiteral("100%");
            return progressText(r.status, fraction, runSecondsLeft(r, QDateTime::currentMSecsSinceEpoch()));
        case COLUMN_SCORE: return numberCell(r.score, 3);
        case COLUMN_FIDELITY_KL: return numberCell(r.fidelityKl, 3);
        case COLUMN_KEPT_MASS: return numberCell(r.fidelityKeptMass, 3);
        case COLUMN_LOSS: return sort ? QVariant(std::isnan(r.loss) ? -1e300 : r.loss) : QVariant(fmtNumber(r.loss, 4));
        case COLUMN_ACCURACY: return sort ? QVariant(std::isnan(r.accuracy) ? -1e300 : r.accuracy) : QVariant(fmtNumber(r.accuracy, 3));
        case COLUMN_PEAK_MEMORY: return sort ? QVariant(qint64(r.peakBytes)) : QVariant(formatBytes(r.peakBytes));
        case COLUMN_RANKS: return sort ? QVariant(qint64(r.ranks)) : QVariant(QString::number(r.ranks));
        case COLUMN_TOKENS_PER_S:
            if (sort) return std::isnan(r.tokensPerS) ? -1e300 : r.tokensPerS;
            return std::isnan(r.tokensPerS) ? QStringLiteral("-") : QString::number(qint64(r.tokensPerS + 0.5));
        default: return {};
    }
}

void RunsModel::emitRowChanged(int row) { Q_EMIT dataChanged(index(row, 0), index(row, columnCount() - 1)); }

void RunsModel::setRuns(std::vector<RunRow> rows) {
    std::sort(rows.begin(), rows.end(), [](const RunRow& a, const RunRow& b) { return a.id < b.id; });
    std::map<int64_t, const RunRow*> incoming;
    for (const auto& r : rows) incoming[r.id] = &r;
    // Remove rows that disappeared (from the back, so indices stay valid).
    for (int i = int(rows_.size()) - 1; i >= 0; --i) {
        if (incoming.count(rows_[size_t(i)].id)) continue;
        beginRemoveRows({}, i, i);
        rows_.erase(rows_.begin() + i);
        endRemoveRows();
    }
    // Update and insert in id order.
    size_t i = 0;
    for (const auto& in : rows) {
        while (i < rows_.size() && rows_[i].id < in.id) ++i;
        if (i < rows_.size() && rows_[i].id == in.id) {
            RunRow merged = in;
            const RunRow& old = rows_[i];
            // Live progress from events is finer than the database's until the run is final.
            if (old.liveProgress && !storage::run_status_final(in.status)) {
                merged.done = old.done, merged.total = old.total, merged.progressWhat = old.progressWhat;
                merged.liveProgress = true;
            }
            if (!sameRow(merged, old)) {
                rows_[i] = merged;
                emitRowChanged(int(i));
            }
        } else {
            beginInsertRows({}, int(i), int(i));
            rows_.insert(rows_.begin() + long(i), in);
            endInsertRows();
        }
        ++i;
    }
    // New summary numbers get columns of their own, appended (existing columns keep their place,
    // so hidden/shown state and widths in the browser stay with their metric). After the rows:
    // a sorting proxy loses its sort column when columns arrive while it has no rows.
    std::vector<QString> added;
    for (const auto& r : rows)
        for (const auto& [name, v] : r.metrics)
            if (std::find(metric_names_.begin(), metric_names_.end(), name) == metric_names_.end() &&
                std::find(added.begin(), added.end(), name) == added.end())
                added.push_back(name);
    if (!added.empty()) {
        std::sort(added.begin(), added.end());
        beginInsertColumns({}, columnCount(), columnCount() + int(added.size()) - 1);
        metric_names_.insert(metric_names_.end(), added.begin(), added.end());
        endInsertColumns();
    }
}

void RunsModel::clear() {
    beginResetModel();
    rows_.clear();
    metric_names_.clear();
    endResetModel();
}

void RunsModel::setStatus(int64_t run, storage::RunStatus status, const QString& message) {
    const int row = rowOfRun(run);
    if (row < 0) return;
    RunRow& r = rows_[size_t(row)];
    r.status = status;
    if (status == storage::RunStatus::FAILED || status == storage::RunStatus::CANCELLED ||
        status == storage::RunStatus::DEGRADED)
        r.error = message;
    if (status == storage::RunStatus::DONE && r.total > 0) r.done = r.total;
    emitRowChanged(row);
}

void RunsModel::setProgress(int64_t run, int64_t done, int64_t total, const QString& what) {
    const int row = rowOfRun(run);
    if (row < 0) return;
    RunRow& r = rows_[size_t(row)];
    r.done = done, r.total = total, r.progressWhat = what, r.liveProgress = true;
    if (r.status == storage::RunStatus::QUEUED) r.status = storage::RunStatus::RUNNING;
    Q_EMIT dataChanged(index(row, COLUMN_STATUS), index(row, COLUMN_PROGRESS));
}

int RunsModel::rowOfRun(int64_t run) const {
    auto it = std::lower_bound(rows_.begin(), rows_.end(), run, [](const RunRow& r, int64_t id) { return r.id < id; });
    return it != rows_.end() && it->id == run ? int(it - rows_.begin()) : -1;
}

const RunRow* RunsModel::run(int64_t run) const {
    const int row = rowOfRun(run);
    return row < 0 ? nullptr : &rows_[size_t(row)];
}

int RunsModel::activeRuns() const {
    return int(std::count_if(rows_.begin(), rows_.end(), [](const RunRow& r) { return !storage::run_status_final(r.status); }));
}

}  // namespace kv::gui
