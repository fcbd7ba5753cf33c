// Main window actions: sessions, launching, comparisons, exports, help, about.
#include <QDialog>
#include <QAction>
#include <QMenu>
#include <QSettings>
#include <QDir>
#include <QFileDialog>
#include <algorithm>
#include <QFileInfo>
#include <QMessageBox>
#include <QPlainTextEdit>
#include <QPointer>
#include <QRegularExpression>
#include <QStatusBar>
#include <QTabBar>
#include <QThread>

#include "app/cli_python/policy_file_loader.h"
#include "canvas_widget.h"
#include "compare_dialog.h"
#include "engine/core/error.h"
#include "help.h"
#include "main_window.h"
#include "models/runs_model.h"
#include "run_form.h"
#include "session_browser.h"
#include "session_controller.h"
#include "sessions/run_manager.h"

namespace kv::gui {

void MainWindow::showProblem(const QString& title, const QString& message) {
    log(title + ": " + message);
    statusBar()->showMessage(message, 10000);
    if (!quiet_) QMessageBox::warning(this, title, message);
}

QString MainWindow::loadPolicyFile(const QString& path) {
    std::string name;
    try {
        name = load_python_policy_file(path.toStdString());
    } catch (const Error& e) {
        showProblem(tr("Cannot load the policy file"), QString::fromStdString(e.what()));
        return {};
    }
    form_->refreshPolicies();
    log(tr("policy '%1' loaded from %2: choose it in the run form (cache name %1-default)").arg(QString::fromStdString(name), path));
    return QString::fromStdString(name);
}

bool MainWindow::openSession(const QString& path) {
    try {
        controller_->openSession(path);
    } catch (const Error& e) {
        showProblem(tr("Cannot open session"), QString::fromStdString(e.what()));
        return false;
    }
    for (int64_t id : controller_->crashedAtOpen())
        log(tr("run %1 was left running by a process that is gone: marked crashed").arg(id));
    return true;
}

void MainWindow::onSessionChanged(const QString& path) {
    setWindowTitle(path.isEmpty() ? QStringLiteral("kvlab") : QStringLiteral("%1 — kvlab").arg(QFileInfo(path).fileName()));
    try {
        canvas_->openSession(path);
    } catch (const Error& e) {
        showProblem(tr("The views cannot read the session"), QString::fromStdString(e.what()));
    }
    if (!path.isEmpty()) log(tr("session %1: %n run(s)", nullptr, model_->rowCount()).arg(path));
    if (!path.isEmpty()) rememberSession(path);
    canvas_->setLive(controller_->anyActive());
    form_->setSessionBusy(controller_->anyActive());
    updateStatus();
}

int64_t MainWindow::launch(const RunConfig& cfg) {
    if (!controller_->isOpen()) {
        const QString path = QString::fromStdString(sessions::default_session_path());
        log(tr("no session open: recording into %1").arg(path));
        if (!openSession(path)) return -1;
    }
    try {
        const int64_t run = controller_->submit(cfg);
        const RunRow* r = model_->run(run);
        log(tr("run %1 queued: %2").arg(run).arg(r ? r->name : QString()));
        canvas_->setLive(true);
        // The launched run is the one to watch: select it, so every view follows it live with no
        // click (a comparison selects its whole set once all are queued).
        selectRuns({run});
        return run;
    } catch (const Error& e) {
        showProblem(tr("Cannot launch"), QString::fromStdString(e.what()));
        return -1;
    }
}

std::vector<int64_t> MainWindow::launchComparison(const std::vector<RunConfig>& cfgs) {
    std::vector<int64_t> ids;
    for (const auto& c : cfgs) {
        const int64_t id = launch(c);
        if (id < 0) break;  // the reason is shown; runs already queued keep going
        ids.push_back(id);
    }
    if (ids.empty()) return ids;
    pending_reference_ = ids.front();
    // A sweep over cache sizes (several lengths of one cache) opens on its curves.
    std::vector<int64_t> lengths;
    for (const auto& c : cfgs)
        if (c.kv_cache.policy() != "dense" && std::find(lengths.begin(), lengths.end(), c.kv_cache.cache_length) == lengths.end())
            lengths.push_back(c.kv_cache.cache_length);
    const bool sweep = lengths.size() > 1;
    if (sweep) setView(views::view_named("sweep"));
    selectRuns(sweep ? std::vector<int64_t>{ids.front()} : ids);
    if (ids.size() >= 2 && !sweep) setView(views::view_named("compare"));
    log(tr("comparison of %n run(s) launched; reference: run %1", nullptr, int(ids.size())).arg(ids.front()));
    return ids;
}

void MainWindow::selectRuns(const std::vector<int64_t>& runs) { browser_->selectRuns(runs); }

bool MainWindow::deleteRuns(const std::vector<int64_t>& runs) {
    if (runs.empty()) return false;
    QStringList names;
    for (int64_t id : runs) {
        const RunRow* r = model_->run(id);
        names << tr("run %1 (%2)").arg(id).arg(r ? r->name : QString());
    }
    const bool yes = confirm_delete_ ? confirm_delete_(names)
                     : quiet_        ? true
                                     : QMessageBox::question(this, tr("Delete runs?"),
                                                             tr("Delete %n run(s) and everything recorded for them from the session? "
                                                                "Other runs are not touched. This cannot be undone.\n\n%1",
                                                                nullptr, int(runs.size()))
                                                                 .arg(names.join('\n')),
                                                             QMessageBox::Yes | QMessageBox::Cancel, QMessageBox::Cancel) == QMessageBox::Yes;
    if (!yes) {
        log(tr("delete cancelled"));
        return false;
    }
    try {
        controller_->deleteRuns(runs);
    } catch (const Error& e) {
        showProblem(tr("Cannot delete"), QString::fromStdString(e.what()));
        canvas_->refresh();
        return false;
    }
    log(tr("deleted %1").arg(names.join(", ")));
    canvas_->refresh();
    return true;
}

std::vector<int64_t> MainWindow::rerunRuns(const std::vector<int64_t>& runs) {
    std::vector<RunConfig> cfgs;
    for (int64_t id : runs) {
        const RunRow* r = model_->run(id);
        if (!r) continue;
        try {
            cfgs.push_back(run_config_from_json(r->config.toStdString(), str("run ", id)));
            // Under the run's current name (it may have been renamed), without its "#N": the
            // controller numbers the new run.
            cfgs.back().name = QString(r->name).remove(QRegularExpression(QStringLiteral(" #\\d+$"))).toStdString();
        } catch (const Error& e) {
            showProblem(tr("Cannot run again"), QString::fromStdString(e.what()));
            return {};
        }
    }
    std::vector<int64_t> ids;
    for (const RunConfig& c : cfgs) {
        const int64_t id = launch(c);
        if (id < 0) break;  // the reason is shown; runs already queued keep going
        ids.push_back(id);
    }
    if (ids.size() > 1) selectRuns(ids);
    return ids;
}

void MainWindow::onSelectionChanged(const std::vector<int64_t>& runs) {
    std::vector<int64_t> shown = runs;
    if (shown.size() > 8) {
        shown.resize(8);
        statusBar()->showMessage(tr("the compare view shows the first 8 of %1 selected runs").arg(runs.size()), 5000);
    }
    canvas_->selectRuns(shown);
    if (shown.size() >= 2) {
        const bool refSelected = std::find(shown.begin(), shown.end(), pending_reference_) != shown.end();
        canvas_->setReference(refSelected ? pending_reference_ : shown.front());
    }
    // The canvas chose the view for the selection (fidelity and sweep keep several runs, the
    // others give way to compare, compare to the default for one run): the tab bar follows.
    setView(canvas_->view());
}

void MainWindow::onRunStatus(qint64 run, int status, const QString& message) {
    const auto s = storage::RunStatus(status);
    const RunRow* r = model_->run(run);
    const QString name = r ? r->name : QString();
    QString line = tr("run %1 (%2) %3").arg(run).arg(name, QString::fromLatin1(storage::run_status_name(s)));
    if (!message.isEmpty()) line += ": " + message;
    log(line);
    if (storage::run_status_final(s)) canvas_->refresh();
    updateStatus();
}

void MainWindow::startDemo() {
    if (model_->rowCount() > 0) {
        std::vector<int64_t> all;
        for (const auto& r : model_->rows()) all.push_back(r.id);
        if (all.size() > 8) all.resize(8);
        selectRuns(all);
        return;
    }
    const std::vector<RunConfig> cfgs = demoConfigs(&demo_model_);
    if (demo_model_ == "tiny")
        log(tr("demo: %1 is missing (scripts/fetch_assets.sh fetches it); falling back to the random tiny model, whose "
               "numbers do not rank the policies")
                .arg(smolLm2AssetPath()));
    std::vector<int64_t> ids;
    for (const auto& c : cfgs) {
        const int64_t id = launch(c);
        if (id < 0) break;
        ids.push_back(id);
    }
    if (ids.empty()) return;
    pending_reference_ = ids.front();
    // The first screen: the curves of the sweep, filling in as its runs finish.
    setView(views::view_named("sweep"));
    selectRuns({ids.front()});
    log(tr("demo: %n run(s) of %1 launched (dense and h2o, lastrec, tova at 256 and 512 slots on the repeat task and on "
           "licence text, fidelity on); the sweep view draws them as they finish",
           nullptr, int(ids.size()))
            .arg(QString::fromStdString(demo_model_)));
}

std::vector<RunConfig> demoConfigs(std::string* model_used) {
    // SmolLM2-135M when its asset is there (a real model: the policies differ), else tiny.
    const bool real = smolLm2Installed();
    const std::string model = real ? "smollm2-135m" : "tiny";
    if (model_used) *model_used = model;
    auto base = [&](const std::string& task) {
        RunConfig c;
        c.mode = "eval_long";
        c.model = model;
        set_run_option(c, "data", task);
        set_run_option(c, "data.seq_length", "1024");
        set_run_option(c, "data.num_samples", "1");
        if (task == "repeat") {
            set_run_option(c, "data.repeat_length", "64");
            set_run_option(c, "data.repeat_distance", "384");
        } else {
            set_run_option(c, "data.files", "/usr/share/common-licenses/GPL-3");
        }
        set_run_option(c, "kv_cache.chunk_size", "64");
        c.fidelity = true;
        return c;
    };
    std::vector<RunConfig> out;
    for (const std::string task : {"repeat", "text"}) {
        std::vector<RunConfig> g = compareConfigs(base(task), {"h2o", "lastrec", "tova"}, {"default"}, CompareReference::DENSE, {256, 512});
        for (RunConfig& c : g) c.name = task + ": " + c.name;
        out.insert(out.end(), g.begin(), g.end());
    }
    return out;
}

void MainWindow::newSessionDialog() {
    QString path = QFileDialog::getSaveFileName(this, tr("New session"), QString(), tr("kvlab sessions (*.kvlab)"), nullptr,
                                                QFileDialog::DontConfirmOverwrite);
    if (path.isEmpty()) return;
    if (QFileInfo(path).suffix().isEmpty()) path += ".kvlab";
    if (QFileInfo::exists(path)) log(tr("%1 exists: opening it (a session is never overwritten)").arg(path));
    openSession(path);
}

void MainWindow::openSessionDialog() {
    // Start where sessions are: the open one's folder, else the last one's, else where kvlab
    // writes new sessions (~/.local/share/kvlab), else home.
    QString dir;
    const QStringList recent = recentSessions();
    if (!controller_->path().isEmpty()) dir = QFileInfo(controller_->path()).absolutePath();
    else if (!recent.isEmpty()) dir = QFileInfo(recent.front()).absolutePath();
    else if (const QString d = QDir::homePath() + QStringLiteral("/.local/share/kvlab"); QFileInfo(d).isDir()) dir = d;
    else dir = QDir::homePath();
    const QString path = QFileDialog::getOpenFileName(this, tr("Open session"), dir, tr("kvlab sessions (*.kvlab);;All files (*)"));
    if (!path.isEmpty()) openSession(path);
}

QStringList MainWindow::recentSessions() const {
    QStringList out;
    for (const QString& p : QSettings().value("session/recent").toStringList())
        if (QFileInfo::exists(p) && !out.contains(p) && out.size() < kMaxRecent) out.push_back(p);
    return out;
}

void MainWindow::rememberSession(const QString& path) {
    QStringList list = recentSessions();
    const QString abs = QFileInfo(path).absoluteFilePath();
    list.removeAll(abs);
    list.prepend(abs);
    while (list.size() > kMaxRecent) list.removeLast();
    QSettings().setValue("session/recent", list);
    rebuildRecentMenu();
}

void MainWindow::rebuildRecentMenu() {
    if (!recent_menu_) return;
    recent_menu_->clear();
    const QStringList list = recentSessions();
    for (int i = 0; i < list.size(); ++i) {
        const QString p = list[i];
        // "&1 name.kvlab — /its/folder": a number to press, the name first, the folder to tell equal names apart
        QAction* a = recent_menu_->addAction(QStringLiteral("&%1 %2 — %3").arg(i + 1).arg(QFileInfo(p).fileName(), QFileInfo(p).absolutePath()));
        a->setData(p);
        connect(a, &QAction::triggered, this, [this, p] { openSession(p); });
    }
    recent_menu_->setEnabled(!list.isEmpty());
    updateFirstScreen();
}

void MainWindow::compareDialog(const RunConfig& base) {
    CompareDialog dlg(base, this);
    if (dlg.exec() != QDialog::Accepted) return;
    launchComparison(dlg.configs());
}

bool MainWindow::exportSelected(const ExportChoice& choice, const QString& path, QString* error) {
    const auto runs = browser_->selectedRuns();
    try {
        if (runs.empty()) throw Error("no run selected; select one in the runs table first");
        const storage::ExportResult res = exportRun(controller_->path(), runs.front(), choice, path);
        log(tr("exported run %1 to %2: %3 records, %4").arg(runs.front()).arg(path).arg(res.records).arg(formatBytes(int64_t(res.bytes))));
        return true;
    } catch (const Error& e) {
        if (error) *error = QString::fromStdString(e.what());
        showProblem(tr("Export failed"), QString::fromStdString(e.what()));
        return false;
    }
}

void MainWindow::exportDialog(const ExportChoice& choice) {
    const auto runs = browser_->selectedRuns();
    if (runs.empty()) {
        showProblem(tr("Export"), tr("no run selected; select one in the runs table first"));
        return;
    }
    QString path = QFileDialog::getSaveFileName(this, choice.title, QStringLiteral("run%1.%2").arg(runs.front()).arg(choice.suffix),
                                                choice.filter);
    if (path.isEmpty()) return;
    // Large runs take a while: export on a worker thread; the reader is its own connection.
    const QString session = controller_->path();
    const int64_t run = runs.front();
    auto result = std::make_shared<QString>();
    QThread* t = QThread::create([session, run, choice, path, result] {
        try {
            const storage::ExportResult res = exportRun(session, run, choice, path);
            *result = QStringLiteral("exported run %1 to %2: %3 records, %4")
                          .arg(run)
                          .arg(path)
                          .arg(res.records)
                          .arg(formatBytes(int64_t(res.bytes)));
        } catch (const std::exception& e) {
            *result = QStringLiteral("!") + QString::fromStdString(e.what());
        }
    });
    QPointer<MainWindow> self(this);
    connect(t, &QThread::finished, this, [self, t, result] {
        t->deleteLater();
        if (!self) return;
        if (result->startsWith('!')) self->showProblem(tr("Export failed"), result->mid(1));
        else self->log(*result);
    });
    log(tr("exporting run %1 to %2 …").arg(run).arg(path));
    t->start();
}

bool MainWindow::saveViewPng(const QString& path) {
    const QImage img = canvas_->grabFramebuffer();
    if (img.isNull() || !img.save(path, "PNG")) {
        showProblem(tr("PNG export failed"), tr("could not write %1").arg(path));
        return false;
    }
    log(tr("saved the %1 view to %2").arg(QString::fromLatin1(views::view_name(view())), path));
    return true;
}

bool MainWindow::saveWindowPng(const QString& path) {
    const QPixmap pm = grab();
    if (pm.isNull() || !pm.save(path, "PNG")) {
        showProblem(tr("PNG export failed"), tr("could not write %1").arg(path));
        return false;
    }
    log(tr("saved the window to %1").arg(path));
    return true;
}

void MainWindow::exportPngDialog(bool window) {
    const QString path = QFileDialog::getSaveFileName(this, window ? tr("Window as PNG") : tr("View as PNG"),
                                                      QStringLiteral("kvlab-%1.png").arg(window ? "window" : views::view_name(view())),
                                                      tr("PNG images (*.png)"));
    if (path.isEmpty()) return;
    window ? saveWindowPng(path) : saveViewPng(path);
}

QDialog* MainWindow::showShortcuts() {
    QDialog* d = makeShortcutDialog(menuBar(), this);
    d->show();
    return d;
}

QDialog* MainWindow::showUserGuide() {
    QString error;
    QDialog* d = makeUserGuideDialog(this, &error);
    if (!d) {
        showProblem(tr("No user guide"), error);
        return nullptr;
    }
    d->show();
    return d;
}

void MainWindow::aboutDialog() {
    QMessageBox box(this);
    box.setWindowTitle(tr("About kvlab"));
    box.setTextFormat(Qt::RichText);
    box.setText(tr("<h3>%1</h3><p>A lab for KV-cache policies in large language models: run a model with a cache "
                   "policy, watch which tokens each layer keeps and evicts, and measure memory and speed.</p>")
                    .arg(versionText().toHtmlEscaped()));
    box.setInformativeText(QStringLiteral("<pre>%1</pre>").arg(buildInfoText().toHtmlEscaped()));
    box.setTextInteractionFlags(Qt::TextSelectableByMouse);
    box.exec();
}

}  // namespace kv::gui
