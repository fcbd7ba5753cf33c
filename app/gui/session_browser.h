// The session browser: a filter box over the runs table (sortable, multi-select, progress bars,
// name and notes editable in place) over RunsModel; a header menu shows or hides any column
// (every summary number has one, hidden until asked). Reports the selected run ids in id order
// and asks for run management (delete, re-run, load) by signals; holds no run state of its own.
#pragma once

#include <QWidget>

#include <QSet>
#include <QString>

#include <cstdint>
#include <vector>

class QLineEdit;
class QSortFilterProxyModel;
class QTableView;
class QModelIndex;

namespace kv::gui {

class RunsModel;

class SessionBrowser : public QWidget {
    Q_OBJECT
   public:
    SessionBrowser(RunsModel* model, QWidget* parent = nullptr);

    std::vector<int64_t> selectedRuns() const;
    void selectRuns(const std::vector<int64_t>& runs);
    QTableView* table() const { return table_; }
    QSortFilterProxyModel* proxy() const { return proxy_; }
    QLineEdit* filterEdit() const { return filter_; }
    // Shows only the runs with `text` in any shown column (case-insensitive; "" shows all).
    void setFilterText(const QString& text);
    // Shows or hides a column of the model (e.g. a summary metric from RunsModel::metricNames()).
    void setColumnShown(int column, bool shown);
    bool columnShown(int column) const;
    // Starts editing the run's name or notes in place (the context menu's Rename / Notes).
    void editCell(int64_t run, int column);

   Q_SIGNALS:
    void selectionChanged(const std::vector<int64_t>& runs);
    void runActivated(qint64 run);  // double click: load its configuration into the form
    void cancelRequested(const std::vector<int64_t>& runs);
    void deleteRequested(const std::vector<int64_t>& runs);
    void rerunRequested(const std::vector<int64_t>& runs);  // launch the same configurations again

   protected:
    bool eventFilter(QObject* watched, QEvent* event) override;

   private:
    void showHeaderMenu(const QPoint& pos);
    void applyColumnChoice();  // hides what the person hid (or has not asked to see)
    RunsModel* model_;
    QSortFilterProxyModel* proxy_;
    QTableView* table_;
    QLineEdit* filter_;
    QSet<QString> shown_metrics_;  // summary metrics the user chose to see
    QSet<int> hidden_fixed_;       // fixed columns hidden (some start hidden)
};

}  // namespace kv::gui
