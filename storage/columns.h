// Column tables: one table per stored record, one entry per column naming it once with its SQL
// type, how the writer binds it from the record and how a reader decodes it into its row type.
// From the table come the CREATE TABLE statement (schema.cpp), the INSERT statement and its
// binding (session_writer.cpp) and the SELECT list and its decoding (session_reader.cpp), so a
// column cannot be added to one and forgotten in another, and the positions ?1..?N / column i
// are never written by hand.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "storage/sqlite_util.h"

namespace kv::storage {

// W: what the writer binds from (a record plus its run id and resolved string ids); R: the row
// type a reader fills. A column the readers do not return has read == nullptr; one the writer
// leaves to SQLite (INTEGER PRIMARY KEY id) has bind == nullptr.
template <class W, class R>
struct Column {
    const char* name;  // as SQL spells it ("\"end\"" for a keyword)
    const char* type;  // as the DDL declares it: "INTEGER", "INTEGER NOT NULL", "REAL", "BLOB"...
    void (*bind)(Stmt& q, int index, const W& w);
    void (*read)(const Stmt& s, int index, R& r);
};

template <class W, class R, size_t N>
struct Table {
    const char* name;
    std::array<Column<W, R>, N> columns;

    // "CREATE TABLE name(\n  a INTEGER, b INTEGER, ...);" (under another name for a migration
    // that rebuilds the table).
    std::string create_sql(const char* as = nullptr) const {
        std::string s = std::string("CREATE TABLE ") + (as ? as : name) + "(\n  ";
        for (size_t i = 0; i < N; ++i) s += std::string(i ? ", " : "") + columns[i].name + " " + columns[i].type;
        return s + ");\n";
    }
    // "INSERT INTO name(a, b, ...) VALUES(?,?,...)" over the columns the writer binds.
    std::string insert_sql() const {
        std::string cols, vals;
        for (const auto& c : columns)
            if (c.bind) {
                cols += std::string(cols.empty() ? "" : ", ") + c.name;
                vals += vals.empty() ? "?" : ",?";
            }
        return std::string("INSERT INTO ") + name + "(" + cols + ") VALUES(" + vals + ")";
    }
    // Binds every writer column of `w` in order (1-based, as insert_sql lists them).
    void bind(Stmt& q, const W& w) const {
        int i = 1;
        for (const auto& c : columns)
            if (c.bind) c.bind(q, i++, w);
    }
    // "a, b, ..." over the columns readers decode (the start of a SELECT).
    std::string select_list() const {
        std::string s;
        for (const auto& c : columns)
            if (c.read) s += std::string(s.empty() ? "" : ", ") + c.name;
        return s;
    }
    // Decodes one row selected with select_list() (first column at `first`); returns the index
    // after the last decoded column, where a query's own extra columns start.
    int read(const Stmt& s, R& r, int first = 0) const {
        int i = first;
        for (const auto& c : columns)
            if (c.read) c.read(s, i++, r);
        return i;
    }
};

template <class W, class R, size_t N>
Table<W, R, N> make_table(const char* name, const Column<W, R> (&cols)[N]) {
    Table<W, R, N> t{name, {}};
    for (size_t i = 0; i < N; ++i) t.columns[i] = cols[i];
    return t;
}

// A table of integer columns written through BatchedInsert (the high-volume event tables): the
// writer fills a row of int64 values instead of binding a statement. A column the writer leaves
// to SQLite has value == nullptr; one the readers do not return has read == nullptr.
template <class W, class R>
struct IntColumn {
    const char* name;
    const char* type;
    int64_t (*value)(const W& w);
    void (*read)(const Stmt& s, int index, R& r);
};

template <class W, class R, size_t N>
struct IntTable {
    const char* name;
    std::array<IntColumn<W, R>, N> columns;
    std::array<int64_t (*)(const W&), N> values{};  // the writer's columns, in order
    int nvalues = 0;

    std::string create_sql() const {
        std::string s = std::string("CREATE TABLE ") + name + "(\n  ";
        for (size_t i = 0; i < N; ++i) s += std::string(i ? ", " : "") + columns[i].name + " " + columns[i].type;
        return s + ");\n";
    }
    // "name(a, b, ...)" over the writer's columns, as BatchedInsert takes it (with nvalues).
    std::string insert_columns() const {
        std::string cols;
        for (const auto& c : columns)
            if (c.value) cols += std::string(cols.empty() ? "" : ", ") + c.name;
        return std::string(name) + "(" + cols + ")";
    }
    // Fills one BatchedInsert row (nvalues slots) from `w`.
    void fill(int64_t* v, const W& w) const {
        for (int i = 0; i < nvalues; ++i) v[i] = values[size_t(i)](w);
    }
    std::string select_list() const {
        std::string s;
        for (const auto& c : columns)
            if (c.read) s += std::string(s.empty() ? "" : ", ") + c.name;
        return s;
    }
    int read(const Stmt& s, R& r, int first = 0) const {
        int i = first;
        for (const auto& c : columns)
            if (c.read) c.read(s, i++, r);
        return i;
    }
};

template <class W, class R, size_t N>
IntTable<W, R, N> make_int_table(const char* name, const IntColumn<W, R> (&cols)[N]) {
    IntTable<W, R, N> t{name, {}, {}, 0};
    for (size_t i = 0; i < N; ++i) {
        t.columns[i] = cols[i];
        if (cols[i].value) t.values[size_t(t.nvalues++)] = cols[i].value;
    }
    return t;
}

}  // namespace kv::storage
