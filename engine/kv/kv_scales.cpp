// Calibrated FP8 K/V scales (see kv_scales.h).
#include "engine/kv/kv_scales.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "engine/core/error.h"
#include "engine/model/attention.h"
#include "engine/model/transformer.h"
#include "kernels/common/quant_formats.h"

namespace kv {

namespace {

constexpr const char* kMagic = "kvlab kv-scales 1";

// Plain attention that also keeps the running max |k| and |v| of each KV head.
class ScaleRecorder final : public LayerAttention {
   public:
    ScaleRecorder(int64_t layers, int64_t G) : G_(G), kmax_(size_t(layers * G), 0.0f), vmax_(size_t(layers * G), 0.0f) {}
    void attend(int layer, const Tensor& q, const Tensor& k, const Tensor& v, int64_t input_pos, float scale, int window,
                Tensor& y) override {
        record(layer, k, kmax_);
        record(layer, v, vmax_);
        plain_.attend(layer, q, k, v, input_pos, scale, window, y);
    }
    const std::vector<float>& kmax() const { return kmax_; }
    const std::vector<float>& vmax() const { return vmax_; }

   private:
    void record(int layer, const Tensor& x, std::vector<float>& mx) const {
        const int64_t B = x.size(0), n = x.size(2), D = x.size(3);
        const std::vector<float> a = x.contiguous().to_f32_vector();  // (B, G, n, D)
        for (int64_t b = 0; b < B; ++b)
            for (int64_t g = 0; g < G_; ++g) {
                float& m = mx[size_t(layer * G_ + g)];
                for (int64_t i = 0; i < n * D; ++i) m = std::max(m, std::fabs(a[size_t((b * G_ + g) * n * D + i)]));
            }
    }
    PlainAttention plain_;
    int64_t G_;
    std::vector<float> kmax_, vmax_;
};

}  // namespace

KvScales read_kv_scales(const std::string& path) {
    const std::string what = str("--kv_cache.kv_scales: '", path, "'");
    std::ifstream in(path);
    if (!in) throw Error(str(what, " cannot be read; expected a scale file written by `kvlab calibrate kv-scales MODEL --data FILE -o ", path, "`"));
    std::string line;
    if (!std::getline(in, line) || line != kMagic)
        throw Error(str(what, " is not a kv-scales file; expected its first line to be '", kMagic, "'"));
    KvScales s;
    std::string key;
    if (!std::getline(in, line) || !(std::istringstream(line) >> key >> s.model) || key != "model")
        throw Error(str(what, ": line 2 must be 'model NAME'"));
    {
        std::string a, b, c;
        if (!std::getline(in, line) || !(std::istringstream(line) >> a >> s.layers >> b >> s.kv_heads >> c >> s.head_dim) || a != "layers" ||
            b != "kv_heads" || c != "head_dim" || s.layers < 1 || s.kv_heads < 1 || s.head_dim < 1)
            throw Error(str(what, ": line 3 must be 'layers L kv_heads G head_dim D' with positive counts"));
    }
    s.k.assign(size_t(s.layers * s.kv_heads), -1.0f);
    s.v = s.k;
    for (int64_t i = 0; i < s.layers * s.kv_heads; ++i) {
        int64_t l = -1, g = -1;
        float ks = 0, vs = 0;
        if (!std::getline(in, line) || !(std::istringstream(line) >> l >> g >> ks >> vs) || l < 0 || l >= s.layers || g < 0 ||
            g >= s.kv_heads || !(ks > 0.0f) || !(vs > 0.0f) || !std::isfinite(ks) || !std::isfinite(vs))
            throw Error(str(what, ": line ", i + 4, " must be 'LAYER HEAD K_SCALE V_SCALE' with a layer below ", s.layers, ", a head below ",
                            s.kv_heads, " and finite scales > 0 (", s.layers * s.kv_heads, " such lines)"));
        s.k[size_t(l * s.kv_heads + g)] = ks;
        s.v[size_t(l * s.kv_heads + g)] = vs;
    }
    for (float x : s.k)
        if (x < 0.0f) throw Error(str(what, ": some (layer, head) has no line; expected one per layer and KV head"));
    return s;
}

void write_kv_scales(const std::string& path, const KvScales& s) {
    std::FILE* f = std::fopen(path.c_str(), "w");
    if (!f) throw Error(str("calibrate kv-scales: cannot write '", path, "'"));
    std::fprintf(f, "%s\nmodel %s\nlayers %lld kv_heads %lld head_dim %lld\n", kMagic, s.model.empty() ? "-" : s.model.c_str(),
                 (long long)s.layers, (long long)s.kv_heads, (long long)s.head_dim);
    for (int64_t l = 0; l < s.layers; ++l)
        for (int64_t g = 0; g < s.kv_heads; ++g) std::fprintf(f, "%lld %lld %.9g %.9g\n", (long long)l, (long long)g, double(s.k_scale(l, g)), double(s.v_scale(l, g)));
    if (std::fclose(f) != 0) throw Error(str("calibrate kv-scales: writing '", path, "' failed"));
}

void check_kv_scales(const KvScales& s, const std::string& path, int64_t layers, int64_t kv_heads, int64_t head_dim) {
    if (s.layers != layers || s.kv_heads != kv_heads || s.head_dim != head_dim)
        throw Error(str("--kv_cache.kv_scales: '", path, "' holds scales for ", s.layers, " layers x ", s.kv_heads, " KV heads of size ",
                        s.head_dim, " (model ", s.model, "); this model has ", layers, " x ", kv_heads, " of size ", head_dim,
                        "; expected a file calibrated on this model"));
}

KvScales calibrate_kv_scales(const Transformer& model, const std::vector<int32_t>& ids) {
    return calibrate_kv_scales(model, std::vector<std::vector<int32_t>>{ids});
}

KvScales calibrate_kv_scales(const Transformer& model, const std::vector<std::vector<int32_t>>& windows,
                             const std::function<void(int64_t, int64_t)>& progress) {
    const ModelConfig& c = model.config();
    ScaleRecorder rec(c.num_layers, c.num_kv_heads);  // maxima over every window
    for (size_t w = 0; w < windows.size(); ++w) {
        const std::vector<int32_t>& ids = windows[w];
        if (ids.empty()) throw Error("calibrate kv-scales: the text has no tokens; expected a non-empty text");
        const int64_t n = int64_t(ids.size());
        Tensor idt = Tensor::from_i32({1, n}, ids, {model.embedding().device(), MemCategory::WORKSPACE, "calibration ids"});
        Tensor x = model.embed(idt);
        for (int l = 0; l < int(c.num_layers); ++l) x = model.block(l, x, 0, rec);
        if (progress) progress(int64_t(w) + 1, int64_t(windows.size()));
    }
    if (windows.empty()) throw Error("calibrate kv-scales: no text windows; expected at least one");
    KvScales s;
    s.model = c.name.empty() ? "-" : c.name;
    for (char& ch : s.model) ch = ch == ' ' ? '_' : ch;  // one word in the file
    s.layers = c.num_layers, s.kv_heads = c.num_kv_heads, s.head_dim = c.head_dim;
    for (float m : rec.kmax()) s.k.push_back(m / kE4M3Max);
    for (float m : rec.vmax()) s.v.push_back(m / kE4M3Max);
    // A head that never saw a non-zero value gets a scale that keeps its zeros exact.
    for (float& x : s.k) x = x > 0.0f ? x : 1.0f;
    for (float& x : s.v) x = x > 0.0f ? x : 1.0f;
    return s;
}

std::string run_kv_scales_calibration(const CalibrationRun& run) {
    KvScales s = calibrate_kv_scales(run.model, run.samples, [&](int64_t done, int64_t total) {
        run.progress(done, total, "max|K| and max|V| of every KV head");
    });
    write_kv_scales(run.output, s);
    float kmax = 0, vmax = 0;
    for (float x : s.k) kmax = std::max(kmax, x);
    for (float x : s.v) vmax = std::max(vmax, x);
    char buf[256];
    std::snprintf(buf, sizeof buf, "%lld x %lld per-head E4M3 scales; largest key scale %.6g (max|K| %.6g), value %.6g (max|V| %.6g)",
                  (long long)s.layers, (long long)s.kv_heads, double(kmax), double(kmax) * 448.0, double(vmax), double(vmax) * 448.0);
    return buf;
}

}  // namespace kv
