// The library of named queries behind `kvlab sql SESSION NAME`: each is SQL text over the
// session's tables (docs/SESSIONS.md, "Named queries": a stable interface, usable from any
// SQLite client) with named parameters, a one-line description and the parameters it needs.
// Only the registry lives here; running them is sql_query.h.
#pragma once

#include <string>
#include <vector>

namespace kv::storage {

struct NamedQueryParam {
    std::string name;  // bound as :name
    bool required = false;
    std::string help;
};

struct NamedQuery {
    std::string name;
    std::string description;  // one line
    std::vector<NamedQueryParam> params;
    std::string sql;
};

// Every named query, in the order `kvlab sql --list` prints them.
const std::vector<NamedQuery>& named_queries();
// nullptr when there is none of that name.
const NamedQuery* find_named_query(const std::string& name);

}  // namespace kv::storage
