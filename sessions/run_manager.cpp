// Run manager (see run_manager.h).
#include "run_manager.h"

#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <new>

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

namespace {
// "disk full while writing session X: 720 telemetry events lost" (or the writer's own error).
std::string describe_write_fault(const std::string& path, uint64_t lost, const std::string& error) {
    // SQLITE_FULL says "disk is full"; a write past a file-size limit fails with EFBIG.
    const bool full = error.find("full") != std::string::npos || error.find("No space left") != std::string::npos ||
                      error.find("File too large") != std::string::npos;
    // SQLite reports a write refused at commit as "disk I/O error" whose errno is often already
    // overwritten by the rollback that follows: name the likely cause and keep SQLite's words.
    const bool io = !full && error.find("disk I/O error") != std::string::npos;
    std::string why = full ? str("disk full while writing session ", path)
                      : io ? str("disk full or I/O error while writing session ", path, " (", error, ")")
                           : str("writing session ", path, " failed (", error.empty() ? "unknown error" : error, ")");
    return str(why, ": ", lost, " telemetry event", lost == 1 ? "" : "s", " lost");
}
}  // namespace

RunManager::RunManager(const std::string& path, RunEvents events) : path_(path), events_(std::move(events)) {
    session_ = storage::Session::open_or_create(path);
    storage::WriterOptions wo;
    wo.on_fault = [this](int64_t run, uint64_t lost, const std::string& error) { on_write_fault(run, lost, error); };
    writer_ = std::make_unique<storage::SessionWriter>(path, wo);
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
    // Before the members its fault callback uses (mu_, faults_) are destroyed.
    writer_.reset();
    // Fold the WAL back and truncate it. SQLite deletes the WAL when the last connection closes,
    // but the GUI's read-only connections may outlive this one and cannot: without this, the
    // runs' megabytes of WAL would stay beside the session after quitting. Idle readers do not
    // block it; one mid-read leaves the WAL as it is (recorded data is safe either way).
    if (session_) session_->checkpoint();
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

void RunManager::on_write_fault(int64_t run, uint64_t lost, const std::string& error) {
    std::lock_guard<std::mutex> lk(mu_);
    WriteFault& f = faults_[run];
    f.lost = std::max(f.lost, lost);
    f.error = error;
    auto stop = stop_on_fault_.find(run);
    auto flag = cancel_flags_.find(run);
    if (stop != stop_on_fault_.end() && stop->second && flag != cancel_flags_.end() && !f.stopped) {
        f.stopped = true;
        flag->second->store(true);  // the run stops within one chunk
    }
}

void RunManager::set_status(int64_t run, RunStatus s, const std::string& message) {
    {
        std::lock_guard<std::mutex> lk(mu_);
        status_[run] = s;
        if (s != RunStatus::DONE) messages_[run] = message;
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

std::string RunManager::message(int64_t run) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = messages_.find(run);
    return it == messages_.end() ? std::string() : it->second;
}

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
        // Nothing may escape the worker thread (it would end the process): a session that cannot
        // be written (disk full) or memory that ran out fails the run with the reason.
        try {
            execute(job);
        } catch (const std::bad_alloc&) {
            fail_unexpectedly(job.run, "out of memory (an allocation failed); lower the sizes or set --memory.budget");
        } catch (const std::exception& e) {
            fail_unexpectedly(job.run, e.what());
        }
    }
}

void RunManager::fail_unexpectedly(int64_t run, const std::string& why) {
    std::string msg = why;
    try {
        session_->finish_run(run, RunStatus::FAILED, why);
    } catch (const std::exception& e) {
        // The file keeps the run unfinished; the next open marks it crashed.
        msg = str(why, " (and the session could not record it: ", e.what(), ")");
    }
    {
        std::lock_guard<std::mutex> lk(mu_);
        cancel_flags_.erase(run);
    }
    set_status(run, RunStatus::FAILED, msg);
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
    {
        std::lock_guard<std::mutex> lk(mu_);
        stop_on_fault_[job.run] = cfg.telemetry.on_error != "continue";
    }
    if (cfg.telemetry.enabled) {
        alloc_sink = std::make_unique<trace::RecorderAllocSink>(recorder, tracker);
        writer_->attach(job.run, recorder);
    }
    nlohmann::json build;
    build["version"] = KVLAB_VERSION;
    build["cpu"] = cpu_backend().build_info();
    build["cpu_kernels"] = cpu_variant_status();
    // A CPU run does not load the CUDA plugin just to describe it (its libraries are ~60 MiB of RSS).
    build["cuda"] = cfg.device.rfind("cuda", 0) == 0 ? cuda_status() : cuda_status_if_loaded();
    build["threads"] = num_threads();
    try {
        session_->start_run(job.run, build.dump());
    } catch (...) {
        // The recorder dies with this frame: the writer must let go of it first.
        if (cfg.telemetry.enabled) {
            try {
                writer_->detach(job.run);
            } catch (const std::exception&) {
            }
        }
        throw;
    }
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
        // One row per sample, written at once on the session's connection (a commit per
        // sample, not per token). A failed write is lost telemetry like a failed batch.
        if (cfg.telemetry.enabled)
            hooks.sample_tokens = [&](const storage::SampleTokensRow& row) {
                try {
                    session_->write_sample_tokens(job.run, row);
                } catch (const std::exception& e) {
                    std::lock_guard<std::mutex> lk(mu_);
                    WriteFault& f = faults_[job.run];
                    f.lost += 1;
                    if (f.error.empty()) f.error = e.what();
                }
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
    storage::WriterRunStats ws;
    std::string detach_error;
    if (cfg.telemetry.enabled) {
        try {
            ws = writer_->detach(job.run);  // drains and writes the event summary
        } catch (const std::exception& e) {
            detach_error = e.what();
        }
    }
    WriteFault fault;
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (faults_.count(job.run)) fault = faults_[job.run];
        stop_on_fault_.erase(job.run);
        faults_.erase(job.run);
    }
    fault.lost = std::max(fault.lost, ws.lost);
    if (fault.error.empty()) fault.error = !ws.error.empty() ? ws.error : detach_error;
    // Lost telemetry never passes silently: the run is degraded (finished, events incomplete),
    // or failed when the fault stopped it.
    if (fault.lost > 0 || !fault.error.empty()) {
        const std::string what = describe_write_fault(path_, fault.lost, fault.error);
        if (fault.stopped && final_status != RunStatus::DONE) {
            final_status = RunStatus::FAILED;
            error = str(what, "; the run was stopped (--telemetry.on_error continue finishes it without telemetry)");
        } else if (final_status == RunStatus::DONE) {
            final_status = RunStatus::DEGRADED;
            error = what;
        } else {
            error = error.empty() ? what : str(error, "; ", what);
        }
    }
    try {
        session_->merge_summary(job.run, summary);
    } catch (const std::exception& e) {
        const std::string why = str("the run's summary could not be written to session ", path_, ": ", e.what());
        final_status = RunStatus::FAILED;
        error = error.empty() ? why : str(error, "; ", why);
    }
    try {
        session_->finish_run(job.run, final_status, error);
    } catch (const std::exception& e) {
        // The file keeps the run unfinished (the next open marks it crashed); say so here.
        const std::string why = str("its end could not be recorded in session ", path_, ": ", e.what());
        if (final_status == RunStatus::DONE) final_status = RunStatus::FAILED;
        error = error.empty() ? why : str(error, "; ", why);
    }
    {
        std::lock_guard<std::mutex> lk(mu_);
        text_[job.run] = text;
        cancel_flags_.erase(job.run);
    }
    set_status(job.run, final_status, final_status == RunStatus::DONE ? text : error);
}

}  // namespace kv::sessions
