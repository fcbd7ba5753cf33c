// Helpers for the storage and telemetry suites: a scratch directory removed after each test,
// whole-file reads for "nothing was overwritten" checks, and a sink that collects drained events.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/telemetry/recorder.h"

namespace kv::test {

class ScratchDir {
   public:
    ScratchDir() {
        std::string tmpl = (std::filesystem::temp_directory_path() / "kvlab-storage-test-XXXXXX").string();
        std::vector<char> buf(tmpl.begin(), tmpl.end());
        buf.push_back(0);
        if (!mkdtemp(buf.data())) throw std::runtime_error("mkdtemp failed");
        path_ = buf.data();
    }
    ~ScratchDir() {
        std::error_code ec;
        std::filesystem::permissions(path_, std::filesystem::perms::owner_all, std::filesystem::perm_options::add, ec);
        std::filesystem::remove_all(path_, ec);
    }
    ScratchDir(const ScratchDir&) = delete;
    ScratchDir& operator=(const ScratchDir&) = delete;
    const std::string& path() const { return path_; }
    std::string file(const std::string& name) const { return path_ + "/" + name; }

   private:
    std::string path_;
};

inline std::string read_file_bytes(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::ostringstream os;
    os << f.rdbuf();
    return os.str();
}

inline void write_file_bytes(const std::string& path, const std::string& bytes) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), std::streamsize(bytes.size()));
}

// Copies every drained event (payloads are deep-copied where the test needs them).
struct CollectingSink : trace::EventSink {
    std::vector<trace::Event> events;
    std::vector<std::vector<uint8_t>> replay_logs;  // per CACHE_STEP, in order
    std::vector<trace::ScorePayload> scores;        // per SCORES, in order
    std::vector<std::string> logs;                  // per LOG, in order
    void on_event(trace::Event& ev) override {
        events.push_back(ev);
        if (ev.type() == trace::EventType::CACHE_STEP && ev.cache_step.replay_log)
            replay_logs.push_back(*ev.cache_step.replay_log);
        if (ev.type() == trace::EventType::SCORES && ev.scores.payload) scores.push_back(*ev.scores.payload);
        if (ev.type() == trace::EventType::LOG && ev.log.text) logs.push_back(*ev.log.text);
        // The copies in `events` must not keep pointers the recorder is about to free.
        if (trace::event_has_payload(ev.type())) {
            trace::Event& mine = events.back();
            switch (ev.type()) {
                case trace::EventType::CACHE_STEP:
                    mine.cache_step.replay_log = nullptr;
                    break;
                case trace::EventType::SCORES:
                    mine.scores.payload = nullptr;
                    break;
                case trace::EventType::LOG:
                    mine.log.text = nullptr;
                    break;
                case trace::EventType::GPU_BATCH:
                    mine.gpu.payload = nullptr;
                    break;
                default:
                    break;
            }
        }
    }
    std::vector<trace::Event> of(trace::EventType t) const {
        std::vector<trace::Event> out;
        for (const auto& e : events)
            if (e.type() == t) out.push_back(e);
        return out;
    }
};

}  // namespace kv::test

#include "engine/telemetry/trace.h"
#include "storage/session.h"
#include "storage/session_writer.h"

namespace kv::test {

// A closed session at `path` with one finished run holding `spans` spans and a metric per 100.
// Returns the run id.
inline int64_t make_session_with_spans(const std::string& path, int spans) {
    auto session = storage::Session::create(path);
    int64_t run = session->create_run("fixture", R"({"mode":"eval_long","kv_cache":{"name":"h2o-q8"}})");
    session->start_run(run);
    trace::Recorder rec;
    {
        storage::SessionWriter writer(path);
        writer.attach(run, rec);
        {
            trace::RecorderScope scope(rec);
            static const trace::Name kName("fixture span");
            for (int i = 0; i < spans; ++i) {
                trace::SpanScope s(trace::SpanCategory::LAYER, kName, {.layer = i % 8, .chunk = i / 8});
                if (i % 100 == 0) trace::metric("loss", i, 1.0 / (1 + i));
                while (rec.stats().pending > 30000) std::this_thread::yield();
            }
        }
        writer.detach(run);
    }
    session->finish_run(run, storage::RunStatus::DONE);
    session->checkpoint();
    return run;
}

}  // namespace kv::test
