// Session browser (see session_browser.h).
#include "session_browser.h"

#include <QAction>
#include <QApplication>
#include <QHeaderView>
#include <QItemSelectionModel>
#include <QMenu>
#include <QPainter>
#include <QSortFilterProxyModel>
#include <QStyle>
#include <QStyledItemDelegate>
#include <QTableView>
#include <QVBoxLayout>

#include <algorithm>

#include "models/runs_model.h"

namespace kv::gui {

namespace {

// Draws the progress column as a progress bar (fraction from RunsModel::ProgressRole).
class ProgressDelegate : public QStyledItemDelegate {
   public:
    using QStyledItemDelegate::QStyledItemDelegate;
    void paint(QPainter* p, const QStyleOptionViewItem& option, const QModelIndex& index) const override {
        const double f = index.data(RunsModel::ProgressRole).toDouble();
        if (f < 0) {
            QStyledItemDelegate::paint(p, option, index);
            return;
        }
        QStyleOptionProgressBar bar;
        bar.rect = option.rect.adjusted(2, 3, -2, -3);
        bar.minimum = 0;
        bar.maximum = 1000;
        bar.progress = int(f * 1000.0 + 0.5);
        bar.text = index.data(Qt::DisplayRole).toString();
        bar.textVisible = true;
        bar.state = option.state | QStyle::State_Horizontal;
        // A run that stopped short (cancelled, failed, crashed) is greyed: not live progress.
        const auto st = storage::RunStatus(index.data(RunsModel::StatusRole).toInt());
        if (storage::run_status_final(st) && st != storage::RunStatus::DONE) bar.state &= ~QStyle::State_Enabled;
        if (option.state & QStyle::State_Selected) p->fillRect(option.rect, option.palette.highlight());
        QApplication::style()->drawControl(QStyle::CE_ProgressBar, &bar, p);
    }
};

// The runs table's sorting proxy, which also puts the style's warning icon beside the status
// of a run that cannot be trusted (RunsModel::WarningRole; the model itself has no widgets).
class RunsProxy : public QSortFilterProxyModel {
   public:
    using QSortFilterProxyModel::QSortFilterProxyModel;
    QVariant data(const QModelIndex& index, int role) const override {
        if (role == Qt::DecorationRole && index.column() == RunsModel::COLUMN_STATUS &&
            index.data(RunsModel::WarningRole).toBool())
            return QApplication::style()->standardIcon(QStyle::SP_MessageBoxWarning);
        return QSortFilterProxyModel::data(index, role);
    }
};

}  // namespace

SessionBrowser::SessionBrowser(RunsModel* model, QWidget* parent) : QWidget(parent), model_(model) {
    proxy_ = new RunsProxy(this);
    proxy_->setSourceModel(model);
    proxy_->setSortRole(RunsModel::SortRole);
    table_ = new QTableView;
    table_->setObjectName("runsTable");
    table_->setModel(proxy_);
    table_->setSortingEnabled(true);
    table_->sortByColumn(RunsModel::COLUMN_ID, Qt::AscendingOrder);
    table_->setSelectionBehavior(QAbstractItemView::SelectRows);
    table_->setSelectionMode(QAbstractItemView::ExtendedSelection);
    table_->setAlternatingRowColors(true);
    table_->setWordWrap(false);
    table_->verticalHeader()->hide();
    table_->verticalHeader()->setDefaultSectionSize(table_->fontMetrics().height() + 8);
    table_->horizontalHeader()->setStretchLastSection(false);
    table_->horizontalHeader()->setSectionResizeMode(QHeaderView::Interactive);
    table_->horizontalHeader()->setSectionResizeMode(RunsModel::COLUMN_NAME, QHeaderView::Stretch);
    table_->setColumnWidth(RunsModel::COLUMN_ID, 40);
    // Wide enough for the longest text it shows ("cancelled at 99%") in the table's font.
    table_->setColumnWidth(RunsModel::COLUMN_PROGRESS, table_->fontMetrics().horizontalAdvance(QStringLiteral("cancelled at 100%")) + 24);
    table_->setItemDelegateForColumn(RunsModel::COLUMN_PROGRESS, new ProgressDelegate(table_));
    table_->setContextMenuPolicy(Qt::CustomContextMenu);
    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(0, 0, 0, 0);
    layout->addWidget(table_);

    connect(table_->selectionModel(), &QItemSelectionModel::selectionChanged, this,
            [this] { Q_EMIT selectionChanged(selectedRuns()); });
    connect(table_, &QTableView::doubleClicked, this, [this](const QModelIndex& i) {
        Q_EMIT runActivated(i.data(RunsModel::RunIdRole).toLongLong());
    });
    connect(table_, &QTableView::customContextMenuRequested, this, [this](const QPoint& pos) {
        const auto runs = selectedRuns();
        if (runs.empty()) return;
        QMenu menu;
        QAction* cancel = menu.addAction(tr("Cancel %n run(s)", nullptr, int(runs.size())));
        QAction* load = runs.size() == 1 ? menu.addAction(tr("Load its configuration into the form")) : nullptr;
        QAction* chosen = menu.exec(table_->viewport()->mapToGlobal(pos));
        if (chosen == cancel) Q_EMIT cancelRequested(runs);
        if (load && chosen == load) Q_EMIT runActivated(runs.front());
    });
}

std::vector<int64_t> SessionBrowser::selectedRuns() const {
    std::vector<int64_t> ids;
    for (const QModelIndex& i : table_->selectionModel()->selectedRows()) ids.push_back(i.data(RunsModel::RunIdRole).toLongLong());
    std::sort(ids.begin(), ids.end());
    return ids;
}

void SessionBrowser::selectRuns(const std::vector<int64_t>& runs) {
    QItemSelection sel;
    for (int64_t id : runs) {
        const int row = model_->rowOfRun(id);
        if (row < 0) continue;
        const QModelIndex left = proxy_->mapFromSource(model_->index(row, 0));
        const QModelIndex right = proxy_->mapFromSource(model_->index(row, RunsModel::NUM_COLUMNS - 1));
        sel.select(left, right);
    }
    table_->selectionModel()->select(sel, QItemSelectionModel::ClearAndSelect | QItemSelectionModel::Rows);
    if (!runs.empty()) {
        const int row = model_->rowOfRun(runs.front());
        if (row >= 0) table_->scrollTo(proxy_->mapFromSource(model_->index(row, 0)));
    }
}

}  // namespace kv::gui
