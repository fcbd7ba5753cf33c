// Columns for pandas: a std::vector handed to NumPy without a copy (the array owns the vector
// through a capsule), strings as Python lists (object columns), and the column dict itself.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>
#include <utility>
#include <vector>

namespace kv::python {

namespace py = pybind11;

// The array views v's storage, which now lives as long as the array does.
template <class T>
py::array_t<T> numpy_owning(std::vector<T>&& v, std::vector<py::ssize_t> shape = {}) {
    auto* heap = new std::vector<T>(std::move(v));
    py::capsule owner(heap, [](void* p) { delete static_cast<std::vector<T>*>(p); });
    if (shape.empty()) shape = {py::ssize_t(heap->size())};
    return py::array_t<T>(shape, heap->data(), owner);
}

inline py::list string_column(const std::vector<std::string>& v) {
    py::list out(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
        // Token pieces may be incomplete UTF-8 sequences: replace, as the CSV reader would.
        PyObject* s = PyUnicode_DecodeUTF8(v[i].data(), py::ssize_t(v[i].size()), "replace");
        if (!s) throw py::error_already_set();
        out[i] = py::reinterpret_steal<py::object>(s);
    }
    return out;
}

// Ordered column name -> array / list; kvlab/__init__.py turns it into a DataFrame.
class Columns {
   public:
    template <class T>
    void add(const char* name, std::vector<T>&& v) {
        d_[name] = numpy_owning(std::move(v));
    }
    void add(const char* name, const std::vector<std::string>& v) { d_[name] = string_column(v); }
    py::dict release() { return std::move(d_); }

   private:
    py::dict d_;
};

}  // namespace kv::python
