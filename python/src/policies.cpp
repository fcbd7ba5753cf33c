// kvlab._kvlab.register_policy: a Python class as a KV-cache policy. The engine sees an
// ExternalScorer (engine/kv/policies/policy_runtime.h); this file implements it by calling the class's
// score(f) / update(f) with the GIL held, the features as NumPy views of the engine's own arrays
// (no copies; valid during the call only). A Python exception becomes a kv::Error carrying the
// traceback, so the run fails with it as its error and its log line.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iterator>
#include <thread>
#include <utility>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/kv/policies/policy_runtime.h"
#include "python/src/bindings.h"

namespace kv::python {

namespace py = pybind11;

namespace {

// A view of memory the engine owns: the capsule base keeps NumPy from copying and frees nothing.
template <class T>
py::array_t<T> view(const T* p, std::vector<py::ssize_t> shape, bool writable) {
    py::capsule no_owner(p, [](void*) {});
    py::array_t<T> a(shape, p, no_owner);
    if (!writable) py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
    return a;
}

std::string traceback_text(py::error_already_set& e) {
    try {
        py::list lines = py::module_::import("traceback").attr("format_exception")(e.type(), e.value(), e.trace());
        std::string s;
        for (auto l : lines) s += l.cast<std::string>();
        return s;
    } catch (...) {
        return e.what();
    }
}

class PyScorer final : public ExternalScorer {
   public:
    PyScorer(py::object obj, std::string policy, bool has_update)
        : obj_(std::move(obj)), policy_(std::move(policy)), has_update_(has_update) {}
    ~PyScorer() override {
        py::gil_scoped_acquire gil;  // policies end on the run's worker thread
        obj_ = py::object();
    }

    void score_new(const ExternalFeatures& f, float* out) override {
        py::gil_scoped_acquire gil;
        try {
            py::object r = obj_.attr("score")(features(f, "score"));
            auto a = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(r);
            if (!a || a.size() != f.rows * f.n)
                throw Error(str("policy '", policy_, "': score() returned ", shape_text(r), " at layer ", f.layer,
                                "; expected float scores of shape (", f.rows, ", ", f.n, ") (rows = batch x KV heads, new tokens)"));
            std::memcpy(out, a.data(), sizeof(float) * size_t(f.rows * f.n));
        } catch (py::error_already_set& e) {
            throw Error(str("policy '", policy_, "' raised in score() at layer ", f.layer, ", chunk at position ", f.input_pos, ":\n",
                            traceback_text(e)));
        }
    }

    void update(const ExternalFeatures& f) override {
        if (!has_update_) return;
        py::gil_scoped_acquire gil;
        try {
            py::object r = obj_.attr("update")(features(f, "update"));
            if (r.is_none()) return;  // it wrote f.scores in place
            auto a = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(r);
            if (!a || a.size() != f.rows * f.length)
                throw Error(str("policy '", policy_, "': update() returned ", shape_text(r), " at layer ", f.layer,
                                "; expected None or float scores of shape (", f.rows, ", ", f.length, ") (rows, filled slots)"));
            for (int64_t r0 = 0; r0 < f.rows; ++r0)
                std::memcpy(f.scores + r0 * f.slots, a.data() + r0 * f.length, sizeof(float) * size_t(f.length));
        } catch (py::error_already_set& e) {
            throw Error(str("policy '", policy_, "' raised in update() at layer ", f.layer, ", chunk at position ", f.input_pos, ":\n",
                            traceback_text(e)));
        }
    }

   private:
    static std::string shape_text(const py::object& r) {
        if (py::hasattr(r, "shape")) return "an array of shape " + py::str(r.attr("shape")).cast<std::string>();
        return "a " + py::str(py::type::of(r).attr("__name__")).cast<std::string>();
    }

    py::object features(const ExternalFeatures& f, const char* phase) {
        py::dict d;
        d["phase"] = phase;
        d["layer"] = f.layer;
        d["input_pos"] = f.input_pos;
        d["n"] = f.n;
        d["rows"] = f.rows;
        d["groups"] = f.groups;
        d["slots"] = f.slots;
        d["length"] = f.length;
        auto none = py::none();
        d["key_norm"] = f.key_norm ? py::object(view(f.key_norm, {f.rows, f.n}, false)) : none;
        d["value_norm"] = f.value_norm ? py::object(view(f.value_norm, {f.rows, f.n}, false)) : none;
        d["keys"] = f.keys ? py::object(view(f.keys, {f.rows, f.n, f.head_dim}, false)) : none;
        d["values"] = f.values ? py::object(view(f.values, {f.rows, f.n, f.head_dim}, false)) : none;
        d["queries"] = f.queries ? py::object(view(f.queries, {f.rows / f.groups, f.query_heads, f.n, f.head_dim}, false)) : none;
        d["token_ids"] = f.token_ids ? py::object(view(f.token_ids, {f.rows / f.groups, f.n}, false)) : none;
        d["positions"] = f.positions ? py::object(view(f.positions, {f.rows, f.slots}, false)) : none;
        d["weights"] = f.weights ? py::object(view(f.weights, {f.rows, f.length}, false)) : none;
        d["scores"] = f.scores ? py::object(view(static_cast<const float*>(f.scores), {f.rows, f.slots}, true)) : none;
        return namespace_(**d);
    }

    py::object obj_;
    std::string policy_;
    bool has_update_;
    py::object namespace_ = py::module_::import("types").attr("SimpleNamespace");
};

// factory(layer) -> the Python scorer object of that layer.
void register_policy(const std::string& name, const std::string& summary, const std::vector<std::string>& needs,
                     int64_t attention_window, bool has_update, py::object factory) {
    // The Python names of the features (the fields of f in score_new).
    static constexpr std::pair<const char*, Feature> kFeatures[] = {
        {"key_norm", Feature::KeyNorm}, {"value_norm", Feature::ValueNorm}, {"keys", Feature::KeyVectors},
        {"values", Feature::ValueVectors}, {"queries", Feature::QueryVectors}};
    ExternalNeeds n;
    for (const std::string& s : needs) {
        const auto* it = std::find_if(std::begin(kFeatures), std::end(kFeatures), [&](const auto& e) { return s == e.first; });
        if (it != std::end(kFeatures)) n.features |= it->second;
        else if (s == "token_ids") n.token_ids = true;
        else if (s == "attention") n.attention = true;
        else if (s == "positions" || s == "layer") continue;  // always given
        else
            throw Error(str("policy '", name, "': needs '", s, "' is not a feature; expected some of key_norm, value_norm, keys, values, ",
                            "queries, token_ids, attention, positions, layer"));
    }
    if (attention_window < 0) throw Error(str("policy '", name, "': attention_window ", attention_window, " is negative; expected >= 0 (0: every query)"));
    n.attention_window = attention_window;
    if (n.attention && !has_update)
        throw Error(str("policy '", name, "' needs attention but has no update(f) method; expected one that rescores from f.weights"));
    // An update() without attention rescores every held slot after each chunk from the class's
    // own state (keydiff: every key against the mean key).
    n.rescore = has_update && !n.attention;
    ExternalPolicySpec spec;
    spec.name = name;
    spec.summary = summary;
    spec.needs = n;
    // Every factory ever registered stays alive (a replaced one may still be making a running
    // run's scorers) in a list never freed; the engine's table, a static destroyed after the
    // interpreter, holds a borrowed handle, so its destruction never touches Python.
    static py::list* factories = new py::list();
    factories->append(factory);
    py::handle borrowed = factory;
    spec.make = [borrowed, name, has_update](const PolicyArgs& a) -> std::unique_ptr<ExternalScorer> {
        py::gil_scoped_acquire gil;
        try {
            return std::make_unique<PyScorer>(borrowed(a.layer), name, has_update);
        } catch (py::error_already_set& e) {
            throw Error(str("policy '", name, "': creating its scorer for layer ", a.layer, " raised:\n", traceback_text(e)));
        }
    };
    register_external_policy(std::move(spec));
}

// The boundary's own cost (bench/python_policy_bench.py): `calls` score() calls of `obj` as
// the engine makes them (from another thread, taking the GIL, key norms of rows x n as views),
// in seconds per call.
double time_score_calls(py::object obj, int64_t rows, int64_t n, int64_t calls) {
    std::vector<float> key_norm(size_t(rows * n), 1.0f), out(size_t(rows * n));
    std::vector<int32_t> pos(size_t(rows * n), 0);
    auto scorer = std::make_unique<PyScorer>(std::move(obj), "bench", false);
    ExternalFeatures f;
    f.rows = rows, f.groups = 1, f.n = n, f.slots = n, f.length = n;
    f.key_norm = key_norm.data();
    f.positions = pos.data();
    std::string error;
    double seconds = 0;
    {
        py::gil_scoped_release nogil;
        std::thread t([&] {
            const auto t0 = std::chrono::steady_clock::now();
            try {
                for (int64_t i = 0; i < calls; ++i) scorer->score_new(f, out.data());
            } catch (const std::exception& e) {
                error = e.what();
            }
            seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        });
        t.join();
    }
    if (!error.empty()) throw Error(error);
    return seconds / double(std::max<int64_t>(calls, 1));
}

}  // namespace

void bind_policies(py::module_& m) {
    m.def("_time_score_calls", &time_score_calls, py::arg("scorer"), py::arg("rows"), py::arg("n"), py::arg("calls"));
    m.def("register_policy", &register_policy, py::arg("name"), py::arg("summary"), py::arg("needs"), py::arg("attention_window"),
          py::arg("has_update"), py::arg("factory"));
    m.def("policy_names", [] { return kv_policy_names(); });
    m.def("external_policy_names", &external_policy_names);
}

}  // namespace kv::python
