// Main window: layout, menus, status bar and settings (actions are in main_window_actions.cpp).
#include "main_window.h"

#include <QAction>
#include <algorithm>
#include <QActionGroup>
#include <QApplication>
#include <QCloseEvent>
#include <QDateTime>
#include <QDockWidget>
#include <QFileInfo>
#include <QFrame>
#include <QKeySequence>
#include <QLabel>
#include <QListWidget>
#include <QFileDialog>
#include <QMenuBar>
#include <QPushButton>
#include <QMessageBox>
#include <QPlainTextEdit>
#include <QScrollBar>
#include <QSettings>
#include <QStatusBar>
#include <QTabBar>
#include <QVBoxLayout>

#include "canvas_widget.h"
#include "engine/core/error.h"
#include "models/runs_model.h"
#include "run_form.h"
#include "session_browser.h"
#include "session_controller.h"

namespace kv::gui {

namespace {
// One tab per view, in ViewKind order (a new view needs no change here).
const int kNumViews = int(views::view_count());
views::ViewKind view_at(int i) { return views::ViewKind(i); }
}  // namespace

MainWindow::MainWindow(QWidget* parent) : QMainWindow(parent) {
    setObjectName("kvlabMainWindow");
    setWindowTitle("kvlab");
    model_ = new RunsModel(this);
    controller_ = new SessionController(model_, this);

    // Central: the view switcher above the ImGui canvas.
    auto* central = new QWidget;
    auto* v = new QVBoxLayout(central);
    v->setContentsMargins(0, 0, 0, 0);
    v->setSpacing(0);
    view_tabs_ = new QTabBar;
    view_tabs_->setObjectName("viewTabs");
    view_tabs_->setDocumentMode(true);
    view_tabs_->setExpanding(false);
    for (int i = 0; i < kNumViews; ++i) view_tabs_->addTab(QString::fromLatin1(views::view_name(view_at(i))));
    canvas_ = new CanvasWidget;
    canvas_->setObjectName("canvas");
    v->addWidget(view_tabs_);
    v->addWidget(canvas_, 1);
    setCentralWidget(central);
    // The first screen floats over the canvas (which keeps drawing underneath: hiding it would
    // stop its frames) and follows its size.
    first_screen_ = buildFirstScreen();
    first_screen_->setParent(central);
    canvas_->installEventFilter(this);
    connect(view_tabs_, &QTabBar::currentChanged, this, [this](int i) {
        if (i >= 0 && i < kNumViews) canvas_->setView(view_at(i));
    });

    // Docks: browser (top), form (right), log (bottom). Object names key the saved state.
    browser_ = new SessionBrowser(model_);
    auto* runsDock = new QDockWidget(tr("Runs"));
    runsDock->setObjectName("runsDock");
    runsDock->setWidget(browser_);
    addDockWidget(Qt::TopDockWidgetArea, runsDock);
    form_ = new RunForm;
    form_->setObjectName("runForm");
    auto* formDock = new QDockWidget(tr("Run"));
    formDock->setObjectName("formDock");
    formDock->setWidget(form_);
    addDockWidget(Qt::RightDockWidgetArea, formDock);
    log_ = new QPlainTextEdit;
    log_->setObjectName("logPanel");
    log_->setReadOnly(true);
    log_->setMaximumBlockCount(10000);
    log_->setLineWrapMode(QPlainTextEdit::NoWrap);
    auto* logDock = new QDockWidget(tr("Log"));
    logDock->setObjectName("logDock");
    logDock->setWidget(log_);
    addDockWidget(Qt::BottomDockWidgetArea, logDock);

    status_session_ = new QLabel;
    status_runs_ = new QLabel;
    status_frame_ = new QLabel;
    status_frame_->setMinimumWidth(90);
    statusBar()->addWidget(status_session_, 1);
    statusBar()->addPermanentWidget(status_runs_);
    statusBar()->addPermanentWidget(status_frame_);

    connect(browser_, &SessionBrowser::selectionChanged, this, &MainWindow::onSelectionChanged);
    connect(browser_, &SessionBrowser::cancelRequested, this, [this](const std::vector<int64_t>& runs) {
        for (int64_t r : runs) controller_->cancel(r);
    });
    connect(browser_, &SessionBrowser::runActivated, this, [this](qint64 run) {
        const RunRow* r = model_->run(run);
        if (!r) return;
        try {
            form_->setConfig(run_config_from_json(r->config.toStdString(), str("run ", run)));
            log(tr("loaded the configuration of run %1 into the form").arg(run));
        } catch (const Error& e) {
            log(tr("run %1: %2").arg(run).arg(QString::fromStdString(e.what())));
        }
    });
    connect(form_, &RunForm::launchRequested, this, [this](const RunConfig& cfg) { launch(cfg); });
    connect(form_, &RunForm::compareRequested, this, &MainWindow::compareDialog);
    connect(form_, &RunForm::cancelRequested, this, [this] {
        controller_->cancelAll();
        log(tr("cancelling the active runs (each stops within one chunk)"));
    });
    connect(controller_, &SessionController::sessionChanged, this, &MainWindow::onSessionChanged);
    connect(controller_, &SessionController::runStatusChanged, this, &MainWindow::onRunStatus);
    connect(controller_, &SessionController::runOutput, this,
            [this](qint64 run, const QString& text) { log(QStringLiteral("[run %1] %2").arg(run).arg(text)); });
    connect(controller_, &SessionController::activeChanged, this, [this](bool active) {
        canvas_->setLive(active);
        form_->setSessionBusy(active);
        updateStatus();
    });
    connect(model_, &QAbstractItemModel::dataChanged, this, &MainWindow::updateStatus);
    connect(model_, &QAbstractItemModel::rowsInserted, this, &MainWindow::updateStatus);
    connect(model_, &QAbstractItemModel::rowsRemoved, this, &MainWindow::updateStatus);
    connect(model_, &QAbstractItemModel::modelReset, this, &MainWindow::updateStatus);
    connect(model_, &RunsModel::editRequested, this, [this](qint64 run, int column, const QString& text) {
        try {
            if (column == RunsModel::COLUMN_NAME) {
                const QString got = controller_->renameRun(run, text);
                log(tr("run %1 renamed to %2").arg(run).arg(got));
            } else {
                controller_->setRunNotes(run, text);
                log(tr("run %1: notes saved").arg(run));
            }
        } catch (const Error& e) {
            showProblem(column == RunsModel::COLUMN_NAME ? tr("Cannot rename") : tr("Cannot save notes"), QString::fromStdString(e.what()));
        }
    });
    connect(browser_, &SessionBrowser::deleteRequested, this, [this](const std::vector<int64_t>& runs) { deleteRuns(runs); });
    connect(browser_, &SessionBrowser::rerunRequested, this, [this](const std::vector<int64_t>& runs) { rerunRuns(runs); });
    connect(canvas_, &CanvasWidget::viewChanged, this, [this](int v) { setView(views::ViewKind(v)); });
    // A sweep point: select its run in the table (the canvas follows the table's selection) and
    // stay on the sweep, so the next point is one click away; the other views show that run.
    connect(canvas_, &CanvasWidget::runRequested, this, [this](qint64 run) {
        browser_->selectRuns({int64_t(run)});
        log(tr("selected run %1 from the sweep").arg(run));
    });
    connect(canvas_, &CanvasWidget::frameDrawn, this,
            [this](double ms) { status_frame_->setText(QStringLiteral("frame %1 ms").arg(ms, 0, 'f', 1)); });

    buildMenus();
    resize(1600, 1000);
    // First-run proportions: the canvas gets most of the window (saved state overrides these).
    resizeDocks({runsDock, logDock}, {170, 120}, Qt::Vertical);
    resizeDocks({formDock}, {420}, Qt::Horizontal);
    restoreSettings();
    canvas_->setView(view_at(std::max(0, view_tabs_->currentIndex())));
    updateStatus();
}

MainWindow::~MainWindow() {
    // Runs stop (within one chunk) before the model, the canvas and the docks go away.
    delete controller_;
    controller_ = nullptr;
}

void MainWindow::buildMenus() {
    QMenu* file = menuBar()->addMenu(tr("&File"));
    file->addAction(tr("&New session…"), QKeySequence::New, this, &MainWindow::newSessionDialog);
    file->addAction(tr("&Open session…"), QKeySequence::Open, this, &MainWindow::openSessionDialog);
    recent_menu_ = file->addMenu(tr("Open &Recent"));
    rebuildRecentMenu();
    file->addAction(tr("&Reload runs"), QKeySequence::Refresh, this, [this] {
        controller_->reload();
        canvas_->refresh();  // the selected runs' rows too, live or not
    });
    file->addSeparator();
    file->addAction(tr("&Quit"), QKeySequence::Quit, this, &QWidget::close);

    QMenu* run = menuBar()->addMenu(tr("&Run"));
    QAction* launchAct = run->addAction(tr("&Launch"), QKeySequence(Qt::CTRL | Qt::Key_R), this, [this] {
        if (form_->isValid()) launch(form_->config());
        else showProblem(tr("Cannot launch"), form_->problems().join('\n'));
    });
    run->addAction(tr("&Compare policies…"), QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_R), this, [this] {
        if (form_->isValid()) compareDialog(form_->config());
        else showProblem(tr("Cannot compare"), form_->problems().join('\n'));
    });
    run->addSeparator();
    run->addAction(tr("Cancel &selected runs"), this, [this] {
        for (int64_t r : browser_->selectedRuns()) controller_->cancel(r);
    });
    run->addAction(tr("Cancel &all runs"), this, [this] { controller_->cancelAll(); });
    run->addSeparator();
    run->addAction(tr("Load &Python policy…"), this, [this] {
        const QString path = QFileDialog::getOpenFileName(this, tr("Load a policy written in Python (docs/PYTHON.md)"), QString(),
                                                          tr("Python files (*.py)"));
        if (!path.isEmpty()) loadPolicyFile(path);
    });
    connect(form_, &RunForm::validityChanged, launchAct, &QAction::setEnabled);

    QMenu* exp = menuBar()->addMenu(tr("&Export"));
    for (const auto& c : exportChoices()) exp->addAction(c.title, this, [this, c] { exportDialog(c); });
    exp->addSeparator();
    exp->addAction(tr("Current view as PNG…"), this, [this] { exportPngDialog(false); });
    exp->addAction(tr("Window as PNG…"), this, [this] { exportPngDialog(true); });

    QMenu* view = menuBar()->addMenu(tr("&View"));
    auto* group = new QActionGroup(this);
    for (int i = 0; i < kNumViews; ++i) {
        QAction* a = view->addAction(QString::fromLatin1(views::view_name(view_at(i))));
        a->setCheckable(true);
        a->setShortcut(QKeySequence(Qt::CTRL | Qt::Key(Qt::Key_1 + i)));
        group->addAction(a);
        connect(a, &QAction::triggered, this, [this, i] { view_tabs_->setCurrentIndex(i); });
        connect(view_tabs_, &QTabBar::currentChanged, a, [a, i](int cur) { a->setChecked(cur == i); });
        a->setChecked(i == 0);
    }
    view->addSeparator();
    for (QDockWidget* d : findChildren<QDockWidget*>()) view->addAction(d->toggleViewAction());
    view->addSeparator();
    QAction* metrics = view->addAction(tr("ImGui metrics (debug)"));
    metrics->setCheckable(true);
    connect(metrics, &QAction::toggled, canvas_, &CanvasWidget::setShowMetricsWindow);

    QMenu* help = menuBar()->addMenu(tr("&Help"));
    // "?" as in most desktop apps (text fields keep the character: they take printable keys first).
    QAction* keys = help->addAction(tr("&Keyboard shortcuts"), this, [this] { showShortcuts(); });
    keys->setObjectName("helpShortcuts");
    keys->setShortcut(QKeySequence(Qt::Key_Question));
    QAction* guide = help->addAction(tr("&User guide"), QKeySequence::HelpContents, this, [this] { showUserGuide(); });
    guide->setObjectName("helpGuide");
    help->addSeparator();
    help->addAction(tr("&About kvlab"), this, &MainWindow::aboutDialog);
    help->addAction(tr("About &Qt"), qApp, &QApplication::aboutQt);
}

void MainWindow::restoreSettings() {
    QSettings s;
    restoreGeometry(s.value("window/geometry").toByteArray());
    restoreState(s.value("window/state").toByteArray());
    // Stored by name, so reordering or adding views keeps the user's choice.
    views::ViewKind v = views::view_named("eviction map");
    if (views::view_from_name(s.value("view/name").toString().toStdString(), &v)) view_tabs_->setCurrentIndex(int(v.index()));
    const QString form = s.value("form/config").toString();
    if (!form.isEmpty()) {
        try {
            form_->setConfig(run_config_from_json(form.toStdString(), "saved form"));
        } catch (const Error&) {
            form_->resetToDefaults();  // from an older option table: start over
        }
    }
}

void MainWindow::saveSettings() {
    QSettings s;
    s.setValue("window/geometry", saveGeometry());
    s.setValue("window/state", saveState());
    s.setValue("view/name", QString::fromLatin1(views::view_name(view_at(std::max(0, view_tabs_->currentIndex())))));
    if (!controller_->path().isEmpty()) s.setValue("session/last", controller_->path());
    if (form_->isValid()) s.setValue("form/config", QString::fromStdString(run_config_to_json(form_->config(), false)));
}

void MainWindow::restoreLastSession() {
    const QString last = QSettings().value("session/last").toString();
    if (!last.isEmpty() && QFileInfo::exists(last)) openSession(last);
}

void MainWindow::closeEvent(QCloseEvent* e) {
    if (controller_->anyActive()) {
        const int active = std::max(1, model_->activeRuns());
        const bool quit = confirm_quit_ ? confirm_quit_(active)
                          : quiet_      ? true
                                        : QMessageBox::question(this, tr("Quit kvlab?"),
                                                                tr("%n run(s) still running. Quitting cancels them; what they recorded "
                                                                   "so far stays in the session and they are marked cancelled.",
                                                                   nullptr, active),
                                                                QMessageBox::Yes | QMessageBox::Cancel,
                                                                QMessageBox::Cancel) == QMessageBox::Yes;
        if (!quit) {
            log(tr("still running: quit cancelled"));
            e->ignore();
            return;
        }
        log(tr("cancelling active runs before closing"));
    }
    saveSettings();
    QMainWindow::closeEvent(e);
}

QWidget* MainWindow::buildFirstScreen() {
    auto* card = new QFrame;
    card->setObjectName("firstScreen");
    card->setFrameShape(QFrame::StyledPanel);
    card->setAutoFillBackground(true);
    auto* v = new QVBoxLayout(card);
    v->setContentsMargins(24, 20, 24, 20);
    v->setSpacing(8);
    auto* title = new QLabel(tr("<h2>Start here</h2>"));
    title->setObjectName("firstScreenTitle");
    v->addWidget(title);
    auto* demo = new QPushButton(tr("Run the demo comparison"));
    demo->setObjectName("firstScreenDemo");
    demo->setDefault(true);
    demo->setToolTip(tr("What kvlab-gui --demo runs"));
    connect(demo, &QPushButton::clicked, this, [this] { startDemo(); });
    v->addWidget(demo);
    auto* demoText = new QLabel(tr("Dense and h2o, lastrec, tova at 256 and 512 slots, on the repeat task and on licence "
                                   "text (1024 tokens, fidelity on), on SmolLM2-135M (the random tiny model when it is not "
                                   "installed). The sweep view draws the runs as they finish."));
    demoText->setWordWrap(true);
    v->addWidget(demoText);
    auto* open = new QPushButton(tr("Open a session…"));
    open->setObjectName("firstScreenOpen");
    connect(open, &QPushButton::clicked, this, &MainWindow::openSessionDialog);
    v->addSpacing(6);
    v->addWidget(open);
    v->addSpacing(6);
    v->addWidget(new QLabel(tr("<b>Recent sessions</b> (click to open)")));
    recent_list_ = new QListWidget;
    recent_list_->setObjectName("firstScreenRecent");
    recent_list_->setVerticalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
    connect(recent_list_, &QListWidget::itemClicked, this, [this](QListWidgetItem* item) {
        const QString p = item->data(Qt::UserRole).toString();
        if (!p.isEmpty() && p != controller_->path()) openSession(p);
    });
    v->addWidget(recent_list_);
    auto* hint = new QLabel(tr("Or set up a run in the Run panel on the right and press Launch (Ctrl+R)."));
    hint->setWordWrap(true);
    v->addWidget(hint);
    card->setFixedWidth(520);
    return card;
}

void MainWindow::updateFirstScreen() {
    if (!first_screen_) return;
    recent_list_->clear();
    for (const QString& p : recentSessions()) {
        if (p == QFileInfo(controller_->path()).absoluteFilePath()) continue;  // the open one
        auto* item = new QListWidgetItem(QStringLiteral("%1 — %2").arg(QFileInfo(p).fileName(), QFileInfo(p).absolutePath()));
        item->setData(Qt::UserRole, p);
        item->setToolTip(p);
        recent_list_->addItem(item);
    }
    if (recent_list_->count() == 0) {
        auto* none = new QListWidgetItem(tr("(none yet: sessions you open are listed here)"));
        none->setFlags(Qt::NoItemFlags);
        recent_list_->addItem(none);
    }
    // As tall as its entries (at most kMaxRecent), not a box of blank lines.
    recent_list_->setFixedHeight(recent_list_->sizeHintForRow(0) * recent_list_->count() + 2 * recent_list_->frameWidth() + 4);
    if (auto* title = first_screen_->findChild<QLabel*>("firstScreenTitle"))
        title->setText(controller_->isOpen() ? tr("<h2>This session has no runs yet</h2>") : tr("<h2>Start here</h2>"));
    first_screen_->setVisible(model_->rowCount() == 0);
    first_screen_->adjustSize();
    const QRect area = canvas_->geometry();
    first_screen_->move(area.x() + std::max(0, (area.width() - first_screen_->width()) / 2),
                        area.y() + std::max(0, (area.height() - first_screen_->height()) / 3));
    first_screen_->raise();
}

bool MainWindow::eventFilter(QObject* watched, QEvent* event) {
    if (watched == canvas_ && (event->type() == QEvent::Resize || event->type() == QEvent::Move)) updateFirstScreen();
    return QMainWindow::eventFilter(watched, event);
}

void MainWindow::updateStatus() {
    updateFirstScreen();
    status_session_->setText(controller_->path().isEmpty()
                                 ? tr("no session — File > New session or Open session")
                                 : tr("session %1%2").arg(controller_->path(), controller_->readOnly() ? tr(" (read-only)") : QString()));
    const int active = model_->activeRuns();
    status_runs_->setText(tr("%n run(s)", nullptr, model_->rowCount()) + (active ? tr(", %1 active").arg(active) : QString()));
}

void MainWindow::log(const QString& line) {
    // Follow the newest line unless the reader scrolled up to read older ones.
    QScrollBar* bar = log_->verticalScrollBar();
    const bool follow = bar->value() >= bar->maximum() - 1;
    log_->appendPlainText(QDateTime::currentDateTime().toString("hh:mm:ss  ") + line);
    if (follow) bar->setValue(bar->maximum());
}

QString MainWindow::logText() const { return log_->toPlainText(); }

void MainWindow::setView(views::ViewKind view) {
    for (int i = 0; i < kNumViews; ++i)
        if (view_at(i) == view) view_tabs_->setCurrentIndex(i);
}

views::ViewKind MainWindow::view() const { return canvas_->view(); }

}  // namespace kv::gui
