// ImGui canvas host (see canvas_widget.h). Input follows ImGui 1.86's legacy API: io.MousePos,
// io.MouseDown[], io.MouseWheel, io.KeysDown[] indexed through io.KeyMap[], and
// AddInputCharactersUTF8 for text.
#include "canvas_widget.h"

#include <QKeyEvent>
#include <QMouseEvent>
#include <QOpenGLContext>
#include <QWheelEvent>

#include <backends/imgui_impl_opengl3.h>
#include <imgui.h>

#include <algorithm>
#include <cfloat>

#include "views/canvas_impl.h"

namespace kv::gui {

namespace {

// io.KeysDown[] indices: printable ASCII keys use their Qt code (Qt::Key_A == 'A'), special
// keys are packed above 256 so every index stays below 512.
int keyIndex(int qtKey) {
    if (qtKey >= 0x20 && qtKey < 0x7f) return qtKey;
    switch (qtKey) {
        case Qt::Key_Tab: return 256;
        case Qt::Key_Left: return 257;
        case Qt::Key_Right: return 258;
        case Qt::Key_Up: return 259;
        case Qt::Key_Down: return 260;
        case Qt::Key_PageUp: return 261;
        case Qt::Key_PageDown: return 262;
        case Qt::Key_Home: return 263;
        case Qt::Key_End: return 264;
        case Qt::Key_Insert: return 265;
        case Qt::Key_Delete: return 266;
        case Qt::Key_Backspace: return 267;
        case Qt::Key_Return: return 268;
        case Qt::Key_Escape: return 269;
        case Qt::Key_Enter: return 270;  // keypad
        case Qt::Key_Backtab: return 256;
        default: return -1;
    }
}

int mouseButtonIndex(Qt::MouseButton b) {
    switch (b) {
        case Qt::LeftButton: return 0;
        case Qt::RightButton: return 1;
        case Qt::MiddleButton: return 2;
        case Qt::BackButton: return 3;
        case Qt::ForwardButton: return 4;
        default: return -1;
    }
}

}  // namespace

CanvasWidget::CanvasWidget(QWidget* parent) : QOpenGLWidget(parent) {
    setMouseTracking(true);  // hover tooltips need moves without buttons
    setFocusPolicy(Qt::StrongFocus);
    setMinimumSize(320, 200);
    // The ImGui context exists before GL does, so the canvas can be used before the first show.
    ImGuiContext* previous = ImGui::GetCurrentContext();
    ctx_ = ImGui::CreateContext();
    ImGui::SetCurrentContext(ctx_);
    ImGuiIO& io = ImGui::GetIO();
    io.IniFilename = nullptr;  // view preferences are persisted by the app, not imgui.ini
    io.BackendPlatformName = "kvlab_qt";
    io.KeyMap[ImGuiKey_Tab] = 256;
    io.KeyMap[ImGuiKey_LeftArrow] = 257;
    io.KeyMap[ImGuiKey_RightArrow] = 258;
    io.KeyMap[ImGuiKey_UpArrow] = 259;
    io.KeyMap[ImGuiKey_DownArrow] = 260;
    io.KeyMap[ImGuiKey_PageUp] = 261;
    io.KeyMap[ImGuiKey_PageDown] = 262;
    io.KeyMap[ImGuiKey_Home] = 263;
    io.KeyMap[ImGuiKey_End] = 264;
    io.KeyMap[ImGuiKey_Insert] = 265;
    io.KeyMap[ImGuiKey_Delete] = 266;
    io.KeyMap[ImGuiKey_Backspace] = 267;
    io.KeyMap[ImGuiKey_Space] = Qt::Key_Space;
    io.KeyMap[ImGuiKey_Enter] = 268;
    io.KeyMap[ImGuiKey_Escape] = 269;
    io.KeyMap[ImGuiKey_KeyPadEnter] = 270;
    io.KeyMap[ImGuiKey_A] = Qt::Key_A;
    io.KeyMap[ImGuiKey_C] = Qt::Key_C;
    io.KeyMap[ImGuiKey_V] = Qt::Key_V;
    io.KeyMap[ImGuiKey_X] = Qt::Key_X;
    io.KeyMap[ImGuiKey_Y] = Qt::Key_Y;
    io.KeyMap[ImGuiKey_Z] = Qt::Key_Z;
    ImGui::StyleColorsDark();
    canvas_ = std::make_unique<views::Canvas>(this);
    canvas_->impl().show_view_tabs = false;  // the Qt tab bar above switches views
    ImGui::SetCurrentContext(previous ? previous : ctx_);
    clock_.start();
    live_timer_.setInterval(50);
    connect(&live_timer_, &QTimer::timeout, this, [this] {
        if (refresh()) update();
    });
}

CanvasWidget::~CanvasWidget() {
    live_timer_.stop();
    // Textures are released by the canvas; GL must be current for that and for the renderer.
    const bool gl = gl_ready_ && context();
    if (gl) makeCurrent();
    ImGui::SetCurrentContext(ctx_);
    canvas_.reset();
    if (gl) {
        ImGui_ImplOpenGL3_Shutdown();
        doneCurrent();
    }
    ImGui::DestroyContext(ctx_);
}

void CanvasWidget::useContext() const { ImGui::SetCurrentContext(ctx_); }

void CanvasWidget::ensureGLCurrent() {
    if (gl_ready_ && QOpenGLContext::currentContext() != context()) makeCurrent();
}

void CanvasWidget::openSession(const QString& path) {
    useContext();
    canvas_->open_session(path.toStdString());
    requestFrames(2);
}

void CanvasWidget::selectRuns(const std::vector<int64_t>& runs) {
    useContext();
    canvas_->select_runs(runs);
    requestFrames(2);
}

void CanvasWidget::setReference(int64_t run) {
    useContext();
    canvas_->set_reference(run);
    requestFrames(2);
}

void CanvasWidget::setView(views::ViewKind view) {
    useContext();
    canvas_->set_view(view);
    requestFrames(2);
}

bool CanvasWidget::refresh() {
    useContext();
    QElapsedTimer t;
    t.start();
    const bool changed = canvas_->refresh();
    last_refresh_ms_ = double(t.nsecsElapsed()) * 1e-6;
    max_refresh_ms_ = std::max(max_refresh_ms_, last_refresh_ms_);
    if (changed) update();
    return changed;
}

void CanvasWidget::setLive(bool live) {
    if (live && !live_timer_.isActive()) live_timer_.start();
    if (!live && live_timer_.isActive()) {
        live_timer_.stop();
        refresh();  // the last rows of the run
    }
}

void CanvasWidget::setShowMetricsWindow(bool show) {
    show_metrics_ = show;
    requestFrames(2);
}

void CanvasWidget::requestFrames(int n) {
    frames_pending_ = std::max(frames_pending_, n);
    update();
}

void CanvasWidget::initializeGL() {
    initializeOpenGLFunctions();
    useContext();
    // GLSL 1.30 works in both the compatibility and the core 4.5 contexts Mesa gives us.
    gl_ready_ = ImGui_ImplOpenGL3_Init("#version 130");
    glGetIntegerv(GL_MAX_TEXTURE_SIZE, &max_texture_size_);
}

void CanvasWidget::paintGL() {
    if (!gl_ready_) return;
    QElapsedTimer frameClock;
    frameClock.start();
    useContext();
    ImGuiIO& io = ImGui::GetIO();
    const qreal dpr = devicePixelRatioF();
    io.DisplaySize = ImVec2(float(width()), float(height()));
    io.DisplayFramebufferScale = ImVec2(float(dpr), float(dpr));
    const qint64 now = clock_.nsecsElapsed();
    io.DeltaTime = std::max(1e-4f, float(double(now - last_ns_) * 1e-9));  // ImGui asserts > 0
    last_ns_ = now;

    ImGui_ImplOpenGL3_NewFrame();
    ImGui::NewFrame();
    canvas_->draw(float(width()), float(height()));
    if (show_metrics_) ImGui::ShowMetricsWindow(&show_metrics_);
    ImGui::Render();
    if (canvas_->view() != drawn_view_) {  // a view may switch itself (e.g. a compare link)
        drawn_view_ = canvas_->view();
        Q_EMIT viewChanged(int(drawn_view_.index()));
    }
    // A point clicked in the sweep view: the window selects that run (after this frame).
    if (const int64_t run = canvas_->take_requested_run(); run > 0)
        QMetaObject::invokeMethod(this, [this, run] { Q_EMIT runRequested(qint64(run)); }, Qt::QueuedConnection);

    glViewport(0, 0, int(width() * dpr), int(height() * dpr));
    glClearColor(0.09f, 0.09f, 0.11f, 1.0f);
    glClear(GL_COLOR_BUFFER_BIT);
    ImGui_ImplOpenGL3_RenderDrawData(ImGui::GetDrawData());
    if (finish_frames_) glFinish();
    last_frame_ms_ = double(frameClock.nsecsElapsed()) * 1e-6;
    ++frames_;
    Q_EMIT frameDrawn(last_frame_ms_);
    if (frames_pending_ > 0) {
        --frames_pending_;
        QTimer::singleShot(0, this, [this] { update(); });
    }
    // What the frame asked the session for (draw never queries): read after it, then repaint.
    if (canvas_->has_draw_requests())
        QTimer::singleShot(0, this, [this] {
            if (canvas_->serve_draw_requests()) update();
        });
}

uint64_t CanvasWidget::upload_rgba(uint64_t id, int width, int height, const uint8_t* pixels) {
    ensureGLCurrent();
    if (!gl_ready_) return 0;
    GLint previous = 0;
    glGetIntegerv(GL_TEXTURE_BINDING_2D, &previous);
    GLuint tex = GLuint(id);
    if (!tex) {
        glGenTextures(1, &tex);
        glBindTexture(GL_TEXTURE_2D, tex);
        // Nearest: one texel is one token x chunk cell; smoothing would invent values.
        glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_MIN_FILTER, GL_NEAREST);
        glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_MAG_FILTER, GL_NEAREST);
        glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_WRAP_S, GL_CLAMP_TO_EDGE);
        glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_WRAP_T, GL_CLAMP_TO_EDGE);
    } else {
        glBindTexture(GL_TEXTURE_2D, tex);
    }
    glPixelStorei(GL_UNPACK_ALIGNMENT, 4);
    const TextureInfo old = textures_.count(tex) ? textures_[tex] : TextureInfo{};
    if (old.width == width && old.height == height)
        glTexSubImage2D(GL_TEXTURE_2D, 0, 0, 0, width, height, GL_RGBA, GL_UNSIGNED_BYTE, pixels);
    else
        glTexImage2D(GL_TEXTURE_2D, 0, GL_RGBA, width, height, 0, GL_RGBA, GL_UNSIGNED_BYTE, pixels);
    glBindTexture(GL_TEXTURE_2D, GLuint(previous));
    textures_[tex] = {width, height};
    return tex;
}

void CanvasWidget::release(uint64_t id) {
    textures_.erase(id);
    if (!gl_ready_ || !id) return;
    ensureGLCurrent();
    GLuint tex = GLuint(id);
    glDeleteTextures(1, &tex);
}

// ---- input --------------------------------------------------------------------------------

void CanvasWidget::setModifiers(Qt::KeyboardModifiers m) {
    ImGuiIO& io = ImGui::GetIO();
    io.KeyCtrl = m & Qt::ControlModifier;
    io.KeyShift = m & Qt::ShiftModifier;
    io.KeyAlt = m & Qt::AltModifier;
    io.KeySuper = m & Qt::MetaModifier;
}

void CanvasWidget::mouseMoveEvent(QMouseEvent* e) {
    useContext();
    ImGui::GetIO().MousePos = ImVec2(float(e->position().x()), float(e->position().y()));
    setModifiers(e->modifiers());
    requestFrames(1);
}

void CanvasWidget::mousePressEvent(QMouseEvent* e) {
    useContext();
    ImGuiIO& io = ImGui::GetIO();
    io.MousePos = ImVec2(float(e->position().x()), float(e->position().y()));
    if (int b = mouseButtonIndex(e->button()); b >= 0) io.MouseDown[b] = true;
    setModifiers(e->modifiers());
    setFocus(Qt::MouseFocusReason);
    requestFrames(2);
}

void CanvasWidget::mouseReleaseEvent(QMouseEvent* e) {
    useContext();
    ImGuiIO& io = ImGui::GetIO();
    io.MousePos = ImVec2(float(e->position().x()), float(e->position().y()));
    if (int b = mouseButtonIndex(e->button()); b >= 0) io.MouseDown[b] = false;
    setModifiers(e->modifiers());
    requestFrames(2);
}

void CanvasWidget::mouseDoubleClickEvent(QMouseEvent* e) {
    // ImGui detects double clicks from press timing itself; a Qt double click is a second press.
    mousePressEvent(e);
}

void CanvasWidget::wheelEvent(QWheelEvent* e) {
    useContext();
    ImGuiIO& io = ImGui::GetIO();
    // 120 units per notch; pixel deltas (touchpads) are scaled to about the same feel.
    const QPoint a = e->angleDelta();
    io.MouseWheel += float(a.y()) / 120.0f;
    io.MouseWheelH += float(a.x()) / 120.0f;
    io.MousePos = ImVec2(float(e->position().x()), float(e->position().y()));
    setModifiers(e->modifiers());
    requestFrames(2);
    e->accept();
}

void CanvasWidget::setKey(QKeyEvent* e, bool down) {
    useContext();
    ImGuiIO& io = ImGui::GetIO();
    setModifiers(e->modifiers());
    if (int k = keyIndex(e->key()); k >= 0) io.KeysDown[k] = down;
    if (down && !e->text().isEmpty() && !(e->modifiers() & Qt::ControlModifier)) {
        const QByteArray utf8 = e->text().toUtf8();
        if (static_cast<unsigned char>(utf8[0]) >= 0x20 && utf8[0] != 0x7f) io.AddInputCharactersUTF8(utf8.constData());
    }
    requestFrames(2);
}

void CanvasWidget::keyPressEvent(QKeyEvent* e) { setKey(e, true); }
void CanvasWidget::keyReleaseEvent(QKeyEvent* e) { setKey(e, false); }

void CanvasWidget::leaveEvent(QEvent* e) {
    useContext();
    ImGui::GetIO().MousePos = ImVec2(-FLT_MAX, -FLT_MAX);
    requestFrames(1);
    QOpenGLWidget::leaveEvent(e);
}

void CanvasWidget::focusOutEvent(QFocusEvent* e) {
    useContext();
    ImGuiIO& io = ImGui::GetIO();
    std::fill(std::begin(io.KeysDown), std::end(io.KeysDown), false);
    std::fill(std::begin(io.MouseDown), std::end(io.MouseDown), false);
    io.KeyCtrl = io.KeyShift = io.KeyAlt = io.KeySuper = false;
    QOpenGLWidget::focusOutEvent(e);
}

}  // namespace kv::gui
