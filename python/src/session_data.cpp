// kvlab._kvlab.SessionData: one session opened read-only through storage::SessionReader, each
// table of one run as columns named as `kvlab export` writes them (storage/export_csv.cpp) and
// as docs/SESSIONS.md names them. Numbers go to NumPy without a copy of the rows read.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "engine/memory/mem_category.h"
#include "engine/telemetry/event_types.h"
#include "python/src/bindings.h"
#include "python/src/numpy_columns.h"
#include "storage/cache_step_plan.h"
#include "storage/run_info.h"
#include "storage/session_reader.h"

namespace kv::python {

namespace {

class SessionData {
   public:
    explicit SessionData(const std::string& path) : reader_(path) {}

    const std::string& path() const { return reader_.path(); }

    py::dict runs() {
        using R = storage::RunInfo;
        RowColumns<R> c;
        c.field("id", &R::id)
            .field("name", &R::name)
            .col<std::string>("status", [](const R& r) { return storage::run_status_name(r.status); })
            .col<int64_t>("created_ms", [](const R& r) { return r.created_ms; })
            .col<int64_t>("started_ms", [](const R& r) { return r.started_ms; })
            .col<int64_t>("finished_ms", [](const R& r) { return r.finished_ms; })
            .col<int64_t>("t0_ns", [](const R& r) { return r.t0_ns; })
            .col<int64_t>("tokens_done", [](const R& r) { return r.progress.tokens_done; })
            .col<int64_t>("tokens_total", [](const R& r) { return r.progress.tokens_total; })
            .col<int32_t>("chunks_done", [](const R& r) { return r.progress.chunks_done; })
            .col<int32_t>("chunks_total", [](const R& r) { return r.progress.chunks_total; })
            .col<int32_t>("steps_done", [](const R& r) { return r.progress.steps_done; })
            .col<int32_t>("steps_total", [](const R& r) { return r.progress.steps_total; })
            .field("error", &R::error)
            .col<int64_t>("owner_pid", [](const R& r) { return r.owner_pid; })
            .field("owner_host", &R::owner_host)
            .field("host", &R::host)
            .field("build", &R::build)
            .field("config", &R::config)
            .field("summary", &R::summary);
        for (const R& r : reader_.runs()) c.append(r);
        return c.release();
    }

    // Columns of export_metrics_csv.
    py::dict metrics(int64_t run) {
        using R = storage::MetricRow;
        const int64_t t0 = reader_.run(run).t0_ns;
        RowColumns<R> c;
        c.field("id", &R::id).field("name", &R::name).field("step", &R::step).field("value", &R::value).field("t_ns", &R::t_ns);
        c.col<int64_t>("t_rel_ns", [t0](const R& r) { return r.t_ns - t0; });
        for (const R& m : reader_.metrics(run)) c.append(m);
        return c.release();
    }

    // Columns of export_spans_csv.
    py::dict spans(int64_t run) {
        using R = storage::SpanRow;
        const int64_t t0 = reader_.run(run).t0_ns;
        RowColumns<R> c;
        c.field("id", &R::id)
            .field("start_ns", &R::start_ns)
            .field("end_ns", &R::end_ns)
            .col<int64_t>("start_rel_ns", [t0](const R& r) { return r.start_ns - t0; })
            .col<int64_t>("dur_ns", [](const R& r) { return r.end_ns - r.start_ns; })
            .field("name", &R::name)
            .col<std::string>("category", [](const R& r) { return trace::span_category_name(r.category); })
            .field("layer", &R::layer)
            .field("chunk", &R::chunk)
            .field("cell_row", &R::cell_row)
            .field("cell_col", &R::cell_col)
            .field("thread", &R::thread)
            .col<std::string>("device", [](const R& r) { return trace::device_code_name(r.device); })
            .field("stream", &R::stream)
            .field("correlation_id", &R::correlation_id);
        reader_.for_each_span(run, [&](const R& s) { c.append(s); });
        return c.release();
    }

    // Columns of export_memory_csv.
    py::dict memory(int64_t run) {
        using R = storage::MemoryEventRow;
        const int64_t t0 = reader_.run(run).t0_ns;
        RowColumns<R> c;
        c.field("id", &R::id)
            .field("t_ns", &R::t_ns)
            .col<int64_t>("t_rel_ns", [t0](const R& r) { return r.t_ns - t0; })
            .col<std::string>("device", [](const R& r) { return trace::device_code_name(r.device); })
            .col<std::string>("category", [](const R& r) { return mem_category_name(r.category); })
            .field("bytes", &R::bytes)
            .field("category_total", &R::category_total)
            .field("device_total", &R::device_total)
            .field("label", &R::label)
            .field("alloc_id", &R::alloc_id)
            .field("address", &R::address)
            .field("layer", &R::layer)
            .field("chunk", &R::chunk)
            .field("flags", &R::flags);
        reader_.for_each_memory_event(run, {}, [&](const R& r) { c.append(r); });
        return c.release();
    }

    // Columns of export_tokens_csv: one row per (sample, position); loss NaN where unscored.
    py::dict tokens(int64_t run) {
        struct At {
            const storage::SampleTokensRow& r;
            size_t i;
        };
        RowColumns<At> c;
        c.col<int64_t>("sample", [](const At& a) { return a.r.sample; })
            .col<int64_t>("position", [](const At& a) { return int64_t(a.i); })
            .col<int32_t>("token_id", [](const At& a) { return a.r.ids[a.i]; })
            .col<std::string>("piece", [](const At& a) { return a.i < a.r.pieces.size() ? a.r.pieces[a.i] : std::string(); })
            .col<float>("loss", [](const At& a) { return a.i < a.r.loss.size() ? a.r.loss[a.i] : std::numeric_limits<float>::quiet_NaN(); });
        for (const storage::SampleTokensRow& r : reader_.sample_tokens(run))
            for (size_t i = 0; i < r.ids.size(); ++i) c.append(At{r, i});
        return c.release();
    }

    // sample_tokens rows without their arrays: one row per evaluated sample.
    py::dict samples(int64_t run) {
        using R = storage::SampleTokensRow;
        RowColumns<R> c;
        c.field("id", &R::id)
            .field("sample", &R::sample)
            .field("description", &R::description)
            .col<int64_t>("tokens", [](const R& r) { return int64_t(r.ids.size()); })
            .field("mean_loss", &R::mean_loss)
            .field("scored", &R::scored)
            .field("correct", &R::correct)
            .field("token_accuracy", &R::token_accuracy);
        for (const R& r : reader_.sample_tokens(run, 0, false)) c.append(r);
        return c.release();
    }

    py::dict logs(int64_t run) {
        using R = storage::LogRow;
        RowColumns<R> c;
        c.field("id", &R::id).field("t_ns", &R::t_ns).field("level", &R::level).field("thread", &R::thread).field("text", &R::text);
        for (const R& r : reader_.logs(run)) c.append(r);
        return c.release();
    }

    // cache_steps rows (every layer), the replay log decoded to its plan's shape.
    py::dict cache_steps(int64_t run) {
        struct Step {
            const storage::CacheStepRow& r;
            const SlotPlan& p;
        };
        RowColumns<Step> c;
        c.col<int64_t>("id", [](const Step& s) { return s.r.id; })
            .col<int32_t>("layer", [](const Step& s) { return s.r.layer; })
            .col<int32_t>("chunk", [](const Step& s) { return s.r.chunk; })
            .col<int32_t>("pass", [](const Step& s) { return s.r.pass; })
            .col<int64_t>("t_ns", [](const Step& s) { return s.r.t_ns; })
            .col<int64_t>("input_pos", [](const Step& s) { return s.r.input_pos; })
            .col<int32_t>("num_tokens", [](const Step& s) { return s.r.num_tokens; })
            .col<int32_t>("cache_length", [](const Step& s) { return s.r.cache_length; })
            .col<int64_t>("rows", [](const Step& s) { return s.p.rows; })
            .col<int64_t>("moves", [](const Step& s) { return s.p.moves; })
            .col<int64_t>("length_after", [](const Step& s) { return s.p.length_after; });
        for (const storage::CacheStepRow& r : reader_.cache_steps(run, -1)) {
            SlotPlan p;
            std::string why;
            if (!storage::decode_cache_step(r, p, why))
                throw Error(str("session '", path(), "' run ", run, ": cache step ", r.id, " (layer ", r.layer,
                                ", chunk ", r.chunk, ") has a damaged replay log: ", why));
            c.append(Step{r, p});
        }
        return c.release();
    }

    // The kept slots of one layer and pass after each of its cache steps, replayed from the
    // replay logs: int32 (steps, rows, slots), the token position in each slot (-1 empty), plus
    // the cache_steps ids of the steps, in write order. A step with input_pos 0 starts a new sample.
    py::tuple kept_slots(int64_t run, int layer, int pass) {
        std::vector<storage::CacheStepRow> steps;
        for (storage::CacheStepRow& r : reader_.cache_steps(run, layer))
            if (r.pass == pass) steps.push_back(std::move(r));
        // The reader orders by chunk, so samples interleave; the replay needs write order.
        std::sort(steps.begin(), steps.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
        std::vector<SlotPlan> plans(steps.size());
        int64_t rows = 1, slots = 0;
        for (size_t i = 0; i < steps.size(); ++i) {
            std::string why;
            if (!storage::decode_cache_step(steps[i], plans[i], why))
                throw Error(str("session '", path(), "' run ", run, ": cache step ", steps[i].id, " has a damaged replay log: ", why));
            rows = std::max(rows, plans[i].rows);
            slots = std::max(slots, plans[i].length_after);
        }
        std::vector<int32_t> table(size_t(rows * slots), -1), out;
        out.reserve(steps.size() * size_t(rows * slots));
        std::vector<int64_t> ids;
        for (size_t i = 0; i < steps.size(); ++i) {
            if (plans[i].input_pos == 0) std::fill(table.begin(), table.end(), -1);
            for (int64_t r = 0; r < rows; ++r)
                apply_plan_to_row(plans[i], plans[i].rows == 1 ? 0 : r, table.data() + r * slots, slots);
            out.insert(out.end(), table.begin(), table.end());
            ids.push_back(steps[i].id);
        }
        return py::make_tuple(numpy_owning(std::move(ids)),
                              numpy_owning(std::move(out), {py::ssize_t(steps.size()), py::ssize_t(rows), py::ssize_t(slots)}));
    }

    // score_snapshots rows (every layer): summary statistics, has_values where the full array was stored.
    py::dict scores(int64_t run) {
        using R = storage::ScoreRow;
        RowColumns<R> c;
        c.field("id", &R::id)
            .field("layer", &R::layer)
            .field("chunk", &R::chunk)
            .field("pass", &R::pass)
            .field("t_ns", &R::t_ns)
            .field("B", &R::B)
            .field("G", &R::G)
            .field("T", &R::T)
            .col<int64_t>("count", [](const R& r) { return r.stats.count; })
            .col<int64_t>("nonfinite", [](const R& r) { return r.stats.nonfinite; })
            .col<float>("min", [](const R& r) { return r.stats.min; })
            .col<float>("max", [](const R& r) { return r.stats.max; })
            .col<float>("mean", [](const R& r) { return r.stats.mean; })
            .col<float>("stddev", [](const R& r) { return r.stats.stddev; })
            .col<float>("p10", [](const R& r) { return r.stats.p10; })
            .col<float>("p50", [](const R& r) { return r.stats.p50; })
            .col<float>("p90", [](const R& r) { return r.stats.p90; })
            .col<float>("p99", [](const R& r) { return r.stats.p99; })
            .col<uint8_t>("has_values", [](const R& r) { return r.has_values; });
        for (const R& r : reader_.score_snapshots(run, -1, 0, false)) c.append(r);
        return c.release();
    }

    // The full (B, G, T) float32 scores of one snapshot row, without a copy of the stored array.
    py::array_t<float> score_values(int64_t run, int64_t snapshot_id) {
        // The reader orders by chunk: find the row's layer without values, then read that
        // layer's rows from the id on and keep the one.
        int layer = -1;
        for (const storage::ScoreRow& r : reader_.score_snapshots(run, -1, snapshot_id - 1, false))
            if (r.id == snapshot_id) layer = r.layer;
        if (layer >= 0)
            for (storage::ScoreRow& r : reader_.score_snapshots(run, layer, snapshot_id - 1, true)) {
                if (r.id != snapshot_id) continue;
                if (!r.has_values)
                    throw Error(str("score snapshot ", snapshot_id, " of run ", run,
                                    " stored statistics only; expected a row with has_values (every --telemetry.score_interval chunks)"));
                return numpy_owning(std::move(r.values), {r.B, r.G, r.T});
            }
        throw Error(str("run ", run, " has no score snapshot ", snapshot_id, "; expected an id from Session.scores(run)"));
    }

   private:
    storage::SessionReader reader_;
};

}  // namespace

void bind_sessions(py::module_& m) {
    py::class_<SessionData>(m, "SessionData")
        .def(py::init<const std::string&>(), py::arg("path"))
        .def_property_readonly("path", &SessionData::path)
        .def("runs", &SessionData::runs)
        .def("metrics", &SessionData::metrics, py::arg("run"))
        .def("spans", &SessionData::spans, py::arg("run"))
        .def("memory", &SessionData::memory, py::arg("run"))
        .def("tokens", &SessionData::tokens, py::arg("run"))
        .def("samples", &SessionData::samples, py::arg("run"))
        .def("logs", &SessionData::logs, py::arg("run"))
        .def("cache_steps", &SessionData::cache_steps, py::arg("run"))
        .def("kept_slots", &SessionData::kept_slots, py::arg("run"), py::arg("layer"), py::arg("pass_") = 0)
        .def("scores", &SessionData::scores, py::arg("run"))
        .def("score_values", &SessionData::score_values, py::arg("run"), py::arg("snapshot_id"));
}

}  // namespace kv::python
