// DuoAttention gate files (see duo_gates.h).
#include "engine/kv/policies/duo_gates.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <sstream>

#include "engine/core/error.h"
#include "engine/kv/calibration_file.h"

namespace kv {

namespace {
const CalibrationFormat kFormat{"kvlab-duo-gates", kDuoGatesVersion, "a DuoAttention gate file", "gates", "model, layers, kv_heads, sink, recent",
                                "expected a gate file written by `kvlab calibrate duo` (docs/POLICIES.md#duo)"};
}  // namespace

DuoGates parse_duo_gates(const std::string& text, const std::string& what) {
    CalibrationLines lines(text);
    DuoGates g;
    bool have_layers = false, have_heads = false;
    g.model = read_calibration_header(lines, kFormat, what, [&](const std::string& key, int64_t v) {
        if (key == "layers") g.layers = v, have_layers = true;
        else if (key == "kv_heads") g.kv_heads = v, have_heads = true;
        else if (key == "sink") g.sink = v;
        else if (key == "recent") g.recent = v;
        else return false;
        return true;
    });
    if (!have_layers || !have_heads || g.layers < 1 || g.kv_heads < 1)
        throw Error(str(what, ": 'layers' and 'kv_heads' (>= 1) must come before 'gates'; ", kFormat.expected));
    std::string line;
    std::vector<double> row;
    for (int64_t l = 0; l < g.layers; ++l) {
        if (!lines.next(line))
            throw Error(str(what, " has ", l, " rows of gates; expected ", g.layers, " (one per layer, ", g.kv_heads, " numbers each)"));
        const bool numbers = parse_calibration_row(line, row);
        for (double x : row)
            if (!std::isfinite(x) || x < 0 || x > 1)
                throw Error(str(what, " line ", lines.lineno(), ": gate ", x, " is out of range; expected a number in [0, 1]"));
        if (!numbers || int64_t(row.size()) != g.kv_heads)
            throw Error(str(what, " line ", lines.lineno(), ": '", line.substr(0, 60), "' is not ", g.kv_heads, " numbers in [0, 1] (layer ", l, ")"));
        g.gates.insert(g.gates.end(), row.begin(), row.end());
    }
    expect_calibration_end(lines, what, str(g.layers, " rows of gates"));
    return g;
}

DuoGates read_duo_gates(const std::string& path) {
    return parse_duo_gates(read_calibration_file(path, "--kv_cache.duo_gates", kFormat), str("--kv_cache.duo_gates: '", path, "'"));
}

std::string format_duo_gates(const DuoGates& g) {
    std::ostringstream o;
    o << kFormat.magic << " " << kDuoGatesVersion << "\n";
    o << "# DuoAttention gates (docs/POLICIES.md#duo): one row per layer, one value per KV head;\n";
    o << "# 1 = retrieval head (full cache), 0 = streaming head (sinks + recent window)\n";
    if (!g.model.empty()) o << "model " << g.model << "\n";
    o << "layers " << g.layers << "\nkv_heads " << g.kv_heads << "\nsink " << g.sink << "\nrecent " << g.recent << "\ngates\n";
    o.precision(6);
    for (int64_t l = 0; l < g.layers; ++l) {
        for (int64_t h = 0; h < g.kv_heads; ++h) o << (h ? " " : "") << std::fixed << g.gates[size_t(l * g.kv_heads + h)];
        o << "\n";
    }
    return o.str();
}

void write_duo_gates(const std::string& path, const DuoGates& g) {
    if (int64_t(g.gates.size()) != g.layers * g.kv_heads)
        throw Error(str("duo gates: ", g.gates.size(), " values for ", g.layers, " layers x ", g.kv_heads, " KV heads"));
    write_calibration_file(path, format_duo_gates(g), "gate file");
}

DuoGates duo_gates_for_model(const std::string& option, int64_t layers, int64_t kv_heads) {
    if (option.empty())
        throw Error("--kv_cache.duo_gates is required for policy 'duo'; expected a gate file from `kvlab calibrate duo MODEL -o FILE`");
    DuoGates g;
    if (option.rfind("pattern:", 0) == 0) {
        const std::string bits = option.substr(8);
        if (bits.empty() || bits.find_first_not_of("01") != std::string::npos)
            throw Error(str("--kv_cache.duo_gates: '", option, "' is invalid; expected pattern: followed by 0s and 1s, or a gate file"));
        g.layers = layers, g.kv_heads = kv_heads;
        for (int64_t i = 0; i < layers * kv_heads; ++i) g.gates.push_back(bits[size_t(i) % bits.size()] == '1' ? 1.0 : 0.0);
        return g;
    }
    g = read_duo_gates(option);
    if (g.layers != layers || g.kv_heads != kv_heads)
        throw Error(str("--kv_cache.duo_gates: '", option, "' has gates for ", g.layers, " layers x ", g.kv_heads, " KV heads",
                        g.model.empty() ? "" : str(" (model ", g.model, ")"), "; this model has ", layers, " layers x ", kv_heads,
                        " KV heads"),
                    "calibrate the gates for this model: kvlab calibrate duo MODEL -o FILE");
    return g;
}

std::vector<uint8_t> duo_retrieval_heads(const DuoGates& g, double threshold, double sparsity) {
    const size_t N = g.gates.size();
    std::vector<uint8_t> r(N, 0);
    if (sparsity < 0) {
        for (size_t i = 0; i < N; ++i) r[i] = g.gates[i] >= threshold;
        return r;
    }
    const size_t streaming = std::min(N, size_t(std::llround(sparsity * double(N))));
    std::vector<size_t> order(N);
    std::iota(order.begin(), order.end(), size_t(0));
    // Highest gate first; a tie goes to the earlier head.
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return g.gates[a] > g.gates[b]; });
    for (size_t i = 0; i < N - streaming; ++i) r[order[i]] = 1;
    return r;
}

}  // namespace kv
