// Q-Filter calibration (see qfilter_calibration.h).
#include "engine/kv/policies/qfilter_calibration.h"

#include <chrono>
#include <cstdio>

#include "engine/core/error.h"
#include "engine/model/attention.h"

namespace kv {

namespace {
// Plain causal attention that first folds each layer's queries into the moments.
class QueryRecorder final : public LayerAttention {
   public:
    explicit QueryRecorder(QueryMoments& m) : m_(m) {}
    void attend(int layer, const Tensor& q, const Tensor& k, const Tensor& v, int64_t input_pos, float scale, int window,
                Tensor& y) override {
        const int64_t B = q.size(0), NH = q.size(1), n = q.size(2), D = q.size(3), G = m_.kv_heads;
        if (D != m_.head_dim || NH % G != 0)
            throw Error(str("calibrate qfilter: layer ", layer, " has ", NH, " query heads of size ", D, "; expected a multiple of ", G,
                            " heads of size ", m_.head_dim));
        const std::vector<double> qv = q.contiguous().to_f64_vector();  // (B, NH, n, D)
        const int64_t R = NH / G;
        for (int64_t b = 0; b < B; ++b)
            for (int64_t h = 0; h < NH; ++h) {
                const int64_t at = layer * G + h / R;
                double* C = m_.C.data() + at * D * D;
                double* s = m_.s.data() + at * D;
                for (int64_t t = 0; t < n; ++t) {
                    const double* x = qv.data() + ((b * NH + h) * n + t) * D;
                    for (int64_t a = 0; a < D; ++a) {
                        s[a] += x[a];
                        for (int64_t c = 0; c < D; ++c) C[a * D + c] += x[a] * x[c];
                    }
                }
            }
        PlainAttention().attend(layer, q, k, v, input_pos, scale, window, y);
    }

   private:
    QueryMoments& m_;
};
}  // namespace

QueryMoments collect_query_moments(const Transformer& model, const std::vector<std::vector<int32_t>>& windows,
                                   const std::function<void(int64_t, int64_t)>& progress) {
    const ModelConfig& cfg = model.config();
    QueryMoments m;
    m.layers = cfg.num_layers, m.kv_heads = cfg.num_kv_heads, m.head_dim = cfg.head_dim;
    m.C.assign(size_t(m.layers * m.kv_heads * m.head_dim * m.head_dim), 0.0);
    m.s.assign(size_t(m.layers * m.kv_heads * m.head_dim), 0.0);
    QueryRecorder rec(m);
    for (size_t w = 0; w < windows.size(); ++w) {
        const std::vector<int32_t>& ids = windows[w];
        if (ids.empty()) throw Error("calibrate qfilter: an empty calibration window");
        (void)model.forward(Tensor::from_i32({1, int64_t(ids.size())}, ids, TensorOptions{.device = model.options().device, .category = MemCategory::ACTIVATIONS, .label = "calibration ids"}), 0, &rec);
        m.tokens += int64_t(ids.size());
        if (progress) progress(int64_t(w + 1), int64_t(windows.size()));
    }
    return m;
}

QFilters qfilters_from_moments(const QueryMoments& m) {
    QFilters f;
    f.layers = m.layers, f.kv_heads = m.kv_heads, f.head_dim = m.head_dim, f.tokens = m.tokens;
    const int64_t D = m.head_dim;
    for (int64_t i = 0; i < m.layers * m.kv_heads; ++i) {
        const std::vector<double> C(m.C.begin() + i * D * D, m.C.begin() + (i + 1) * D * D);
        const std::vector<double> s(m.s.begin() + i * D, m.s.begin() + (i + 1) * D);
        const std::vector<double> v = qfilter_direction(C, s, D);
        f.filters.insert(f.filters.end(), v.begin(), v.end());
    }
    return f;
}

std::string run_qfilter_calibration(const CalibrationRun& run) {
    const auto t0 = std::chrono::steady_clock::now();
    const QueryMoments m = collect_query_moments(run.model, run.samples, [&](int64_t done, int64_t total) {
        run.progress(done, total, "post-RoPE queries folded into each head's second moments");
    });
    const auto t1 = std::chrono::steady_clock::now();
    QFilters f = qfilters_from_moments(m);
    f.model = run.model_name;
    write_qfilters(run.output, f);
    const auto t2 = std::chrono::steady_clock::now();
    char buf[192];
    std::snprintf(buf, sizeof buf, "%lld filters of %lld channels from %lld tokens (forward %.2f s, directions %.3f s)",
                  (long long)(f.layers * f.kv_heads), (long long)f.head_dim, (long long)f.tokens,
                  std::chrono::duration<double>(t1 - t0).count(), std::chrono::duration<double>(t2 - t1).count());
    return buf;
}

}  // namespace kv
