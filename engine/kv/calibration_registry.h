// What `kvlab calibrate NAME MODEL -o FILE` can calibrate: one entry per calibration (a policy's
// gates, filters or scales learned from the model's own activations), owned by engine/kv so that
// the command line never names a policy. The CLI loads the model, makes the samples (the entry
// says which synthetic tasks it accepts), parses the entry's options, shows progress, and calls
// `run`, which writes the file and returns the line the command prints. Adding a calibration is
// one entry in calibration_registry.cpp and its run function beside the calibration's math.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/model/transformer.h"

namespace kv {

struct TextCodec;

struct CalibrationOption {
    enum class Kind { INT, REAL };
    const char* name;  // spelled --NAME on the command line
    Kind kind;
    double def, lo, hi;  // default and accepted range (inclusive)
    const char* help;
};

// Everything a calibration reads; the option values are parsed and range-checked already.
struct CalibrationRun {
    Transformer& model;  // a calibration may set its context width (positions past the samples)
    const std::string& model_name;  // as given on the command line (recorded in the file)
    int64_t layers = 0, kv_heads = 0;
    const std::vector<std::vector<int32_t>>& samples;  // token ids
    std::function<double(std::string_view)> option;  // the value of one of the entry's options
    std::function<void(int64_t step, int64_t steps, const std::string& status)> progress;
    std::string output;  // the file to write
    const TextCodec* text = nullptr;  // the model's tokenizer (prompts a calibration encodes)
};

struct Calibration {
    const char* name;
    const char* description;  // a paragraph for --help: what is learned, and which run reads the file
    const char* unit;         // what the progress bar counts ("steps", "windows")
    // Where the samples come from: synthetic tasks named by --data (the first is the default),
    // or, with no tasks, windows of text files given as --data FILE[,FILE...] (required).
    std::vector<const char*> tasks;
    int64_t seq_length = 1024, samples = 8;  // defaults of --data.seq_length and --samples
    std::vector<CalibrationOption> options;
    std::string (*run)(const CalibrationRun&);  // writes run.output; returns the summary line
};

const std::vector<Calibration>& calibrations();
const Calibration* find_calibration(std::string_view name);  // nullptr when none has the name
std::string calibration_names(const char* separator);        // "duo|..." for messages

}  // namespace kv
