// The OpenGL widget hosting the ImGui views: owns an ImGui context and the OpenGL3 renderer,
// feeds Qt input into ImGui 1.86's legacy io fields, implements views::TextureHost with GL
// textures, and drives Canvas::draw once per frame. While a run is live, a timer pulls new rows
// (Canvas::refresh) at 20 Hz and repaints when anything arrived. Draws no view content itself.
#pragma once

#include <QElapsedTimer>
#include <QOpenGLFunctions>
#include <QOpenGLWidget>
#include <QTimer>

#include <map>
#include <memory>
#include <vector>

#include "views/canvas.h"

struct ImGuiContext;

namespace kv::gui {

class CanvasWidget : public QOpenGLWidget, public views::TextureHost, protected QOpenGLFunctions {
    Q_OBJECT
   public:
    explicit CanvasWidget(QWidget* parent = nullptr);
    ~CanvasWidget() override;

    // Canvas calls go through here so ImGui's current context is ours (several widgets may exist).
    void openSession(const QString& path);  // throws storage::SessionError
    void selectRuns(const std::vector<int64_t>& runs);
    void setReference(int64_t run);
    void setView(views::ViewKind view);
    views::ViewKind view() const { return canvas_->view(); }
    bool refresh();  // Canvas::refresh; repaints when anything arrived
    views::Canvas& canvas() { return *canvas_; }
    ImGuiContext* imguiContext() const { return ctx_; }

    // Live mode: refresh at 20 Hz (SPEC: >= 10 updates/s while a run writes).
    void setLive(bool live);
    bool live() const { return live_timer_.isActive(); }
    void setShowMetricsWindow(bool show);

    // Frame timing: CPU time of the last paintGL; with finishFrames the GPU work too (glFinish),
    // which on llvmpipe is most of it.
    double lastFrameMs() const { return last_frame_ms_; }
    void setFinishFrames(bool finish) { finish_frames_ = finish; }
    uint64_t framesDrawn() const { return frames_; }
    double lastRefreshMs() const { return last_refresh_ms_; }
    double maxRefreshMs() const { return max_refresh_ms_; }
    void resetRefreshStats() { max_refresh_ms_ = 0; }

    // TextureHost (GL textures; called from Canvas inside or outside paintGL).
    uint64_t upload_rgba(uint64_t id, int width, int height, const uint8_t* pixels) override;
    void release(uint64_t id) override;
    struct TextureInfo {
        int width = 0, height = 0;
    };
    const std::map<uint64_t, TextureInfo>& textures() const { return textures_; }
    int maxTextureSize() const { return max_texture_size_; }

   Q_SIGNALS:
    void frameDrawn(double ms);
    void viewChanged(int view);  // the canvas switched views by itself
    void runRequested(qint64 run);  // a view asked to select this run (a sweep point)

   protected:
    void initializeGL() override;
    void paintGL() override;
    void mouseMoveEvent(QMouseEvent* e) override;
    void mousePressEvent(QMouseEvent* e) override;
    void mouseReleaseEvent(QMouseEvent* e) override;
    void mouseDoubleClickEvent(QMouseEvent* e) override;
    void wheelEvent(QWheelEvent* e) override;
    void keyPressEvent(QKeyEvent* e) override;
    void keyReleaseEvent(QKeyEvent* e) override;
    void leaveEvent(QEvent* e) override;
    void focusOutEvent(QFocusEvent* e) override;

   private:
    void useContext() const;
    void ensureGLCurrent();
    void requestFrames(int n);
    void setKey(QKeyEvent* e, bool down);
    void setModifiers(Qt::KeyboardModifiers m);

    ImGuiContext* ctx_ = nullptr;
    std::unique_ptr<views::Canvas> canvas_;
    bool gl_ready_ = false;
    bool show_metrics_ = false;
    bool finish_frames_ = false;
    QElapsedTimer clock_;
    qint64 last_ns_ = 0;
    double last_frame_ms_ = 0;
    double last_refresh_ms_ = 0, max_refresh_ms_ = 0;
    views::ViewKind drawn_view_ = views::view_named("eviction map");
    uint64_t frames_ = 0;
    int frames_pending_ = 0;  // ImGui settles hover/clicks over a couple of frames
    QTimer live_timer_;
    std::map<uint64_t, TextureInfo> textures_;
    int max_texture_size_ = 0;
};

}  // namespace kv::gui
