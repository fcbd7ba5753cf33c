// `kvlab calibrate NAME MODEL [--data TASK|FILE] [--samples N] [entry options] -o FILE`: runs one
// calibration of engine/kv's table (engine/kv/calibration_registry.h) on synthetic samples or
// windows of a text, with a progress bar. This file knows no calibration by name: the entry brings its options, its
// accepted tasks and what it writes.
#include <cstdio>
#include <string>

#include "commands.h"
#include "engine/core/error.h"
#include "engine/data/synthetic_samples.h"
#include "engine/data/text_windows.h"
#include "engine/kv/calibration_registry.h"
#include "engine/kv/kv_policy.h"
#include "engine/model/model_loader.h"
#include "progress.h"

namespace kv::cli {

namespace {

std::string join(const std::vector<const char*>& xs, const char* sep) {
    std::string s;
    for (const char* x : xs) s += (s.empty() ? "" : sep) + std::string(x);
    return s;
}

std::vector<std::string> split_commas(const std::string& s) {
    std::vector<std::string> out;
    for (size_t a = 0;;) {
        const size_t b = s.find(',', a);
        out.push_back(s.substr(a, b == std::string::npos ? std::string::npos : b - a));
        if (b == std::string::npos) return out;
        a = b + 1;
    }
}

std::string number(double x, CalibrationOption::Kind kind) {
    return kind == CalibrationOption::Kind::INT ? std::to_string((long long)x) : str(x);
}

std::vector<OptionSpec> calibrate_options(const Calibration* c) {
    std::vector<OptionSpec> o;
    if (c) {
        if (c->tasks.empty())
            o.push_back({"data", OptKind::STRING, "", "text file(s) the model reads (required; comma-separated)"});
        else
            o.push_back({"data", OptKind::STRING, c->tasks.front(), "synthetic task of the samples: " + join(c->tasks, ", ")});
        o.push_back({"data.seq_length", OptKind::INT, std::to_string(c->seq_length), "tokens per calibration sample"});
        o.push_back({"samples", OptKind::INT, std::to_string(c->samples), "distinct samples"});
        for (const CalibrationOption& e : c->options)
            o.push_back({e.name, e.kind == CalibrationOption::Kind::INT ? OptKind::INT : OptKind::FLOAT, number(e.def, e.kind), e.help});
        o.push_back({"seed", OptKind::INT, "1234", "seed of the synthetic samples"});
        o.push_back({"output", OptKind::STRING, "", "the file to write (required; also -o PATH)"});
    }
    for (const OptionSpec& g : global_options()) o.push_back(g);
    return o;
}

std::string expected() { return "kvlab calibrate " + calibration_names("|") + " MODEL -o FILE"; }

}  // namespace

int cmd_calibrate(int argc, char** argv, int first) {
    // The entry is the first word; its options are known only once it is.
    const Calibration* c = first < argc && argv[first][0] != '-' ? find_calibration(argv[first]) : nullptr;
    // "-o PATH" is the conventional spelling; the option parser only knows "--name".
    std::vector<std::string> av_s(argv, argv + argc);
    for (size_t i = size_t(first); i < av_s.size(); ++i)
        if (av_s[i] == "-o") av_s[i] = "--output";
    std::vector<char*> av;
    for (auto& s : av_s) av.push_back(s.data());
    Args args(int(av.size()), av.data(), first, calibrate_options(c));
    if (args.flag("help")) {
        if (!c) {
            std::printf("usage: kvlab calibrate NAME MODEL -o FILE [options]\n\ncalibrations (NAME):\n");
            for (const Calibration& e : calibrations()) {
                const std::string d = e.description;
                std::printf("  %-12s %s\n", e.name, d.substr(0, d.find('\n')).c_str());
            }
            std::printf("\n`kvlab calibrate NAME --help` shows one calibration's options.\n");
        } else {
            std::printf("usage: kvlab calibrate %s MODEL -o FILE [options]\n\n%s\n\noptions:\n%s", c->name, c->description,
                        format_options(calibrate_options(c)).c_str());
        }
        return 0;
    }
    apply_global_options(args);
    const auto& pos = args.positional();
    if (!c)
        throw UsageError(str("calibrate: ", pos.empty() ? std::string("missing what to calibrate") : "unknown '" + pos[0] + "'",
                             "; expected: ", expected()));
    const std::string what = str("calibrate ", c->name);
    if (pos.size() < 2) throw UsageError(str(what, ": missing MODEL; expected e.g. kvlab calibrate ", c->name, " tiny -o FILE"));
    if (pos.size() > 2) throw UsageError(str(what, ": unexpected argument '", pos[2], "'; expected one MODEL"));
    const std::string out = args.str("output");
    if (out.empty()) throw UsageError(what + ": -o FILE is required (where to write the result)");
    const bool text = c->tasks.empty();
    const std::string task = args.str("data", text ? "" : c->tasks.front());
    if (text && task.empty())
        throw UsageError(what + ": --data FILE is required (the text the model reads; comma-separated files)");
    bool known = text;
    for (const char* t : c->tasks) known = known || task == t;
    if (!known) throw UsageError(str("--data: '", task, "' is not a task of ", what, "; expected ", join(c->tasks, ", ")));
    const int64_t seq = args.integer("data.seq_length", c->seq_length, 16, 1 << 20);
    const int64_t count = args.integer("samples", c->samples, 1, 100000);
    const uint64_t seed = uint64_t(args.integer("seed", 1234, 0, (1LL << 62)));
    std::vector<std::pair<std::string, double>> values;
    for (const CalibrationOption& e : c->options)
        values.emplace_back(e.name, e.kind == CalibrationOption::Kind::INT
                                        ? double(args.integer(e.name, (long long)e.def, (long long)e.lo, (long long)e.hi))
                                        : args.real(e.name, e.def, e.lo, e.hi));

    LoadedModel lm = load_model(pos[1], ModelOptions{});
    lm.model->set_context_width(seq);
    const std::vector<std::vector<int32_t>> samples = text ? make_text_windows(split_commas(task), *lm.tokenizer, seq, count).windows
                                                           : synthetic_samples(task, seq, count, seed, *lm.tokenizer);
    std::fprintf(stderr, "%s: %s, %lld layers x %lld KV heads, %zu %s samples of %lld tokens\n", what.c_str(), lm.source.c_str(),
                 (long long)lm.config.num_layers, (long long)lm.config.num_kv_heads, samples.size(), text ? "text" : task.c_str(),
                 (long long)seq);
    const Tokenizer& tok = *lm.tokenizer;
    const TextCodec codec{[&tok](const std::vector<int32_t>& v) { return tok.decode(v, true); },
                          [&tok](const std::string& t) { return tok.encode(t, false); }};
    Progress progress(what, stderr, c->unit);
    const CalibrationRun run{*lm.model,
                             pos[1],
                             lm.config.num_layers,
                             lm.config.num_kv_heads,
                             samples,
                             [&](std::string_view name) {
                                 for (const auto& [n, v] : values)
                                     if (n == name) return v;
                                 throw Error(str(what, ": the calibration asked for option '", name, "', which it does not declare"));
                             },
                             [&](int64_t step, int64_t steps, const std::string& status) { progress.update(step, steps, status); },
                             out,
                             &codec};
    const std::string line = c->run(run);
    progress.finish();
    std::printf("wrote %s: %s\n", out.c_str(), line.c_str());
    return 0;
}

}  // namespace kv::cli
