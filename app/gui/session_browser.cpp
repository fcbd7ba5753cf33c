// Session browser (see session_browser.h).
#include "session_browser.h"

#include <QAction>
#include <QApplication>
#include <QHeaderView>
#include <QItemSelectionModel>
#include <QKeyEvent>
#include <QLineEdit>
#include <QMenu>
#include <QPainter>
#include <QSettings>
#include <QSortFilterProxyModel>
#include <QStyle>
#include <QStyledItemDelegate>
#include <QTableView>
#include <QVBoxLayout>

#include <algorithm>
#include <functional>

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
    std::function<bool(int)> columnShown;  // the filter reads what the person sees, not hidden numbers
    void setText(const QString& text) {
        text_ = text;
        invalidateFilter();
    }
    bool filterAcceptsRow(int row, const QModelIndex& parent) const override {
        if (text_.isEmpty()) return true;
        const QAbstractItemModel* m = sourceModel();
        for (int c = 0; c < m->columnCount(parent); ++c)
            if ((!columnShown || columnShown(c)) && m->index(row, c, parent).data().toString().contains(text_, Qt::CaseInsensitive))
                return true;
        return false;
    }
    QVariant data(const QModelIndex& index, int role) const override {
        if (role == Qt::DecorationRole && index.column() == RunsModel::COLUMN_STATUS &&
            index.data(RunsModel::WarningRole).toBool())
            return QApplication::style()->standardIcon(QStyle::SP_MessageBoxWarning);
        return QSortFilterProxyModel::data(index, role);
    }

   private:
    QString text_;
};

}  // namespace

SessionBrowser::SessionBrowser(RunsModel* model, QWidget* parent) : QWidget(parent), model_(model) {
    auto* proxy = new RunsProxy(this);
    proxy_ = proxy;
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
    table_->horizontalHeader()->setStretchLastSection(true);
    table_->horizontalHeader()->setSectionResizeMode(QHeaderView::Interactive);
    table_->setColumnWidth(RunsModel::COLUMN_ID, 40);
    // Wide enough for the longest text it shows ("cancelled at 99%") in the table's font.
    table_->setColumnWidth(RunsModel::COLUMN_PROGRESS, table_->fontMetrics().horizontalAdvance(QStringLiteral("cancelled at 100%")) + 24);
    table_->setItemDelegateForColumn(RunsModel::COLUMN_PROGRESS, new ProgressDelegate(table_));
    table_->setContextMenuPolicy(Qt::CustomContextMenu);
    // F2 edits a name or notes; a double click keeps loading the run's configuration.
    table_->setEditTriggers(QAbstractItemView::EditKeyPressed);
    // Twenty columns share the dock: the name gets room (more as longer names arrive), numbers get what their text needs,
    // and the columns a comparison rarely varies start hidden (the header menu shows them).
    table_->horizontalHeader()->setDefaultSectionSize(table_->fontMetrics().horizontalAdvance(QStringLiteral("KL vs dense")) + 16);
    table_->horizontalHeader()->setSectionResizeMode(RunsModel::COLUMN_NAME, QHeaderView::Interactive);
    table_->setColumnWidth(RunsModel::COLUMN_NAME, table_->fontMetrics().horizontalAdvance(QStringLiteral("repeat: lastrec-default L=512 #2")) + 12);
    table_->setColumnWidth(RunsModel::COLUMN_NOTES, 140);
    hidden_fixed_ = {int(RunsModel::COLUMN_MODE), int(RunsModel::COLUMN_CHUNK_SIZE), int(RunsModel::COLUMN_RANKS)};
    // The person's last choice of columns, by header name (column numbers change between builds).
    QSettings settings;
    if (settings.contains("runs/hiddenColumns")) {
        hidden_fixed_.clear();
        const QStringList hidden = settings.value("runs/hiddenColumns").toStringList();
        for (int c = 0; c < RunsModel::NUM_COLUMNS; ++c)
            if (hidden.contains(model_->headerData(c, Qt::Horizontal).toString())) hidden_fixed_.insert(c);
    }
    for (const QString& m : settings.value("runs/shownMetrics").toStringList()) shown_metrics_.insert(m);
    proxy->columnShown = [this](int c) { return !table_->isColumnHidden(c); };
    filter_ = new QLineEdit;
    filter_->setObjectName("runsFilter");
    filter_->setPlaceholderText(tr("Filter runs: any text of a row (name, notes, task, policy, status, …)"));
    filter_->setClearButtonEnabled(true);
    connect(filter_, &QLineEdit::textChanged, proxy, &RunsProxy::setText);
    table_->horizontalHeader()->setContextMenuPolicy(Qt::CustomContextMenu);
    connect(table_->horizontalHeader(), &QHeaderView::customContextMenuRequested, this, &SessionBrowser::showHeaderMenu);
    // Every summary number has a column; they start hidden (the fixed columns lead with the
    // study's numbers), and the header menu shows any of them.
    // Names as long as the CLI's defaults ("eval_long smollm2-135m h2o-default L=256") fit, up to a
    // third of the table; a name edited by hand (renamed) keeps what the person set.
    connect(proxy_, &QAbstractItemModel::rowsInserted, this, [this] {
        const int before = table_->columnWidth(RunsModel::COLUMN_NAME);
        table_->resizeColumnToContents(RunsModel::COLUMN_NAME);
        const int fits = table_->columnWidth(RunsModel::COLUMN_NAME);
        table_->setColumnWidth(RunsModel::COLUMN_NAME, std::max(before, std::min(fits, std::max(200, table_->viewport()->width() / 3))));
    });
    connect(proxy_, &QAbstractItemModel::columnsInserted, this, &SessionBrowser::applyColumnChoice);
    connect(proxy_, &QAbstractItemModel::modelReset, this, &SessionBrowser::applyColumnChoice);
    applyColumnChoice();
    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(0, 0, 0, 0);
    layout->setSpacing(2);
    layout->addWidget(filter_);
    layout->addWidget(table_);

    table_->installEventFilter(this);  // Del deletes the selected runs (asks first)
    connect(table_->selectionModel(), &QItemSelectionModel::selectionChanged, this,
            [this] { Q_EMIT selectionChanged(selectedRuns()); });
    connect(table_, &QTableView::doubleClicked, this, [this](const QModelIndex& i) {
        Q_EMIT runActivated(i.data(RunsModel::RunIdRole).toLongLong());
    });
    connect(table_, &QTableView::customContextMenuRequested, this, [this](const QPoint& pos) {
        const auto runs = selectedRuns();
        if (runs.empty()) return;
        const int n = int(runs.size());
        bool anyLive = false;
        for (int64_t id : runs)
            if (const RunRow* r = model_->run(id); r && !storage::run_status_final(r->status)) anyLive = true;
        QMenu menu;
        QAction* load = n == 1 ? menu.addAction(tr("Load its configuration into the form")) : nullptr;
        QAction* rerun = menu.addAction(tr("Run again (%n run(s))", nullptr, n));
        menu.addSeparator();
        QAction* rename = n == 1 ? menu.addAction(tr("Rename…")) : nullptr;
        QAction* notes = n == 1 ? menu.addAction(tr("Edit notes…")) : nullptr;
        menu.addSeparator();
        QAction* cancel = menu.addAction(tr("Cancel %n run(s)", nullptr, n));
        cancel->setEnabled(anyLive);
        QAction* del = menu.addAction(tr("Delete %n run(s)…", nullptr, n));
        del->setEnabled(!anyLive);
        if (anyLive) del->setToolTip(tr("cancel the running ones first"));
        QAction* chosen = menu.exec(table_->viewport()->mapToGlobal(pos));
        if (!chosen) return;
        if (chosen == cancel) Q_EMIT cancelRequested(runs);
        if (chosen == load) Q_EMIT runActivated(runs.front());
        if (chosen == rerun) Q_EMIT rerunRequested(runs);
        if (chosen == rename) editCell(runs.front(), RunsModel::COLUMN_NAME);
        if (chosen == notes) editCell(runs.front(), RunsModel::COLUMN_NOTES);
        if (chosen == del) Q_EMIT deleteRequested(runs);
    });
}

void SessionBrowser::showHeaderMenu(const QPoint& pos) {
    QMenu menu;
    QMenu* metrics = nullptr;
    for (int c = 0; c < model_->columnCount(); ++c) {
        QMenu* in = &menu;
        if (c >= RunsModel::NUM_COLUMNS) {
            if (!metrics) metrics = menu.addMenu(tr("Summary numbers"));
            in = metrics;
        }
        QAction* a = in->addAction(model_->headerData(c, Qt::Horizontal).toString());
        a->setCheckable(true);
        a->setChecked(columnShown(c));
        connect(a, &QAction::toggled, this, [this, c](bool on) { setColumnShown(c, on); });
    }
    menu.exec(table_->horizontalHeader()->mapToGlobal(pos));
}

bool SessionBrowser::eventFilter(QObject* watched, QEvent* event) {
    // The table's own keys: a cell being edited has its own editor widget, so Del there edits text.
    if (watched == table_ && event->type() == QEvent::KeyPress && static_cast<QKeyEvent*>(event)->key() == Qt::Key_Delete) {
        const auto runs = selectedRuns();
        if (!runs.empty()) Q_EMIT deleteRequested(runs);
        return true;
    }
    return QWidget::eventFilter(watched, event);
}

void SessionBrowser::applyColumnChoice() {
    for (int c = 0; c < model_->columnCount(); ++c) {
        const size_t m = size_t(c - RunsModel::NUM_COLUMNS);
        const bool shown = c < RunsModel::NUM_COLUMNS ? !hidden_fixed_.contains(c)
                                                      : m < model_->metricNames().size() && shown_metrics_.contains(model_->metricNames()[m]);
        table_->setColumnHidden(c, !shown);
    }
}

void SessionBrowser::setFilterText(const QString& text) { filter_->setText(text); }

void SessionBrowser::setColumnShown(int column, bool shown) {
    if (column < 0 || column >= model_->columnCount()) return;
    const size_t m = size_t(column - RunsModel::NUM_COLUMNS);
    if (column >= RunsModel::NUM_COLUMNS && m < model_->metricNames().size()) {
        if (shown) shown_metrics_.insert(model_->metricNames()[m]);
        else shown_metrics_.remove(model_->metricNames()[m]);
    } else if (column < RunsModel::NUM_COLUMNS) {
        if (shown) hidden_fixed_.remove(column);
        else hidden_fixed_.insert(column);
    }
    table_->setColumnHidden(column, !shown);
    static_cast<RunsProxy*>(proxy_)->setText(filter_->text());  // the filter reads the shown columns
    QStringList hidden, metrics(shown_metrics_.begin(), shown_metrics_.end());
    for (int c : hidden_fixed_) hidden << model_->headerData(c, Qt::Horizontal).toString();
    QSettings settings;
    settings.setValue("runs/hiddenColumns", hidden);
    settings.setValue("runs/shownMetrics", metrics);
    if (shown && table_->columnWidth(column) < 40) table_->resizeColumnToContents(column);
}

bool SessionBrowser::columnShown(int column) const { return !table_->isColumnHidden(column); }

void SessionBrowser::editCell(int64_t run, int column) {
    const int row = model_->rowOfRun(run);
    if (row < 0) return;
    if (table_->isColumnHidden(column)) setColumnShown(column, true);  // notes hidden by the person: shown to edit
    const QModelIndex i = proxy_->mapFromSource(model_->index(row, column));
    if (!i.isValid()) return;  // filtered out
    table_->scrollTo(i);
    table_->setCurrentIndex(i);
    table_->edit(i);
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
        const QModelIndex right = proxy_->mapFromSource(model_->index(row, model_->columnCount() - 1));
        sel.select(left, right);
    }
    table_->selectionModel()->select(sel, QItemSelectionModel::ClearAndSelect | QItemSelectionModel::Rows);
    if (!runs.empty()) {
        const int row = model_->rowOfRun(runs.front());
        if (row >= 0) table_->scrollTo(proxy_->mapFromSource(model_->index(row, 0)));
    }
}

}  // namespace kv::gui
