// Software screenshots of every view (no GL): ImGui's draw data rasterized on the CPU with the
// recording host's textures and the font atlas, written as PNG for eyeballing layouts. On demand:
//   kvlab_views_tests --gtest_also_run_disabled_tests --gtest_filter='Screenshots.*'
// (files go to $KVLAB_VIEW_SHOTS or /tmp/kvlab-view-shots).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "views/canvas_impl.h"
#include "views/diff_view.h"
#include "views/eviction_map.h"
#include "views/scores_view.h"
#include "views/trace_view.h"
#include "views/compare_view.h"
#include "views/metrics_view.h"
#include "views/sweep_view.h"
#include "views_test_util.h"

extern "C" int stbi_write_png(const char* filename, int w, int h, int comp, const void* data, int stride_in_bytes);

namespace kv::views {
namespace {

struct Image {
    int w = 0, h = 0;
    std::vector<float> rgb;  // (h, w, 3)
};

struct Sampler {
    const uint8_t* px = nullptr;
    int w = 0, h = 0;
    void sample(float u, float v, float out[4]) const {
        if (!px) {
            out[0] = out[1] = out[2] = out[3] = 1;
            return;
        }
        const int x = std::clamp(int(u * w), 0, w - 1), y = std::clamp(int(v * h), 0, h - 1);
        const uint8_t* p = px + (size_t(y) * size_t(w) + size_t(x)) * 4;
        for (int i = 0; i < 4; ++i) out[i] = p[i] / 255.f;
    }
};

void raster(Image& img, const ImDrawData* dd, const test::RecordingTextureHost& host, const Sampler& font, ImTextureID font_id) {
    for (int l = 0; l < dd->CmdListsCount; ++l) {
        const ImDrawList* list = dd->CmdLists[l];
        for (const ImDrawCmd& cmd : list->CmdBuffer) {
            if (cmd.UserCallback) continue;
            Sampler tex;
            if (cmd.TextureId == font_id) {
                tex = font;
            } else {
                auto it = host.live.find(uint64_t(reinterpret_cast<uintptr_t>(cmd.TextureId)));
                if (it != host.live.end()) tex = {it->second.pixels.data(), it->second.width, it->second.height};
            }
            const int cx0 = std::max(0, int(cmd.ClipRect.x)), cy0 = std::max(0, int(cmd.ClipRect.y));
            const int cx1 = std::min(img.w, int(cmd.ClipRect.z)), cy1 = std::min(img.h, int(cmd.ClipRect.w));
            for (unsigned i = 0; i + 2 < cmd.ElemCount; i += 3) {
                const ImDrawVert* v[3];
                for (int k = 0; k < 3; ++k) v[k] = &list->VtxBuffer[int(cmd.VtxOffset + list->IdxBuffer[int(cmd.IdxOffset + i + k)])];
                const float x0 = v[0]->pos.x, y0 = v[0]->pos.y, x1 = v[1]->pos.x, y1 = v[1]->pos.y, x2 = v[2]->pos.x, y2 = v[2]->pos.y;
                const float area = (x1 - x0) * (y2 - y0) - (x2 - x0) * (y1 - y0);
                if (std::fabs(area) < 1e-6f) continue;
                const int bx0 = std::max(cx0, int(std::floor(std::min({x0, x1, x2})))), bx1 = std::min(cx1, int(std::ceil(std::max({x0, x1, x2}))));
                const int by0 = std::max(cy0, int(std::floor(std::min({y0, y1, y2})))), by1 = std::min(cy1, int(std::ceil(std::max({y0, y1, y2}))));
                for (int y = by0; y < by1; ++y)
                    for (int x = bx0; x < bx1; ++x) {
                        const float px = x + 0.5f, py = y + 0.5f;
                        const float w0 = ((x1 - px) * (y2 - py) - (x2 - px) * (y1 - py)) / area;
                        const float w1 = ((x2 - px) * (y0 - py) - (x0 - px) * (y2 - py)) / area;
                        const float w2 = 1 - w0 - w1;
                        if (w0 < 0 || w1 < 0 || w2 < 0) continue;
                        float t[4];
                        tex.sample(w0 * v[0]->uv.x + w1 * v[1]->uv.x + w2 * v[2]->uv.x, w0 * v[0]->uv.y + w1 * v[1]->uv.y + w2 * v[2]->uv.y, t);
                        float c[4];
                        for (int k = 0; k < 4; ++k)
                            c[k] = (w0 * ((v[0]->col >> (8 * k)) & 255) + w1 * ((v[1]->col >> (8 * k)) & 255) + w2 * ((v[2]->col >> (8 * k)) & 255)) /
                                   255.f * t[k];
                        float* dst = img.rgb.data() + (size_t(y) * size_t(img.w) + size_t(x)) * 3;
                        for (int k = 0; k < 3; ++k) dst[k] = dst[k] * (1 - c[3]) + c[k] * c[3];
                    }
            }
        }
    }
}

void save(const Image& img, const std::string& path) {
    std::vector<uint8_t> out(size_t(img.w) * size_t(img.h) * 3);
    for (size_t i = 0; i < out.size(); ++i) out[i] = uint8_t(std::clamp(img.rgb[i], 0.f, 1.f) * 255.f + 0.5f);
    ASSERT_NE(stbi_write_png(path.c_str(), img.w, img.h, 3, out.data(), img.w * 3), 0) << path;
}

// Where the pictures go: $KVLAB_VIEW_SHOTS, else /tmp/kvlab-view-shots (made if missing).
std::string shots_dir() {
    const char* env = std::getenv("KVLAB_VIEW_SHOTS");
    const std::string out_dir = env ? env : "/tmp/kvlab-view-shots";
    std::filesystem::create_directories(out_dir);
    return out_dir;
}

// Every run of a recorded session, in id order.
std::vector<int64_t> session_runs(const std::string& path) {
    std::vector<int64_t> runs;
    for (const auto& r : storage::SessionReader(path).runs()) runs.push_back(r.id);
    return runs;
}

TEST(Screenshots, DISABLED_EveryView) {
    const std::string out_dir = shots_dir();
    test::ViewsScratchDir dir;
    // $KVLAB_VIEW_SHOTS_SESSION: draw that session's runs instead (its first run alone, then all).
    const char* session = std::getenv("KVLAB_VIEW_SHOTS_SESSION");
    const std::string path = session ? session : dir.file("runs.kvlab");
    std::vector<int64_t> runs;
    if (session) {
        runs = session_runs(path);
        ASSERT_FALSE(runs.empty()) << path;
    } else {
        runs = test::record_tiny_runs(path, {test::tiny_eval_config("h2o-default", 128, 1024, 2, 16),
                                             test::tiny_eval_config("dense-default", 0, 1024, 2, 16),
                                             test::tiny_eval_config("lastrec-default", 128, 1024, 2, 16),
                                             test::tiny_eval_config("streaming-default", 128, 1024, 2, 16)});
    }
    const float W = 1280, H = 800;
    test::ImGuiHarness h(W, H);
    test::RecordingTextureHost host;
    unsigned char* font_px = nullptr;
    int fw = 0, fh = 0;
    ImGui::GetIO().Fonts->GetTexDataAsRGBA32(&font_px, &fw, &fh);
    const ImTextureID font_id = reinterpret_cast<ImTextureID>(uintptr_t(0xF0F0));
    ImGui::GetIO().Fonts->SetTexID(font_id);
    const Sampler font{font_px, fw, fh};
    Canvas canvas(&host);
    canvas.open_session(path);
    auto shoot = [&](const std::string& name, ImVec2 mouse) {
        while (canvas.refresh()) {
        }
        // What a view computes off the frame (the diff's worker) arrives through draw requests.
        for (int i = 0; i < 100'000 && canvas.has_draw_requests(); ++i) canvas.serve_draw_requests();
        for (int f = 0; f < 3; ++f) h.frame([&] { canvas.draw(W, H); }, mouse);
        Image img{int(W), int(H), std::vector<float>(size_t(W * H * 3), 0.1f)};
        raster(img, ImGui::GetDrawData(), host, font, font_id);
        save(img, out_dir + "/" + name + ".png");
    };
    canvas.select_runs({runs[0]});
    for (ViewKind k : {view_named("eviction map"), view_named("scores"), view_named("memory timeline"), view_named("cell grid"), view_named("metrics")}) {
        canvas.set_view(k);
        std::string name = view_name(k);
        std::replace(name.begin(), name.end(), ' ', '_');
        shoot(name, ImVec2(W * 0.55f, H * 0.45f));
    }
    canvas.set_view(view_named("trace"));  // whole run, then the icicle and a search
    shoot("trace", ImVec2(W * 0.45f, H * 0.2f));
    {
        auto& ts = canvas.impl().state<TraceViewState>();
        ts.panel = TracePanel::ICICLE;
        shoot("trace_icicle", ImVec2(W * 0.3f, H * 0.75f));
        ts.panel = TracePanel::SEARCH;
        std::snprintf(ts.search_text, sizeof ts.search_text, "attention");
        ts.search = search_spans(ts.model, ts.search_text);
        shoot("trace_search", ImVec2(-100, -100));
        // Its busiest bar clicked: the list holds that bar's spans.
        select_search_bin(ts, int(std::max_element(ts.search.bins.begin(), ts.search.bins.end()) - ts.search.bins.begin()));
        shoot("trace_search_bar", ImVec2(-100, -100));
        ts.panel = TracePanel::RANGE;
        // The policy pass selected and zoomed to (a third of the run when there is none).
        int64_t a = ts.model.t_min + (ts.model.t_max - ts.model.t_min) / 3, b = ts.model.t_min + (ts.model.t_max - ts.model.t_min) / 2;
        for (const TraceSpan& sp : ts.model.spans)
            if (ts.model.names[sp.name] == "policy pass") {
                a = sp.start_ns, b = sp.end_ns;
                break;
            }
        select_trace_range(ts, a, b);
        ts.follow = false;
        ts.time = {double(a - ts.t0_ns) - double(b - a) * 0.05, double(b - ts.t0_ns) + double(b - a) * 0.05};
        shoot("trace_range", ImVec2(W * 0.4f, H * 0.22f));
        ts.panel = TracePanel::ICICLE;  // the range's icicle
        shoot("trace_range_icicle", ImVec2(W * 0.3f, H * 0.75f));
        ts.panel = TracePanel::RANGE;
        // Zoomed in to one layer of a chunk a quarter into the policy pass: every op with its name.
        for (uint32_t i = 0; i < ts.model.spans.size(); ++i) {
            const TraceSpan& sp = ts.model.spans[i];
            if (ts.model.names[sp.name] != "layer" || sp.start_ns < a + (b - a) / 4) continue;
            const double pad = double(sp.end_ns - sp.start_ns) * 0.1;
            ts.time = {double(sp.start_ns - ts.t0_ns) - pad, double(sp.end_ns - ts.t0_ns) + pad};
            break;
        }
        ts.has_selection = false;
        shoot("trace_zoomed", ImVec2(-100, -100));
    }
    canvas.set_view(view_named("eviction map"));
    canvas.impl().state<EvictionMapViewState>().colour = EvictionColour::SCORE;
    shoot("eviction_map_score", ImVec2(W * 0.7f, H * 0.6f));
    canvas.impl().state<EvictionMapViewState>().colour = EvictionColour::READS;  // Quest runs: pages read per chunk
    shoot("eviction_map_quest_reads", ImVec2(W * 0.7f, H * 0.6f));
    canvas.impl().state<EvictionMapViewState>().all_layers = true;  // every layer's reads as small multiples
    shoot("eviction_map_all_layers_quest_reads", ImVec2(W * 0.3f, H * 0.5f));
    canvas.impl().state<EvictionMapViewState>().all_layers = false;
    canvas.impl().state<EvictionMapViewState>().colour = EvictionColour::AGE;
    canvas.impl().state<EvictionMapViewState>().all_layers = true;
    shoot("eviction_map_all_layers_age", ImVec2(W * 0.3f, H * 0.5f));
    canvas.impl().state<EvictionMapViewState>().all_layers = false;
    canvas.set_view(view_named("scores"));
    canvas.impl().state<ScoresViewState>().image_options.rank = true;
    shoot("scores_rank", ImVec2(-100, -100));
    canvas.set_view(view_named("sweep"));  // every done eval_long run of the session
    shoot("sweep", ImVec2(W * 0.3f, H * 0.6f));
    canvas.set_view(view_named("eviction map"));  // a one-run view: selecting several opens compare
    if (runs.size() < 3) return;
    canvas.select_runs(runs);
    shoot("compare", ImVec2(W * 0.3f, H * 0.6f));
    canvas.impl().state<CompareViewState>().show_difference = true;  // h2o (display 1) against lastrec (2)
    canvas.impl().state<CompareViewState>().difference_a = 1;
    canvas.impl().state<CompareViewState>().difference_run = 2;
    canvas.impl().state<CompareViewState>().difference_chosen = true;
    shoot("compare_difference", ImVec2(W * 0.5f, H * 0.62f));
    canvas.impl().state<CompareViewState>().show_difference = false;
    canvas.impl().state<CompareViewState>().colour = EvictionColour::READS;  // quest runs: their reads side by side
    shoot("compare_quest_reads", ImVec2(W * 0.3f, H * 0.6f));
    canvas.set_view(view_named("diff"));  // the reference against the next selected run
    shoot("diff", ImVec2(W * 0.5f, H * 0.3f));
    std::printf("screenshots in %s\n", out_dir.c_str());
}

// Compare as a person meets it: five runs (the KVLAB_VIEW_SHOTS_SESSION's first five, or tiny
// runs) on a 1600x1000 canvas and on the canvas the GUI's 1600x1000 window leaves (~1180x620),
// maps, difference map and the memory overlay.
TEST(Screenshots, DISABLED_CompareSizes) {
    const std::string out_dir = shots_dir();
    test::ViewsScratchDir dir;
    const char* session = std::getenv("KVLAB_VIEW_SHOTS_SESSION");
    const std::string path = session ? session : dir.file("runs.kvlab");
    std::vector<int64_t> runs;
    if (session) {
        runs = session_runs(path);
    } else {
        runs = test::record_tiny_runs(path, {test::tiny_eval_config("dense-default", 0, 512, 2, 16),
                                             test::tiny_eval_config("h2o-default", 128, 512, 2, 16),
                                             test::tiny_eval_config("lastrec-default", 128, 512, 2, 16),
                                             test::tiny_eval_config("tova-default", 128, 512, 2, 16),
                                             test::tiny_eval_config("streaming-default", 128, 512, 2, 16)});
    }
    if (runs.size() > 5) runs.resize(5);
    for (const ImVec2 size : {ImVec2(1600, 1000), ImVec2(1180, 620), ImVec2(1020, 560)}) {
        const float W = size.x, H = size.y;
        test::ImGuiHarness h(W, H);
        test::RecordingTextureHost host;
        unsigned char* font_px = nullptr;
        int fw = 0, fh = 0;
        ImGui::GetIO().Fonts->GetTexDataAsRGBA32(&font_px, &fw, &fh);
        const ImTextureID font_id = reinterpret_cast<ImTextureID>(uintptr_t(0xF0F0));
        ImGui::GetIO().Fonts->SetTexID(font_id);
        const Sampler font{font_px, fw, fh};
        Canvas canvas(&host);
        canvas.open_session(path);
        canvas.select_runs(runs);
        auto shoot = [&](const std::string& name, ImVec2 mouse) {
            for (int i = 0; i < 200 && (canvas.refresh() || canvas.has_draw_requests()); ++i) canvas.serve_draw_requests();
            for (int f = 0; f < 3; ++f) h.frame([&] { canvas.draw(W, H); }, mouse);
            Image img{int(W), int(H), std::vector<float>(size_t(W * H * 3), 0.1f)};
            raster(img, ImGui::GetDrawData(), host, font, font_id);
            save(img, out_dir + "/" + name + "_" + std::to_string(int(W)) + "x" + std::to_string(int(H)) + ".png");
        };
        shoot("compare5", ImVec2(-100, -100));
        canvas.impl().state<CompareViewState>().colour = EvictionColour::AGE;
        shoot("compare5_age", ImVec2(-100, -100));
        canvas.impl().state<CompareViewState>().colour = EvictionColour::PRESENCE;
        canvas.impl().state<CompareViewState>().show_difference = true;
        shoot("compare5_difference", ImVec2(-100, -100));
    }
    std::printf("screenshots in %s\n", out_dir.c_str());
}

// The metrics view of a fidelity run of a 30-layer model (SmolLM2-135M's 2 x 30 per-layer
// series and the next-token KL), synthetic: by default, then with one family's layers checked.
TEST(Screenshots, DISABLED_MetricsManyLayers) {
    const std::string out_dir = shots_dir();
    MetricsViewState s;
    auto add = [&](const std::string& name, int layer) {
        MetricSeries m;
        m.name = name;
        for (int k = 0; k < 64; ++k)
            m.ids.push_back(k), m.steps.push_back(k), m.t_ns.push_back(1000000 * k), m.values.push_back(0.1 + 0.002 * layer + 0.05 * std::sin(k * 0.2 + layer));
        s.index[name] = s.series.size();
        s.series.push_back(std::move(m));
    };
    for (int l = 0; l < 30; ++l)
        for (const char* q : {"attn_rel_error", "kept_mass"}) add(std::string("fidelity.") + q + ".layer" + std::to_string(l), l);
    add("fidelity.next_token_kl", 0);
    s.layer_means = layer_mean_series(s.series);
    const float W = 1180, H = 620;
    test::ImGuiHarness h(W, H);
    test::RecordingTextureHost host;
    unsigned char* font_px = nullptr;
    int fw = 0, fh = 0;
    ImGui::GetIO().Fonts->GetTexDataAsRGBA32(&font_px, &fw, &fh);
    const ImTextureID font_id = reinterpret_cast<ImTextureID>(uintptr_t(0xF0F0));
    ImGui::GetIO().Fonts->SetTexID(font_id);
    const Sampler font{font_px, fw, fh};
    auto shoot = [&](const std::string& name) {
        for (int f = 0; f < 3; ++f) h.window_frame([&] { DrawMetricsView(s); }, ImVec2(W * 0.6f, H * 0.3f));
        Image img{int(W), int(H), std::vector<float>(size_t(W * H * 3), 0.1f)};
        raster(img, ImGui::GetDrawData(), host, font, font_id);
        save(img, out_dir + "/" + name + ".png");
    };
    shoot("metrics_30_layers");
    for (int l = 0; l < 30; ++l) s.shown_layers.push_back("fidelity.kept_mass.layer" + std::to_string(l));
    shoot("metrics_30_layers_kept_mass_checked");
}

}  // namespace
}  // namespace kv::views

namespace kv::views {
namespace {

// The trace view of a GPU run (synthetic: no GPU here): host ops launching kernels and copies on
// two streams, the statistics panel with the busy share, launch overhead and the kernels under
// their launching spans, and a hovered kernel with the arrow from its launch.
TEST(Screenshots, DISABLED_TraceGpu) {
    const std::string out_dir = shots_dir();
    std::vector<TraceSpan> spans;
    std::vector<std::string> names{"run", "policy pass", "attention", "mlp", "cache update", "sdpa_kernel", "gemm_q8", "memcpy HtoD"};
    int64_t id = 0;
    spans.push_back({0, 2'300'000, 0, trace::SpanCategory::RUN, 0, -1, -1, ++id, 0});
    spans.push_back({20'000, 2'280'000, 1, trace::SpanCategory::RUN, 0, -1, -1, ++id, 0});
    int64_t t = 40'000, corr = 1;
    for (int k = 0; k < 24; ++k) {
        const uint32_t op = uint32_t(2 + k % 3);
        const int64_t d = 30'000 + (k % 5) * 9'000;
        spans.push_back({t, t + d, op, op == 2 ? trace::SpanCategory::ATTENTION : op == 3 ? trace::SpanCategory::MLP : trace::SpanCategory::CACHE_UPDATE,
                         0, -1, -1, ++id, corr});
        const uint32_t kernel = op == 2 ? 5 : op == 3 ? 6 : 7;
        const int64_t g = t + 12'000 + (k % 4) * 3'000;
        spans.push_back({g, g + d + 20'000, kernel, kernel == 7 ? trace::SpanCategory::IO : trace::SpanCategory::OTHER,
                         gpu_lane_thread(0, kernel == 7 ? 14 : 7), -1, -1, 0, corr});
        ++corr;
        t += d + 42'000;
    }
    const float W = 1280, H = 800;
    test::ImGuiHarness h(W, H);
    test::RecordingTextureHost host;
    unsigned char* font_px = nullptr;
    int fw = 0, fh = 0;
    ImGui::GetIO().Fonts->GetTexDataAsRGBA32(&font_px, &fw, &fh);
    const ImTextureID font_id = reinterpret_cast<ImTextureID>(uintptr_t(0xF0F0));
    ImGui::GetIO().Fonts->SetTexID(font_id);
    const Sampler font{font_px, fw, fh};
    TraceViewState s;
    s.run = 1;
    set_trace_model(s, build_trace_model(spans, names));
    // Hover the fifth kernel (sdpa_kernel of the 4th attention op) on the stream-7 lane.
    const TraceSpan* k5 = nullptr;
    int seen = 0;
    for (const TraceSpan& sp : s.model.spans)
        if (is_gpu_lane(sp.thread) && sp.name == 5 && ++seen == 3) k5 = &sp;
    ASSERT_NE(k5, nullptr);
    for (int f = 0; f < 3; ++f) h.frame([&] {
        ImGui::SetNextWindowPos(ImVec2(0, 0));
        ImGui::SetNextWindowSize(ImVec2(W, H));
        ImGui::Begin("shot", nullptr, ImGuiWindowFlags_NoDecoration | ImGuiWindowFlags_NoBackground);
        DrawTraceView(s, &host, ImVec2(W, H - 16));
        ImGui::End();
    }, ImVec2(-100, -100));
    // The kernel's middle on the stream-7 lane (first GPU lane, below thread 0's three rows):
    // the timeline starts after the 70-pixel lane labels.
    const double frac = double((k5->start_ns + k5->end_ns) / 2 - s.model.t_min) / double(s.model.t_max + 1 - s.model.t_min);
    const ImVec2 mouse(float(70 + frac * (W - 70 - 4)), 127);
    for (int f = 0; f < 2; ++f) h.frame([&] {
        ImGui::SetNextWindowPos(ImVec2(0, 0));
        ImGui::SetNextWindowSize(ImVec2(W, H));
        ImGui::Begin("shot", nullptr, ImGuiWindowFlags_NoDecoration | ImGuiWindowFlags_NoBackground);
        DrawTraceView(s, &host, ImVec2(W, H - 16));
        ImGui::End();
    }, mouse);
    auto save_frame = [&](const std::string& name) {
        Image img{int(W), int(H), std::vector<float>(size_t(W * H * 3), 0.09f)};
        raster(img, ImGui::GetDrawData(), host, font, font_id);
        save(img, out_dir + "/" + name + ".png");
    };
    save_frame("trace_gpu");
    auto still = [&] {  // frames with the mouse away
        for (int f = 0; f < 3; ++f) h.frame([&] {
            ImGui::SetNextWindowPos(ImVec2(0, 0));
            ImGui::SetNextWindowSize(ImVec2(W, H));
            ImGui::Begin("shot", nullptr, ImGuiWindowFlags_NoDecoration | ImGuiWindowFlags_NoBackground);
            DrawTraceView(s, &host, ImVec2(W, H - 16));
            ImGui::End();
        }, ImVec2(-100, -100));
    };
    // The policy pass clicked: an arrow to every record it launched? It launched none; the
    // attention op that launched that kernel instead, zoomed to its neighbourhood.
    const uint32_t launch = find_launcher(s.model, uint32_t(k5 - s.model.spans.data()));
    ASSERT_NE(launch, kNoParent);
    select_trace_span(s, launch);
    s.follow = false;
    s.time = {double(s.model.spans[launch].start_ns - s.t0_ns) - 150'000, double(s.model.spans[launch].end_ns - s.t0_ns) + 250'000};
    still();
    save_frame("trace_gpu_selected");
    // The icicle of device time under the launching spans' paths.
    select_trace_span(s, kNoParent);
    s.follow = true;
    s.panel = TracePanel::ICICLE;
    s.icicle_gpu = true;
    still();
    save_frame("trace_gpu_icicle");
}

}  // namespace
}  // namespace kv::views

namespace kv::views {
namespace {

// The sweep view's needle heat map (synthetic: three caches, three lengths, five depths).
// KVLAB_SHOT_SESSION=FILE draws a recorded session's needle map instead (a real run's look).
TEST(Screenshots, DISABLED_SweepNeedleMap) {
    const std::string out_dir = shots_dir();
    test::ViewsScratchDir dir;
    const char* given = std::getenv("KVLAB_SHOT_SESSION");
    const std::string path = given ? given : dir.file("needles.kvlab");
    const char* caches[] = {"snapkv-default", "knorm-default", "lastrec-default"};
    for (int c = 0; c < 3 && !given; ++c)
        for (int64_t T : {1024, 2048, 4096}) {
            const std::string cfg = std::string(R"({"mode":"eval_long","data":{"name":"niah_single","seq_length":)") + std::to_string(T) +
                                    R"(,"depths":"0,0.25,0.5,0.75,1","num_samples":10},"kv_cache":{"name":")" + caches[c] + R"("}})";
            test::SyntheticRun run(path, cfg);
            run.produce([&] {
                for (int i = 0; i < 10; ++i) trace::metric("sample_correct", i, ((i * 3 + c + int(T / 1024)) % 4) < 3 - c ? 1.0 : 0.0);
            });
        }
    storage::SessionReader reader(path);
    SweepViewState s;
    refresh_sweep(s, reader);
    s.needle_map = true;
    const float W = 1180, H = 620;
    test::ImGuiHarness h(W, H);
    test::RecordingTextureHost host;
    unsigned char* font_px = nullptr;
    int fw = 0, fh = 0;
    ImGui::GetIO().Fonts->GetTexDataAsRGBA32(&font_px, &fw, &fh);
    const ImTextureID font_id = reinterpret_cast<ImTextureID>(uintptr_t(0xF0F0));
    ImGui::GetIO().Fonts->SetTexID(font_id);
    const Sampler font{font_px, fw, fh};
    for (int f = 0; f < 3; ++f) h.window_frame([&] { DrawSweepView(s); });
    Image img{int(W), int(H), std::vector<float>(size_t(W * H * 3), 0.1f)};
    raster(img, ImGui::GetDrawData(), host, font, font_id);
    save(img, out_dir + "/sweep_needle_map.png");
}

}  // namespace
}  // namespace kv::views
