// `kvlab list policies|buffers|modes|presets`: what this build offers, from the registries
// themselves, for people and for scripts (the GPU kit builds its eval matrix from
// `kvlab list policies --format tsv`, so a new policy joins it without an edit).
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.h"
#include "engine/core/join.h"
#include "engine/core/kv_names.h"
#include "engine/core/run_mode.h"
#include "engine/kv/policies/policy_registry.h"
#include "engine/model/presets.h"

namespace kv::cli {

namespace {

const char* const kLists = "policies, buffers, modes, presets";

// One row per entry: the columns of its list, as text cells.
struct Listing {
    std::vector<std::string> columns;
    std::vector<std::vector<std::string>> rows;
};

Listing list_policies() {
    Listing l{{"name", "buffers", "required", "needs_text", "needs_cache_length", "evicts", "summary"}, {}};
    for (const PolicyInfo& p : policy_registry()) {
        std::vector<std::string> req;
        for (const auto& [k, v] : p.required) req.push_back(k + "=" + v);
        l.rows.push_back({p.name, p.buffers.empty() ? "all" : join(p.buffers, ","), join(req, ";"), p.needs_text ? "1" : "0",
                          p.needs_cache_length ? "1" : "0", p.evicts ? "1" : "0", p.summary});
    }
    return l;
}

Listing list_buffers() {
    Listing l{{"name", "aliases", "bits"}, {}};
    for (const BufferInfo& b : kv_buffer_registry())
        l.rows.push_back({b.name, join(b.aliases, ","), b.bits ? std::to_string(b.bits) : ""});
    return l;
}

Listing list_modes() {
    Listing l{{"name", "kind", "summary"}, {}};
    for (const RunModeInfo& m : run_mode_registry()) {
        const char* kind = m.kind == RunKind::EVALUATE ? "evaluate" : m.kind == RunKind::GENERATE ? "generate" : "train";
        l.rows.push_back({m.name, kind, m.summary});
    }
    return l;
}

Listing list_presets() {
    Listing l{{"name", "description"}, {}};
    for (const PresetInfo& p : kv::list_presets()) l.rows.push_back({p.name, p.description});
    return l;
}

}  // namespace

int cmd_list(int argc, char** argv, int first) {
    auto specs = global_options();
    specs.push_back({"format", OptKind::STRING, "text", "output: text (names), tsv (a header and every column) or json"});
    Args args(argc, argv, first, specs);
    if (args.flag("help")) {
        std::printf("usage: kvlab list %s [--format text|tsv|json]\n\nWhat this build offers, read from its registries.\n\noptions:\n%s",
                    "policies|buffers|modes|presets", format_options(specs).c_str());
        return 0;
    }
    if (args.positional().size() != 1)
        throw UsageError(str("list: expected one list name (", kLists, "); got ", args.positional().size()));
    const std::string what = args.positional()[0];
    Listing l;
    if (what == "policies") l = list_policies();
    else if (what == "buffers") l = list_buffers();
    else if (what == "modes") l = list_modes();
    else if (what == "presets") l = list_presets();
    else throw UsageError(str("list: '", what, "' is not a list; expected one of ", kLists));
    const std::string format = args.str("format", "text");
    if (format == "text") {
        for (const auto& r : l.rows) std::printf("%s\n", r[0].c_str());
    } else if (format == "tsv") {
        std::printf("%s\n", join(l.columns, "\t").c_str());
        for (const auto& r : l.rows) std::printf("%s\n", join(r, "\t").c_str());
    } else if (format == "json") {
        nlohmann::json out = nlohmann::json::array();
        for (const auto& r : l.rows) {
            nlohmann::json o;
            for (size_t c = 0; c < l.columns.size(); ++c) o[l.columns[c]] = r[c];
            out.push_back(o);
        }
        std::printf("%s\n", out.dump(2).c_str());
    } else {
        throw UsageError(str("--format: '", format, "' is not an output format; expected text, tsv or json"));
    }
    return 0;
}

}  // namespace kv::cli
