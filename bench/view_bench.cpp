// View frame-time benchmark (see view_bench.h).
//
// Index
//   [SECTION] synthetic session
//   [SECTION] frames and scenarios
#include "bench/view_bench.h"

#include <imgui.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <thread>

#include "engine/core/error.h"
#include "engine/kv/replay_log.h"
#include "engine/run/run_config.h"
#include "engine/telemetry/recorder.h"
#include "engine/telemetry/string_table.h"
#include "engine/telemetry/trace.h"
#include "sessions/run_manager.h"
#include "storage/session.h"
#include "storage/session_reader.h"
#include "storage/session_writer.h"
#include "views/canvas_impl.h"
#include "views/eviction_map.h"
#include "views/memory_timeline.h"

namespace kv::views {

// =========================================================================================
// [SECTION] synthetic session
// =========================================================================================
namespace {

uint64_t mix(uint64_t x) {  // splitmix64 finaliser: a deterministic hash for scores and sizes
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// A token's synthetic eviction score: heavy hitters (1 in 16 tokens) score high, the rest
// decay with distance to the newest token, as H2O scores tend to.
float token_score(int layer, int row, int64_t pos, int64_t newest) {
    const uint64_t h = mix(uint64_t(layer) * 1000003u + uint64_t(row) * 7919u + uint64_t(pos));
    const double noise = double(h & 0xFFFF) / 65536.0;
    const double heavy = (h >> 20) % 16 == 0 ? 4.0 : 0.0;
    return float(heavy + noise + 2.0 * std::exp(-double(newest - pos) / 2048.0));
}

void push_blocking(trace::Recorder& rec, trace::Event& ev) {
    while (!rec.push(ev)) std::this_thread::sleep_for(std::chrono::microseconds(200));
}

void throttle(trace::Recorder& rec, uint64_t i) {
    if (i % 1024 == 0)
        while (rec.stats().pending > 200000) std::this_thread::sleep_for(std::chrono::microseconds(300));
}

}  // namespace

int64_t write_view_bench_session(const std::string& path, const ViewBenchOptions& o) {
    auto session = storage::Session::create(path);
    const std::string config = str(R"({"mode":"eval_long","model":"synthetic","name":"view bench","kv_cache":{"name":"h2o-default","cache_length":)",
                                   o.cache_length, R"(},"driver":{"chunk_size":)", o.chunk_size, R"(},"data":{"seq_length":)", o.tokens, "}}");
    const int64_t run = session->create_run("view bench (synthetic)", config);
    const int64_t base = int64_t(session->start_run(run));
    trace::RecorderOptions ro;
    ro.queue_capacity = size_t(1) << 18;
    ro.score_interval = std::max(1, o.score_interval);
    trace::Recorder rec(ro);
    const int64_t span_ns = std::max<int64_t>(1, o.memory_events) * 100;  // 100 ns between memory events
    {
        storage::SessionWriter writer(path);
        writer.attach(run, rec);
        trace::Event ev;
        uint64_t pushed = 0;
        // ---- memory events: weights, then per cell a pyramid of allocations freed in reverse ----
        const uint32_t weights_label = trace::intern("model weights");
        std::vector<uint32_t> labels;
        const MemCategory cats[] = {MemCategory::ACTIVATIONS, MemCategory::ACTIVATION_CHECKPOINT, MemCategory::GRADIENTS,
                                    MemCategory::WORKSPACE, MemCategory::KV_CHECKPOINT};
        for (int l = 0; l < o.layers; ++l)
            for (MemCategory c : cats) labels.push_back(trace::intern(str("layer ", l, " ", mem_category_name(c))));
        std::array<int64_t, kNumMemCategories> cat_total{};
        int64_t device_total = 0;
        auto alloc_event = [&](int64_t t, MemCategory c, int64_t bytes, uint32_t label, uint64_t id) {
            cat_total[size_t(c)] += bytes;
            device_total += bytes;
            ev.alloc = trace::AllocRecord{};
            ev.alloc.type = trace::EventType::ALLOC;
            ev.alloc.category = c;
            ev.alloc.device = -1;
            ev.alloc.label_id = label;
            ev.alloc.t_ns = uint64_t(t);
            ev.alloc.bytes = bytes;
            ev.alloc.alloc_id = id;
            ev.alloc.address = id * 4096;
            ev.alloc.category_total = cat_total[size_t(c)];
            ev.alloc.device_total = device_total;
            ev.alloc.layer = ev.alloc.chunk = -1;
            push_blocking(rec, ev);
            throttle(rec, ++pushed);
        };
        int64_t i = 0;
        if (o.memory_events > 0) alloc_event(base, MemCategory::WEIGHTS, int64_t(512) << 20, weights_label, 1), ++i;
        const int cells = std::max(1, o.cells);
        const int64_t per_cell = std::max<int64_t>(2, (o.memory_events - 1) / cells);
        struct Live {
            MemCategory c;
            int64_t bytes;
            uint32_t label;
            uint64_t id;
        };
        std::vector<Live> stack;
        uint64_t next_id = 2;
        for (int c = 0; c < cells && i < o.memory_events; ++c) {
            const int64_t end = c + 1 == cells ? o.memory_events : std::min(o.memory_events, i + per_cell);
            const int64_t half = i + (end - i) / 2;
            for (; i < end; ++i) {
                const int64_t t = base + i * 100;
                if (i < half || stack.empty()) {
                    const uint64_t h = mix(uint64_t(i));
                    const size_t k = size_t(h % labels.size());
                    const MemCategory cat = cats[k % (sizeof(cats) / sizeof(cats[0]))];
                    const int64_t bytes = int64_t(4096) << (h >> 40) % 8;  // 4 KiB .. 512 KiB
                    stack.push_back({cat, bytes, labels[k], next_id});
                    alloc_event(t, cat, bytes, labels[k], next_id++);
                } else {
                    const Live l = stack.back();
                    stack.pop_back();
                    alloc_event(t, l.c, -l.bytes, l.label, l.id);
                }
            }
        }
        // ---- op spans in four lanes, chunk spans, cell spans ----
        static const char* const kNames[] = {"sdpa", "mlp", "rmsnorm", "cache update"};
        const trace::SpanCategory kCats[] = {trace::SpanCategory::ATTENTION, trace::SpanCategory::MLP, trace::SpanCategory::NORM,
                                             trace::SpanCategory::CACHE_UPDATE};
        uint32_t name_ids[4];
        for (int k = 0; k < 4; ++k) name_ids[k] = trace::intern(kNames[k]);
        const double spacing = double(span_ns) / double(std::max<int64_t>(1, o.spans));
        for (int64_t s = 0; s < o.spans; ++s) {
            ev.span = trace::SpanRecord{};
            ev.span.type = trace::EventType::SPAN;
            ev.span.category = kCats[s % 4];
            ev.span.device = -1;
            ev.span.name_id = name_ids[s % 4];
            ev.span.start_ns = uint64_t(base + int64_t(double(s) * spacing));
            ev.span.end_ns = ev.span.start_ns + uint64_t(std::max(1.0, spacing * 3.0));
            ev.span.layer = int32_t((s / 4) % std::max(1, o.layers));
            ev.span.chunk = int32_t(s / (4 * std::max(1, o.layers)));
            ev.span.cell_row = ev.span.cell_col = -1;
            ev.span.thread = 1;
            push_blocking(rec, ev);
            throttle(rec, ++pushed);
        }
        // ---- cache steps (+ scores, chunk spans) ----
        const int64_t L = std::min(o.cache_length, o.tokens);
        std::vector<int64_t> starts = {0}, sizes = {L};
        for (int64_t p = L; p < o.tokens; p += o.chunk_size) starts.push_back(p), sizes.push_back(std::min(o.chunk_size, o.tokens - p));
        const int steps = int(starts.size());
        const uint32_t chunk_name = trace::intern("chunk"), cell_name = trace::intern("cell");
        const int G = std::max(1, o.kv_heads);
        for (int l = 0; l < o.layers; ++l) {
            std::vector<std::vector<int64_t>> pos(size_t(G), std::vector<int64_t>(size_t(L), -1));
            for (int k = 0; k < steps; ++k) {
                const int64_t t = base + int64_t(double(span_ns) * (double(k) + double(l) / o.layers) / steps);
                SlotPlan p;
                p.input_pos = starts[size_t(k)];
                p.n = sizes[size_t(k)];
                if (k == 0) {
                    p.rows = 1;
                    for (int64_t s = 0; s < p.n; ++s) p.targets.push_back(int32_t(s));
                    for (auto& r : pos)
                        for (int64_t s = 0; s < p.n; ++s) r[size_t(s)] = s;
                } else {  // per KV head: evict the n lowest-scoring slots
                    p.rows = G;
                    std::vector<int32_t> idx(static_cast<size_t>(L));
                    for (int r = 0; r < G; ++r) {
                        std::iota(idx.begin(), idx.end(), 0);
                        const int64_t newest = p.input_pos;
                        auto score = [&](int32_t s) { return token_score(l, r, pos[size_t(r)][size_t(s)], newest); };
                        std::nth_element(idx.begin(), idx.begin() + p.n, idx.end(),
                                         [&](int32_t a, int32_t b) { return score(a) < score(b); });
                        std::sort(idx.begin(), idx.begin() + p.n);
                        for (int64_t t2 = 0; t2 < p.n; ++t2) {
                            p.targets.push_back(idx[size_t(t2)]);
                            pos[size_t(r)][size_t(idx[size_t(t2)])] = p.input_pos + t2;
                        }
                    }
                }
                p.length_after = L;
                ev.cache_step = trace::CacheStepRecord{};
                ev.cache_step.type = trace::EventType::CACHE_STEP;
                ev.cache_step.layer = l;
                ev.cache_step.chunk = k;
                ev.cache_step.num_tokens = int32_t(p.n);
                ev.cache_step.input_pos = p.input_pos;
                ev.cache_step.cache_length = int32_t(L);
                ev.cache_step.t_ns = uint64_t(t);
                ev.cache_step.replay_log = new std::vector<uint8_t>(encode_plan(p));
                push_blocking(rec, ev);
                // scores of the slots after the step (full arrays every score_interval chunks)
                auto* sp = new trace::ScorePayload;
                sp->B = 1, sp->G = G, sp->T = int32_t(L);
                const bool full = rec.wants_full_scores(k);
                double sum = 0;
                float mn = 1e30f, mx = -1e30f;
                for (int r = 0; r < G; ++r)
                    for (int64_t s = 0; s < L; ++s) {
                        const float v = token_score(l, r, pos[size_t(r)][size_t(s)], p.input_pos + p.n);
                        if (full) sp->values.push_back(v);
                        sum += v, mn = std::min(mn, v), mx = std::max(mx, v);
                    }
                sp->stats.count = G * L;
                sp->stats.min = mn, sp->stats.max = mx, sp->stats.mean = float(sum / double(G * L));
                sp->stats.p10 = mn, sp->stats.p50 = sp->stats.mean, sp->stats.p90 = mx, sp->stats.p99 = mx;
                ev.scores = trace::ScoresRecord{};
                ev.scores.type = trace::EventType::SCORES;
                ev.scores.full = full ? 1 : 0;
                ev.scores.layer = l;
                ev.scores.chunk = k;
                ev.scores.t_ns = uint64_t(t);
                ev.scores.payload = sp;
                push_blocking(rec, ev);
                ev.span = trace::SpanRecord{};
                ev.span.type = trace::EventType::SPAN;
                ev.span.category = trace::SpanCategory::CHUNK;
                ev.span.device = -1;
                ev.span.name_id = chunk_name;
                ev.span.start_ns = uint64_t(t);
                ev.span.end_ns = uint64_t(t + span_ns / (int64_t(steps) * o.layers));
                ev.span.layer = l;
                ev.span.chunk = k;
                ev.span.cell_row = 0;
                ev.span.cell_col = int32_t(int64_t(k) * cells / steps);
                push_blocking(rec, ev);
                throttle(rec, ++pushed);
            }
        }
        for (int c = 0; c < cells; ++c) {
            ev.span = trace::SpanRecord{};
            ev.span.type = trace::EventType::SPAN;
            ev.span.category = trace::SpanCategory::CELL;
            ev.span.device = -1;
            ev.span.name_id = cell_name;
            ev.span.start_ns = uint64_t(base + span_ns * c / cells);
            ev.span.end_ns = uint64_t(base + span_ns * (c + 1) / cells);
            ev.span.layer = ev.span.chunk = -1;
            ev.span.cell_row = 0;
            ev.span.cell_col = c;
            push_blocking(rec, ev);
        }
        {
            trace::RecorderScope scope(rec);
            for (int k = 0; k < 20; ++k) trace::metric("bench_loss", k, 2.0 / (1 + k));
        }
        writer.detach(run);
    }
    session->finish_run(run, storage::RunStatus::DONE);
    session->checkpoint();
    return run;
}

// =========================================================================================
// [SECTION] frames and scenarios
// =========================================================================================
namespace {

double thread_cpu_ms() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) * 1e-6;
}

class CountingHost : public TextureHost {
   public:
    explicit CountingHost(TextureHost& inner) : inner_(inner) {}
    uint64_t upload_rgba(uint64_t id, int w, int h, const uint8_t* px) override {
        ++uploads;
        return inner_.upload_rgba(id, w, h, px);
    }
    void release(uint64_t id) override { inner_.release(id); }
    int64_t uploads = 0;

   private:
    TextureHost& inner_;
};

struct FrameTimer {
    std::vector<double> cpu, wall;
};

ViewBenchScenario summarize(const std::string& name, const FrameTimer& t) {
    ViewBenchScenario s;
    s.name = name;
    s.frames = int(t.wall.size());
    if (t.wall.empty()) return s;
    auto stats = [](std::vector<double> v, double& mean, double& p50, double& mx) {
        mean = std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
        std::sort(v.begin(), v.end());
        p50 = v[v.size() / 2];
        mx = v.back();
    };
    s.first_frame_ms = t.wall.front();
    stats(t.cpu, s.cpu_ms_mean, s.cpu_ms_p50, s.cpu_ms_max);
    stats(t.wall, s.wall_ms_mean, s.wall_ms_p50, s.wall_ms_max);
    return s;
}

struct Driver {
    Canvas& canvas;
    const ViewBenchOptions& o;
    // One frame: optional input, refresh (when asked), NewFrame, draw, Render, host hooks.
    void frame(FrameTimer& t, bool refresh, const std::function<void(ImGuiIO&)>& input = {}) {
        const auto w0 = std::chrono::steady_clock::now();
        const double c0 = thread_cpu_ms();
        ImGuiIO& io = ImGui::GetIO();
        io.DisplaySize = ImVec2(o.width, o.height);
        io.DeltaTime = 1.0f / 30.0f;
        io.MouseWheel = 0;
        if (input) input(io);
        if (refresh) canvas.refresh();
        canvas.serve_draw_requests();  // what the previous frame asked for (draw never queries)
        if (o.before_frame) o.before_frame();
        ImGui::NewFrame();
        canvas.draw(o.width, o.height);
        ImGui::Render();
        if (o.after_frame) o.after_frame(ImGui::GetDrawData());
        t.cpu.push_back(thread_cpu_ms() - c0);
        t.wall.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - w0).count());
    }
    void warm() {  // two untimed frames: a new window is hidden on its first
        FrameTimer t;
        frame(t, false);
        frame(t, false);
    }
};

}  // namespace

ViewBenchResult run_view_bench(TextureHost& host_in, const ViewBenchOptions& o) {
    ViewBenchResult res;
    namespace fs = std::filesystem;
    const bool write = o.session.empty();
    res.session = write ? (fs::path(o.dir) / str("kvlab-view-bench-", getpid(), ".kvlab")).string() : o.session;
    if (write) {
        fs::remove(res.session);
        const auto t = std::chrono::steady_clock::now();
        write_view_bench_session(res.session, o);
        res.write_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
    }
    ImGuiContext* prev = ImGui::GetCurrentContext();
    ImGuiContext* own = nullptr;
    if (!prev) {
        own = ImGui::CreateContext();
        ImGui::GetIO().IniFilename = nullptr;
        unsigned char* px = nullptr;
        int w = 0, h = 0;
        ImGui::GetIO().Fonts->GetTexDataAsRGBA32(&px, &w, &h);
    }
    CountingHost host(host_in);
    {
        Canvas canvas(&host);
        canvas.open_session(res.session);
        CanvasImpl& c = canvas.impl();
        Driver d{canvas, o};
        const float cx = o.width * 0.5f, cy = o.height * 0.55f;
        auto hover = [&](ImGuiIO& io) { io.MousePos = ImVec2(cx, cy); };
        {
            storage::SessionReader& r = *c.reader;
            res.memory_events = r.count_rows("memory_events", c.runs.front());
            res.spans = r.count_rows("spans", c.runs.front());
            res.cache_steps = r.count_rows("cache_steps", c.runs.front());
        }
        // Reads a view's data completely, one budgeted refresh after the other.
        auto load = [&](ViewKind k) {
            canvas.set_view(k);
            ViewBenchLoad l;
            l.view = view_name(k);
            const auto t0 = std::chrono::steady_clock::now();
            while (l.refreshes < 100000) {
                const auto r0 = std::chrono::steady_clock::now();
                const bool more = canvas.refresh();
                l.max_refresh_ms =
                    std::max(l.max_refresh_ms, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - r0).count());
                ++l.refreshes;
                if (!more && (k != view_named("memory timeline") || c.state<MemoryTimelineViewState>().caught_up)) break;
            }
            l.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            res.loads.push_back(l);
            return l;
        };
        auto want = [&](const std::string& group) { return o.only.empty() || group.find(o.only) != std::string::npos; };
        auto run_scenario = [&](const std::string& name, bool refresh, const std::function<void(int, ImGuiIO&)>& input) {
            FrameTimer t;
            for (int f = 0; f < o.frames; ++f) d.frame(t, refresh, [&](ImGuiIO& io) { input(f, io); });
            res.scenarios.push_back(summarize(name, t));
        };
        // ---- eviction map ----
        if (want("eviction map")) {
        res.eviction_load_ms = load(view_named("eviction map")).seconds * 1e3;
        d.warm();
        run_scenario("eviction map: presence, one layer, hover", true, [&](int, ImGuiIO& io) { hover(io); });
        run_scenario("eviction map: layer scrub (texture rebuilt every frame)", true, [&](int f, ImGuiIO& io) {
            hover(io);
            c.state<EvictionMapViewState>().layer = f % std::max(1, o.layers);
        });
        c.state<EvictionMapViewState>().colour = EvictionColour::SCORE;
        run_scenario("eviction map: score colour, layer scrub (scores read + rebuilt)", true, [&](int f, ImGuiIO& io) {
            hover(io);
            c.state<EvictionMapViewState>().layer = f % std::max(1, o.layers);
        });
        c.state<EvictionMapViewState>().colour = EvictionColour::AGE;
        c.state<EvictionMapViewState>().layer = 0;
        run_scenario("eviction map: age colour, wheel zoom in/out + drag", true, [&](int f, ImGuiIO& io) {
            io.MousePos = ImVec2(cx + float(f % 10) * 3, cy);
            io.MouseWheel = (f / 5) % 2 ? -1.f : 1.f;
            io.MouseDown[0] = (f % 10) >= 5;
        });
        c.state<EvictionMapViewState>().colour = EvictionColour::PRESENCE;
        c.state<EvictionMapViewState>().all_layers = true;
        c.state<EvictionMapViewState>().follow = true;
        run_scenario(str("eviction map: all ", o.layers, " layers (small multiples)"), true, [&](int, ImGuiIO& io) {
            hover(io);
            io.MouseDown[0] = false;
        });
        c.state<EvictionMapViewState>().all_layers = false;
        }

        // ---- memory timeline: load in budgeted refreshes, then frames ----
        if (want("memory timeline")) {
        {
            const ViewBenchLoad l = load(view_named("memory timeline"));
            res.memory_load_seconds = l.seconds;
            res.memory_load_refreshes = l.refreshes;
            res.memory_load_max_refresh_ms = l.max_refresh_ms;
        }
        d.warm();
        run_scenario("memory timeline: whole run, hover", true, [&](int, ImGuiIO& io) { hover(io); });
        run_scenario("memory timeline: wheel zoom in/out at the cursor", true, [&](int f, ImGuiIO& io) {
            io.MousePos = ImVec2(cx, o.height * 0.3f);
            io.MouseWheel = (f / 8) % 2 ? -2.f : 2.f;
        });
        {  // deep zoom (0.5% of the run) and drag: exact buckets from the reader
            c.state<MemoryTimelineViewState>().follow = false;
            const double span = c.state<MemoryTimelineViewState>().time.span();
            c.state<MemoryTimelineViewState>().time = {c.state<MemoryTimelineViewState>().time.lo + span * 0.5, c.state<MemoryTimelineViewState>().time.lo + span * 0.505};
        }
        run_scenario("memory timeline: 0.5% window, drag pan", true, [&](int f, ImGuiIO& io) {
            io.MousePos = ImVec2(cx + float(f % 8) * 6, o.height * 0.3f);
            io.MouseDown[0] = f % 8 != 0;
        });
        }
        // ---- the other views, steady ----
        for (ViewKind k : {view_named("cell grid"), view_named("scores"), view_named("metrics")}) {
            if (!want(view_name(k))) continue;
            load(k);
            d.warm();
            run_scenario(str(view_name(k), ": hover"), true, [&](int, ImGuiIO& io) {
                hover(io);
                io.MouseDown[0] = false;
            });
        }
    }
    // ---- a live `small` run writing while frames refresh and draw ----
    if (o.live_run) {
        const std::string live = (fs::path(o.dir) / str("kvlab-view-bench-live-", getpid(), ".kvlab")).string();
        fs::remove(live);
        try {
            sessions::RunManager rm(live);
            RunConfig cfg;
            set_run_option(cfg, "data", "passkey");
            cfg.model = "small";
            cfg.mode = "eval_long";
            set_run_option(cfg, "data.seq_length", std::to_string(o.live_seq_length));
            set_run_option(cfg, "data.num_samples", "1");
            set_run_option(cfg, "kv_cache.name", "h2o-default");
            set_run_option(cfg, "kv_cache.cache_length", "1024");
            set_run_option(cfg, "kv_cache.chunk_size", "128");
            const int64_t run = rm.submit(cfg);
            Canvas canvas(&host);
            canvas.open_session(live);
            canvas.select_runs({run});
            Driver d{canvas, o};
            FrameTimer ev_t, mem_t;
            int f = 0;
            while (rm.status(run) == storage::RunStatus::QUEUED || rm.status(run) == storage::RunStatus::RUNNING) {
                const bool mem = (f / 15) % 2 == 1;
                canvas.set_view(mem ? view_named("memory timeline") : view_named("eviction map"));
                d.frame(mem ? mem_t : ev_t, true);
                std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a ~30 fps host
                if (++f > 20000) break;
            }
            rm.wait(run);
            res.scenarios.push_back(summarize("live small run: refresh + eviction map", ev_t));
            res.scenarios.push_back(summarize("live small run: refresh + memory timeline", mem_t));
        } catch (const std::exception& e) {
            res.live_error = e.what();
        }
        for (const char* suffix : {"", "-wal", "-shm"}) fs::remove(live + suffix);
    }
    res.texture_uploads = host.uploads;
    if (own) ImGui::DestroyContext(own);
    if (prev) ImGui::SetCurrentContext(prev);
    if (write && !o.keep_session)
        for (const char* suffix : {"", "-wal", "-shm"}) fs::remove(res.session + suffix);
    return res;
}

std::string format_view_bench(const ViewBenchResult& r) {
    std::string out;
    char line[400];
    std::snprintf(line, sizeof line,
                  "session: %lld memory events, %lld spans, %lld cache steps (written in %.1f s)\n"
                  "eviction map first refresh: %.1f ms; memory timeline load: %.2f s in %d refreshes (longest %.1f ms)\n"
                  "texture uploads: %lld\n",
                  (long long)r.memory_events, (long long)r.spans, (long long)r.cache_steps, r.write_seconds, r.eviction_load_ms,
                  r.memory_load_seconds, r.memory_load_refreshes, r.memory_load_max_refresh_ms, (long long)r.texture_uploads);
    out += line;
    for (const auto& l : r.loads) {
        std::snprintf(line, sizeof line, "load %-20s %8.2f s in %6d refreshes, longest refresh %6.1f ms\n", l.view.c_str(), l.seconds,
                      l.refreshes, l.max_refresh_ms);
        out += line;
    }
    std::snprintf(line, sizeof line, "%-66s %6s %9s %9s %9s %9s %9s\n", "scenario (per frame, ms)", "frames", "cpu mean",
                  "cpu p50", "cpu max", "wall p50", "1st wall");
    out += line;
    for (const auto& s : r.scenarios) {
        std::snprintf(line, sizeof line, "%-66s %6d %9.2f %9.2f %9.2f %9.2f %9.2f\n", s.name.c_str(), s.frames, s.cpu_ms_mean,
                      s.cpu_ms_p50, s.cpu_ms_max, s.wall_ms_p50, s.first_frame_ms);
        out += line;
    }
    if (!r.live_error.empty()) out += "live run not measured: " + r.live_error + "\n";
    return out;
}

}  // namespace kv::views
