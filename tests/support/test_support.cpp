// Test helpers (see test_support.h).
#include "test_support.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>

namespace kv::test {

uint64_t base_seed() {
    static const uint64_t seed = [] {
        const char* env = std::getenv("KVLAB_TEST_SEED");
        uint64_t s = env ? std::strtoull(env, nullptr, 10) : std::random_device{}();
        std::fprintf(stderr, "[kvlab tests] base seed %llu (reproduce with KVLAB_TEST_SEED=%llu)\n",
                     (unsigned long long)s, (unsigned long long)s);
        return s;
    }();
    return seed;
}

uint64_t seed_for(const std::string& name) { return base_seed() ^ (std::hash<std::string>{}(name) * 0x9e3779b97f4a7c15ull); }

Tensor random_tensor(const Shape& shape, DType dtype, std::mt19937_64& rng, double lo, double hi, const TensorOptions& opt) {
    std::uniform_real_distribution<double> u(lo, hi);
    std::vector<double> v((size_t)shape.numel());
    for (auto& x : v) x = u(rng);
    TensorOptions o = opt;
    return Tensor::from_f64(shape, v, dtype, o);
}

Comparison compare(const Tensor& got, const Tensor& ref, int show) {
    Comparison c;
    std::vector<double> g = got.to_f64_vector(), r = ref.to_f64_vector();
    if (g.size() != r.size()) {
        c.nonfinite_mismatch = true;
        c.report = "size mismatch";
        return c;
    }
    for (size_t i = 0; i < g.size(); ++i) {
        bool gf = std::isfinite(g[i]), rf = std::isfinite(r[i]);
        if (gf != rf) {
            c.nonfinite_mismatch = true;
            if (c.worst < 0) c.worst = int64_t(i);
            continue;
        }
        if (!rf) continue;
        c.ref_scale = std::max(c.ref_scale, std::fabs(r[i]));
        double e = std::fabs(g[i] - r[i]);
        if (e > c.max_abs_err) {
            c.max_abs_err = e;
            c.worst = int64_t(i);
        }
    }
    c.rel_err = c.max_abs_err / std::max(c.ref_scale, 1e-300);
    std::ostringstream os;
    os.precision(9);
    for (int i = 0; i < show && size_t(i) < g.size(); ++i) os << "  [" << i << "] got " << g[size_t(i)] << " ref " << r[size_t(i)] << "\n";
    if (c.worst >= 0)
        os << "  worst [" << c.worst << "] got " << g[size_t(c.worst)] << " ref " << r[size_t(c.worst)] << " (max |err| "
           << c.max_abs_err << ", max |ref| " << c.ref_scale << ")\n";
    c.report = os.str();
    return c;
}

}  // namespace kv::test
