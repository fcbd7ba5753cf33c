// kvlab-gui end to end under a real X server (Xvfb) and OpenGL (llvmpipe): the main window on a
// temporary session and temporary settings; the run form against the engine's option table and
// the CLI's messages; a tiny run launched from the form, watched to `done`, then every view
// drawn, with the views' state checked against the run (eviction map width = chunks per sample,
// memory peak = the allocator's peak); cancel; exports; a policy comparison; the demo sweep
// (sweep, fidelity and compare views; on SmolLM2 its windows are the README screenshots);
// settings restored by a second window.
#include <QCoreApplication>
#include <QFileInfo>
#include <QAbstractItemModelTester>
#include <QAction>
#include <QComboBox>
#include <QDialog>
#include <QDir>
#include <QFile>
#include <QIcon>
#include <QLabel>
#include <QLineEdit>
#include <QListWidget>
#include <QMenuBar>
#include <QPlainTextEdit>
#include <QPushButton>
#include <QRegularExpression>
#include <QScrollArea>
#include <QScrollBar>
#include <QSettings>
#include <QSortFilterProxyModel>
#include <QStatusBar>
#include <QTabBar>
#include <QTableView>
#include <QTemporaryDir>
#include <QTextBrowser>
#include <QToolButton>
#include <QWheelEvent>
#include <QtTest>

#include <nlohmann/json.hpp>

#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include "app/gui/canvas_widget.h"
#include "app/gui/compare_dialog.h"
#include "app/gui/gui_support.h"
#include "engine/model/presets.h"
#include "engine/run/run_plan.h"
#include "app/gui/help.h"
#include "app/gui/main_window.h"
#include "app/gui/models/runs_model.h"
#include "app/gui/run_form.h"
#include "app/gui/session_browser.h"
#include "app/gui/session_controller.h"
#include "engine/core/error.h"
#include "engine/kv/policies/policy_registry.h"
#include "engine/model/model_loader.h"
#include "engine/run/run_config.h"
#include "sessions/run_manager.h"
#include "storage/exports.h"
#include "storage/rank_runs.h"
#include "storage/session.h"
#include "storage/sqlite_util.h"
#include "storage/session_reader.h"
#include "views/canvas_impl.h"
#include "views/eviction_map.h"
#include "views/scores_view.h"
#include "views/memory_timeline.h"
#include "views/cell_grid.h"
#include "views/metrics_view.h"
#include "views/compare_view.h"
#include "views/sweep_view.h"
#include "views/fidelity_view.h"
#include "views/token_text.h"

using namespace kv;
using namespace kv::gui;
using Json = nlohmann::json;

namespace {

QString outDir() {
    const QString d = QStringLiteral(KVLAB_BINARY_DIR "/gui-test");
    QDir().mkpath(d);
    return d;
}

// The CLI's message for one bad value: the option table's own parser on a default config.
QString cliMessage(const std::string& option, const std::string& value) {
    RunConfig cfg;
    try {
        set_run_option(cfg, option, value);
    } catch (const Error& e) {
        return QString::fromStdString(e.what());
    }
    return {};
}

Json summaryOf(SessionController* c, int64_t run) {
    storage::SessionReader reader(c->path().toStdString());
    return Json::parse(reader.run(run).summary);
}

// Draws `n` more frames of the canvas through the event loop.
bool drawFrames(CanvasWidget* canvas, int n) {
    const uint64_t target = canvas->framesDrawn() + uint64_t(n);
    for (int i = 0; i < 400 && canvas->framesDrawn() < target; ++i) {
        canvas->refresh();
        canvas->update();
        QTest::qWait(10);
    }
    return canvas->framesDrawn() >= target;
}

// A PNG that holds a picture, not one flat colour.
bool hasContent(const QImage& img) {
    if (img.isNull()) return false;
    const QRgb first = img.pixel(0, 0);
    int differing = 0;
    for (int y = 0; y < img.height(); y += 7)
        for (int x = 0; x < img.width(); x += 7) differing += img.pixel(x, y) != first;
    return differing > 50;
}

}  // namespace

class GuiAppTest : public QObject {
    Q_OBJECT
    QTemporaryDir tmp_;
    std::unique_ptr<MainWindow> w_;
    QString session_;
    int64_t run_ = 0;  // the tiny run launched from the form

    RunForm* form() { return w_->form(); }

    bool waitFinal(int64_t run, int timeoutMs) {
        QElapsedTimer t;
        t.start();
        while (t.elapsed() < timeoutMs) {
            const RunRow* r = w_->runsModel()->run(run);
            if (r && storage::run_status_final(r->status)) return true;
            QTest::qWait(25);
        }
        return false;
    }

   private Q_SLOTS:
    void initTestCase() {
        QVERIFY(tmp_.isValid());
        // Settings go to the temporary folder, never to the user's.
        QSettings::setDefaultFormat(QSettings::IniFormat);
        QSettings::setPath(QSettings::IniFormat, QSettings::UserScope, tmp_.filePath("settings"));
        QCoreApplication::setOrganizationName("kvlab-test");
        QCoreApplication::setApplicationName("kvlab-gui-test");
        w_ = std::make_unique<MainWindow>();
        w_->setQuiet(true);
        w_->resize(1600, 1000);
        w_->show();
        QVERIFY(QTest::qWaitForWindowExposed(w_.get()));
        session_ = tmp_.filePath("gui.kvlab");
        QVERIFY(w_->openSession(session_));
        QCOMPARE(w_->controller()->path(), session_);
        QVERIFY(drawFrames(w_->canvas(), 2));  // GL works: the canvas drew
        QAbstractItemModelTester* tester =
            new QAbstractItemModelTester(w_->runsModel(), QAbstractItemModelTester::FailureReportingMode::QtTest, w_.get());
        Q_UNUSED(tester);
    }

    // Issue 37: an empty session's centre offers the demo, opening a session and the recent
    // sessions (File > Open Recent's list), over the canvas and inside it.
    void firstScreenOfAnEmptySessionOffersItsThreeActions() {
        const QString empty = tmp_.filePath("empty.kvlab");
        QVERIFY(w_->openSession(empty));  // session_ (empty too) is now a recent one
        QWidget* first = w_->firstScreen();
        QVERIFY(first);
        QTRY_VERIFY(first->isVisible());
        auto* demo = first->findChild<QPushButton*>("firstScreenDemo");
        auto* open = first->findChild<QPushButton*>("firstScreenOpen");
        auto* recent = first->findChild<QListWidget*>("firstScreenRecent");
        QVERIFY(demo && open && recent);
        QVERIFY(demo->isVisible() && demo->isEnabled());
        QVERIFY(open->isVisible() && open->isEnabled());
        QVERIFY(recent->isVisible());
        // The card lies inside the canvas area, not clipped by the window.
        const QRect card(first->mapTo(w_.get(), QPoint(0, 0)), first->size());
        const QRect canvas(w_->canvas()->mapTo(w_.get(), QPoint(0, 0)), w_->canvas()->size());
        QVERIFY2(canvas.contains(card), qPrintable(QString("card %1,%2 %3x%4 outside the canvas").arg(card.x()).arg(card.y()).arg(card.width()).arg(card.height())));
        // The recent sessions are Open Recent's, less the open one; a click opens one.
        QListWidgetItem* item = nullptr;
        for (int i = 0; i < recent->count(); ++i) {
            QCOMPARE(recent->item(i)->data(Qt::UserRole).toString() == QFileInfo(empty).absoluteFilePath(), false);
            if (recent->item(i)->data(Qt::UserRole).toString() == QFileInfo(session_).absoluteFilePath()) item = recent->item(i);
        }
        QVERIFY2(item, "the previous session is not listed");
        QTest::mouseClick(recent->viewport(), Qt::LeftButton, {}, recent->visualItemRect(item).center());
        QCOMPARE(w_->controller()->path(), session_);
        QVERIFY(first->isVisible());  // still no runs
        QVERIFY(w_->saveWindowPng(outDir() + "/first-screen.png"));
    }

    void formIsGeneratedFromTheOptionTable() {
        const RunConfig defaults;
        const QStringList names = form()->optionNames();
        for (const auto& o : run_options()) {
            const QString n = QString::fromStdString(o.name);
            QVERIFY2(names.contains(n), qPrintable(n));
            QVERIFY2(form()->editor(n), qPrintable(n));
            QCOMPARE(form()->value(n), QString::fromStdString(o.get(defaults)));
            QVERIFY2(form()->editor(n)->toolTip().contains(QString::fromStdString(o.help).toHtmlEscaped()), qPrintable(n));
            QVERIFY(form()->groupNames().contains(QString::fromStdString(o.group)));
        }
        for (const char* g : {"model", "data", "mode", "cache", "gradient", "training", "telemetry"})
            QVERIFY2(form()->groupNames().contains(g), g);
        QVERIFY(form()->isValid());
        QVERIFY(form()->launchButton()->isEnabled());
    }

    void invalidFieldsShowTheCliMessageAndBlockLaunch_data() {
        QTest::addColumn<QString>("option");
        QTest::addColumn<QString>("value");
        QTest::addColumn<QString>("expected");
        const std::vector<std::pair<std::string, std::string>> cases = {
            {"data.seq_length", "abc"},        {"data.seq_length", "4"},        {"data.num_samples", "0"},
            {"kv_cache.name", "h2o-q9"},       {"kv_cache.name", "frobnicate"}, {"kv_cache.cache_length", "-5"},
            {"kv_cache.chunk_size", "1.5"},    {"kv_cache.keep_initial_fraction", "1.5"},
            {"train.lr", "fast"},              {"data.depths", "0.5,2"},        {"grad.layers_per_cell", "0"},
            {"telemetry.score_interval", "-1"}};
        for (const auto& [opt, v] : cases) {
            const QString expected = cliMessage(opt, v);
            QVERIFY2(!expected.isEmpty(), opt.c_str());
            QTest::newRow((opt + "=" + v).c_str()) << QString::fromStdString(opt) << QString::fromStdString(v) << expected;
        }
        // Runtime options: the CLI's global-option messages.
        QTest::newRow("threads=2000") << "threads" << "2000" << "--threads: 2000 is out of range; expected a whole number in [0, 1024]";
        QTest::newRow("device=gpu") << "device" << "gpu" << "--device: 'gpu' is not a device; expected cpu or cuda:N";
        QString budget;
        try {
            parse_bytes("lots", "--memory.budget");
        } catch (const Error& e) {
            budget = QString::fromStdString(e.what());
        }
        QTest::newRow("memory.budget=lots") << "memory.budget" << "lots" << budget;
    }

    void invalidFieldsShowTheCliMessageAndBlockLaunch() {
        QFETCH(QString, option);
        QFETCH(QString, value);
        QFETCH(QString, expected);
        form()->resetToDefaults();
        const QString before = form()->value(option);
        const int rows = w_->runsModel()->rowCount();
        form()->setValue(option, value);
        QCOMPARE(form()->message(option), expected);
        auto* label = form()->findChild<QLabel*>("message:" + option);
        QVERIFY(label && !label->isHidden());
        QVERIFY(!form()->isValid());
        QVERIFY(!form()->launchButton()->isEnabled());
        QVERIFY(!form()->compareButton()->isEnabled());
        QTest::mouseClick(form()->launchButton(), Qt::LeftButton);
        QTest::qWait(20);
        QCOMPARE(w_->runsModel()->rowCount(), rows);  // nothing was launched
        form()->setValue(option, before);
        QVERIFY(form()->message(option).isEmpty());
        QVERIFY(form()->launchButton()->isEnabled());
    }

    void crossFieldProblemsUseTheCliChecks() {
        form()->resetToDefaults();
        form()->setValue("kv_cache.name", "h2o-default");
        form()->setValue("kv_cache.cache_length", "0");
        RunConfig cfg;
        set_run_option(cfg, "kv_cache.name", "h2o-default");
        QCOMPARE(form()->message("kv_cache.cache_length"), QString::fromStdString(run_config_problems(cfg).front()));
        QVERIFY(!form()->launchButton()->isEnabled());
        form()->setValue("kv_cache.cache_length", "64");
        form()->setValue("kv_cache.chunk_size", "128");
        set_run_option(cfg, "kv_cache.cache_length", "64");
        set_run_option(cfg, "kv_cache.chunk_size", "128");
        QCOMPARE(form()->message("kv_cache.chunk_size"), QString::fromStdString(run_config_problems(cfg).front()));
        QVERIFY(!form()->launchButton()->isEnabled());
        form()->setValue("kv_cache.chunk_size", "16");
        QVERIFY(form()->isValid());
        form()->resetToDefaults();
    }

    // Day one (issue 37): the model drop-down lists the installed real model first. It is the
    // file the name smollm2-135m loads (engine/model/model_loader.cpp); without it there is
    // nothing to list first, so the case skips and says where the file was looked for.
    void modelDropDownListsSmolLm2FirstWhenInstalled() {
        auto* combo = qobject_cast<QComboBox*>(form()->editor("model"));
        QVERIFY(combo);
        QVERIFY(combo->isEditable());  // a folder or .gguf path may still be typed
        QVERIFY(combo->findText("tiny") >= 0 && combo->findText("small") >= 0);
        QVERIFY(combo->toolTip().contains("smollm2-135m"));
        const QString asset = QString::fromStdString(asset_cache_dir() + "/SmolLM2-135M-Instruct.Q4_1.gguf");
        if (!QFileInfo(asset).isFile())
            QSKIP(qPrintable("SmolLM2-135M is not installed (" + asset + "; scripts/setup.sh fetches it): no real model to list"));
        QCOMPARE(combo->itemText(0), QString("smollm2-135m"));
        // The presets lead with it too.
        bool presetOnSmol = false;
        for (const auto& [opt, v] : runPresets().front().values) presetOnSmol |= opt == "model" && v == "smollm2-135m";
        QVERIFY2(presetOnSmol, qPrintable(runPresets().front().name));
    }

    // The policy drop-down is the registry with its one-line summaries; the Cache section shows
    // the chosen policy's knobs and folds every other policy's away; fidelity is a switch near
    // the top that states its cost; the sections fit the dock and never scroll sideways.
    void choosingAPolicyShowsItsOptionsAndHidesTheOthers() {
        form()->resetToDefaults();
        QComboBox* policy = form()->policyCombo();
        QVERIFY(policy);
        QCOMPARE(policy->count(), int(policy_registry().size()));
        for (const PolicyInfo& p : policy_registry()) {
            const int i = policy->findData(QString::fromStdString(p.name));
            QVERIFY2(i >= 0, p.name.c_str());
            QVERIFY2(policy->itemText(i).contains(QString::fromStdString(p.summary)), p.name.c_str());
        }
        auto* cacheSection = form()->findChild<QToolButton*>("section:cache");
        QVERIFY(cacheSection);
        cacheSection->click();
        auto choose = [&](const char* name) {
            const int i = policy->findData(QString(name));
            QVERIFY(i >= 0);
            policy->setCurrentIndex(i);
            Q_EMIT policy->activated(i);  // what a pick in the list sends
        };
        auto knobs = [](const char* name) {
            std::set<QString> k;
            const PolicyInfo* p = find_policy(name);
            for (const auto& u : p->uses) k.insert(QString::fromStdString("kv_cache." + u));
            for (const auto& o : p->options) k.insert(QString::fromStdString("kv_cache." + o.name));
            return k;
        };
        const std::set<QString> h2o = knobs("h2o"), streaming = knobs("streaming");
        QVERIFY(!h2o.empty() && !streaming.empty());
        choose("h2o");
        QCOMPARE(form()->value("kv_cache.name"), QString("h2o-default"));
        // From dense (cache_length 0: everything) the pick gets a budget and can launch at once.
        QCOMPARE(form()->value("kv_cache.cache_length").toLongLong(), form()->value("data.seq_length").toLongLong() / 4);
        QVERIFY2(form()->isValid(), qPrintable(form()->problems().join("; ")));
        QVERIFY(!form()->advancedToggle()->isChecked());
        for (const QString& k : h2o) QVERIFY2(form()->editor(k)->isVisibleTo(form()), qPrintable(k));
        for (const QString& k : streaming)
            if (!h2o.count(k)) QVERIFY2(!form()->editor(k)->isVisibleTo(form()), qPrintable(k + " shown for h2o"));
        QTest::qWait(50);  // the moved rows are laid out before the picture
        QVERIFY(w_->saveWindowPng(outDir() + "/form-cache.png"));
        // The fold opens on request and shows the others' knobs.
        form()->advancedToggle()->click();
        for (const QString& k : streaming) QVERIFY2(form()->editor(k)->isVisibleTo(form()), qPrintable(k));
        form()->advancedToggle()->click();
        choose("streaming");
        QCOMPARE(form()->value("kv_cache.name"), QString("streaming-default"));
        for (const QString& k : streaming) QVERIFY2(form()->editor(k)->isVisibleTo(form()), qPrintable(k));
        for (const QString& k : h2o)
            if (!streaming.count(k)) QVERIFY2(!form()->editor(k)->isVisibleTo(form()), qPrintable(k + " shown for streaming"));
        // Typing a cache name moves the drop-down with it.
        form()->setValue("kv_cache.name", "lastrec-q8");
        QCOMPARE(policy->currentData().toString(), QString("lastrec"));
        // A problem on a folded knob unfolds it.
        form()->setValue("kv_cache.snapkv_kernel", "0");
        QVERIFY(!form()->isValid());
        QVERIFY(form()->advancedToggle()->isChecked());
        QLabel* msg = form()->findChild<QLabel*>("message:kv_cache.snapkv_kernel");
        QVERIFY(msg && msg->isVisibleTo(form()));
        QVERIFY(msg->wordWrap());
        // Nothing in the Cache section is wider than its view: no sideways scrolling, no cut message.
        auto* scroll = qobject_cast<QScrollArea*>(form()->findChild<QTabWidget*>("formTabs")->currentWidget());
        QVERIFY(scroll);
        QTRY_VERIFY(scroll->widget()->width() <= scroll->viewport()->width());
        QVERIFY(scroll->widget()->minimumSizeHint().width() <= scroll->viewport()->width());
        QVERIFY(msg->mapTo(scroll->viewport(), QPoint(msg->width(), 0)).x() <= scroll->viewport()->width());
        form()->resetToDefaults();
        QVERIFY(form()->isValid());
        QVERIFY(!form()->advancedToggle()->isChecked());  // fixed: the fold it opened closes again
        // Fidelity: above the sections, with its cost.
        QVERIFY(form()->editor("fidelity")->isVisibleTo(form()));
        auto* cost = form()->findChild<QLabel*>("fidelityCost");
        QVERIFY(cost && cost->isVisibleTo(form()));
        QVERIFY(cost->text().contains("dense shadow cache") && cost->text().contains("reference pass"));
        // Every section's button shows its whole title inside the form at 1600x1000.
        const auto buttons = form()->findChildren<QToolButton*>(QRegularExpression("^section:"));
        QCOMPARE(buttons.size(), form()->groupNames().size() - 1);  // "mode" sits above them
        for (QToolButton* b : buttons) {
            QVERIFY2(b->isVisibleTo(form()), qPrintable(b->objectName()));
            QVERIFY2(b->mapTo(form(), QPoint(b->width(), 0)).x() <= form()->width(), qPrintable(b->objectName() + " overflows"));
            QVERIFY2(b->width() >= b->fontMetrics().horizontalAdvance(b->text()), qPrintable(b->objectName() + " is cut"));
        }
    }

    void presetsAreValidAndApplyTheirValues() {
        for (const auto& p : runPresets()) {
            form()->applyPreset(p.name);
            QVERIFY2(form()->isValid(), qPrintable(p.name + ": " + form()->problems().join("; ")));
            const RunConfig cfg = form()->config();
            for (const auto& [opt, v] : p.values) QCOMPARE(QString::fromStdString(find_run_option(opt)->get(cfg)), QString::fromStdString(v));
        }
    }

    // Issue 17: a degraded (or failed, crashed) run shows the style's warning icon beside its
    // status in the runs table, with the reason as the tooltip; a done run shows none.
    void untrustedRunsShowAWarningIcon() {
        RunsModel model;
        std::vector<RunRow> rows;
        for (auto [id, st] : {std::pair{1, storage::RunStatus::DONE}, {2, storage::RunStatus::DEGRADED},
                              {3, storage::RunStatus::CRASHED}}) {
            storage::RunInfo i;
            i.id = id;
            i.name = "run";
            i.status = st;
            if (st != storage::RunStatus::DONE) i.error = "disk full while writing session X: 720 telemetry events lost";
            rows.push_back(runRowFromInfo(i));
        }
        model.setRuns(rows);
        SessionBrowser browser(&model);
        QAbstractItemModel* shown = browser.table()->model();
        for (int row = 0; row < 3; ++row) {
            const QModelIndex st = shown->index(row, RunsModel::COLUMN_STATUS);
            const QIcon icon = st.data(Qt::DecorationRole).value<QIcon>();
            const bool done = st.data(RunsModel::StatusRole).toInt() == int(storage::RunStatus::DONE);
            QCOMPARE(icon.isNull(), done);
            if (!done) {
                QVERIFY(!icon.pixmap(16, 16).isNull());
                QCOMPARE(st.data(Qt::ToolTipRole).toString(),
                         QString("disk full while writing session X: 720 telemetry events lost"));
            }
            // Only the status column carries it.
            QVERIFY(shown->index(row, RunsModel::COLUMN_NAME).data(Qt::DecorationRole).value<QIcon>().isNull());
        }
    }

    void compareBuildsOneRunPerPolicyPlusReference() {
        form()->applyPreset("passkey 8k, tiny model");
        const RunConfig base = form()->config();
        auto cfgs = compareConfigs(base, {"h2o", "lastrec", "streaming"}, {"default", "q8"}, CompareReference::DENSE);
        QCOMPARE(cfgs.size(), size_t(7));
        QCOMPARE(QString::fromStdString(cfgs[0].kv_cache.name), QString("dense-default"));
        QCOMPARE(cfgs[0].kv_cache.cache_length, int64_t(0));
        // The dense reference steps in the compared runs' chunks (issue 37): the same chunk plan.
        QCOMPARE(cfgs[0].driver.prefill_length, base.kv_cache.cache_length);
        {
            const ModelConfig mc = preset_config("tiny");
            auto chunks = [&](const RunConfig& c) {
                return run_chunk_plan(c, run_cache_config(c, mc, DType::F32), mc, c.data.seq_length, 0).chunks;
            };
            QVERIFY(chunks(cfgs[0]).size() > 1);
            QVERIFY(chunks(cfgs[0]) == chunks(cfgs[1]));
        }
        // Everything but the cache name (and run name) equals the form's configuration.
        for (size_t i = 1; i < cfgs.size(); ++i) {
            RunConfig c = cfgs[i];
            QVERIFY(run_config_problems(c).empty());
            c.kv_cache.name = base.kv_cache.name;
            c.name = base.name;
            QCOMPARE(run_config_to_json(c), run_config_to_json(base));
        }
        auto large = compareConfigs(base, {"h2o"}, {"default"}, CompareReference::LARGE_CACHE);
        QCOMPARE(large[0].kv_cache.cache_length, base.data.seq_length);
        QCOMPARE(QString::fromStdString(large[0].kv_cache.name), QString("h2o-default"));
        CompareDialog dlg(base);
        dlg.setSelection({"h2o", "lastrec", "streaming"}, {"default"}, CompareReference::DENSE);
        QVERIFY(dlg.problems().isEmpty());
        QCOMPARE(dlg.configs().size(), size_t(4));
        dlg.setSelection({}, {"default"}, CompareReference::DENSE);
        QVERIFY(!dlg.problems().isEmpty());
        // Several cache lengths: a sweep over cache sizes, one dense reference.
        dlg.setSelection({"h2o", "lastrec", "streaming"}, {"default"}, CompareReference::DENSE);
        dlg.setCacheLengths("256, 512");
        QVERIFY(dlg.problems().isEmpty());
        const auto sweep = dlg.configs();
        QCOMPARE(sweep.size(), size_t(7));
        QCOMPARE(sweep[0].kv_cache.policy(), std::string("dense"));
        std::map<std::string, std::vector<int64_t>> lengths;
        for (size_t i = 1; i < sweep.size(); ++i) lengths[sweep[i].kv_cache.policy()].push_back(sweep[i].kv_cache.cache_length);
        for (const char* p : {"h2o", "lastrec", "streaming"}) QCOMPARE(lengths[p], (std::vector<int64_t>{256, 512}));
        dlg.setCacheLengths("256, x");
        QCOMPARE(dlg.problems().size(), 1);
        QVERIFY2(dlg.problems().front().contains("'x' is not a positive whole number"), qPrintable(dlg.problems().front()));
        std::vector<int64_t> parsed;
        QVERIFY(parseCacheLengths(" 64 128,128 ", &parsed, nullptr));
        QCOMPARE(parsed, (std::vector<int64_t>{64, 128}));
        QVERIFY(!parseCacheLengths("", &parsed, nullptr));
        QVERIFY(!parseCacheLengths("-4", &parsed, nullptr));
    }

    void launchTinyRunAndDrawEveryView() {
        form()->applyPreset("passkey 2k, tiny model (quick)");
        form()->setValue("name", "gui test run");
        QVERIFY(form()->isValid());
        const int rows = w_->runsModel()->rowCount();
        QTest::mouseClick(form()->launchButton(), Qt::LeftButton);
        QTRY_COMPARE_WITH_TIMEOUT(w_->runsModel()->rowCount(), rows + 1, 5000);
        run_ = w_->runsModel()->rows().back().id;
        QCOMPARE(w_->runsModel()->run(run_)->name, QString("gui test run"));
        // Launch shows the run: it is selected and the views follow it, with no click (issue 37).
        QCOMPARE(w_->browser()->selectedRuns(), std::vector<int64_t>{run_});
        QCOMPARE(w_->canvas()->canvas().impl().runs, std::vector<int64_t>{run_});
        QVERIFY(waitFinal(run_, 120000));
        const RunRow* r = w_->runsModel()->run(run_);
        QCOMPARE(int(r->status), int(storage::RunStatus::DONE));
        QCOMPARE(r->policy, QString("h2o"));
        QCOMPARE(r->buffer, QString("default"));
        QCOMPARE(r->cacheLength, int64_t(256));
        QCOMPARE(r->chunkSize, int64_t(32));
        QVERIFY(std::isfinite(r->loss));
        QVERIFY(r->tokensPerS > 0);
        const Json summary = summaryOf(w_->controller(), run_);
        const int64_t allocatorPeak = summary["memory"]["cpu"]["peak_total"].get<int64_t>();
        const int chunks = summary["chunks_per_sample"].get<int>();
        QCOMPARE(r->peakBytes, allocatorPeak);
        QVERIFY(chunks > 1);
        // The log line follows the run manager's status signal, which may arrive after the table
        // already read the final row from the session (a reload under load).
        QTRY_VERIFY_WITH_TIMEOUT(w_->logText().contains(QString("run %1 (gui test run) done").arg(run_)), 10000);

        w_->selectRuns({run_});
        views::CanvasImpl& impl = w_->canvas()->canvas().impl();
        QCOMPARE(impl.runs, std::vector<int64_t>{run_});
        QTabBar* tabs = w_->viewTabs();
        QCOMPARE(tabs->count(), int(views::view_count()));
        for (int i = 0; i < tabs->count(); ++i) {
            tabs->setCurrentIndex(i);
            QCOMPARE(int(w_->view().index()), i);
            QVERIFY(drawFrames(w_->canvas(), 4));
            const QString png = outDir() + QStringLiteral("/view-%1.png").arg(i);
            QVERIFY(w_->saveViewPng(png));
            QImage img(png);
            QCOMPARE(img.size(), w_->canvas()->size() * w_->canvas()->devicePixelRatio());
            QVERIFY2(hasContent(img), qPrintable(png));
            // docs/GUIDE.md shows each view as this test draws it.
            // (Compare needs 2+ runs, fidelity a --fidelity run, sweep several cache sizes: their
            // pictures come from the demo sweep below. Metrics: its picture is the per-token loss of
            // real CLI runs, below.)
            const views::ViewKind vk = views::ViewKind(i);
            if (qEnvironmentVariableIsSet("KVLAB_UPDATE_SCREENSHOTS") && vk != views::view_named("compare") && vk != views::view_named("fidelity") &&
                vk != views::view_named("sweep") && vk != views::view_named("metrics")) {
                QString name = QString::fromLatin1(views::view_name(views::ViewKind(i))).replace(' ', '_');
                const QString guide = QStringLiteral(KVLAB_SOURCE_DIR "/assets/screenshots/guide-%1.png").arg(name);
                QFile::remove(guide);
                QVERIFY(QImage(png).scaledToWidth(900, Qt::SmoothTransformation).save(guide));
                QVERIFY2(QFileInfo(guide).size() < 200 * 1024, qPrintable(guide + " must stay under 200 KB"));
            }
        }
        // Eviction map: x = chunk step, so the texture is one texel per chunk of a sample.
        QCOMPARE(impl.state<views::EvictionMapViewState>().run, run_);
        QVERIFY(impl.state<views::EvictionMapViewState>().main.valid);
        QCOMPARE(impl.state<views::EvictionMapViewState>().main.image.width, chunks);
        QCOMPARE(impl.state<views::EvictionMapViewState>().main.image.steps_per_texel, 1);
        QVERIFY(w_->canvas()->textures().count(impl.state<views::EvictionMapViewState>().main.id));
        QCOMPARE(w_->canvas()->textures().at(impl.state<views::EvictionMapViewState>().main.id).width, chunks);
        // Qt input reaches ImGui: hovering the map names a token, the wheel zooms (stops following).
        w_->setView(views::view_named("eviction map"));
        CanvasWidget* canvas = w_->canvas();
        const QPoint mid(canvas->width() / 2, canvas->height() / 2);
        QTest::mouseMove(canvas, mid);
        QVERIFY(drawFrames(canvas, 3));
        QVERIFY(impl.state<views::EvictionMapViewState>().hovered);
        QVERIFY(impl.state<views::EvictionMapViewState>().hover.token >= 0);
        QVERIFY(impl.state<views::EvictionMapViewState>().follow);
        QWheelEvent wheel(QPointF(mid), canvas->mapToGlobal(QPointF(mid)), QPoint(), QPoint(0, 120), Qt::NoButton,
                          Qt::NoModifier, Qt::NoScrollPhase, false);
        QApplication::sendEvent(canvas, &wheel);
        QVERIFY(drawFrames(canvas, 3));
        QVERIFY(!impl.state<views::EvictionMapViewState>().follow);
        // Memory timeline: its peak is the run's allocator peak (every event recorded).
        QCOMPARE(impl.state<views::MemoryTimelineViewState>().run, run_);
        QCOMPARE(impl.state<views::MemoryTimelineViewState>().peak_bytes(), allocatorPeak);
        QCOMPARE(impl.state<views::MemoryTimelineViewState>().shown_peak, allocatorPeak);
        // Scores: one heatmap row per layer of the tiny model (2); metrics: the sample losses.
        QCOMPARE(impl.state<views::ScoresViewState>().layers.size(), size_t(2));
        QVERIFY(impl.state<views::MetricsViewState>().index.count("sample_loss"));
        QVERIFY(!impl.state<views::CellGridViewState>().sequences.empty());
        QVERIFY(w_->saveWindowPng(outDir() + "/window.png"));
        QVERIFY(hasContent(QImage(outDir() + "/window.png")));
    }

    // Token text (issue 16): hovering the eviction map names the token the session stored for
    // that position; the search marks exactly the positions an independent scan of the stored
    // ids finds, and a string over two tokens marks both.
    void evictionMapHoverShowsTokenTextAndSearchMarks() {
        QVERIFY(run_ > 0);
        w_->selectRuns({run_});
        w_->setView(views::view_named("eviction map"));
        views::CanvasImpl& impl = w_->canvas()->canvas().impl();
        CanvasWidget* canvas = w_->canvas();
        QVERIFY(drawFrames(canvas, 4));
        storage::SessionReader reader(session_.toStdString());
        const auto samples = reader.sample_tokens(run_);
        QVERIFY(!samples.empty());
        const int seq = impl.state<views::EvictionMapViewState>().data.resolve_sequence(impl.state<views::EvictionMapViewState>().sequence);
        QVERIFY(seq >= 0 && size_t(seq) < samples.size());
        const storage::SampleTokensRow& sample = samples[size_t(seq)];
        QCOMPARE(impl.state<views::EvictionMapViewState>().tokens.samples.size(), samples.size());
        QTest::mouseMove(canvas, QPoint(canvas->width() / 2, canvas->height() / 2));
        QVERIFY(drawFrames(canvas, 3));
        QVERIFY(impl.state<views::EvictionMapViewState>().hovered);
        const int64_t pos = impl.state<views::EvictionMapViewState>().hover.token;
        QVERIFY(pos >= 0 && size_t(pos) < sample.ids.size());
        QCOMPARE(QString::fromStdString(views::token_label(impl.state<views::EvictionMapViewState>().tokens.sample(seq), pos)),
                 QString::fromStdString(views::printable_piece(sample.pieces[size_t(pos)]) + " (id " +
                                        std::to_string(sample.ids[size_t(pos)]) + ")"));
        // Search by id: the box's text set directly (the widget's position is ImGui's), then drawn.
        const int32_t id = sample.ids[size_t(pos)];
        std::vector<int64_t> scan;
        for (size_t p = 0; p < sample.ids.size(); ++p)
            if (sample.ids[p] == id) scan.push_back(int64_t(p));
        impl.state<views::EvictionMapViewState>().search = {};
        const std::string query = "#" + std::to_string(id);
        std::snprintf(impl.state<views::EvictionMapViewState>().search.query, sizeof impl.state<views::EvictionMapViewState>().search.query, "%s", query.c_str());
        QVERIFY(drawFrames(canvas, 3));
        QCOMPARE(impl.state<views::EvictionMapViewState>().search.result.positions, scan);
        QCOMPARE(impl.state<views::EvictionMapViewState>().search.result.matches, int64_t(scan.size()));
        // Two neighbouring tokens' text: both marked.
        const size_t a = std::min(sample.ids.size() - 2, size_t(pos));
        const std::string two = sample.pieces[a] + sample.pieces[a + 1];
        std::snprintf(impl.state<views::EvictionMapViewState>().search.query, sizeof impl.state<views::EvictionMapViewState>().search.query, "%s", two.c_str());
        QVERIFY(drawFrames(canvas, 3));
        QVERIFY(impl.state<views::EvictionMapViewState>().search.marked(int64_t(a)));
        QVERIFY(impl.state<views::EvictionMapViewState>().search.marked(int64_t(a + 1)));
        QVERIFY(impl.state<views::EvictionMapViewState>().search.result.matches >= 1);
        QVERIFY(w_->saveViewPng(outDir() + "/eviction-search.png"));
        impl.state<views::EvictionMapViewState>().search = {};
        // Scores: hovering a slot reads which token it holds at that chunk.
        w_->setView(views::view_named("scores"));
        QVERIFY(drawFrames(canvas, 3));
        QTest::mouseMove(canvas, QPoint(canvas->width() / 3, canvas->height() / 5));
        QVERIFY(drawFrames(canvas, 4));
        QVERIFY(impl.state<views::ScoresViewState>().want_positions);
        QVERIFY(impl.state<views::ScoresViewState>().positions_loaded);
        QVERIFY(impl.state<views::ScoresViewState>().positions.resolve_sequence(-1) >= 0);
        QVERIFY(views::scores_slot_tokens(impl.state<views::ScoresViewState>(), 0, 0) != nullptr);
        // The scores view's search looks in the newest sample (whose snapshots it shows).
        std::vector<int64_t> newest_scan;
        for (size_t p = 0; p < samples.back().ids.size(); ++p)
            if (samples.back().ids[p] == id) newest_scan.push_back(int64_t(p));
        std::snprintf(impl.state<views::ScoresViewState>().search.query, sizeof impl.state<views::ScoresViewState>().search.query, "%s", query.c_str());
        QVERIFY(drawFrames(canvas, 3));
        QCOMPARE(impl.state<views::ScoresViewState>().search.result.positions, newest_scan);
        QVERIFY(w_->saveViewPng(outDir() + "/scores-search.png"));
        impl.state<views::ScoresViewState>().search = {};
    }

    // Per-token loss (issue 16): two runs the CLI records in another process into the open
    // session (H2O and the dense cache, same model and data); the metrics view of the H2O run
    // overlays the dense run found in the session, and its curve is the stored losses' mean.
    // With KVLAB_UPDATE_SCREENSHOTS the runs use SmolLM2-135M, so the guide shows a real model.
    void perTokenLossOfCliRunsWithTheDenseOverlay() {
        const bool real = qEnvironmentVariableIsSet("KVLAB_UPDATE_SCREENSHOTS");
        const std::string model = real ? "smollm2-135m" : "tiny";
        const std::string data = real ? " --data repeat --data.seq_length 1024 --data.num_samples 2 --data.repeat_length 64"
                                      : " --data repeat --data.seq_length 256 --data.num_samples 2 --data.repeat_length 32";
        std::vector<int64_t> ids;
        for (const char* cache : {"h2o-default --kv_cache.cache_length 128", "dense-default"}) {
            const std::string cmd = std::string(KVLAB_BINARY_DIR "/bin/kvlab eval_long ") + model + data +
                                    " --kv_cache.chunk_size 32 --kv_cache.name " + cache + " --session '" +
                                    session_.toStdString() + "' > /dev/null 2>&1";
            QCOMPARE(std::system(cmd.c_str()), 0);
        }
        w_->controller()->reload();
        QTRY_VERIFY_WITH_TIMEOUT(w_->runsModel()->rowCount() >= 2, 5000);
        const auto& rows = w_->runsModel()->rows();
        const int64_t h2o = rows[rows.size() - 2].id, dense = rows.back().id;
        QCOMPARE(w_->runsModel()->run(h2o)->policy, QString("h2o"));
        w_->selectRuns({h2o});
        w_->setView(views::view_named("metrics"));
        CanvasWidget* canvas = w_->canvas();
        QVERIFY(drawFrames(canvas, 6));
        views::CanvasImpl& impl = w_->canvas()->canvas().impl();
        QCOMPARE(impl.state<views::MetricsViewState>().reference_run, dense);
        QCOMPARE(impl.state<views::MetricsViewState>().loss_runs.size(), size_t(2));
        QVERIFY(impl.state<views::MetricsViewState>().loss_runs[1].dense);
        storage::SessionReader reader(session_.toStdString());
        const auto stored = reader.sample_tokens(h2o);
        QCOMPARE(impl.state<views::MetricsViewState>().loss_runs[0].tokens.samples.size(), stored.size());
        // Hover the curve: the view's state and the drawn frame come from the stored losses.
        QTest::mouseMove(canvas, QPoint(canvas->width() / 2, canvas->height() / 4));
        QVERIFY(drawFrames(canvas, 3));
        const QString png = outDir() + "/metrics-token-loss.png";
        QVERIFY(w_->saveViewPng(png));
        QVERIFY(hasContent(QImage(png)));
        if (real) {
            const QString guide = QStringLiteral(KVLAB_SOURCE_DIR "/assets/screenshots/guide-metrics.png");
            QFile::remove(guide);
            QVERIFY(QImage(png).scaledToWidth(900, Qt::SmoothTransformation).save(guide));
            QVERIFY2(QFileInfo(guide).size() < 200 * 1024, qPrintable(guide + " must stay under 200 KB"));
        }
        // Both runs selected: the metrics view overlays them (not the one-run empty state).
        w_->selectRuns({h2o, dense});
        w_->setView(views::view_named("metrics"));
        QVERIFY(drawFrames(canvas, 4));
        QCOMPARE(impl.state<views::MetricsViewState>().overlay_runs, std::vector<int64_t>{dense});
        QVERIFY(impl.empty_state().empty());
    }

    void exportsWriteWhatTheCliWrites() {
        QVERIFY(run_ > 0);
        w_->selectRuns({run_});
        QStringList paths;
        for (const auto& c : exportChoices()) {
            const QString path = tmp_.filePath(QStringLiteral("export-%1.%2").arg(paths.size()).arg(c.suffix));
            QString error;
            QVERIFY2(w_->exportSelected(c, path, &error), qPrintable(c.title + ": " + error));
            QVERIFY(QFileInfo(path).size() > 0);
            paths << path;
        }
        // The memory CSV is byte for byte what storage::export_memory_csv (kvlab export) writes.
        QCOMPARE(int(exportChoices()[0].what), int(storage::ExportWhat::MEMORY));
        storage::SessionReader reader(session_.toStdString());
        std::ostringstream cli;
        storage::export_memory_csv(reader, run_, cli);
        QFile m(paths[0]);
        QVERIFY(m.open(QIODevice::ReadOnly));
        QCOMPARE(m.readAll().toStdString(), cli.str());
        QFile trace(paths[3]);
        QVERIFY(trace.open(QIODevice::ReadOnly));
        const Json j = Json::parse(trace.readAll().toStdString());
        QVERIFY(j.contains("traceEvents") && !j["traceEvents"].empty());
        QFile pickle(paths[4]);
        QVERIFY(pickle.open(QIODevice::ReadOnly));
        QCOMPARE(uint8_t(pickle.read(1)[0]), uint8_t(0x80));  // pickle protocol marker
        // Nothing selected: a clear message, no file.
        w_->selectRuns({});
        QString error;
        QVERIFY(!w_->exportSelected(exportChoices()[0], tmp_.filePath("none.csv"), &error));
        QVERIFY(error.contains("no run selected"));
        QVERIFY(!QFileInfo::exists(tmp_.filePath("none.csv")));
    }

    void cancelStopsTheRunQuickly() {
        form()->applyPreset("passkey 8k, tiny model");
        form()->setValue("data.num_samples", "200");  // about a minute if left alone
        const int64_t run = w_->launch(form()->config());
        QVERIFY(run > 0);
        QTRY_VERIFY_WITH_TIMEOUT(w_->runsModel()->run(run)->done > 0, 30000);
        QVERIFY(w_->canvas()->live());  // the views refresh at 20 Hz while it writes
        const int64_t seen = w_->runsModel()->run(run)->done;
        // Progress moves live; 20 s because one sample can take several seconds on a loaded 2-core CI machine.
        QTRY_VERIFY_WITH_TIMEOUT(w_->runsModel()->run(run)->done > seen, 20000);
        QVERIFY(form()->cancelButton()->isEnabled());
        // Quitting while a run is live asks first; declining keeps the window and the run.
        int asked = -1;
        w_->setQuitConfirmation([&](int active) {
            asked = active;
            return false;
        });
        QVERIFY(!w_->close());
        QCOMPARE(asked, 1);
        QVERIFY(w_->isVisible());
        QVERIFY(!storage::run_status_final(w_->runsModel()->run(run)->status));
        w_->setQuitConfirmation({});
        QElapsedTimer t;
        t.start();
        QTest::mouseClick(form()->cancelButton(), Qt::LeftButton);
        QVERIFY(waitFinal(run, 10000));
        const RunRow* r = w_->runsModel()->run(run);
        QCOMPARE(int(r->status), int(storage::RunStatus::CANCELLED));
        QVERIFY2(t.elapsed() < 5000, qPrintable(QString("took %1 ms").arg(t.elapsed())));
        // eval_long's live progress counts the whole run (every sample's tokens), so a run
        // cancelled early stopped short of its total.
        QVERIFY2(r->done > 0 && r->done < r->total, qPrintable(QString("done %1 of %2").arg(r->done).arg(r->total)));
        QVERIFY2(r->total > int64_t(200) * 4096, qPrintable(QString("total %1: not 200 samples of about 8192 tokens").arg(r->total)));
        // The table says where it stopped, not a bar that looks stuck (nor 100%).
        const int row = w_->runsModel()->rowOfRun(run);
        const QString progress = w_->runsModel()->data(w_->runsModel()->index(row, RunsModel::COLUMN_PROGRESS)).toString();
        QVERIFY2(progress.startsWith("cancelled at ") && !progress.contains("100%"), qPrintable(progress));
        QVERIFY(!form()->cancelButton()->isEnabled());
        QVERIFY(!w_->canvas()->live());
    }

    void comparisonOfFourRunsIsTheReadmeScreenshot() {
        form()->applyPreset("passkey 8k, tiny model");
        const auto cfgs = compareConfigs(form()->config(), {"h2o", "lastrec", "streaming"}, {"default"}, CompareReference::DENSE);
        const std::vector<int64_t> ids = w_->launchComparison(cfgs);
        QCOMPARE(ids.size(), size_t(4));
        QCOMPARE(w_->view(), views::view_named("compare"));
        QCOMPARE(w_->browser()->selectedRuns(), ids);
        for (int64_t id : ids) QVERIFY(waitFinal(id, 180000));
        for (int64_t id : ids) QCOMPARE(int(w_->runsModel()->run(id)->status), int(storage::RunStatus::DONE));
        QVERIFY(drawFrames(w_->canvas(), 6));
        views::CanvasImpl& impl = w_->canvas()->canvas().impl();
        QCOMPARE(impl.state<views::CompareViewState>().runs, ids);
        QVERIFY2(impl.state<views::CompareViewState>().have_comparison, impl.state<views::CompareViewState>().comparison_error.c_str());
        QCOMPARE(impl.state<views::CompareViewState>().comparison.reference, ids.front());
        QCOMPARE(impl.state<views::CompareViewState>().comparison.runs.size(), size_t(4));
        const int chunks = summaryOf(w_->controller(), ids[1])["chunks_per_sample"].get<int>();
        QCOMPARE(impl.state<views::CompareViewState>().maps.size(), size_t(4));
        QCOMPARE(impl.state<views::CompareViewState>().maps[1].main.image.width, chunks);
        w_->statusBar()->clearMessage();  // leftovers of earlier cases do not belong in the README
        const QString png = outDir() + "/compare.png";
        QVERIFY(w_->saveWindowPng(png));
        QVERIFY(hasContent(QImage(png)));
        // (The README's compare picture comes from the real-model demo below, not this tiny run.)
    }

    void demoSweepOpensOnItsCurvesAndIsTheReadmeScreenshot() {
        // The demo's grid (dense + 3 policies x 2 cache lengths x 2 tasks, fidelity on) in a
        // session of its own. In the suite on the tiny model at 256 tokens (seconds); with
        // KVLAB_UPDATE_SCREENSHOTS on SmolLM2-135M as `kvlab-gui --demo` runs it (minutes), whose
        // windows become the README's and the guide's pictures.
        const bool update = qEnvironmentVariableIsSet("KVLAB_UPDATE_SCREENSHOTS");
        std::string model;
        std::vector<RunConfig> cfgs = demoConfigs(&model);
        QCOMPARE(cfgs.size(), size_t(14));
        if (update) QCOMPARE(QString::fromStdString(model), QString("smollm2-135m"));  // a README picture needs the real model
        for (RunConfig& c : cfgs) {
            QVERIFY(c.fidelity);
            if (!update) {
                c.model = "tiny";
                set_run_option(c, "data.seq_length", "256");
                if (c.kv_cache.cache_length > 0) c.kv_cache.cache_length /= 4;  // 64 and 128 of 256, as 256 and 512 of 1024
                set_run_option(c, "kv_cache.chunk_size", "32");
                if (c.data.name == "repeat") set_run_option(c, "data.repeat_distance", "96");
                c.threads = 1;
            }
        }
        const QString demoSession = tmp_.filePath("demo.kvlab");
        w_->openSession(demoSession);
        std::vector<int64_t> ids;
        for (const auto& c : cfgs) ids.push_back(w_->launch(c));
        for (int64_t id : ids) QVERIFY(id > 0);
        w_->setView(views::view_named("sweep"));
        w_->selectRuns({ids.front()});
        for (int64_t id : ids) QVERIFY(waitFinal(id, update ? 1800000 : 300000));
        for (int64_t id : ids) QCOMPARE(int(w_->runsModel()->run(id)->status), int(storage::RunStatus::DONE));
        QVERIFY(drawFrames(w_->canvas(), 6));
        views::CanvasImpl& impl = w_->canvas()->canvas().impl();
        QCOMPARE(w_->view(), views::view_named("sweep"));
        // Two panels (repeat, text), three lines of two points each, and the dense reference,
        // every point the value its run's summary holds.
        QCOMPARE(impl.state<views::SweepViewState>().panels.size(), size_t(2));
        storage::SessionReader reader(demoSession.toStdString());
        for (const views::SweepPanel& p : impl.state<views::SweepViewState>().panels) {
            QCOMPARE(p.lines.size(), size_t(3));
            QCOMPARE(p.references.size(), size_t(1));
            for (const views::SweepLine& l : p.lines) {
                QCOMPARE(l.points.size(), size_t(2));
                for (const views::SweepPoint& pt : l.points)
                    QCOMPARE(pt.y, Json::parse(reader.run(pt.run).summary)[p.metric].get<double>());
            }
        }
        w_->statusBar()->clearMessage();
        const QString sweepPng = outDir() + "/demo-sweep.png";
        QVERIFY(w_->saveWindowPng(sweepPng));
        QVERIFY(hasContent(QImage(sweepPng)));
        // A click on a point (the view's request) selects that run in the table, on the sweep.
        const int64_t picked = impl.state<views::SweepViewState>().panels[0].lines[0].points[0].run;
        impl.state<views::SweepViewState>().requested_run = picked;
        QVERIFY(drawFrames(w_->canvas(), 3));
        QTRY_COMPARE_WITH_TIMEOUT(w_->browser()->selectedRuns(), std::vector<int64_t>{picked}, 3000);
        QCOMPARE(w_->view(), views::view_named("sweep"));
        // Fidelity of the repeat task's runs at the small cache, side by side with dense.
        std::vector<int64_t> small = {ids[0]};
        for (size_t i = 1; i < 7; ++i)
            if (cfgs[i].kv_cache.cache_length == cfgs[1].kv_cache.cache_length) small.push_back(ids[i]);
        QCOMPARE(small.size(), size_t(4));
        w_->setView(views::view_named("fidelity"));
        w_->selectRuns(small);
        QVERIFY(drawFrames(w_->canvas(), 6));
        QCOMPARE(w_->view(), views::view_named("fidelity"));
        QCOMPARE(impl.state<views::FidelityViewState>().grids.size(), size_t(4));
        for (const auto& g : impl.state<views::FidelityViewState>().grids) QVERIFY(!g.empty() && g.layers > 0);
        const QString fidPng = outDir() + "/demo-fidelity.png";
        QVERIFY(w_->saveWindowPng(fidPng));
        QVERIFY(hasContent(QImage(fidPng)));
        // And the classic compare of the same runs.
        w_->setView(views::view_named("compare"));
        QVERIFY(drawFrames(w_->canvas(), 6));
        QVERIFY2(impl.state<views::CompareViewState>().have_comparison, impl.state<views::CompareViewState>().comparison_error.c_str());
        const QString cmpPng = outDir() + "/demo-compare.png";
        QVERIFY(w_->saveWindowPng(cmpPng));
        if (update) {
            const std::pair<QString, QString> pics[] = {{sweepPng, "demo-sweep.png"}, {fidPng, "demo-fidelity.png"}, {cmpPng, "compare.png"}};
            for (const auto& [from, name] : pics) {
                const QString to = QStringLiteral(KVLAB_SOURCE_DIR "/assets/screenshots/") + name;
                QFile::remove(to);
                QVERIFY(QImage(from).save(to));
                QVERIFY2(QFileInfo(to).size() < 400 * 1024, qPrintable(to + " must stay under 400 KB"));
            }
            for (const auto& [from, name] : {std::pair<QString, QString>{sweepPng, "guide-sweep.png"}, {fidPng, "guide-fidelity.png"}}) {
                const QString to = QStringLiteral(KVLAB_SOURCE_DIR "/assets/screenshots/") + name;
                QFile::remove(to);
                QVERIFY(QImage(from).scaledToWidth(900, Qt::SmoothTransformation).save(to));
            }
        }
        w_->openSession(session_);  // the next cases work on the first session
    }

    void openRecentListsOpenedSessionsNewestFirst() {
        // File > Open Recent (issue 37): sessions opened before, newest first, one click away.
        const QString other = tmp_.filePath("recent-other.kvlab");
        QVERIFY(w_->openSession(other));
        QVERIFY(w_->openSession(session_));
        const QStringList recent = w_->recentSessions();
        QVERIFY(recent.size() >= 2);
        QCOMPARE(recent[0], QFileInfo(session_).absoluteFilePath());
        QCOMPARE(recent[1], QFileInfo(other).absoluteFilePath());
        QMenu* menu = nullptr;
        for (QAction* a : w_->menuBar()->actions())
            if (a->menu() && a->text().remove('&') == "File")
                for (QAction* b : a->menu()->actions())
                    if (b->menu() && b->text().remove('&') == "Open Recent") menu = b->menu();
        QVERIFY(menu);
        QVERIFY(menu->isEnabled());
        QCOMPARE(menu->actions().size(), recent.size());
        QCOMPARE(menu->actions()[1]->data().toString(), recent[1]);
        menu->actions()[1]->trigger();  // reopens the other session
        QCOMPARE(QFileInfo(w_->controller()->path()).absoluteFilePath(), recent[1]);
        QCOMPARE(w_->recentSessions().front(), recent[1]);
        QVERIFY(w_->openSession(session_));  // the next cases work on the first session
    }

    // Run management (issue 37): unique default names, rename, notes, filter, re-run and delete,
    // each stored in the session file: reopening it shows the same, and a deleted run's rows
    // are gone from the file while the other runs' stay.
    void runManagementRoundTripsThroughTheSessionFile() {
        const QString manage = tmp_.filePath("manage.kvlab");
        QVERIFY(w_->openSession(manage));
        RunConfig cfg;
        cfg.mode = "eval_long";
        cfg.model = "tiny";
        for (const auto& [o, v] : std::vector<std::pair<std::string, std::string>>{
                 {"data", "repeat"}, {"data.seq_length", "256"}, {"data.repeat_length", "16"}, {"data.repeat_distance", "64"},
                 {"data.num_samples", "1"}, {"kv_cache.name", "h2o-default"}, {"kv_cache.cache_length", "64"},
                 {"kv_cache.chunk_size", "16"}})
            set_run_option(cfg, o, v);
        cfg.threads = 1;
        const int64_t a = w_->launch(cfg), b = w_->launch(cfg);
        QVERIFY(a > 0 && b > 0);
        const std::vector<int64_t> again = w_->rerunRuns({a});
        QCOMPARE(again.size(), size_t(1));
        const int64_t c = again.front();
        for (int64_t r : {a, b, c}) QVERIFY(waitFinal(r, 120000));
        RunsModel* m = w_->runsModel();
        const QString base = m->run(a)->name;
        QCOMPARE(m->run(b)->name, base + " #2");
        QCOMPARE(m->run(c)->name, base + " #3");
        // The repeat task's own score leads: copied tokens.
        QCOMPARE(m->data(m->index(m->rowOfRun(a), RunsModel::COLUMN_SCORE), Qt::ToolTipRole).toString(), QString("copied tokens"));

        // Rename and notes as the table's editor stores them; a taken name is numbered.
        QVERIFY(m->setData(m->index(m->rowOfRun(a), RunsModel::COLUMN_NAME), "baseline"));
        QVERIFY(m->setData(m->index(m->rowOfRun(b), RunsModel::COLUMN_NAME), "baseline"));
        QVERIFY(m->setData(m->index(m->rowOfRun(a), RunsModel::COLUMN_NOTES), "first try\nwith h2o"));
        QCOMPARE(m->run(a)->name, QString("baseline"));
        QCOMPARE(m->run(b)->name, QString("baseline #2"));
        QCOMPARE(m->run(a)->notes, QString("first try\nwith h2o"));

        // The filter box hides the rows that do not match.
        QSortFilterProxyModel* shown = w_->browser()->proxy();
        w_->browser()->filterEdit()->setText("BASELINE #2");
        QCOMPARE(shown->rowCount(), 1);
        QCOMPARE(shown->index(0, 0).data(RunsModel::RunIdRole).toLongLong(), qint64(b));
        w_->browser()->setFilterText("first try");
        QCOMPARE(shown->rowCount(), 1);
        QCOMPARE(shown->index(0, 0).data(RunsModel::RunIdRole).toLongLong(), qint64(a));
        w_->browser()->setFilterText("no run has this");
        QCOMPARE(shown->rowCount(), 0);
        w_->browser()->setFilterText("");
        QCOMPARE(shown->rowCount(), 3);

        // Every summary number has a column, hidden until asked for (the header menu); the
        // choice holds for the next browser too.
        const auto& metrics = m->metricNames();
        const auto seconds = std::find(metrics.begin(), metrics.end(), QString("seconds"));
        QVERIFY(seconds != metrics.end());
        const int col = RunsModel::NUM_COLUMNS + int(seconds - metrics.begin());
        QVERIFY(!w_->browser()->columnShown(col));
        w_->browser()->setColumnShown(col, true);
        QVERIFY(SessionBrowser(m).columnShown(col));
        w_->browser()->setColumnShown(col, false);
        QVERIFY(!SessionBrowser(m).columnShown(col));

        // Delete asks first; declined, nothing goes.
        auto spansOf = [&](int64_t run) {
            storage::Db db(manage.toStdString(), SQLITE_OPEN_READONLY);
            return db.query_int(str("SELECT count(*) FROM spans WHERE run_id=", run), -1, "test");
        };
        const int64_t spansA = spansOf(a), spansB = spansOf(b);
        QVERIFY(spansA > 0 && spansOf(c) > 0);
        QStringList asked;
        w_->setDeleteConfirmation([&](const QStringList& names) {
            asked = names;
            return false;
        });
        QVERIFY(!w_->deleteRuns({c}));
        QCOMPARE(asked.size(), 1);
        QVERIFY(asked.front().contains(base + " #3"));
        QCOMPARE(m->rowCount(), 3);
        // Accepted, from the table's Del key on the selected run.
        w_->setDeleteConfirmation([](const QStringList&) { return true; });
        w_->selectRuns({c});
        w_->browser()->table()->setFocus();
        QTest::keyClick(w_->browser()->table(), Qt::Key_Delete);
        QTRY_COMPARE(m->rowCount(), 2);
        QVERIFY(!m->run(c));
        QVERIFY(w_->saveWindowPng(outDir() + "/runs-managed.png"));

        // Reopened: the names, the notes and the deletion are in the file.
        QVERIFY(w_->openSession(session_));
        QVERIFY(w_->openSession(manage));
        QCOMPARE(m->rowCount(), 2);
        QCOMPARE(m->run(a)->name, QString("baseline"));
        QCOMPARE(m->run(a)->notes, QString("first try\nwith h2o"));
        QCOMPARE(m->run(b)->name, QString("baseline #2"));
        QVERIFY(m->run(b)->notes.isEmpty());
        QVERIFY(!m->run(c));
        QCOMPARE(QString::fromStdString(storage::read_run_notes(manage.toStdString()).at(a)), QString("first try\nwith h2o"));
        QCOMPARE(spansOf(c), 0);
        QCOMPARE(spansOf(a), spansA);
        QCOMPARE(spansOf(b), spansB);
        w_->setDeleteConfirmation({});
        QVERIFY(w_->openSession(session_));  // the next cases work on the first session
    }

    void logFollowsTheNewestLineUnlessScrolledUp() {
        // A run's output streams into the log dock: it follows the newest line, stays where the
        // reader scrolled up to, and follows again once they are back at the bottom (issue 37).
        auto* log = w_->findChild<QPlainTextEdit*>("logPanel");
        QVERIFY(log);
        QScrollBar* bar = log->verticalScrollBar();
        auto emit_lines = [&](int n) {
            for (int i = 0; i < n; ++i) Q_EMIT w_->controller()->runOutput(1, QStringLiteral("output line %1 of a long run").arg(i));
            QCoreApplication::processEvents();
        };
        emit_lines(300);
        QTRY_VERIFY(bar->maximum() > 0);
        QCOMPARE(bar->value(), bar->maximum());
        bar->setValue(bar->maximum() / 2);
        const int held = bar->value();
        emit_lines(50);
        QCOMPARE(bar->value(), held);
        bar->setValue(bar->maximum());
        emit_lines(50);
        QCOMPARE(bar->value(), bar->maximum());
    }

    void helpListsEveryShortcutAndOpensTheGuide() {
        // "?" opens the sheet; it names every menu action that has a shortcut, with its keys,
        // and the views' mouse gestures.
        QCOMPARE(w_->findChild<QAction*>("helpShortcuts")->shortcut(), QKeySequence(Qt::Key_Question));
        w_->activateWindow();
        QVERIFY(QTest::qWaitForWindowActive(w_.get()));
        QTest::keyClick(w_.get(), Qt::Key_Question);
        QDialog* sheet = nullptr;
        QTRY_VERIFY_WITH_TIMEOUT((sheet = w_->findChild<QDialog*>("shortcutDialog")) != nullptr, 3000);
        auto* text = sheet->findChild<QTextBrowser*>("shortcutText");
        QVERIFY(text);
        const QString sheetText = text->toPlainText();
        int withKeys = 0;
        for (QAction* a : w_->menuBar()->findChildren<QAction*>()) {
            if (a->shortcut().isEmpty()) continue;
            ++withKeys;
            QVERIFY2(sheetText.contains(a->shortcut().toString(QKeySequence::NativeText)), qPrintable(a->text()));
            QVERIFY2(sheetText.contains(QString(a->text()).remove('&')), qPrintable(a->text()));
        }
        QVERIFY(withKeys >= 10);  // file, run, view (one per view) and help actions
        for (const auto& g : views::canvas_gestures()) QVERIFY2(sheetText.contains(QString::fromUtf8(g.action)), g.action);
        sheet->close();
        // The user guide: docs/GUIDE.md, with a section per view and every image it shows present.
        QDialog* guide = w_->showUserGuide();
        QVERIFY(guide);
        auto* gt = guide->findChild<QTextBrowser*>("guideText");
        QVERIFY(gt);
        const QString guideText = gt->toPlainText();
        for (int i = 0; i < int(views::view_count()); ++i) {
            const QString view = QString::fromLatin1(views::view_name(views::ViewKind(i)));
            QVERIFY2(guideText.contains(view, Qt::CaseInsensitive), qPrintable(view));
        }
        QFile md(findUserGuide());
        QVERIFY(md.open(QIODevice::ReadOnly));
        const QString source = QString::fromUtf8(md.readAll());
        QRegularExpression image(R"(!\[[^\]]*\]\(([^)]+)\))");
        int images = 0;
        for (auto it = image.globalMatch(source); it.hasNext();) {
            const QString rel = it.next().captured(1);
            QVERIFY2(QFileInfo(QFileInfo(md.fileName()).dir().filePath(rel)).isFile(), qPrintable(rel));
            ++images;
        }
        QVERIFY(images >= int(views::view_count()));
        guide->close();
    }

    void memoryTimelineFiltersByRankOfADataParallelRun() {
        // A data-parallel run as the CLI leaves it (issue 23): rank 0's run, and rank 1's run
        // imported from rank 1's own session (a longer sequence, so the ranks differ).
        const std::string dp = tmp_.filePath("ranks.kvlab").toStdString();
        const std::string rank1 = tmp_.filePath("rank1.kvlab").toStdString();
        auto record = [](const std::string& path, int64_t seq) {
            RunConfig c;
            c.mode = "eval_long";
            c.model = "tiny";
            for (auto [k, v] : {std::pair<const char*, std::string>{"data", "passkey"}, {"data.seq_length", std::to_string(seq)},
                                {"data.num_samples", "2"}, {"kv_cache.name", "h2o-default"}, {"kv_cache.cache_length", "64"},
                                {"kv_cache.chunk_size", "16"}})
                set_run_option(c, k, v);
            c.threads = 1;
            sessions::RunManager rm(path);
            const int64_t id = rm.submit(c);
            return rm.wait(id) == storage::RunStatus::DONE ? id : int64_t(0);
        };
        const int64_t r0 = record(dp, 256), src = record(rank1, 512);
        QVERIFY(r0 && src);
        const storage::RankImport imp = storage::import_rank_run(dp, r0, 1, rank1, src);
        QVERIFY(w_->openSession(QString::fromStdString(dp)));
        QCOMPARE(w_->runsModel()->rowCount(), 1);  // the rank run is part of its run, not a row
        w_->selectRuns({r0});
        w_->setView(views::view_named("memory timeline"));
        QVERIFY(drawFrames(w_->canvas(), 4));
        views::CanvasImpl& impl = w_->canvas()->canvas().impl();
        QCOMPARE(impl.state<views::MemoryTimelineViewState>().rank_runs, (std::vector<int64_t>{r0, imp.run}));
        QVERIFY(impl.state<views::MemoryTimelineViewState>().shown_rank_selector);
        QVERIFY(views::select_memory_rank(impl.state<views::MemoryTimelineViewState>(), 1, impl.textures));
        QVERIFY(drawFrames(w_->canvas(), 6));
        storage::SessionReader reader(dp);
        int64_t peak = 0;
        for (const auto& e : reader.memory_events(imp.run)) peak = std::max(peak, e.device_total);
        QCOMPARE(impl.state<views::MemoryTimelineViewState>().run, imp.run);
        QCOMPARE(impl.state<views::MemoryTimelineViewState>().peak_bytes(), peak);
        QCOMPARE(impl.state<views::MemoryTimelineViewState>().shown_peak, peak);
        const QString png = outDir() + "/memory-rank1.png";
        QVERIFY(w_->saveWindowPng(png));
        QVERIFY(hasContent(QImage(png)));
        QVERIFY(w_->openSession(session_));  // the session the next slot expects
    }

    // Run > Load Python policy (issue 39): a policy class in a .py file joins the form's policy
    // list and runs like a built-in, deciding as the built-in it mirrors (python/examples/knorm.py
    // is knorm); a file that does not load says why and changes nothing.
    void pythonPolicyFileJoinsTheFormAndRuns() {
        if (!QFileInfo::exists(QCoreApplication::applicationDirPath() + "/libkvlab_python_cli.so"))
            QSKIP("this build has no Python module (KVLAB_PYTHON off): no libkvlab_python_cli.so beside the app");
        const int before = form()->policyCombo()->count();
        QCOMPARE(w_->loadPolicyFile(QStringLiteral(KVLAB_SOURCE_DIR "/python/does_not_exist.py")), QString());
        QVERIFY(w_->logText().contains("Cannot load the policy file"));
        QCOMPARE(form()->policyCombo()->count(), before);
        QCOMPARE(w_->loadPolicyFile(QStringLiteral(KVLAB_SOURCE_DIR "/python/examples/knorm.py")), QString("knorm_py"));
        QCOMPARE(form()->policyCombo()->count(), before + 1);
        QVERIFY(form()->policyCombo()->findData(QString("knorm_py")) >= 0);
        std::vector<int64_t> ids;
        for (const char* cache : {"knorm-default", "knorm_py-default"}) {
            form()->applyPreset("passkey 2k, tiny model (quick)");
            form()->setValue("kv_cache.name", cache);
            QVERIFY2(form()->isValid(), cache);
            ids.push_back(w_->launch(form()->config()));
            QVERIFY(ids.back() > 0);
        }
        for (int64_t id : ids) QVERIFY(waitFinal(id, 120000));
        for (int64_t id : ids) QCOMPARE(int(w_->runsModel()->run(id)->status), int(storage::RunStatus::DONE));
        // The same decisions: equal losses to the last bit (the replay logs are compared in
        // python.policies; here the app's path to them).
        QCOMPARE(summaryOf(w_->controller(), ids[0])["mean_loss"].get<double>(),
                 summaryOf(w_->controller(), ids[1])["mean_loss"].get<double>());
        QCOMPARE(w_->runsModel()->run(ids[1])->policy, QString("knorm_py"));
    }

    void settingsPersistAcrossWindows() {
        w_->setView(views::view_named("memory timeline"));
        w_->close();
        QSettings s;
        QCOMPARE(s.value("session/last").toString(), session_);
        QVERIFY(!s.value("window/geometry").toByteArray().isEmpty());
        QCOMPARE(s.value("view/name").toString(), QString::fromLatin1(views::view_name(views::view_named("memory timeline"))));
        w_.reset();  // stops its session
        // Quitting folds the runs' WAL back into the session: no -wal over 1 MiB is left beside it
        // (the window's read-only connections close last and could not delete it themselves).
        const QFileInfo wal(session_ + "-wal");
        QVERIFY2(!wal.exists() || wal.size() <= (1 << 20), qPrintable(QString("%1 bytes of WAL left").arg(wal.size())));
        MainWindow again;
        again.setQuiet(true);
        again.restoreLastSession();
        QCOMPARE(again.controller()->path(), session_);
        QCOMPARE(again.view(), views::view_named("memory timeline"));
        QVERIFY(again.runsModel()->rowCount() >= 6);
        QVERIFY(again.form()->isValid());  // the last form came back
    }
};

QTEST_MAIN(GuiAppTest)
#include "gui_app_test.moc"
