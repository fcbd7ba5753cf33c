// The session browser: the runs table (sortable, multi-select, progress bars) over RunsModel.
// Reports the selected run ids in id order; holds no run state of its own.
#pragma once

#include <QWidget>

#include <cstdint>
#include <vector>

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

   Q_SIGNALS:
    void selectionChanged(const std::vector<int64_t>& runs);
    void runActivated(qint64 run);  // double click: load its configuration into the form
    void cancelRequested(const std::vector<int64_t>& runs);

   private:
    RunsModel* model_;
    QSortFilterProxyModel* proxy_;
    QTableView* table_;
};

}  // namespace kv::gui
