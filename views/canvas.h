// The ImGui canvas: every view of kvlab (eviction map, scores, memory timeline, cell grid,
// metrics, compare) behind one small surface that a host drives once per frame. The host (the
// Qt widget in app/gui, or a test with no GL at all) owns the ImGui context and the renderer;
// the canvas only reads the session through storage::SessionReader and emits ImGui calls.
//
// Contract between views/ and app/gui/ (keep it stable; extend, don't break):
//   - The host creates the ImGui context, calls ImGui::NewFrame(), then Canvas::draw(), then
//     ImGui::Render() and renders the draw data. Canvas never touches GL.
//   - The host clears the frame to the background (kvlab draws no window background).
//   - Views that are textures (eviction map, heatmaps) produce RGBA8 pixels; the host turns
//     them into textures through TextureHost (GL in the app, a recorder in tests).
//   - refresh() reads only rows newer than what the views hold; the host calls it from a
//     timer (>= 10 Hz) on the GUI thread while a run writes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kv::views {

// A view: its index in the view table (views/view_table.h), which lists every view once.
// Hosts list views with view_count() / ViewKind(i) and name the few they act on with
// view_named("compare").
class ViewKind {
   public:
    constexpr explicit ViewKind(size_t index = 0) : index_(uint8_t(index)) {}
    constexpr size_t index() const { return index_; }
    friend constexpr bool operator==(ViewKind a, ViewKind b) { return a.index_ == b.index_; }

   private:
    uint8_t index_;
};
size_t view_count();
const char* view_name(ViewKind k);
// The view called `name` (view_name's text); false when there is none.
bool view_from_name(const std::string& name, ViewKind* out);
// The view called `name`; throws std::logic_error when the table has none (a host naming a
// view that does not exist is a programming error).
ViewKind view_named(const char* name);
// The view shows every selected run (compare, metrics, fidelity, sweep); else one run.
bool view_shows_several(ViewKind k);
// Selecting several runs keeps this view (fidelity, sweep); from the others the canvas moves
// to the comparison view.
bool view_keeps_several(ViewKind k);

// Mouse gestures the views understand, for the host's shortcut sheet (Help > Keyboard shortcuts).
struct CanvasGesture {
    const char* input;   // "wheel", "Shift + wheel", ...
    const char* where;   // the view(s) it applies to
    const char* action;  // what it does
};
const std::vector<CanvasGesture>& canvas_gestures();

// Textures for views drawn as images. Pixels are RGBA8, row-major, width*height*4 bytes.
class TextureHost {
   public:
    virtual ~TextureHost() = default;
    // Returns an id usable as ImTextureID; `id` is 0 to create, else the texture to replace.
    virtual uint64_t upload_rgba(uint64_t id, int width, int height, const uint8_t* pixels) = 0;
    virtual void release(uint64_t id) = 0;
};

struct CanvasImpl;

class Canvas {
   public:
    explicit Canvas(TextureHost* textures);
    ~Canvas();
    Canvas(const Canvas&) = delete;
    Canvas& operator=(const Canvas&) = delete;

    // Opens a session read-only ("" closes). Throws storage::SessionError with a clear message.
    void open_session(const std::string& path);
    const std::string& session_path() const;
    // 1 run: single-run views; 2..8 runs: the compare view; the reference is the first dense
    // run of the selection (else the first selected) unless set_reference() says otherwise.
    void select_runs(const std::vector<int64_t>& runs);
    const std::vector<int64_t>& selected_runs() const;
    void set_reference(int64_t run);
    // A run the user picked inside a view (a point of the sweep view): the host should select
    // it (its own run list too). Returns 0 when there is none; clears the request.
    int64_t take_requested_run();

    void set_view(ViewKind k);
    ViewKind view() const;

    // Pulls rows newer than what the views hold. Cheap when nothing changed. Returns true when
    // anything new arrived (the host may then request a repaint).
    bool refresh();
    // Draw never queries the session: what a frame could not take from the views' state (a
    // zoomed window of a huge run, the allocations under the cursor) it records as a request.
    // The host checks after each frame and serves them outside the draw; true when something
    // was read (repaint). A new selection or view, a click in a view, or a refresh cut short
    // by its time budget is such a request too (a refresh), so a finished run opened from disk
    // loads without the live timer.
    bool has_draw_requests() const;
    bool serve_draw_requests();
    // Emits the ImGui calls of the active view into one window filling [0,0,width,height).
    void draw(float width, float height);

    // For tests and for exports: the views' state (CanvasImpl is defined in views/canvas_impl.h,
    // each view's state in the view's own header).
    CanvasImpl& impl() { return *impl_; }

   private:
    std::unique_ptr<CanvasImpl> impl_;
};

}  // namespace kv::views
