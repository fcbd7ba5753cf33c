// kvlab's main window: session browser, run form and log as docks around the ImGui canvas with
// its view switcher; File / Run / Export / View / Help menus; a status bar. Window state, the
// last session, the last view and the form persist in QSettings. Collaborators (model,
// controller) are created here and handed to the pages through their constructors.
#pragma once

#include <QMainWindow>

#include <cstdint>
#include <functional>
#include <vector>

#include "engine/run/run_config.h"
#include "gui_support.h"
#include "views/canvas.h"

class QDialog;
class QLabel;
class QListWidget;
class QPlainTextEdit;
class QTabBar;

namespace kv::gui {

class CanvasWidget;
class RunForm;
class RunsModel;
class SessionBrowser;
class SessionController;

class MainWindow : public QMainWindow {
    Q_OBJECT
   public:
    explicit MainWindow(QWidget* parent = nullptr);
    ~MainWindow() override;

    // Quiet: problems go to the log and status bar instead of modal dialogs (tests, scripts).
    void setQuiet(bool quiet) { quiet_ = quiet; }
    // Asked before the window closes while runs are live, with their number: true quits (the
    // runs are cancelled, what they recorded stays). Default: a dialog; quiet windows quit.
    using QuitConfirmation = std::function<bool(int activeRuns)>;
    void setQuitConfirmation(QuitConfirmation confirm) { confirm_quit_ = std::move(confirm); }
    // Asked before runs are deleted, with their names: true deletes. Default: a dialog; quiet
    // windows delete.
    using DeleteConfirmation = std::function<bool(const QStringList& names)>;
    void setDeleteConfirmation(DeleteConfirmation confirm) { confirm_delete_ = std::move(confirm); }
    // Help: the shortcut sheet and the user guide (nullptr when the guide cannot be found;
    // the reason is shown/logged).
    QDialog* showShortcuts();
    QDialog* showUserGuide();
    // Opens (or creates) a session; false with the reason shown/logged.
    bool openSession(const QString& path);
    // Restores the last session from the settings when no path was given.
    void restoreLastSession();
    // Validates and queues one run; -1 with the reason shown/logged.
    int64_t launch(const RunConfig& cfg);
    // Registers the policy class a Python file defines (docs/PYTHON.md) and lists it in the run
    // form; its name, or "" with the reason (and the traceback) shown/logged.
    QString loadPolicyFile(const QString& path);
    // Deletes finished runs (after the confirmation) with what they recorded; false when
    // declined or refused (the reason is shown/logged).
    bool deleteRuns(const std::vector<int64_t>& runs);
    // Launches the runs' configurations again (each gets "… #2" and so on); the new run ids.
    std::vector<int64_t> rerunRuns(const std::vector<int64_t>& runs);
    // The centre's first screen while the session has no runs: the demo, open a session, and
    // the recent sessions (File > Open Recent's list).
    QWidget* firstScreen() const { return first_screen_; }
    // Queues the configurations (reference first), selects them and shows the compare view.
    std::vector<int64_t> launchComparison(const std::vector<RunConfig>& cfgs);
    // The demo (demoConfigs): a small sweep on SmolLM2-135M (tiny without the asset), opened
    // on the sweep view, unless the session already has runs (then they are shown).
    void startDemo();
    const std::string& demoModel() const { return demo_model_; }

    void setView(views::ViewKind view);
    views::ViewKind view() const;
    void selectRuns(const std::vector<int64_t>& runs);
    // Synchronous export (the menu runs the same call on a worker thread).
    bool exportSelected(const ExportChoice& choice, const QString& path, QString* error = nullptr);
    bool saveViewPng(const QString& path);
    bool saveWindowPng(const QString& path);

    RunsModel* runsModel() const { return model_; }
    SessionController* controller() const { return controller_; }
    SessionBrowser* browser() const { return browser_; }
    RunForm* form() const { return form_; }
    CanvasWidget* canvas() const { return canvas_; }
    QTabBar* viewTabs() const { return view_tabs_; }
    QString logText() const;
    // Sessions opened before, newest first (File > Open Recent; at most kMaxRecent, files that
    // still exist). Kept in QSettings "session/recent".
    QStringList recentSessions() const;
    static constexpr int kMaxRecent = 8;

   protected:
    void closeEvent(QCloseEvent* e) override;

   private:
    void buildMenus();
    void saveSettings();
    void restoreSettings();
    void showProblem(const QString& title, const QString& message);
    void log(const QString& line);
    void onSelectionChanged(const std::vector<int64_t>& runs);
    void onRunStatus(qint64 run, int status, const QString& message);
    void onSessionChanged(const QString& path);
    void updateStatus();
    void newSessionDialog();
    void openSessionDialog();
    void rememberSession(const QString& path);  // front of the recent list
    void rebuildRecentMenu();
    void compareDialog(const RunConfig& base);
    void exportDialog(const ExportChoice& choice);
    void exportPngDialog(bool window);
    void aboutDialog();
    QWidget* buildFirstScreen();
    void updateFirstScreen();  // shown while the session has no runs; lists the recent sessions
    bool eventFilter(QObject* watched, QEvent* event) override;

    RunsModel* model_;
    SessionController* controller_;
    SessionBrowser* browser_;
    RunForm* form_;
    CanvasWidget* canvas_;
    QTabBar* view_tabs_;
    QPlainTextEdit* log_;
    QMenu* recent_menu_ = nullptr;
    QLabel* status_session_;
    QLabel* status_runs_;
    QLabel* status_frame_;
    bool quiet_ = false;
    QuitConfirmation confirm_quit_;
    DeleteConfirmation confirm_delete_;
    QWidget* first_screen_ = nullptr;
    QListWidget* recent_list_ = nullptr;
    int64_t pending_reference_ = 0;  // reference of the last comparison launched
    std::string demo_model_;         // what the last demo ran on ("smollm2-135m" or "tiny")
};

// The demo's runs: dense plus h2o, lastrec and tova at 256 and 512 slots, on the repeat task and
// on licence text (1024 tokens each, fidelity on), on SmolLM2-135M, or on tiny when the asset is
// missing; *model_used says which.
std::vector<RunConfig> demoConfigs(std::string* model_used = nullptr);

}  // namespace kv::gui
