// kvlab._kvlab.run / sweep: runs from Python through sessions::RunManager, as the CLI's
// run_session.cpp and cmd_sweep.cpp do, with the CLI's one option table (engine/run/run_config.h).
// The caller's thread waits with the GIL released (the run's worker thread may call into
// Python: progress here, Python policies later), forwards progress to a Python callback, and
// turns a KeyboardInterrupt (or an exception in the callback) into a cancel: the run ends
// `cancelled`, the session stays sound, and the exception propagates.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "engine/core/error.h"
#include "kernels/cpu/cpu_variants.h"
#include "engine/run/run_config.h"
#include "python/src/bindings.h"
#include "sessions/run_manager.h"
#include "sessions/sweep_grid.h"
#include "sessions/sweep_results.h"
#include "storage/session.h"

namespace kv::python {

namespace py = pybind11;

namespace {

using Options = std::vector<std::pair<std::string, std::string>>;

// The run options the CLI sets outside the option table (app/cli/run_options.cpp).
bool set_process_option(RunConfig& cfg, const std::string& name, const std::string& value) {
    if (name == "threads") {
        try {
            size_t used = 0;
            const long long n = std::stoll(value, &used);
            if (used != value.size() || n < 0 || n > 1024) throw std::invalid_argument(value);
            cfg.threads = n;
        } catch (const std::exception&) {
            throw Error(str("--threads: '", value, "' is not a thread count; expected an integer in [0, 1024] (0: all cores)"));
        }
        return true;
    }
    if (name == "device") return cfg.device = value, true;
    if (name == "memory.budget") return cfg.memory_budget = value, true;
    return false;
}

RunConfig make_config(const std::string& mode, const std::string& model, const Options& options) {
    RunConfig cfg;
    cfg.mode = mode;
    cfg.model = model;
    for (const auto& [name, value] : options)
        if (!set_process_option(cfg, name, value)) set_run_option(cfg, name, value);
    const auto problems = run_config_problems(cfg);
    if (!problems.empty()) throw Error(problems.front());
    return cfg;
}

// Latest progress of the running run, written by the worker, read by the waiting thread.
struct ProgressState {
    std::mutex mu;
    int64_t run = 0, done = 0, total = 0;
    std::string what;
    uint64_t seq = 0;
};

sessions::RunEvents progress_events(ProgressState& ps) {
    sessions::RunEvents ev;
    ev.progress = [&ps](int64_t run, int64_t d, int64_t t, const std::string& w) {
        std::lock_guard<std::mutex> lock(ps.mu);
        ps.run = run, ps.done = d, ps.total = t, ps.what = w;
        ++ps.seq;
    };
    return ev;
}

// Waits for `run` (GIL held on entry and exit, released between polls). A pending Python
// exception (KeyboardInterrupt from PyErr_CheckSignals, or one the callback raised) cancels the
// run, waits for it to end, and is rethrown.
storage::RunStatus wait_run(sessions::RunManager& rm, int64_t run, ProgressState& ps, const py::object& progress) {
    uint64_t seen = 0;
    for (;;) {
        bool final_status = false;
        {
            py::gil_scoped_release nogil;
            final_status = storage::run_status_final(rm.status(run));
            if (!final_status) std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        try {
            if (PyErr_CheckSignals() != 0) throw py::error_already_set();
            if (!progress.is_none()) {
                int64_t r = 0, d = 0, t = 0;
                std::string w;
                bool fresh = false;
                {
                    std::lock_guard<std::mutex> lock(ps.mu);
                    if (ps.seq != seen) fresh = true, seen = ps.seq, r = ps.run, d = ps.done, t = ps.total, w = ps.what;
                }
                if (fresh) progress(r, d, t, w);
            }
        } catch (py::error_already_set&) {
            py::gil_scoped_release nogil;
            rm.cancel(run);
            rm.wait(run);
            throw;
        }
        if (final_status) break;
    }
    py::gil_scoped_release nogil;
    return rm.wait(run);
}

// The manager joins its worker when it ends, and the worker may need the GIL to finish (a
// Python policy's scorers are released there): end it with the GIL released, also when an
// exception (KeyboardInterrupt) unwinds through.
struct Manager {
    std::unique_ptr<sessions::RunManager> rm;
    Manager(const std::string& path, sessions::RunEvents ev) {
        py::gil_scoped_release nogil;
        rm = std::make_unique<sessions::RunManager>(path, std::move(ev));
    }
    ~Manager() {
        py::gil_scoped_release nogil;
        rm.reset();
    }
    sessions::RunManager& operator*() { return *rm; }
};

int64_t submit(sessions::RunManager& rm, const RunConfig& cfg) {
    py::gil_scoped_release nogil;  // the worker of an earlier run may still be ending in Python
    return rm.submit(cfg);
}

// Generated text may end inside a UTF-8 sequence (a tiny model's tokens are any bytes).
py::str text(const std::string& s) {
    PyObject* o = PyUnicode_DecodeUTF8(s.data(), py::ssize_t(s.size()), "replace");
    if (!o) throw py::error_already_set();
    return py::reinterpret_steal<py::str>(o);
}

py::dict run_result(sessions::RunManager& rm, int64_t run, storage::RunStatus st) {
    py::dict d;
    d["run"] = run;
    d["status"] = storage::run_status_name(st);
    d["message"] = text(rm.message(run));
    d["result"] = text(rm.result_text(run));
    d["summary"] = text(rm.summary(run));
    d["session"] = rm.path();
    return d;
}

py::dict run(const std::string& session, const std::string& mode, const std::string& model, const Options& options,
             const py::object& progress) {
    const RunConfig cfg = make_config(mode, model, options);
    ProgressState ps;
    Manager manager(session, progress_events(ps));
    sessions::RunManager& rm = *manager;
    const int64_t id = submit(rm, cfg);
    const storage::RunStatus st = wait_run(rm, id, ps, progress);
    return run_result(rm, id, st);
}

// One run per sweep cell (sessions/sweep_grid.h), the cells the session already holds skipped
// (their runs returned), as `kvlab sweep` does.
py::list sweep(const std::string& session, const std::string& model, const Options& options, const py::object& progress) {
    RunConfig base;
    base.mode = "eval_long";
    base.model = model;
    Options table_options;
    for (const auto& [name, value] : options)
        if (!set_process_option(base, name, value)) table_options.emplace_back(name, value);
    const sessions::SweepSpec spec = sessions::make_sweep_spec(base, table_options);
    const std::vector<sessions::SweepCell> cells = sessions::expand_sweep(spec);
    ProgressState ps;
    Manager manager(session, progress_events(ps));
    sessions::RunManager& rm = *manager;
    const auto done = sessions::done_runs_by_identity(rm.session());
    py::list out;
    for (const sessions::SweepCell& cell : cells) {
        py::dict coords;
        for (const auto& [k, v] : cell.coords) coords[py::str(k)] = v;
        py::dict r;
        if (auto it = done.find(cell.identity); it != done.end()) {
            r = run_result(rm, it->second, rm.session().run(it->second).status);
            r["skipped"] = true;
        } else {
            const int64_t id = submit(rm, cell.cfg);
            r = run_result(rm, id, wait_run(rm, id, ps, progress));
            r["skipped"] = false;
        }
        r["name"] = text(cell.cfg.name);
        r["reference"] = cell.reference;
        r["coords"] = coords;
        out.append(r);
    }
    return out;
}

py::list option_table() {
    py::list out;
    for (const OptionDef& o : run_options()) {
        py::dict d;
        d["name"] = o.name;
        d["group"] = o.group;
        d["help"] = o.help;
        d["choices"] = o.choices;
        d["default"] = o.get(RunConfig{});
        out.append(d);
    }
    return out;
}

}  // namespace

void bind_runs(py::module_& m) {
    m.def("run", &run, py::arg("session"), py::arg("mode"), py::arg("model"), py::arg("options"), py::arg("progress"),
          "Run one mode into a session; options as (dotted name, text value) pairs");
    m.def("sweep", &sweep, py::arg("session"), py::arg("model"), py::arg("options"), py::arg("progress"),
          "Run a sweep's cells into a session; comma lists make axes");
    m.def("run_options", &option_table, "The run option table: name, group, help, choices, default");
    m.def("modes", [] { return run_modes(); });
    // Which CPU kernel variant this process runs (as `kvlab version` says it).
    m.def("cpu_variant", [] { return cpu::chosen_variant().status; });
}

}  // namespace kv::python
