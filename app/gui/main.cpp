// kvlab-gui: the desktop app. `kvlab-gui [SESSION]` opens a session (the last one when none is
// given); --demo launches the demo comparison into an empty session; --bench-frames times the
// views' frames and prints the numbers (see frame_bench.h).
#include <QApplication>
#include <QCommandLineParser>
#include <QSurfaceFormat>
#include <QTimer>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "frame_bench.h"
#include "gui_support.h"
#include "main_window.h"
#include "models/runs_model.h"
#include "session_controller.h"

namespace {
// The command line, shared by the GUI start and the display-less --help/--version path.
struct GuiCommandLine {
    QCommandLineParser parser;
    QCommandLineOption demo{"demo", "launch the demo sweep (dense, h2o, lastrec, tova at 256 and 512 slots on SmolLM2-135M, repeat task and licence text, fidelity on; tiny without the model) into an empty session"};
    QCommandLineOption screenshot{"screenshot", "when no run is active any more, save the window as PNG to PATH and quit", "PATH"};
    QCommandLineOption bench{"bench-frames",
                             "time frames of the views (synthetic 128k-token 24-layer eviction map, 10M-event memory timeline, a live small run) and quit"};
    QCommandLineOption benchFrames{"frames", "frames per benchmark case", "N", "60"};
    QCommandLineOption benchSession{"bench-session", "with --bench-frames: reuse this synthetic session (written and kept when missing)", "FILE"};
    QCommandLineOption benchOnly{"bench-only", "with --bench-frames: only the scenarios of this view (e.g. memory, eviction) and no live run", "VIEW"};
    QCommandLineOption benchSpans{"bench-spans", "with --bench-frames --bench-only trace: synthetic spans", "N", "10000000"};
    QCommandLineOption benchMd{"md", "with --bench-frames --bench-only trace: append the table as Markdown to FILE (scripts/performance.sh)", "FILE"};
    GuiCommandLine() {
        parser.setApplicationDescription("kvlab: a lab for KV-cache policies in large language models");
        parser.addHelpOption();
        parser.addVersionOption();
        parser.addPositionalArgument("SESSION", "session file to open or create (default: the last one)");
        for (const QCommandLineOption* o : {&demo, &screenshot, &bench, &benchFrames, &benchSession, &benchOnly, &benchSpans, &benchMd}) parser.addOption(*o);
    }
};

void setAppNames() {
    QCoreApplication::setOrganizationName("kvlab");
    QCoreApplication::setApplicationName("kvlab-gui");
    QCoreApplication::setApplicationVersion(QStringLiteral(KVLAB_VERSION));
}

// --help and --version print and exit without a display (QApplication aborts without one).
bool infoOnly(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "-h" || a == "--help" || a == "-?" || a == "--help-all" || a == "-v" || a == "--version") return true;
    }
    return false;
}
}  // namespace

int main(int argc, char** argv) {
    // The GUI thread shares the cores with the run's OpenMP workers; spinning workers starve it
    // and it starves them (runs went 10x slower). libgomp reads OMP_WAIT_POLICY when it loads,
    // before main, so set it and re-exec once.
    if (!std::getenv("OMP_WAIT_POLICY")) {
        setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
        execv("/proc/self/exe", argv);  // returns only on failure: then run with spinning workers
    }
    // Before QApplication: every QOpenGLWidget gets this format (Mesa gives 4.5 compatibility).
    QSurfaceFormat fmt;
    fmt.setDepthBufferSize(0);
    fmt.setStencilBufferSize(0);
    fmt.setSwapInterval(0);  // frames are paced by events and timers, never by vsync waits
    QSurfaceFormat::setDefaultFormat(fmt);
    if (infoOnly(argc, argv)) {
        QCoreApplication core(argc, argv);
        setAppNames();
        GuiCommandLine cl;
        cl.parser.process(core);  // prints and exits
        return 0;
    }
    QApplication app(argc, argv);
    setAppNames();

    GuiCommandLine cl;
    QCommandLineParser& cli = cl.parser;
    cli.process(app);
    const QCommandLineOption &demo = cl.demo, &screenshot = cl.screenshot, &bench = cl.bench, &benchFrames = cl.benchFrames,
                             &benchSession = cl.benchSession, &benchOnly = cl.benchOnly;

    if (cli.isSet(bench)) {
        kv::gui::FrameBenchOptions fo;
        fo.frames = cli.value(benchFrames).toInt();
        fo.session = cli.value(benchSession).toStdString();
        fo.only = cli.value(benchOnly).toStdString();
        fo.live = fo.only.empty();
        fo.md = cli.value(cl.benchMd).toStdString();
        bool spansOk = false;
        fo.trace_spans = cli.value(cl.benchSpans).toLongLong(&spansOk);
        if (!spansOk || fo.trace_spans < 1000) {
            std::fprintf(stderr, "kvlab-gui: --bench-spans '%s': expected a whole number of spans >= 1000\n", qPrintable(cli.value(cl.benchSpans)));
            return 2;
        }
        if ((cli.isSet(cl.benchMd) || cli.isSet(cl.benchSpans)) && fo.only != "trace") {
            std::fprintf(stderr, "kvlab-gui: --md and --bench-spans apply to the trace view's benchmark only; expected --bench-only trace\n");
            return 2;
        }
        return kv::gui::runFrameBench(fo);
    }

    kv::gui::MainWindow w;
    w.show();
    const QStringList args = cli.positionalArguments();
    if (!args.isEmpty())
        w.openSession(args.front());
    else
        w.restoreLastSession();
    if (cli.isSet(demo)) QTimer::singleShot(0, &w, [&w] { w.startDemo(); });
    if (cli.isSet(screenshot)) {
        // Poll: the demo runs queue up first, so "idle" is checked after they were submitted.
        auto* poll = new QTimer(&w);
        const QString path = cli.value(screenshot);
        QObject::connect(poll, &QTimer::timeout, &w, [&w, poll, path] {
            if (w.controller()->anyActive()) return;
            poll->stop();
            QTimer::singleShot(1000, &w, [&w, path] {
                w.saveWindowPng(path);
                std::printf("saved %s\n", qPrintable(path));
                QApplication::quit();
            });
        });
        QTimer::singleShot(1500, poll, [poll] { poll->start(250); });
    }
    return app.exec();
}
