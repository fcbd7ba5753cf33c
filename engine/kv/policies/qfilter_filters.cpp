// Q-Filter files and the filter of one head (see qfilter_filters.h).
#include "engine/kv/policies/qfilter_filters.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "engine/core/error.h"
#include "engine/kv/calibration_file.h"

namespace kv {

namespace {
const CalibrationFormat kFormat{"kvlab-qfilter", kQFilterVersion, "a Q-Filter file", "filters", "model, layers, kv_heads, head_dim, tokens",
                                "expected a filter file written by `kvlab calibrate qfilter` (docs/POLICIES.md#qfilter)"};
}  // namespace

QFilters parse_qfilters(const std::string& text, const std::string& what) {
    CalibrationLines lines(text);
    QFilters f;
    f.model = read_calibration_header(lines, kFormat, what, [&](const std::string& key, int64_t v) {
        if (key == "layers") f.layers = v;
        else if (key == "kv_heads") f.kv_heads = v;
        else if (key == "head_dim") f.head_dim = v;
        else if (key == "tokens") f.tokens = v;
        else return false;
        return true;
    });
    if (f.layers < 1 || f.kv_heads < 1 || f.head_dim < 1)
        throw Error(str(what, ": 'layers', 'kv_heads' and 'head_dim' (>= 1) must come before 'filters'; ", kFormat.expected));
    std::string line;
    std::vector<double> row;
    for (int64_t r = 0; r < f.layers * f.kv_heads; ++r) {
        if (!lines.next(line))
            throw Error(str(what, " has ", r, " filters; expected ", f.layers * f.kv_heads, " (layers x kv_heads rows of ", f.head_dim, " numbers)"));
        if (!parse_calibration_row(line, row) || int64_t(row.size()) != f.head_dim)
            throw Error(str(what, " line ", lines.lineno(), ": '", line.substr(0, 60), "...' is not ", f.head_dim, " numbers (layer ", r / f.kv_heads,
                            ", KV head ", r % f.kv_heads, ")"));
        double n2 = 0;
        for (double x : row) {
            if (!std::isfinite(x)) throw Error(str(what, " line ", lines.lineno(), ": a filter value is not finite"));
            n2 += x * x;
        }
        if (std::fabs(std::sqrt(n2) - 1) > 1e-6)
            throw Error(str(what, " line ", lines.lineno(), ": the filter of layer ", r / f.kv_heads, ", KV head ", r % f.kv_heads, " has norm ",
                            std::sqrt(n2), "; expected a unit vector"));
        f.filters.insert(f.filters.end(), row.begin(), row.end());
    }
    expect_calibration_end(lines, what, str(f.layers * f.kv_heads, " filters"));
    return f;
}

QFilters read_qfilters(const std::string& path) {
    return parse_qfilters(read_calibration_file(path, "--kv_cache.qfilter", kFormat), str("--kv_cache.qfilter: '", path, "'"));
}

std::string format_qfilters(const QFilters& f) {
    std::ostringstream o;
    o << kFormat.magic << " " << kQFilterVersion << "\n";
    o << "# Q-Filters (docs/POLICIES.md#qfilter): one row per (layer, KV head), the main direction of the head's\n";
    o << "# post-RoPE queries, signed so that the mean query projects positively; keys scoring <k, f> low are evicted\n";
    if (!f.model.empty()) o << "model " << f.model << "\n";
    o << "layers " << f.layers << "\nkv_heads " << f.kv_heads << "\nhead_dim " << f.head_dim << "\ntokens " << f.tokens << "\nfilters\n";
    char buf[40];
    for (int64_t r = 0; r < f.layers * f.kv_heads; ++r) {
        for (int64_t d = 0; d < f.head_dim; ++d) {
            std::snprintf(buf, sizeof buf, "%s%.17g", d ? " " : "", f.filters[size_t(r * f.head_dim + d)]);
            o << buf;
        }
        o << "\n";
    }
    return o.str();
}

void write_qfilters(const std::string& path, const QFilters& f) {
    if (int64_t(f.filters.size()) != f.layers * f.kv_heads * f.head_dim)
        throw Error(str("q-filters: ", f.filters.size(), " values for ", f.layers, " layers x ", f.kv_heads, " KV heads x ", f.head_dim));
    write_calibration_file(path, format_qfilters(f), "filter file");
}

QFilters qfilters_for_model(const std::string& option, int64_t layers, int64_t kv_heads) {
    if (option.empty())
        throw Error("--kv_cache.qfilter is required for policy 'qfilter'; expected a filter file from `kvlab calibrate qfilter MODEL -o FILE`");
    QFilters f;
    if (option.rfind("axis:", 0) == 0) {
        const std::string c = option.substr(5);
        if (c.empty() || c.find_first_not_of("0123456789") != std::string::npos || c.size() > 6)
            throw Error(str("--kv_cache.qfilter: '", option, "' is invalid; expected axis: followed by a channel index, or a filter file"));
        f.layers = layers, f.kv_heads = kv_heads, f.axis = std::stoll(c);
        return f;
    }
    f = read_qfilters(option);
    if (f.layers != layers || f.kv_heads != kv_heads)
        throw Error(str("--kv_cache.qfilter: '", option, "' has filters for ", f.layers, " layers x ", f.kv_heads, " KV heads",
                        f.model.empty() ? "" : str(" (model ", f.model, ")"), "; this model has ", layers, " layers x ", kv_heads, " KV heads"),
                    "calibrate the filters for this model: kvlab calibrate qfilter MODEL --data FILE -o FILE");
    return f;
}

std::vector<double> qfilter_direction(const std::vector<double>& C, const std::vector<double>& s, int64_t D) {
    // M = C^256: the same eigenvectors, the gaps raised to the 256th power.
    std::vector<double> M(C), T((size_t)(D * D));
    for (int sq = 0; sq < 8; ++sq) {
        double top = 0;
        for (double x : M) top = std::max(top, std::fabs(x));
        if (!(top > 0)) break;
        for (double& x : M) x /= top;
        for (int64_t a = 0; a < D; ++a)
            for (int64_t b = 0; b < D; ++b) {
                double acc = 0;
                for (int64_t k = 0; k < D; ++k) acc += M[size_t(a * D + k)] * M[size_t(k * D + b)];
                T[size_t(a * D + b)] = acc;
            }
        M.swap(T);
    }
    // Start from the mean query (close to the answer for anisotropic queries), else e_0.
    std::vector<double> v(s), w((size_t)D);
    double n = 0;
    for (double x : v) n += x * x;
    if (!(n > 0)) v.assign(size_t(D), 0.0), v[0] = 1, n = 1;
    for (double& x : v) x /= std::sqrt(n);
    for (int it = 0; it < 10000; ++it) {
        double nn = 0;
        for (int64_t a = 0; a < D; ++a) {
            double acc = 0;
            for (int64_t b = 0; b < D; ++b) acc += M[size_t(a * D + b)] * v[size_t(b)];
            w[size_t(a)] = acc;
            nn += acc * acc;
        }
        if (!(nn > 0)) break;  // C = 0 (no queries): keep the start
        double dot = 0;
        for (int64_t a = 0; a < D; ++a) dot += (w[size_t(a)] /= std::sqrt(nn)) * v[size_t(a)];
        v.swap(w);
        if (1 - std::fabs(dot) < 1e-15) break;
    }
    double proj = 0;
    for (int64_t a = 0; a < D; ++a) proj += v[size_t(a)] * s[size_t(a)];
    if (proj < 0)
        for (double& x : v) x = -x;
    return v;
}

}  // namespace kv
