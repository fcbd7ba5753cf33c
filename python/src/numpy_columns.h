// Columns for pandas: a std::vector handed to NumPy without a copy (the array owns the vector
// through a capsule), strings as Python lists (object columns), and the column dict itself.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <type_traits>
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

// Columns filled row by row from records of one type: each column is declared once, with its
// name, its element type and what it reads from a row, in the order the DataFrame shows them.
//   RowColumns<storage::LogRow> c;
//   c.field("id", &storage::LogRow::id).col<std::string>("level", [](const auto& r) { return r.level; });
//   for (const auto& r : rows) c.append(r);
//   return c.release();
template <class Row>
class RowColumns {
   public:
    template <class T, class Get>
    RowColumns& col(const char* name, Get get) {
        cols_.push_back(std::make_unique<Typed<T, Get>>(name, std::move(get)));
        return *this;
    }
    // A member read as it is stored.
    template <class T>
    RowColumns& field(const char* name, T Row::*member) {
        return col<T>(name, [member](const Row& r) { return r.*member; });
    }
    void append(const Row& r) {
        for (auto& c : cols_) c->append(r);
    }
    py::dict release() {
        Columns out;
        for (auto& c : cols_) c->move_into(out);
        return out.release();
    }

   private:
    struct Column {
        virtual ~Column() = default;
        virtual void append(const Row& r) = 0;
        virtual void move_into(Columns& out) = 0;
    };
    template <class T, class Get>
    struct Typed final : Column {
        Typed(const char* n, Get g) : name(n), get(std::move(g)) {}
        void append(const Row& r) override { values.push_back(T(get(r))); }
        void move_into(Columns& out) override {
            if constexpr (std::is_same_v<T, std::string>) out.add(name, values);
            else out.add(name, std::move(values));
        }
        const char* name;
        Get get;
        std::vector<T> values;
    };
    std::vector<std::unique_ptr<Column>> cols_;
};

}  // namespace kv::python
