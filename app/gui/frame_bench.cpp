// Frame benchmark (see frame_bench.h). Two parts:
//  1. views::run_view_bench driven through this app's GL host: the canvas widget's context is
//     current, its textures are GL textures, and every frame is rendered by ImGui's OpenGL3
//     backend and finished (glFinish), so llvmpipe's rasterization is inside the frame time.
//  2. The app itself while a `small` run streams into a session: every paintGL (with glFinish)
//     and every 20 Hz Canvas::refresh, through the real main window and event loop.
#include "frame_bench.h"

#include <QApplication>
#include <QElapsedTimer>
#include <QFile>
#include <QFileInfo>
#include <QOpenGLContext>
#include <QOpenGLFunctions>
#include <QTemporaryDir>
#include <QThread>

#include <backends/imgui_impl_opengl3.h>
#include <imgui.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "canvas_widget.h"
#include "engine/core/error.h"
#include "main_window.h"
#include "models/runs_model.h"
#include "run_form.h"
#include "session_controller.h"
#include "bench/trace_view_bench.h"
#include "bench/view_bench.h"

namespace kv::gui {

namespace {

void waitUntil(const std::function<bool()>& done, int timeoutMs) {
    QElapsedTimer t;
    t.start();
    while (!done() && t.elapsed() < timeoutMs) {
        QApplication::processEvents(QEventLoop::AllEvents, 20);
        QThread::msleep(2);
    }
}

struct Stats {
    double p50 = 0, p95 = 0, max = 0, mean = 0;
    size_t n = 0;
};
Stats stats(std::vector<double> v) {
    Stats s;
    if (v.empty()) return s;
    std::sort(v.begin(), v.end());
    s.n = v.size();
    s.p50 = v[v.size() / 2];
    s.p95 = v[std::min(v.size() - 1, size_t(double(v.size()) * 0.95))];
    s.max = v.back();
    for (double x : v) s.mean += x;
    s.mean /= double(v.size());
    return s;
}

// The CPU the frames ran on (llvmpipe rasterizes on it): /proc/cpuinfo's model name, "?" elsewhere.
std::string cpuModel() {
    QFile f("/proc/cpuinfo");
    if (!f.open(QIODevice::ReadOnly)) return "?";
    for (const QByteArray& line : f.readAll().split('\n'))
        if (line.startsWith("model name")) return line.mid(line.indexOf(':') + 1).trimmed().toStdString();
    return "?";
}

// Part 1: the views' own benchmark with this app's GL renderer in the loop.
int viewBench(const FrameBenchOptions& fo) {
    CanvasWidget w;
    w.resize(1600, 1000);
    w.show();
    waitUntil([&] { return w.framesDrawn() > 0; }, 10000);
    if (w.framesDrawn() == 0) {
        std::printf("frame bench: the OpenGL widget never drew a frame (no GL context?)\n");
        return 1;
    }
    w.makeCurrent();
    ImGui::SetCurrentContext(w.imguiContext());
    QOpenGLFunctions* gl = w.context()->functions();
    views::ViewBenchOptions o;
    o.frames = fo.frames;
    o.only = fo.only;
    if (!fo.session.empty()) {
        if (QFileInfo::exists(QString::fromStdString(fo.session)))
            o.session = fo.session;
        else {
            std::printf("writing the synthetic session to %s (kept for later runs)\n", fo.session.c_str());
            std::fflush(stdout);
            views::write_view_bench_session(fo.session, o);
            o.session = fo.session;
        }
    }
    o.width = float(w.width());
    o.height = float(w.height());
    o.live_run = fo.live;
    o.before_frame = [] { ImGui_ImplOpenGL3_NewFrame(); };
    o.after_frame = [&](ImDrawData* dd) {
        gl->glViewport(0, 0, w.width(), w.height());
        gl->glClearColor(0.09f, 0.09f, 0.11f, 1.0f);
        gl->glClear(GL_COLOR_BUFFER_BIT);
        ImGui_ImplOpenGL3_RenderDrawData(dd);
        gl->glFinish();  // llvmpipe renders on the CPU: count it in the frame
    };
    const char* renderer = reinterpret_cast<const char*>(gl->glGetString(GL_RENDERER));
    std::printf("renderer: %s, max texture %d, frame %dx%d, cpu: %s\n", renderer ? renderer : "?", w.maxTextureSize(), w.width(),
                w.height(), cpuModel().c_str());
    std::fflush(stdout);
    if (fo.only == "trace") {  // the trace view on ten million spans (in memory: see trace_view_bench.h)
        views::TraceBenchOptions t;
        t.frames = fo.frames;
        t.spans = fo.trace_spans;
        t.width = o.width;
        t.height = o.height;
        t.before_frame = o.before_frame;
        t.after_frame = o.after_frame;
        char how[300];
        std::snprintf(how, sizeof how, "%s, frame %dx%d", renderer ? renderer : "?", w.width(), w.height());
        const bench::BenchTable table = views::trace_bench_table(views::run_trace_view_bench(t), how);
        w.doneCurrent();
        std::printf("%s", table.text().c_str());
        if (!fo.md.empty()) {
            // Appended: scripts/performance.sh collects every benchmark's section in one file.
            std::ofstream f(fo.md, std::ios::app);
            if (!(f << table.markdown(bench::table_caption()))) {
                std::fprintf(stderr, "kvlab-gui: --md: cannot append to '%s'; expected a writable file path\n", fo.md.c_str());
                return 2;
            }
        }
        return 0;
    }
    views::ViewBenchResult r = views::run_view_bench(w, o);
    std::printf("%s", views::format_view_bench(r).c_str());
    w.doneCurrent();
    return 0;
}

// Part 2: the app while a `small` run streams (what a user sees).
int appLiveBench() {
    QTemporaryDir dir;
    MainWindow win;
    win.setQuiet(true);
    win.resize(1600, 1000);
    win.show();
    if (!win.openSession(dir.filePath("live.kvlab"))) return 1;
    RunForm* form = win.form();
    form->applyPreset("needle 16k, small model");
    form->setValue("data.num_samples", "4");  // long enough to stream through every view
    CanvasWidget* canvas = win.canvas();
    canvas->setFinishFrames(true);
    const int64_t run = win.launch(form->config());
    if (run < 0) return 1;
    win.selectRuns({run});
    std::printf("\napp while a `small` run streams (%s, 20 Hz refresh, every frame finished):\n",
                qPrintable(win.runsModel()->run(run) ? win.runsModel()->run(run)->name : QString()));
    std::printf("  %-22s %7s %6s %8s %8s %8s %8s  %s\n", "view", "frames", "fps", "p50 ms", "p95 ms", "max ms", "refresh",
                "(max + refresh) / 100 ms");
    const views::ViewKind kinds[] = {views::view_named("eviction map"), views::view_named("memory timeline"), views::view_named("cell grid"),
                                     views::view_named("scores"), views::view_named("metrics")};
    std::vector<double> all;
    double worstRefresh = 0;
    for (auto k : kinds) {
        win.setView(k);
        std::vector<double> ms;
        auto c = QObject::connect(canvas, &CanvasWidget::frameDrawn, canvas, [&ms](double m) { ms.push_back(m); });
        canvas->resetRefreshStats();
        QElapsedTimer t;
        t.start();
        // Repaint continuously for 3 s (worst case: more frames than the 20 Hz refresh asks for).
        while (t.elapsed() < 3000 && win.controller()->anyActive()) {
            canvas->update();
            QApplication::processEvents(QEventLoop::AllEvents, 5);
        }
        QObject::disconnect(c);
        Stats s = stats(ms);
        worstRefresh = std::max(worstRefresh, canvas->maxRefreshMs());
        all.insert(all.end(), ms.begin(), ms.end());
        std::printf("  %-22s %7zu %6.1f %8.1f %8.1f %8.1f %8.1f  %.2fx\n", views::view_name(k), s.n,
                    double(s.n) * 1000.0 / double(std::max<qint64>(t.elapsed(), 1)), s.p50, s.p95, s.max, canvas->maxRefreshMs(),
                    (s.max + canvas->maxRefreshMs()) / 100.0);
        if (!win.controller()->anyActive()) break;
    }
    Stats s = stats(all);
    std::printf("  worst frame while streaming: %.1f ms paint + %.1f ms refresh (%.2fx of the 100 ms a 10 Hz update allows)\n",
                s.max, worstRefresh, (s.max + worstRefresh) / 100.0);
    win.controller()->cancelAll();
    waitUntil([&] { return !win.controller()->anyActive(); }, 30000);
    return 0;
}

}  // namespace

int runFrameBench(const FrameBenchOptions& o) {
    try {
        FrameBenchOptions fo = o;
        fo.frames = std::max(fo.frames, 1);
        int rc = viewBench(fo);
        if (rc == 0 && fo.live) rc = appLiveBench();
        return rc;
    } catch (const Error& e) {
        std::printf("frame bench failed: %s\n", e.what());
        return 1;
    }
}

}  // namespace kv::gui
