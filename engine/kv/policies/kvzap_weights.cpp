// KVzap surrogate files (see kvzap_weights.h).
#include "engine/kv/policies/kvzap_weights.h"

#include <cmath>
#include <cstdio>
#include <sstream>

#include "engine/core/error.h"
#include "engine/kv/calibration_file.h"

namespace kv {

namespace {
const CalibrationFormat kFormat{"kvlab-kvzap", kKVzapVersion, "a KVzap surrogate file", "weights",
                                "model, layers, kv_heads, hidden_size, tokens",
                                "expected a surrogate file written by `kvlab calibrate kvzap` (docs/POLICIES.md#kvzap)"};
constexpr const char* kMake = "calibrate the surrogate for this model: kvlab calibrate kvzap MODEL --data FILE -o FILE";

uint64_t mix(uint64_t x) {  // splitmix64's finalizer: a counter hash, the same on every platform
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
}  // namespace

KVzapWeights parse_kvzap_weights(const std::string& text, const std::string& what) {
    CalibrationLines lines(text);
    KVzapWeights w;
    w.model = read_calibration_header(lines, kFormat, what, [&](const std::string& key, int64_t v) {
        if (key == "layers") w.layers = v;
        else if (key == "kv_heads") w.kv_heads = v;
        else if (key == "hidden_size") w.hidden_size = v;
        else if (key == "tokens") w.tokens = v;
        else return false;
        return true;
    });
    if (w.layers < 1 || w.kv_heads < 1 || w.hidden_size < 1)
        throw Error(str(what, ": 'layers', 'kv_heads' and 'hidden_size' (>= 1) must come before 'weights'; ", kFormat.expected));
    const int64_t E = w.hidden_size;
    std::string line;
    std::vector<double> row;
    for (int64_t r = 0; r < w.layers * w.kv_heads; ++r) {
        if (!lines.next(line))
            throw Error(str(what, " has ", r, " rows; expected ", w.layers * w.kv_heads, " (layers x kv_heads rows of ", E + 1,
                            " numbers: the weights, then the bias)"));
        if (!parse_calibration_row(line, row) || int64_t(row.size()) != E + 1)
            throw Error(str(what, " line ", lines.lineno(), ": '", line.substr(0, 60), "...' is not ", E + 1, " numbers (layer ",
                            r / w.kv_heads, ", KV head ", r % w.kv_heads, ": ", E, " weights and a bias)"));
        for (double x : row)
            if (!std::isfinite(x)) throw Error(str(what, " line ", lines.lineno(), ": a weight is not finite"));
        w.w.insert(w.w.end(), row.begin(), row.end());
    }
    expect_calibration_end(lines, what, str(w.layers * w.kv_heads, " rows"));
    return w;
}

KVzapWeights read_kvzap_weights(const std::string& path) {
    return parse_kvzap_weights(read_calibration_file(path, "--kv_cache.kvzap", kFormat), str("--kv_cache.kvzap: '", path, "'"));
}

std::string format_kvzap_weights(const KVzapWeights& w) {
    std::ostringstream o;
    o << kFormat.magic << " " << kKVzapVersion << "\n";
    o << "# KVzap surrogate (docs/POLICIES.md#kvzap): one row per (layer, KV head), the weights w then the bias b of\n";
    o << "# pred = w . h + b, h the layer's attention input; pred estimates log(KVzip score); low is evicted first\n";
    if (!w.model.empty()) o << "model " << w.model << "\n";
    o << "layers " << w.layers << "\nkv_heads " << w.kv_heads << "\nhidden_size " << w.hidden_size << "\ntokens " << w.tokens
      << "\nweights\n";
    char buf[40];
    const int64_t C = w.hidden_size + 1;
    for (int64_t r = 0; r < w.layers * w.kv_heads; ++r) {
        for (int64_t d = 0; d < C; ++d) {
            std::snprintf(buf, sizeof buf, "%s%.17g", d ? " " : "", w.w[size_t(r * C + d)]);
            o << buf;
        }
        o << "\n";
    }
    return o.str();
}

void write_kvzap_weights(const std::string& path, const KVzapWeights& w) {
    if (int64_t(w.w.size()) != w.layers * w.kv_heads * (w.hidden_size + 1))
        throw Error(str("kvzap: ", w.w.size(), " values for ", w.layers, " layers x ", w.kv_heads, " KV heads x ", w.hidden_size + 1));
    write_calibration_file(path, format_kvzap_weights(w), "surrogate file");
}

KVzapWeights kvzap_weights_for_model(const std::string& option, int64_t layers, int64_t kv_heads) {
    if (option.empty())
        throw Error("--kv_cache.kvzap is required for policy 'kvzap'; expected a surrogate file from `kvlab calibrate kvzap MODEL --data FILE -o FILE`");
    KVzapWeights w;
    if (option.rfind("seed:", 0) == 0) {
        const std::string c = option.substr(5);
        if (c.empty() || c.find_first_not_of("0123456789") != std::string::npos || c.size() > 18)
            throw Error(str("--kv_cache.kvzap: '", option, "' is invalid; expected seed: followed by a whole number, or a surrogate file"));
        w.layers = layers, w.kv_heads = kv_heads, w.seed = std::stoll(c);
        return w;
    }
    w = read_kvzap_weights(option);
    if (w.layers != layers || w.kv_heads != kv_heads)
        throw Error(str("--kv_cache.kvzap: '", option, "' has a surrogate for ", w.layers, " layers x ", w.kv_heads, " KV heads",
                        w.model.empty() ? "" : str(" (model ", w.model, ")"), "; this model has ", layers, " layers x ", kv_heads, " KV heads"),
                    kMake);
    return w;
}

std::vector<double> seeded_kvzap_row(int64_t seed, int64_t layer, int64_t head, int64_t E) {
    std::vector<double> r(size_t(E + 1), 0.0);
    const double scale = 1.0 / std::sqrt(double(E));
    const uint64_t base = mix(mix(mix(uint64_t(seed)) ^ uint64_t(layer)) ^ uint64_t(head));
    for (int64_t i = 0; i < E; ++i) r[size_t(i)] = (double(mix(base ^ uint64_t(i)) >> 11) * 0x1.0p-53 * 2.0 - 1.0) * scale;
    return r;
}

}  // namespace kv
