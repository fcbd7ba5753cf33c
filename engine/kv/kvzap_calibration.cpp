// KVzap calibration (see kvzap_calibration.h).
#include "engine/kv/kvzap_calibration.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>

#include "engine/core/error.h"
#include "engine/kv/calibration_file.h"
#include "engine/kv/context_reconstruction.h"
#include "engine/kv/kv_cache.h"
#include "engine/kv/policies/kvzap_weights.h"

namespace kv {

KVzapNormalEquations::KVzapNormalEquations(int64_t E_, int64_t G_)
    : E(E_), G(G_), xtx(size_t((E_ + 1) * (E_ + 1)), 0.0), xty(size_t((E_ + 1) * G_), 0.0), yy(size_t(G_), 0.0) {}

void KVzapNormalEquations::add(const std::vector<double>& h, const std::vector<double>& y, int64_t n) {
    const int64_t C = E + 1;
    std::vector<double> x((size_t)C);
    for (int64_t t = 0; t < n; ++t) {
        std::copy(h.begin() + t * E, h.begin() + (t + 1) * E, x.begin());
        x[size_t(E)] = 1.0;
        const double* yt = y.data() + t * G;
        for (int64_t a = 0; a < C; ++a) {
            const double xa = x[size_t(a)];
            double* row = xtx.data() + a * C;
            for (int64_t b = a; b < C; ++b) row[b] += xa * x[size_t(b)];
            for (int64_t g = 0; g < G; ++g) xty[size_t(a * G + g)] += xa * yt[g];
        }
        for (int64_t g = 0; g < G; ++g) yy[size_t(g)] += yt[g] * yt[g];
    }
    tokens += n;
}

std::vector<double> solve_kvzap_layer(const KVzapNormalEquations& ne, double ridge) {
    const int64_t E = ne.E, C = E + 1, G = ne.G;
    double diag = 0;
    for (int64_t e = 0; e < E; ++e) diag += ne.xtx[size_t(e * C + e)];
    const double lambda = ridge * (E > 0 ? diag / double(E) : 0.0);
    // M = X^T X + lambda diag(1, .., 1, 0), mirrored from the upper triangle; M = L L^T.
    std::vector<double> L((size_t)(C * C), 0.0);
    for (int64_t i = 0; i < C; ++i)
        for (int64_t j = 0; j <= i; ++j) {
            double s = ne.xtx[size_t(j * C + i)] + (i == j && i < E ? lambda : 0.0);
            for (int64_t k = 0; k < j; ++k) s -= L[size_t(i * C + k)] * L[size_t(j * C + k)];
            if (i == j) {
                if (!(s > 0))
                    throw Error(str("calibrate kvzap: the normal equations of a layer are singular (", ne.tokens, " tokens for ", C,
                                    " unknowns per head)"),
                                "give more text (--samples, --data.seq_length) or a ridge > 0 (--ridge)");
                L[size_t(i * C + i)] = std::sqrt(s);
            } else {
                L[size_t(i * C + j)] = s / L[size_t(j * C + j)];
            }
        }
    std::vector<double> out((size_t)(G * C)), z((size_t)C);
    for (int64_t g = 0; g < G; ++g) {
        for (int64_t i = 0; i < C; ++i) {  // L z = X^T y
            double s = ne.xty[size_t(i * G + g)];
            for (int64_t k = 0; k < i; ++k) s -= L[size_t(i * C + k)] * z[size_t(k)];
            z[size_t(i)] = s / L[size_t(i * C + i)];
        }
        double* w = out.data() + g * C;
        for (int64_t i = C - 1; i >= 0; --i) {  // L^T w = z
            double s = z[size_t(i)];
            for (int64_t k = i + 1; k < C; ++k) s -= L[size_t(k * C + i)] * w[k];
            w[i] = s / L[size_t(i * C + i)];
        }
    }
    return out;
}

namespace {

constexpr const char* kResumeMagic = "kvlab-kvzap-resume 1";

// The kvzip cache's attention, keeping the attention input each layer hands over.
class InputTap final : public LayerAttention {
   public:
    explicit InputTap(KVCache& cache) : cache_(cache) {}
    void attend(int layer, const Tensor& q, const Tensor& k, const Tensor& v, int64_t input_pos, float scale, int window,
                Tensor& y) override {
        static_cast<LayerAttention&>(cache_).attend(layer, q, k, v, input_pos, scale, window, y);
    }
    void set_rope_frequencies(const std::vector<double>* inv_freq) override { cache_.set_rope_frequencies(inv_freq); }
    void set_output_projection(int layer, const Tensor& wo) override { cache_.set_output_projection(layer, wo); }
    void set_layer_input(int layer, const Tensor& h) override {
        input = h;
        cache_.set_layer_input(layer, h);
    }
    Tensor input;

   private:
    KVCache& cache_;
};

// One text window on its way through the layers: its cache, reconstruction pieces and the
// hidden states entering the next layer.
struct Window {
    std::unique_ptr<KVCache> cache;
    std::unique_ptr<ContextReconstruction> rec;
    ReconstructionChunk chunk;
    Tensor x;  // (1, n, E)
};

uint64_t fnv(uint64_t h, const void* p, size_t n) {
    const unsigned char* c = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ c[i]) * 0x100000001b3ull;
    return h;
}

// What a resume file must have been written for: the model, the windows and the options.
uint64_t resume_key(const CalibrationRun& run, int64_t E, double ridge, double floor, DType dt) {
    uint64_t h = 0xcbf29ce484222325ull;
    h = fnv(h, run.model_name.data(), run.model_name.size());
    const int64_t dims[] = {run.layers, run.kv_heads, E, int64_t(run.samples.size()), int64_t(dt)};
    h = fnv(h, dims, sizeof dims);
    for (const auto& s : run.samples) {
        const int64_t n = int64_t(s.size());
        h = fnv(h, &n, sizeof n);
        h = fnv(h, s.data(), s.size() * sizeof(int32_t));
    }
    h = fnv(h, &ridge, sizeof ridge);
    h = fnv(h, &floor, sizeof floor);
    return h;
}

// Appends a tensor's values (f64 models as doubles, else floats: exact for f32 and bf16).
void put_tensor(std::string& out, const Tensor& t) {
    if (t.dtype() == DType::F64) {
        const std::vector<double> v = t.contiguous().to_f64_vector();
        out.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(double));
    } else {
        const std::vector<float> v = t.contiguous().to_f32_vector();
        out.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
    }
}

Tensor take_tensor(const std::string& in, size_t& at, const Tensor& like, const std::string& what) {
    const size_t n = size_t(like.numel()), bytes = n * (like.dtype() == DType::F64 ? sizeof(double) : sizeof(float));
    if (at + bytes > in.size()) throw Error(str(what, " ends early; delete it to start the calibration over"));
    const TensorOptions o{like.device(), MemCategory::ACTIVATIONS, "kvzap calibration hidden states"};
    Tensor t;
    if (like.dtype() == DType::F64) {
        std::vector<double> v(n);
        std::memcpy(v.data(), in.data() + at, bytes);
        t = Tensor::from_f64(like.shape(), v, like.dtype(), o);
    } else {
        std::vector<float> v(n);
        std::memcpy(v.data(), in.data() + at, bytes);
        t = Tensor::from_f32(like.shape(), v, like.dtype(), o);
    }
    at += bytes;
    return t;
}

}  // namespace

std::string run_kvzap_calibration(const CalibrationRun& run) {
    const auto t0 = std::chrono::steady_clock::now();
    Transformer& model = run.model;
    const ModelConfig& mc = model.config();
    const int64_t NL = mc.num_layers, G = mc.num_kv_heads, E = mc.hidden_size, C = E + 1, S = int64_t(run.samples.size());
    const double ridge = run.option("ridge"), floor = run.option("floor");
    if (!run.text || !run.text->encode)
        throw Error("calibrate kvzap: KVzip's scores need the model's tokenizer (the reconstruction prompt); none was given");
    for (int64_t l = 0; l < NL; ++l)
        if (!mc.has_kv_cache(l))
            throw Error(str("calibrate kvzap: ", mc.name, " layer ", l, " mixes tokens without attention (a short convolution), which KVzip "
                            "does not score; expected a model whose layers all attend"));
    if (S < 1) throw Error("calibrate kvzap: no text windows");
    const int64_t n = int64_t(run.samples.front().size());
    for (const auto& s : run.samples)
        if (int64_t(s.size()) != n || n < 1) throw Error("calibrate kvzap: the text windows must have one length");

    // A kvzip cache that keeps every token (slot j = position j), sinks scored like any token.
    KVCacheConfig kc;
    kc.name = "kvzip-default";
    kc.cache_length = n;
    kc.grace_period = 0;
    kc.policy_options["kvzip_n_sink"] = 0;
    const Device dev = model.options().device;
    std::vector<Window> win((size_t)S);
    for (int64_t s = 0; s < S; ++s) {
        Window& w = win[size_t(s)];
        w.cache = std::make_unique<KVCache>(kc, mc, dev, model.act_dtype(), n, run.text);
        w.rec = std::make_unique<ContextReconstruction>(model, *w.cache);
        if (s == 0) model.set_context_width(n + w.rec->max_piece_tokens(n));
        const Tensor ids = Tensor::from_i32({1, n}, run.samples[size_t(s)], {dev, MemCategory::WORKSPACE, "calibration ids"});
        w.chunk = w.rec->prepare(ids, 0);
        w.x = model.embed(ids);
    }

    KVzapWeights out;
    out.model = run.model_name;
    out.layers = NL, out.kv_heads = G, out.hidden_size = E, out.tokens = S * n;
    out.w.assign(size_t(NL * G * C), 0.0);
    std::vector<double> fit((size_t)(NL * G * 2), 0.0);  // per (layer, head): the fit's mean squared error and the targets' variance

    // Resume: the finished layers' rows and every window's hidden states entering the next layer.
    const std::string resume = run.output + ".resume";
    const uint64_t key = resume_key(run, E, ridge, floor, model.act_dtype());
    int64_t first = 0;
    if (std::filesystem::is_regular_file(resume)) {
        std::ifstream f(resume, std::ios::binary);
        const std::string data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
        const std::string what = str("calibrate kvzap: the resume file '", resume, "'");
        const size_t body = data.find("\nstate\n");
        std::istringstream head(data.substr(0, body == std::string::npos ? 0 : body));
        std::string magic_line, k1, k2;
        uint64_t got = 0;
        std::getline(head, magic_line);
        if (body == std::string::npos || magic_line != kResumeMagic || !(head >> k1 >> std::hex >> got >> std::dec >> k2 >> first) ||
            k1 != "key" || k2 != "next_layer" || first < 1 || first > NL)
            throw Error(str(what, " is not a KVzap resume file"), "delete it to start the calibration over");
        if (got != key)
            throw Error(str(what, " was written for another model, text or options"),
                        "rerun the command that wrote it to resume, or delete it to start over");
        size_t at = body + 7;
        const size_t wbytes = size_t(first * G * C) * sizeof(double), fbytes = size_t(first * G * 2) * sizeof(double);
        if (at + wbytes + fbytes > data.size()) throw Error(str(what, " ends early"), "delete it to start the calibration over");
        std::memcpy(out.w.data(), data.data() + at, wbytes);
        std::memcpy(fit.data(), data.data() + at + wbytes, fbytes);
        at += wbytes + fbytes;
        for (Window& w : win) {
            w.x = take_tensor(data, at, w.x, what);
            for (auto& p : w.chunk.pieces) p.x = take_tensor(data, at, p.x, what);
        }
        if (at != data.size()) throw Error(str(what, " has bytes after its hidden states"), "delete it to start the calibration over");
        run.progress(first * S, NL * S, str("resumed after layer ", first - 1, " from ", resume));
    }

    std::vector<double> h((size_t)(n * E)), y((size_t)(n * G));
    for (int64_t l = first; l < NL; ++l) {
        KVzapNormalEquations ne(E, G);
        for (int64_t s = 0; s < S; ++s) {
            Window& w = win[size_t(s)];
            InputTap tap(*w.cache);
            w.x = model.block(int(l), w.x, 0, tap);
            w.rec->run_layer(int(l), w.chunk);
            LayerCache& lc = w.cache->layer(int(l));
            const std::vector<float> sc = lc.policy().slot_scores();  // (G, n): slot j = position j
            lc.buffer().release();                                    // the layer is done for this window
            if (sc.empty() || !tap.input.defined()) continue;         // a windowed layer: kept by rule, never scored
            const std::vector<double> hv = tap.input.contiguous().to_f64_vector();
            std::copy(hv.begin(), hv.end(), h.begin());
            for (int64_t t = 0; t < n; ++t)
                for (int64_t g = 0; g < G; ++g) y[size_t(t * G + g)] = std::log(std::max(double(sc[size_t(g * n + t)]), floor));
            ne.add(h, y, n);
            run.progress(l * S + s + 1, NL * S, str("layer ", l, ": KVzip scores and hidden states of window ", s + 1, " of ", S));
        }
        if (ne.tokens > 0) {
            const std::vector<double> wl = solve_kvzap_layer(ne, ridge);
            std::copy(wl.begin(), wl.end(), out.w.begin() + l * G * C);
            // The fit on its own tokens: SSE = y^T y - 2 w^T X^T y + w^T X^T X w, SST about the mean.
            for (int64_t g = 0; g < G; ++g) {
                const double* wg = wl.data() + g * C;
                double sse = ne.yy[size_t(g)], quad = 0;
                for (int64_t a = 0; a < C; ++a) {
                    sse -= 2 * wg[a] * ne.xty[size_t(a * G + g)];
                    for (int64_t b = 0; b < C; ++b) quad += wg[a] * wg[b] * ne.xtx[size_t(std::min(a, b) * C + std::max(a, b))];
                }
                const double mean = ne.xty[size_t(E * G + g)] / double(ne.tokens);
                fit[size_t((l * G + g) * 2)] = std::max(0.0, sse + quad) / double(ne.tokens);
                fit[size_t((l * G + g) * 2 + 1)] = ne.yy[size_t(g)] / double(ne.tokens) - mean * mean;
            }
        }
        if (l + 1 < NL) {
            std::string data = str(kResumeMagic, "\nkey ");
            char buf[32];
            std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)key);
            data += str(buf, "\nnext_layer ", l + 1, "\nstate\n");
            data.append(reinterpret_cast<const char*>(out.w.data()), size_t((l + 1) * G * C) * sizeof(double));
            data.append(reinterpret_cast<const char*>(fit.data()), size_t((l + 1) * G * 2) * sizeof(double));
            for (const Window& w : win) {
                put_tensor(data, w.x);
                for (const auto& p : w.chunk.pieces) put_tensor(data, p.x);
            }
            write_calibration_file(resume, data, "resume file");
        }
    }
    write_kvzap_weights(run.output, out);
    std::error_code ec;
    std::filesystem::remove(resume, ec);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double mse = 0, var = 0;
    for (int64_t i = 0; i < NL * G; ++i) mse += fit[size_t(2 * i)], var += fit[size_t(2 * i + 1)];
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "%lld rows of %lld weights + bias from %lld tokens; fit MSE %.4g of target variance %.4g (mean over heads); "
                  "%lld layers in %.2f s (%.3f s per 1k tokens)",
                  (long long)(NL * G), (long long)E, (long long)(S * n), mse / double(NL * G), var / double(NL * G), (long long)(NL - first),
                  secs, secs / (double(S * n) / 1000.0));
    return buf;
}

}  // namespace kv
