// A sweep: run options given as comma lists span a grid of run configurations (every
// combination), plus one dense reference per data configuration. Built on the run option table
// (engine/run/run_config.h), so every option can be an axis, plus two sweep-only axes:
//   kv_cache.buffer  the buffer of every cache name ("h2o" + "q8" -> h2o-q8; lastrec-q4 -> lastrec-q8);
//                    without it, policy names without a buffer get "default"
//   kv_cache.ratio   cache length as a fraction of data.seq_length (instead of cache_length)
// A cell's identity is its configuration without what cannot change its results (run name,
// threads, telemetry), so a sweep finds the cells a session already holds and skips them.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/run/run_config.h"

namespace kv::sessions {

struct SweepAxis {
    std::string option;               // dotted name, e.g. kv_cache.cache_length
    std::vector<std::string> values;  // in the order given
};

struct SweepSpec {
    RunConfig base;                // every option given once (and the defaults)
    std::vector<SweepAxis> axes;   // options given as comma lists, in command-line order
    bool add_reference = true;     // one dense run per data configuration
};

struct SweepCell {
    RunConfig cfg;                                 // complete, validated
    std::map<std::string, std::string> coords;     // axis option -> value of this cell
    bool reference = false;                        // the dense reference of its data configuration
    std::string reference_key;                     // cells with equal keys share one reference
    std::string identity;                          // sweep_identity(cfg)
};

// The sweep-only axes (not in the run option table).
bool is_sweep_only_option(const std::string& name);
// Options whose value decides the cache, not the data: they do not split the dense reference.
bool is_cache_option(const std::string& name);

// `options`: (name, value) in command-line order; a value with a comma makes an axis, except
// for list-valued options (data.files, data.depths, stop), whose commas separate one value.
// Throws kv::Error naming the option for bad values or a single-valued axis.
SweepSpec make_sweep_spec(const RunConfig& base, const std::vector<std::pair<std::string, std::string>>& options);

// Every cell: for each data configuration its dense reference first, then the grid cells in
// row-major order of the axes. A dense policy in the grid becomes (is merged with) the
// reference. Throws kv::Error with the cell and the problem when a cell is not a valid run.
std::vector<SweepCell> expand_sweep(const SweepSpec& spec);

// Canonical JSON of what decides a run's results.
std::string sweep_identity(const RunConfig& cfg);

// "h2o-default L=256" plus the non-cache axes that vary ("data.seq_length=1024").
std::string sweep_cell_name(const SweepCell& cell, const std::vector<SweepAxis>& axes);

}  // namespace kv::sessions
