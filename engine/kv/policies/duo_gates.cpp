// DuoAttention gate files (see duo_gates.h).
#include "engine/kv/policies/duo_gates.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <sstream>

#include "engine/core/error.h"
#include "engine/kv/calibration_file.h"

namespace kv {

namespace {
constexpr const char* kMagic = "kvlab-duo-gates";
constexpr const char* kExpected = "expected a gate file written by `kvlab calibrate duo` (docs/POLICIES.md#duo)";
}  // namespace

DuoGates parse_duo_gates(const std::string& text, const std::string& what) {
    CalibrationLines lines(text);
    std::string line;
    auto next = [&](std::string& out) { return lines.next(out); };
    if (!next(line)) throw Error(str(what, " is empty; ", kExpected));
    {
        std::istringstream h(line);
        std::string magic;
        int version = 0;
        if (!(h >> magic >> version) || magic != kMagic)
            throw Error(str(what, " is not a DuoAttention gate file (first line '", line.substr(0, 60), "'; expected '", kMagic, " ",
                            kDuoGatesVersion, "'); ", kExpected));
        if (version != kDuoGatesVersion)
            throw Error(str(what, " has gate file version ", version, "; this kvlab reads version ", kDuoGatesVersion));
    }
    DuoGates g;
    bool have_layers = false, have_heads = false;
    for (;;) {
        if (!next(line)) throw Error(str(what, " ends before its 'gates' line; ", kExpected));
        if (line == "gates") break;
        std::istringstream kvs(line);
        std::string key;
        kvs >> key;
        if (key == "model") {
            std::getline(kvs >> std::ws, g.model);
            continue;
        }
        int64_t v = -1;
        if (!(kvs >> v) || v < 0) throw Error(str(what, " line ", lines.lineno(), ": '", line, "' needs a whole number >= 0"));
        if (key == "layers") g.layers = v, have_layers = true;
        else if (key == "kv_heads") g.kv_heads = v, have_heads = true;
        else if (key == "sink") g.sink = v;
        else if (key == "recent") g.recent = v;
        else throw Error(str(what, " line ", lines.lineno(), ": unknown key '", key, "'; expected model, layers, kv_heads, sink, recent or gates"));
    }
    if (!have_layers || !have_heads || g.layers < 1 || g.kv_heads < 1)
        throw Error(str(what, ": 'layers' and 'kv_heads' (>= 1) must come before 'gates'; ", kExpected));
    for (int64_t l = 0; l < g.layers; ++l) {
        if (!next(line))
            throw Error(str(what, " has ", l, " rows of gates; expected ", g.layers, " (one per layer, ", g.kv_heads, " numbers each)"));
        std::istringstream row(line);
        double x;
        int64_t k = 0;
        while (row >> x) {
            if (!std::isfinite(x) || x < 0 || x > 1)
                throw Error(str(what, " line ", lines.lineno(), ": gate ", x, " is out of range; expected a number in [0, 1]"));
            g.gates.push_back(x);
            ++k;
        }
        if (!row.eof() || k != g.kv_heads)
            throw Error(str(what, " line ", lines.lineno(), ": '", line.substr(0, 60), "' is not ", g.kv_heads, " numbers in [0, 1] (layer ", l, ")"));
    }
    if (next(line)) throw Error(str(what, " line ", lines.lineno(), ": unexpected '", line.substr(0, 60), "' after ", g.layers, " rows of gates"));
    return g;
}

DuoGates read_duo_gates(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Error(str("--kv_cache.duo_gates: cannot read '", path, "'; ", kExpected));
    std::ostringstream ss;
    ss << f.rdbuf();
    return parse_duo_gates(ss.str(), str("--kv_cache.duo_gates: '", path, "'"));
}

std::string format_duo_gates(const DuoGates& g) {
    std::ostringstream o;
    o << kMagic << " " << kDuoGatesVersion << "\n";
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
    const std::string tmp = path + ".tmp";
    {
        std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
        f << format_duo_gates(g);
        if (!f.flush()) throw Error(str("cannot write the gate file '", path, "'"));
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) throw Error(str("cannot write the gate file '", path, "'"));
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
