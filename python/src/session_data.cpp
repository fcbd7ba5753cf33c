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
        std::vector<int64_t> id, created, started, finished, t0, tok_done, tok_total, owner_pid;
        std::vector<int32_t> ch_done, ch_total, st_done, st_total;
        std::vector<std::string> name, status, config, summary, host, build, error, owner_host;
        for (const storage::RunInfo& r : reader_.runs()) {
            id.push_back(r.id);
            name.push_back(r.name);
            status.push_back(storage::run_status_name(r.status));
            created.push_back(r.created_ms);
            started.push_back(r.started_ms);
            finished.push_back(r.finished_ms);
            t0.push_back(r.t0_ns);
            tok_done.push_back(r.progress.tokens_done);
            tok_total.push_back(r.progress.tokens_total);
            ch_done.push_back(r.progress.chunks_done);
            ch_total.push_back(r.progress.chunks_total);
            st_done.push_back(r.progress.steps_done);
            st_total.push_back(r.progress.steps_total);
            error.push_back(r.error);
            owner_pid.push_back(r.owner_pid);
            owner_host.push_back(r.owner_host);
            config.push_back(r.config);
            summary.push_back(r.summary);
            host.push_back(r.host);
            build.push_back(r.build);
        }
        Columns c;
        c.add("id", std::move(id));
        c.add("name", name);
        c.add("status", status);
        c.add("created_ms", std::move(created));
        c.add("started_ms", std::move(started));
        c.add("finished_ms", std::move(finished));
        c.add("t0_ns", std::move(t0));
        c.add("tokens_done", std::move(tok_done));
        c.add("tokens_total", std::move(tok_total));
        c.add("chunks_done", std::move(ch_done));
        c.add("chunks_total", std::move(ch_total));
        c.add("steps_done", std::move(st_done));
        c.add("steps_total", std::move(st_total));
        c.add("error", error);
        c.add("owner_pid", std::move(owner_pid));
        c.add("owner_host", owner_host);
        c.add("host", host);
        c.add("build", build);
        c.add("config", config);
        c.add("summary", summary);
        return c.release();
    }

    // Columns of export_metrics_csv.
    py::dict metrics(int64_t run) {
        const int64_t t0 = reader_.run(run).t0_ns;
        std::vector<int64_t> id, step, t, trel;
        std::vector<double> value;
        std::vector<std::string> name;
        for (const storage::MetricRow& m : reader_.metrics(run)) {
            id.push_back(m.id);
            name.push_back(m.name);
            step.push_back(m.step);
            value.push_back(m.value);
            t.push_back(m.t_ns);
            trel.push_back(m.t_ns - t0);
        }
        Columns c;
        c.add("id", std::move(id));
        c.add("name", name);
        c.add("step", std::move(step));
        c.add("value", std::move(value));
        c.add("t_ns", std::move(t));
        c.add("t_rel_ns", std::move(trel));
        return c.release();
    }

    // Columns of export_spans_csv.
    py::dict spans(int64_t run) {
        const int64_t t0 = reader_.run(run).t0_ns;
        std::vector<int64_t> id, start, end, start_rel, dur, corr;
        std::vector<int32_t> layer, chunk, cell_row, cell_col, thread, stream;
        std::vector<std::string> name, category, device;
        reader_.for_each_span(run, [&](const storage::SpanRow& s) {
            id.push_back(s.id);
            start.push_back(s.start_ns);
            end.push_back(s.end_ns);
            start_rel.push_back(s.start_ns - t0);
            dur.push_back(s.end_ns - s.start_ns);
            name.push_back(s.name);
            category.push_back(trace::span_category_name(s.category));
            layer.push_back(s.layer);
            chunk.push_back(s.chunk);
            cell_row.push_back(s.cell_row);
            cell_col.push_back(s.cell_col);
            thread.push_back(s.thread);
            device.push_back(trace::device_code_name(s.device));
            stream.push_back(s.stream);
            corr.push_back(s.correlation_id);
        });
        Columns c;
        c.add("id", std::move(id));
        c.add("start_ns", std::move(start));
        c.add("end_ns", std::move(end));
        c.add("start_rel_ns", std::move(start_rel));
        c.add("dur_ns", std::move(dur));
        c.add("name", name);
        c.add("category", category);
        c.add("layer", std::move(layer));
        c.add("chunk", std::move(chunk));
        c.add("cell_row", std::move(cell_row));
        c.add("cell_col", std::move(cell_col));
        c.add("thread", std::move(thread));
        c.add("device", device);
        c.add("stream", std::move(stream));
        c.add("correlation_id", std::move(corr));
        return c.release();
    }

    // Columns of export_memory_csv.
    py::dict memory(int64_t run) {
        const int64_t t0 = reader_.run(run).t0_ns;
        std::vector<int64_t> id, t, trel, bytes, cat_total, dev_total, alloc_id;
        std::vector<uint64_t> address;
        std::vector<int32_t> layer, chunk;
        std::vector<uint8_t> flags;
        std::vector<std::string> device, category, label;
        reader_.for_each_memory_event(run, {}, [&](const storage::MemoryEventRow& r) {
            id.push_back(r.id);
            t.push_back(r.t_ns);
            trel.push_back(r.t_ns - t0);
            device.push_back(trace::device_code_name(r.device));
            category.push_back(mem_category_name(r.category));
            bytes.push_back(r.bytes);
            cat_total.push_back(r.category_total);
            dev_total.push_back(r.device_total);
            label.push_back(r.label);
            alloc_id.push_back(r.alloc_id);
            address.push_back(r.address);
            layer.push_back(r.layer);
            chunk.push_back(r.chunk);
            flags.push_back(r.flags);
        });
        Columns c;
        c.add("id", std::move(id));
        c.add("t_ns", std::move(t));
        c.add("t_rel_ns", std::move(trel));
        c.add("device", device);
        c.add("category", category);
        c.add("bytes", std::move(bytes));
        c.add("category_total", std::move(cat_total));
        c.add("device_total", std::move(dev_total));
        c.add("label", label);
        c.add("alloc_id", std::move(alloc_id));
        c.add("address", std::move(address));
        c.add("layer", std::move(layer));
        c.add("chunk", std::move(chunk));
        c.add("flags", std::move(flags));
        return c.release();
    }

    // Columns of export_tokens_csv: one row per (sample, position); loss NaN where unscored.
    py::dict tokens(int64_t run) {
        std::vector<int64_t> sample, position;
        std::vector<int32_t> token_id;
        std::vector<float> loss;
        std::vector<std::string> piece;
        for (const storage::SampleTokensRow& r : reader_.sample_tokens(run)) {
            for (size_t i = 0; i < r.ids.size(); ++i) {
                sample.push_back(r.sample);
                position.push_back(int64_t(i));
                token_id.push_back(r.ids[i]);
                piece.push_back(i < r.pieces.size() ? r.pieces[i] : std::string());
                loss.push_back(i < r.loss.size() ? r.loss[i] : std::numeric_limits<float>::quiet_NaN());
            }
        }
        Columns c;
        c.add("sample", std::move(sample));
        c.add("position", std::move(position));
        c.add("token_id", std::move(token_id));
        c.add("piece", piece);
        c.add("loss", std::move(loss));
        return c.release();
    }

    // sample_tokens rows without their arrays: one row per evaluated sample.
    py::dict samples(int64_t run) {
        std::vector<int64_t> id, sample, tokens, scored;
        std::vector<double> mean_loss, token_accuracy;
        std::vector<int32_t> correct;
        std::vector<std::string> description;
        for (const storage::SampleTokensRow& r : reader_.sample_tokens(run, 0, false)) {
            id.push_back(r.id);
            sample.push_back(r.sample);
            description.push_back(r.description);
            tokens.push_back(int64_t(r.ids.size()));
            mean_loss.push_back(r.mean_loss);
            scored.push_back(r.scored);
            correct.push_back(r.correct);
            token_accuracy.push_back(r.token_accuracy);
        }
        Columns c;
        c.add("id", std::move(id));
        c.add("sample", std::move(sample));
        c.add("description", description);
        c.add("tokens", std::move(tokens));
        c.add("mean_loss", std::move(mean_loss));
        c.add("scored", std::move(scored));
        c.add("correct", std::move(correct));
        c.add("token_accuracy", std::move(token_accuracy));
        return c.release();
    }

    py::dict logs(int64_t run) {
        std::vector<int64_t> id, t;
        std::vector<int32_t> thread;
        std::vector<std::string> level, text;
        for (const storage::LogRow& r : reader_.logs(run)) {
            id.push_back(r.id);
            t.push_back(r.t_ns);
            level.push_back(r.level);
            thread.push_back(r.thread);
            text.push_back(r.text);
        }
        Columns c;
        c.add("id", std::move(id));
        c.add("t_ns", std::move(t));
        c.add("level", level);
        c.add("thread", std::move(thread));
        c.add("text", text);
        return c.release();
    }

    // cache_steps rows (every layer), the replay log decoded to its plan's shape.
    py::dict cache_steps(int64_t run) {
        std::vector<int64_t> id, t, input_pos, rows, moves, length_after;
        std::vector<int32_t> layer, chunk, pass, num_tokens, cache_length;
        for (const storage::CacheStepRow& r : reader_.cache_steps(run, -1)) {
            SlotPlan p;
            std::string why;
            if (!storage::decode_cache_step(r, p, why))
                throw Error(str("session '", path(), "' run ", run, ": cache step ", r.id, " (layer ", r.layer,
                                ", chunk ", r.chunk, ") has a damaged replay log: ", why));
            id.push_back(r.id);
            layer.push_back(r.layer);
            chunk.push_back(r.chunk);
            pass.push_back(r.pass);
            t.push_back(r.t_ns);
            input_pos.push_back(r.input_pos);
            num_tokens.push_back(r.num_tokens);
            cache_length.push_back(r.cache_length);
            rows.push_back(p.rows);
            moves.push_back(p.moves);
            length_after.push_back(p.length_after);
        }
        Columns c;
        c.add("id", std::move(id));
        c.add("layer", std::move(layer));
        c.add("chunk", std::move(chunk));
        c.add("pass", std::move(pass));
        c.add("t_ns", std::move(t));
        c.add("input_pos", std::move(input_pos));
        c.add("num_tokens", std::move(num_tokens));
        c.add("cache_length", std::move(cache_length));
        c.add("rows", std::move(rows));
        c.add("moves", std::move(moves));
        c.add("length_after", std::move(length_after));
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
        std::vector<int64_t> id, t;
        std::vector<int32_t> layer, chunk, pass, B, G, T;
        std::vector<uint8_t> has_values;
        std::vector<int64_t> count, nonfinite;
        std::vector<float> mn, mx, mean, sd, p10, p50, p90, p99;
        for (const storage::ScoreRow& r : reader_.score_snapshots(run, -1, 0, false)) {
            count.push_back(r.stats.count);
            nonfinite.push_back(r.stats.nonfinite);
            mn.push_back(r.stats.min);
            mx.push_back(r.stats.max);
            mean.push_back(r.stats.mean);
            sd.push_back(r.stats.stddev);
            p10.push_back(r.stats.p10);
            p50.push_back(r.stats.p50);
            p90.push_back(r.stats.p90);
            p99.push_back(r.stats.p99);
            id.push_back(r.id);
            layer.push_back(r.layer);
            chunk.push_back(r.chunk);
            pass.push_back(r.pass);
            t.push_back(r.t_ns);
            B.push_back(r.B);
            G.push_back(r.G);
            T.push_back(r.T);
            has_values.push_back(r.has_values);
        }
        Columns c;
        c.add("id", std::move(id));
        c.add("layer", std::move(layer));
        c.add("chunk", std::move(chunk));
        c.add("pass", std::move(pass));
        c.add("t_ns", std::move(t));
        c.add("B", std::move(B));
        c.add("G", std::move(G));
        c.add("T", std::move(T));
        c.add("count", std::move(count));
        c.add("nonfinite", std::move(nonfinite));
        c.add("min", std::move(mn));
        c.add("max", std::move(mx));
        c.add("mean", std::move(mean));
        c.add("stddev", std::move(sd));
        c.add("p10", std::move(p10));
        c.add("p50", std::move(p50));
        c.add("p90", std::move(p90));
        c.add("p99", std::move(p99));
        c.add("has_values", std::move(has_values));
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
