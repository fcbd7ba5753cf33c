// Helpers for the view tests: a scratch directory, a TextureHost that records uploads, an ImGui
// context with a built font atlas and no renderer (draw data only), real tiny runs recorded
// through sessions::RunManager, and synthetic sessions written event by event.
#pragma once

#include <gtest/gtest.h>
#include <imgui.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/kv/replay_log.h"
#include "engine/run/run_config.h"
#include "engine/telemetry/recorder.h"
#include "engine/telemetry/trace.h"
#include "sessions/run_manager.h"
#include "storage/session.h"
#include "storage/session_reader.h"
#include "storage/session_writer.h"
#include "views/canvas.h"

namespace kv::test {

// For tests that refresh a view's state once and then check all of a recorded session: no
// per-refresh time budget. The views stop reading after refresh_budget_ms of wall time (a GUI
// frame's share); on a loaded machine that can stop after the first layer, and whether a test
// saw everything would depend on the machine's load. Tests of the budget itself set their own.
inline constexpr double kWholeRefresh = 1e12;

class ViewsScratchDir {
   public:
    ViewsScratchDir() {
        std::string tmpl = (std::filesystem::temp_directory_path() / "kvlab-views-test-XXXXXX").string();
        std::vector<char> buf(tmpl.begin(), tmpl.end());
        buf.push_back(0);
        if (!mkdtemp(buf.data())) throw std::runtime_error("mkdtemp failed");
        path_ = buf.data();
    }
    ~ViewsScratchDir() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    ViewsScratchDir(const ViewsScratchDir&) = delete;
    ViewsScratchDir& operator=(const ViewsScratchDir&) = delete;
    std::string file(const std::string& name) const { return path_ + "/" + name; }

   private:
    std::string path_;
};

// Records every upload (a copy of the pixels of the newest upload per id) and release.
class RecordingTextureHost : public views::TextureHost {
   public:
    struct Texture {
        int width = 0, height = 0;
        std::vector<uint8_t> pixels;
        int uploads = 0;
    };
    uint64_t upload_rgba(uint64_t id, int width, int height, const uint8_t* pixels) override {
        EXPECT_GT(width, 0);
        EXPECT_GT(height, 0);
        if (id == 0) id = next_++;
        EXPECT_TRUE(id < next_) << "upload to a texture id this host never handed out";
        Texture& t = live[id];
        t.width = width, t.height = height;
        t.pixels.assign(pixels, pixels + size_t(width) * size_t(height) * 4);
        ++t.uploads;
        ++uploads;
        return id;
    }
    void release(uint64_t id) override {
        EXPECT_EQ(live.count(id), 1u) << "release of unknown texture " << id;
        live.erase(id);
        ++releases;
    }
    std::map<uint64_t, Texture> live;
    int uploads = 0, releases = 0;

   private:
    uint64_t next_ = 1;
};

// An ImGui context with no backend: fonts built, fixed display size; frame() runs one
// NewFrame / body / Render and returns the draw data's vertex count.
class ImGuiHarness {
   public:
    explicit ImGuiHarness(float w = 1400, float h = 900) : w_(w), h_(h) {
        ctx_ = ImGui::CreateContext();
        ImGuiIO& io = ImGui::GetIO();
        io.IniFilename = nullptr;
        unsigned char* px = nullptr;
        int fw = 0, fh = 0;
        io.Fonts->GetTexDataAsRGBA32(&px, &fw, &fh);  // NewFrame asserts without a built atlas
    }
    ~ImGuiHarness() { ImGui::DestroyContext(ctx_); }
    ImGuiHarness(const ImGuiHarness&) = delete;
    ImGuiHarness& operator=(const ImGuiHarness&) = delete;

    int frame(const std::function<void()>& body, ImVec2 mouse = ImVec2(-1, -1), bool mouse_down = false, float wheel = 0) {
        ImGui::SetCurrentContext(ctx_);
        ImGuiIO& io = ImGui::GetIO();
        io.DisplaySize = ImVec2(w_, h_);
        io.DeltaTime = 1.0f / 60.0f;
        io.MousePos = mouse;
        io.MouseDown[0] = mouse_down;
        io.MouseWheel = wheel;
        ImGui::NewFrame();
        body();
        ImGui::Render();
        const ImDrawData* d = ImGui::GetDrawData();
        return d ? d->TotalVtxCount : 0;
    }
    // Body inside one full-size window (what the canvas does).
    int window_frame(const std::function<void()>& body, ImVec2 mouse = ImVec2(-1, -1), bool mouse_down = false,
                     float wheel = 0) {
        return frame(
            [&] {
                ImGui::SetNextWindowPos(ImVec2(0, 0));
                ImGui::SetNextWindowSize(ImVec2(w_, h_));
                ImGui::Begin("test", nullptr, ImGuiWindowFlags_NoDecoration);
                body();
                ImGui::End();
            },
            mouse, mouse_down, wheel);
    }
    float width() const { return w_; }
    float height() const { return h_; }

   private:
    ImGuiContext* ctx_ = nullptr;
    float w_, h_;
};

inline RunConfig tiny_eval_config(const std::string& cache, int64_t cache_length, int64_t seq_length = 256,
                                  int64_t samples = 2, int64_t chunk = 16) {
    RunConfig cfg;
    cfg.mode = "eval_long";
    cfg.model = "tiny";
    set_run_option(cfg, "data", "passkey");
    set_run_option(cfg, "data.seq_length", std::to_string(seq_length));
    set_run_option(cfg, "data.num_samples", std::to_string(samples));
    set_run_option(cfg, "kv_cache.name", cache);
    set_run_option(cfg, "kv_cache.cache_length", std::to_string(cache_length));
    set_run_option(cfg, "kv_cache.chunk_size", std::to_string(chunk));
    cfg.threads = 1;
    return cfg;
}

// Records one finished tiny run per config into `path`; returns the run ids.
inline std::vector<int64_t> record_tiny_runs(const std::string& path, const std::vector<RunConfig>& configs) {
    sessions::RunManager rm(path);
    std::vector<int64_t> ids;
    for (const auto& c : configs) ids.push_back(rm.submit(c));
    for (int64_t id : ids) EXPECT_EQ(rm.wait(id), storage::RunStatus::DONE) << rm.summary(id);
    return ids;
}

// A synthetic run written event by event: `produce` pushes through the trace API on this
// thread (a RecorderScope is installed); flush() makes everything so far visible to readers.
class SyntheticRun {
   public:
    explicit SyntheticRun(const std::string& path, const std::string& config = R"({"mode":"eval_long"})",
                          int score_interval = 1)
        : path_(path), rec_(recorder_options(score_interval)) {
        session_ = std::filesystem::exists(path) ? storage::Session::open(path) : storage::Session::create(path);
        run_ = session_->create_run("synthetic", config);
        t0_ = int64_t(session_->start_run(run_));
        writer_ = std::make_unique<storage::SessionWriter>(path);
        writer_->attach(run_, rec_);
    }
    ~SyntheticRun() { finish(); }
    void produce(const std::function<void()>& fn) {
        trace::RecorderScope scope(rec_);
        fn();
    }
    void push(trace::Event& ev) { ASSERT_TRUE(rec_.push(ev)); }
    void flush() { writer_->flush(); }
    void finish() {
        if (!writer_) return;
        writer_->detach(run_);
        writer_.reset();
        session_->finish_run(run_, storage::RunStatus::DONE);
    }
    int64_t run() const { return run_; }
    int64_t t0() const { return t0_; }
    const std::string& path() const { return path_; }

   private:
    static trace::RecorderOptions recorder_options(int score_interval) {
        trace::RecorderOptions o;
        o.score_interval = score_interval;
        return o;
    }
    std::string path_;
    trace::Recorder rec_;
    std::unique_ptr<storage::Session> session_;
    std::unique_ptr<storage::SessionWriter> writer_;
    int64_t run_ = 0, t0_ = 0;
};

// The blob layout of engine/kv/replay_log.h read field by field, independently of the views'
// decoder (little-endian; flags bit 0 = one contiguous range of slots).
inline SlotPlan hand_decode(const std::vector<uint8_t>& b) {
    size_t at = 0;
    auto rd = [&](auto& v) {
        if (at + sizeof(v) > b.size()) throw std::runtime_error("short blob");
        std::memcpy(&v, b.data() + at, sizeof(v));
        at += sizeof(v);
    };
    uint32_t magic = 0;
    uint16_t version = 0, flags = 0;
    SlotPlan p;
    rd(magic), rd(version), rd(flags), rd(p.input_pos), rd(p.n), rd(p.rows), rd(p.moves), rd(p.length_after);
    if (magic != 0x5052564bu || version != 1) throw std::runtime_error("not a replay log");
    if (flags & 1) {
        int64_t start = 0;
        rd(start);
        for (int64_t t = 0; t < p.n; ++t) p.targets.push_back(int32_t(start + t));
        return p;
    }
    for (auto* v : {&p.targets, &p.move_from, &p.move_to}) {
        const int64_t count = p.rows * (v == &p.targets ? p.n : p.moves);
        for (int64_t i = 0; i < count; ++i) {
            uint32_t u = 0;
            rd(u);
            v->push_back(int32_t(u));
        }
    }
    return p;
}

// The replay log of one layer, decoded independently of the views: pass-0 steps of one
// sequence (the n-th run of input_pos 0), in id order.
inline std::vector<SlotPlan> layer_plans(storage::SessionReader& r, int64_t run, int layer, int sequence) {
    auto rows = r.cache_steps(run, layer);
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
    std::vector<SlotPlan> out;
    int seq = -1;
    for (const auto& row : rows) {
        if (row.pass != 0) continue;
        SlotPlan p = hand_decode(row.replay_log);
        if (p.input_pos == 0) ++seq;
        if (seq == sequence) out.push_back(p);
    }
    return out;
}

}  // namespace kv::test
