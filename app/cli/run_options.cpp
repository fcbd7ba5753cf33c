// Run options on the command line (see run_options.h).
#include "run_options.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "commands.h"
#include "engine/core/run_mode.h"
#include "engine/model/presets.h"
#include "engine/core/error.h"

namespace kv::cli {

std::vector<OptionSpec> run_option_specs() {
    std::vector<OptionSpec> specs = global_options();
    specs.push_back({"config", OptKind::STRING, "", "read run options from this JSON file first"});
    specs.push_back({"session", OptKind::STRING, "", "record the run into this session file"});
    specs.push_back({"format", OptKind::STRING, "text", "stdout: text, or json (the run's summary as stored, full precision)"});
    specs.push_back({"kv_cache.policy_file", OptKind::STRING, "",
                     "a Python file defining one policy class (docs/PYTHON.md): registered as its POLICY_NAME or file stem "
                     "before the options are read, then named in --kv_cache.name like any policy"});
    RunConfig defaults;
    for (const auto& o : run_options()) {
        if (o.name == "mode" || o.name == "model") continue;
        OptKind k = o.type == OptionType::INT ? OptKind::INT : o.type == OptionType::FLOAT ? OptKind::FLOAT
                    : o.type == OptionType::BOOL ? OptKind::STRING : OptKind::STRING;
        specs.push_back({o.name, k, o.get(defaults), o.help});
    }
    return specs;
}

RunConfig run_config_from_args(const Args& args, const std::string& mode) {
    RunConfig cfg;
    try {
        if (args.has("config")) {
            std::ifstream in(args.str("config"));
            if (!in) throw Error(str("--config: cannot read '", args.str("config"), "'; expected a JSON file of run options"));
            std::stringstream ss;
            ss << in.rdbuf();
            cfg = run_config_from_json(ss.str(), args.str("config"));
        }
        cfg.mode = mode;
        if (!args.positional().empty()) cfg.model = args.positional()[0];
        for (const auto& o : run_options())
            if (args.has(o.name)) o.set(cfg, args.str(o.name));
        if (args.has("threads")) cfg.threads = args.integer("threads", 0, 0, 1024);
        if (args.has("device")) cfg.device = args.str("device");
        if (args.has("memory.budget")) cfg.memory_budget = args.str("memory.budget");
    } catch (const Error& e) {
        throw UsageError(e.what());
    }
    if (args.positional().size() > 1)
        throw UsageError(str(mode, ": unexpected argument '", args.positional()[1], "'; options start with --"));
    auto problems = run_config_problems(cfg);
    if (!problems.empty()) throw UsageError(problems.front());
    return cfg;
}

bool run_option_applies(const std::string& mode, const std::string& group, const std::string& name) {
    const RunModeInfo* info = find_run_mode(mode);
    const bool generation = info && info->kind == RunKind::GENERATE;
    const bool training = info && info->kind == RunKind::TRAIN;
    if (group == "generation") return generation;
    // Evaluation and generation run no backward pass: gradient and optimizer options do nothing,
    // except the cell size, which also tiles an evaluation's cell grid.
    if (group == "gradient") return training || (!generation && name == "grad.chunks_per_cell_multiplier");
    if (group == "training") return training;
    if (group == "distributed") return training;  // eval/generate runs are one process (sweeps spread cells instead)
    if (group == "data") return !generation && (training || name != "data.val_split_fraction");
    return true;
}

void print_run_help(const std::string& mode) {
    std::printf("usage: kvlab %s MODEL [--dotted.options ...] [--config run.json] [--session FILE]\n\n", mode.c_str());
    std::string presets;
    for (const PresetInfo& p : list_presets()) presets += p.name + ", ";
    std::printf("MODEL: a preset (%ssmollm2-135m),\n", presets.c_str());
    std::printf("       a Hugging Face model folder, a repo id in the local Hugging Face cache (org/name[@revision]),\n");
    std::printf("       or a .gguf file\n\noptions (default in parentheses):\n");
    std::string group;
    RunConfig defaults;
    // Per group: options listed and left out (a wholly left-out group is named as a group).
    std::vector<std::string> groups;
    std::map<std::string, std::pair<int, std::vector<std::string>>> kept_dropped;
    for (const auto& o : run_options()) {
        if (o.name == "mode" || o.name == "model") continue;
        if (std::find(groups.begin(), groups.end(), o.group) == groups.end()) groups.push_back(o.group);
        auto& kd = kept_dropped[o.group];
        if (!run_option_applies(mode, o.group, o.name)) {
            kd.second.push_back("--" + o.name);
            continue;
        }
        ++kd.first;
        if (o.group != group) {
            group = o.group;
            std::printf("\n[%s]\n", group.c_str());
        }
        std::string left = "  --" + o.name;
        if (left.size() < 36) left.resize(36, ' ');
        std::string def = o.get(defaults);
        std::printf("%s%s%s\n", left.c_str(), o.help.c_str(), def.empty() ? "" : (" (" + def + ")").c_str());
    }
    std::string left_out;
    int n_left_out = 0;
    for (const auto& g : groups) {
        const auto& [kept, dropped] = kept_dropped[g];
        n_left_out += int(dropped.size());
        if (dropped.empty()) continue;
        if (!left_out.empty()) left_out += ", ";
        if (kept == 0) {
            left_out += "all " + g + " options";
        } else {
            for (size_t i = 0; i < dropped.size(); ++i) left_out += (i ? ", " : "") + dropped[i];
        }
    }
    if (n_left_out > 0)
        std::printf("\nnot listed: %d options that do nothing in %s (%s)\n", n_left_out, mode.c_str(), left_out.c_str());
    std::printf("\ncommand options:\n");
    for (const auto& o : run_option_specs())
        if (o.name == "config" || o.name == "session" || o.name == "format") {
            std::string left = "  --" + o.name;
            if (left.size() < 36) left.resize(36, ' ');
            std::printf("%s%s%s\n", left.c_str(), o.help.c_str(), o.def.empty() ? "" : (" (" + o.def + ")").c_str());
        }
    std::printf("\nglobal options:\n%s", format_options(global_options()).c_str());
}

}  // namespace kv::cli
