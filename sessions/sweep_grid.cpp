// Sweep grids (see sweep_grid.h).
#include "sweep_grid.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>

#include "engine/core/error.h"
#include "engine/core/split.h"

namespace kv::sessions {

namespace {

// Options whose commas are part of one value.
bool is_list_valued(const std::string& name) {
    const OptionDef* o = find_run_option(name);
    return name == "lora.targets" || (o && o->type == OptionType::LIST);
}

double parse_ratio(const std::string& v) {
    char* end = nullptr;
    errno = 0;
    const double r = std::strtod(v.c_str(), &end);
    if (v.empty() || *end || errno == ERANGE || !(r > 0 && r <= 1))
        throw Error(str("--kv_cache.ratio: '", v, "' is not a fraction; expected a number in (0, 1], e.g. 0.25"));
    return r;
}

bool is_policy_name(const std::string& s) {
    const auto& p = kv_policy_names();
    return std::find(p.begin(), p.end(), s) != p.end();
}

// Applies one (option, value) to the cell under construction; sweep-only options are kept
// aside and resolved by finish_cell once every option is known.
struct CellBuilder {
    RunConfig cfg;
    std::string buffer;  // kv_cache.buffer ("" = not given)
    std::string ratio;   // kv_cache.ratio ("" = not given)
    bool cache_length_given = false;

    void apply(const std::string& name, const std::string& value) {
        if (name == "kv_cache.buffer") {
            buffer = value;
        } else if (name == "kv_cache.ratio") {
            parse_ratio(value);
            ratio = value;
        } else if (name == "kv_cache.name" && is_policy_name(value)) {
            cfg.kv_cache.name = CacheName{value, "default"}.text();  // the buffer is joined in finish()
        } else {
            set_run_option(cfg, name, value);
            if (name == "kv_cache.cache_length") cache_length_given = true;
        }
    }

    void finish() {
        if (!buffer.empty()) {
            cfg.kv_cache.name = parse_kv_cache_name(CacheName{cfg.kv_cache.policy(), buffer}.text()).text();  // an alias too
        }
        if (!ratio.empty()) {
            if (cache_length_given)
                throw Error("--kv_cache.ratio and --kv_cache.cache_length both set the cache size; expected one of them");
            cfg.kv_cache.cache_length = std::max<int64_t>(1, std::llround(parse_ratio(ratio) * double(cfg.data.seq_length)));
        }
        if (cfg.kv_cache.policy() == "dense") cfg.kv_cache.cache_length = 0;  // dense holds the whole sequence
    }
};

}  // namespace

bool is_sweep_only_option(const std::string& name) { return name == "kv_cache.buffer" || name == "kv_cache.ratio"; }

bool is_cache_option(const std::string& name) {
    if (is_sweep_only_option(name)) return true;
    const OptionDef* o = find_run_option(name);
    return o && o->group == "cache";
}

SweepSpec make_sweep_spec(const RunConfig& base, const std::vector<std::pair<std::string, std::string>>& options) {
    SweepSpec spec;
    spec.base = base;
    for (const auto& [name, value] : options) {
        if (!is_sweep_only_option(name) && !find_run_option(name)) throw Error(str("unknown option --", name));
        const bool axis = value.find(',') != std::string::npos && !is_list_valued(name);
        for (const auto& a : spec.axes)
            if (a.option == name) throw Error(str("--", name, " is given twice; expected one comma list"));
        SweepAxis ax{name, axis ? split(value) : std::vector<std::string>{value}};
        for (const auto& v : ax.values) {
            if (v.empty()) throw Error(str("--", name, ": '", value, "' has an empty item; expected values separated by single commas"));
            // Check each value now, so a typo fails before anything runs.
            CellBuilder probe;
            probe.cfg = base;
            probe.apply(name, v);
        }
        for (size_t i = 0; i < ax.values.size(); ++i)
            for (size_t j = 0; j < i; ++j)
                if (ax.values[i] == ax.values[j]) throw Error(str("--", name, ": '", ax.values[i], "' appears twice in '", value, "'"));
        spec.axes.push_back(std::move(ax));
    }
    return spec;
}

std::string sweep_identity(const RunConfig& cfg) {
    nlohmann::json j = nlohmann::json::parse(run_config_to_json(cfg, false));
    j.erase("name");
    j.erase("telemetry");
    j.erase("dist");  // an eval cell's results do not depend on which rank ran it
    return j.dump();
}

std::string sweep_cell_name(const SweepCell& cell, const std::vector<SweepAxis>& axes) {
    std::string n = cell.cfg.kv_cache.name;
    if (cell.cfg.kv_cache.cache_length > 0) n += str(" L=", cell.cfg.kv_cache.cache_length);
    for (const auto& a : axes)
        if (a.values.size() > 1 && !is_cache_option(a.option) && cell.coords.count(a.option))
            n += str(" ", a.option, "=", cell.coords.at(a.option));
    return n;
}

std::vector<SweepCell> expand_sweep(const SweepSpec& spec) {
    std::vector<const SweepAxis*> data_axes, cache_axes;
    for (const auto& a : spec.axes) (is_cache_option(a.option) ? cache_axes : data_axes).push_back(&a);

    // Row-major walk over a list of axes.
    auto walk = [](const std::vector<const SweepAxis*>& axes, const std::function<void(const std::vector<size_t>&)>& f) {
        std::vector<size_t> idx(axes.size(), 0);
        while (true) {
            f(idx);
            size_t k = axes.size();
            while (k > 0) {
                if (++idx[k - 1] < axes[k - 1]->values.size()) break;
                idx[k - 1] = 0;
                --k;
            }
            if (k == 0) return;
        }
    };

    std::vector<SweepCell> cells;
    std::vector<std::string> seen;
    auto add = [&](SweepCell c) {
        c.identity = sweep_identity(c.cfg);
        if (std::find(seen.begin(), seen.end(), c.identity) != seen.end()) return;
        const std::string name = sweep_cell_name(c, spec.axes);
        auto problems = run_config_problems(c.cfg);
        if (!problems.empty()) throw Error(str("sweep cell '", name, "': ", problems.front()));
        c.cfg.name = name;
        seen.push_back(c.identity);
        cells.push_back(std::move(c));
    };

    walk(data_axes, [&](const std::vector<size_t>& di) {
        std::string key;
        std::map<std::string, std::string> data_coords;
        for (size_t i = 0; i < data_axes.size(); ++i) {
            data_coords[data_axes[i]->option] = data_axes[i]->values[di[i]];
            key += data_axes[i]->option + "=" + data_axes[i]->values[di[i]] + ";";
        }
        auto build = [&](const std::vector<size_t>& ci, bool with_cache) {
            CellBuilder b;
            b.cfg = spec.base;
            SweepCell c;
            c.reference_key = key;
            c.coords = data_coords;
            for (const auto& a : spec.axes)  // single values (and data axes) in command-line order
                if (!is_cache_option(a.option) || with_cache || a.values.size() == 1) {
                    if (a.values.size() == 1) b.apply(a.option, a.values[0]);
                    else if (!is_cache_option(a.option)) b.apply(a.option, data_coords.at(a.option));
                }
            if (with_cache)
                for (size_t i = 0; i < cache_axes.size(); ++i) {
                    c.coords[cache_axes[i]->option] = cache_axes[i]->values[ci[i]];
                    b.apply(cache_axes[i]->option, cache_axes[i]->values[ci[i]]);
                }
            if (!with_cache) {
                b.cfg.kv_cache.name = "dense-default";
                b.buffer.clear();
                b.ratio.clear();
                b.cache_length_given = false;
                b.cfg.kv_cache.head_ratios.clear();  // per-head budgets (lukv-*): the reference keeps every slot
                // compress-then-ask's budgets are the compared runs' (one value is applied to every
                // cell above): the reference is the uncompressed context
                b.cfg.protocol.compression_ratio = 0.0;
                b.cfg.protocol.keep_tokens = 0;
                b.cfg.protocol.decode_ratio = 0.0;
                b.cfg.protocol.decode_rescore_every = 0;
                b.cfg.protocol.score_threshold.clear();
                b.cfg.protocol.threshold_window = 0;
                b.cfg.protocol.threshold_decode = false;
            }
            try {
                b.finish();
            } catch (const Error& e) {
                throw Error(str("sweep cell ", key, ": ", e.what()));
            }
            c.cfg = b.cfg;
            c.reference = !with_cache;
            return c;
        };
        const size_t first = cells.size();
        if (spec.add_reference) add(build({}, false));
        walk(cache_axes, [&](const std::vector<size_t>& ci) { add(build(ci, true)); });
        // The dense reference steps through the sequence in the compared runs' chunks: its first
        // chunk is the smallest of their cache lengths (theirs is their cache length), unless
        // the sweep sets the prefill itself. Its speed and per-chunk numbers then compare step
        // for step; alone it would take the whole sequence in one step.
        if (spec.add_reference && first < cells.size() && cells[first].reference && cells[first].cfg.driver.prefill_length == 0) {
            int64_t smallest = 0;
            for (size_t i = first + 1; i < cells.size(); ++i) {
                const int64_t L = cells[i].cfg.kv_cache.cache_length;
                if (L > 0 && L < cells[first].cfg.data.seq_length && (smallest == 0 || L < smallest)) smallest = L;
            }
            if (smallest > 0) {
                SweepCell& ref = cells[first];
                seen.erase(std::find(seen.begin(), seen.end(), ref.identity));
                ref.cfg.driver.prefill_length = smallest;
                ref.identity = sweep_identity(ref.cfg);
                seen.push_back(ref.identity);
            }
        }
    });
    return cells;
}

}  // namespace kv::sessions
