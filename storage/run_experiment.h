// Which runs are the same experiment. A figure or table that puts runs on one line must not
// merge runs whose configurations differ in anything but the line's own axes: two sequence
// lengths, sample counts, chunkings, models or fidelity settings are two experiments. These
// helpers find the configuration fields that tell a set of runs apart and label each run by
// them; repeated runs of one configuration are summarised by their mean and standard error.
// Used by the sweep view, `kvlab plot` and `kvlab sweep`'s tables.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace kv::storage {

// A stored run configuration as dotted fields ("kv_cache.name" -> "h2o-default"), nested or
// flat JSON alike; values as text (strings bare, numbers and booleans as JSON). Empty for
// malformed JSON.
using FlatConfig = std::map<std::string, std::string>;
FlatConfig flat_run_config(const std::string& config_json);

// Whether a field can change what a run measures. Not: the run's name, output folder or
// resume path, and the telemetry settings (what is recorded, not what is measured).
bool is_experiment_field(const std::string& dotted);

// The experiment fields whose values differ among `configs` (a field absent from some reads
// as ""), sorted, leaving out `axes` -- the fields a figure already shows (its x, its lines,
// its panels) -- and every field under one of them ("data" leaves out "data.seq_length"), and
// with kv_cache.cache_length its companion kv_cache.prefill_length.
std::vector<std::string> differing_fields(const std::vector<FlatConfig>& configs, const std::vector<std::string>& axes);

// "data.seq_length=1024, fidelity=true": the values of `fields` in `config`; "" for none.
std::string experiment_label(const FlatConfig& config, const std::vector<std::string>& fields);

// Mean and standard error of the mean of repeated runs (sample standard deviation over
// sqrt(n); 0 for a single run).
struct MeanSe {
    double mean = 0, se = 0;
    int n = 0;
};
MeanSe mean_and_se(const std::vector<double>& values);

}  // namespace kv::storage
