// Run manager (see run_manager.h).
#include "run_manager.h"

#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdlib>
#include <ctime>

#include "engine/backend/backend_registry.h"
#include "engine/core/device.h"
#include "engine/core/error.h"
#include "engine/driver/long_context.h"
#include "engine/memory/memory_tracker.h"
#include "engine/telemetry/alloc_sink.h"
#include "engine/telemetry/gpu_tracer.h"
#include "engine/telemetry/trace.h"
#include "run_execution.h"
#include "storage/session.h"
#include "storage/session_writer.h"

namespace kv::sessions {

using storage::RunStatus;

std::string default_session_path() {
    char stamp[64];
    std::time_t t = std::time(nullptr);
    std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&t));
    const std::string name = std::string("session-") + stamp + ".kvlab";
    if (const char* home = std::getenv("HOME")) {
        std::string dir = std::string(home) + "/.local/share/kvlab";
        std::string partial;
        for (size_t p = 1; p <= dir.size(); ++p)
            if (p == dir.size() || dir[p] == '/') mkdir(dir.substr(0, p).c_str(), 0755);
        if (access(dir.c_str(), W_OK) == 0) return dir + "/" + name;
    }
    return name;
}

RunManager::RunManager(const std::string& path, RunEvents events) : path_(path), events_(std::move(events)) {
    session_ = storage::Session::open_or_create(path);
    writer_ = std::make_unique<storage::SessionWriter>(path);
    worker_ = std::thread([this] { worker_main(); });
}

RunManager::~RunManager() {
    cancel_all();
    {
        std::lock_guard<std::mutex> lk(mu_);
        stopping_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
}

const std::vector<int64_t>& RunManager::crashed_at_open() const { return session_->crashed_at_open(); }

int64_t RunManager::submit(const RunConfig& cfg) {
    validate_run_config(cfg);
    std::string name = cfg.name;
    if (name.empty()) name = str(cfg.mode, " ", cfg.model, " ", cfg.kv_cache.name, cfg.kv_cache.cache_length ? str(" L=", cfg.kv_cache.cache_length) : "");
    const int64_t run = session_->create_run(name, run_config_to_json(cfg, false));
    auto flag = std::make_shared<std::atomic<bool>>(false);
    {
        std::lock_guard<std::mutex> lk(mu_);
        queue_.push_back({run, cfg, flag});
        cancel_flags_[run] = flag;
        status_[run] = RunStatus::QUEUED;
    }
    cv_.notify_all();
    if (events_.status) events_.status(run, RunStatus::QUEUED, "");
    return run;
}

void RunManager::cancel(int64_t run) {
    bool was_queued = false;
    {
        std::lock_guard<std::mutex> lk(mu_);
        for (auto it = queue_.begin(); it != queue_.end(); ++it)
            if (it->run == run) {
                queue_.erase(it);
                was_queued = true;
                break;
            }
        auto f = cancel_flags_.find(run);
        if (f != cancel_flags_.end()) f->second->store(true);
    }
    if (was_queued) {
        session_->finish_run(run, RunStatus::CANCELLED, "cancelled before it started");
        set_status(run, RunStatus::CANCELLED, "cancelled before it started");
    }
}

void RunManager::cancel_all() {
    std::vector<int64_t> ids;
    {
        std::lock_guard<std::mutex> lk(mu_);
        for (auto& [id, s] : status_)
            if (!storage::run_status_final(s)) ids.push_back(id);
    }
    for (int64_t id : ids) cancel(id);
}

void RunManager::set_status(int64_t run, RunStatus s, const std::string& message) {
    {
        std::lock_guard<std::mutex> lk(mu_);
        status_[run] = s;
    }
    cv_.notify_all();
    if (events_.status) events_.status(run, s, message);
}

RunStatus RunManager::wait(int64_t run) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return status_.count(run) && storage::run_status_final(status_[run]); });
    return status_[run];
}

void RunManager::wait_all() {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] {
        if (!queue_.empty()) return false;
        for (auto& [id, s] : status_)
            if (!storage::run_status_final(s)) return false;
        return true;
    });
}

RunStatus RunManager::status(int64_t run) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = status_.find(run);
    return it == status_.end() ? session_->run(run).status : it->second;
}

std::string RunManager::summary(int64_t run) { return session_->run(run).summary; }

std::string RunManager::result_text(int64_t run) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = text_.find(run);
    return it == text_.end() ? std::string() : it->second;
}

void RunManager::worker_main() {
    for (;;) {
        Job job;
        {
            std::unique_lock<std::mutex> lk(mu_);
            cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
            if (queue_.empty()) return;
            job = queue_.front();
            queue_.pop_front();
        }
        execute(job);
    }
}

void RunManager::execute(Job& job) {
    const RunConfig& cfg = job.cfg;
    MemoryTracker tracker;
    if (!cfg.memory_budget.empty()) {
        tracker.set_budget(parse_device(cfg.device), parse_bytes(cfg.memory_budget, "--memory.budget"));
    }
    trace::RecorderOptions ro;
    ro.score_interval = cfg.telemetry.score_interval > 0 ? int(cfg.telemetry.score_interval)
                                                         : trace::default_score_interval(cfg.model == "tiny");
    trace::Recorder recorder(ro);
    std::unique_ptr<trace::RecorderAllocSink> alloc_sink;
    if (cfg.telemetry.enabled) {
        alloc_sink = std::make_unique<trace::RecorderAllocSink>(recorder, tracker);
        writer_->attach(job.run, recorder);
    }
    nlohmann::json build;
    build["version"] = KVLAB_VERSION;
    build["cpu"] = cpu_backend().build_info();
    build["cpu_kernels"] = cpu_variant_status();
    build["cuda"] = cuda_status();
    build["threads"] = num_threads();
    session_->start_run(job.run, build.dump());
    set_status(job.run, RunStatus::RUNNING, "");

    RunStatus final_status = RunStatus::DONE;
    std::string error, text, summary = "{}";
    {
        MemoryTrackerScope mscope(tracker);
        std::unique_ptr<trace::RecorderScope> rscope;
        if (cfg.telemetry.enabled) rscope = std::make_unique<trace::RecorderScope>(recorder);
        std::unique_ptr<trace::GpuTracer> gpu;
        if (cfg.telemetry.enabled && cfg.telemetry.cupti && cfg.device.rfind("cuda", 0) == 0)
            gpu = std::make_unique<trace::GpuTracer>(recorder);
        RunHooks hooks;
        hooks.cancel = job.cancel.get();
        hooks.progress = [&](int64_t d, int64_t t, const std::string& w) {
            if (events_.progress) events_.progress(job.run, d, t, w);
        };
        hooks.output = [&](const std::string& s) {
            if (events_.output) events_.output(job.run, s);
            if (cfg.telemetry.enabled) trace::log(trace::LogLevel::INFO, s);
        };
        try {
            KV_TRACE_SPAN(trace::SpanCategory::RUN, "run");
            RunOutcome out = execute_run(cfg, hooks);
            text = out.text;
            summary = out.summary_json;
            if (out.cancelled) final_status = RunStatus::CANCELLED;
        } catch (const Cancelled&) {
            final_status = RunStatus::CANCELLED;
            error = "cancelled";
        } catch (const Error& e) {
            final_status = job.cancel->load() ? RunStatus::CANCELLED : RunStatus::FAILED;
            error = e.hint().empty() ? e.what() : str(e.what(), " (hint: ", e.hint(), ")");
        } catch (const std::exception& e) {
            final_status = RunStatus::FAILED;
            error = e.what();
        }
        if (gpu) gpu->flush(true);
    }
    if (cfg.telemetry.enabled) writer_->detach(job.run);  // drains and writes the event summary
    session_->merge_summary(job.run, summary);
    session_->finish_run(job.run, final_status, error);
    {
        std::lock_guard<std::mutex> lk(mu_);
        text_[job.run] = text;
        cancel_flags_.erase(job.run);
    }
    set_status(job.run, final_status, final_status == RunStatus::DONE ? text : error);
}

}  // namespace kv::sessions
