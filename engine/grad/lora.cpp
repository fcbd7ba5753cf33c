// LoRA adapters (see lora.h). The branch is evaluated as two thin matmuls, t = x A^T (r wide)
// and y += s t B^T; the backward recomputes t instead of keeping it (r << in).
#include "lora.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "engine/core/error.h"
#include "engine/ops/ops.h"
#include "grad_math.h"

namespace kv {

namespace {

// Output columns of a view along the last dim (y may be any strided tensor).
Tensor cols(const Tensor& y, int64_t c0, int64_t c1) {
    return y.slice(y.ndim() - 1, c0, c1);
}

}  // namespace

std::vector<std::string> parse_lora_targets(const std::string& list) {
    static const std::vector<std::string> known{"q", "k", "v", "proj", "mlp", "head"};
    std::vector<std::string> out;
    size_t s = 0;
    while (s <= list.size()) {
        size_t e = list.find(',', s);
        if (e == std::string::npos) e = list.size();
        std::string t = list.substr(s, e - s);
        if (!t.empty()) {
            if (std::find(known.begin(), known.end(), t) == known.end())
                throw Error(str("--lora.targets: unknown target '", t, "'; expected any of q, k, v, proj, mlp, head"));
            out.push_back(t);
        }
        s = e + 1;
    }
    if (out.empty()) throw Error("--lora.targets: no targets given; expected any of q, k, v, proj, mlp, head");
    return out;
}

Lora::Lora(const Transformer& model, const LoraConfig& cfg) : cfg_(cfg) {
    if (cfg.r < 1) throw Error(str("--lora.r: ", cfg.r, " must be at least 1"));
    if (cfg.dropout != 0.0)
        throw Error("--lora.dropout: only 0 is supported",
                    "dropout masks would have to be identical in the forward and every gradient recompute");
    const ModelConfig& mc = model.config();
    const int64_t E = mc.hidden_size, Q = mc.q_dim(), K = mc.kv_dim(), I = mc.intermediate_size, V = mc.vocab_size;
    const DType dt = model.act_dtype();
    const Device dev = model.options().device;
    std::mt19937_64 rng(cfg.seed ^ 0x4c6f5241ull);
    auto make = [&](int layer, LinearSite site, int64_t c0, int64_t c1, int64_t in, const std::string& module) {
        LoraAdapter a;
        a.layer = layer, a.site = site, a.col0 = c0, a.col1 = c1, a.module = module;
        // kaiming_uniform_(a = sqrt(5)) as LitGPT: bound = 1 / sqrt(fan_in)
        const double bound = 1.0 / std::sqrt(double(in));
        std::uniform_real_distribution<double> u(-bound, bound);
        std::vector<double> av((size_t)(cfg.r * in));
        for (double& x : av) x = u(rng);
        a.A = Tensor::from_f64({cfg.r, in}, av, dt, {dev, MemCategory::WEIGHTS, module + ".lora_A"});
        a.B = Tensor::zeros({c1 - c0, cfg.r}, dt, {dev, MemCategory::WEIGHTS, module + ".lora_B"});
        a.dA = Tensor::zeros(a.A.shape(), dt, {dev, MemCategory::GRADIENTS, module + ".lora_A grad"});
        a.dB = Tensor::zeros(a.B.shape(), dt, {dev, MemCategory::GRADIENTS, module + ".lora_B grad"});
        index_[{layer, int(site)}].push_back(adapters_.size());
        adapters_.push_back(std::move(a));
    };
    auto has = [&](const char* t) { return std::find(cfg.targets.begin(), cfg.targets.end(), t) != cfg.targets.end(); };
    for (int l = 0; l < int(mc.num_layers); ++l) {
        const std::string p = str("model.layers.", l, ".");
        if (has("q")) make(l, LinearSite::QKV, 0, Q, E, p + "self_attn.q_proj");
        if (has("k")) make(l, LinearSite::QKV, Q, Q + K, E, p + "self_attn.k_proj");
        if (has("v")) make(l, LinearSite::QKV, Q + K, Q + 2 * K, E, p + "self_attn.v_proj");
        if (has("proj")) make(l, LinearSite::O, 0, E, Q, p + "self_attn.o_proj");
        if (has("mlp")) {
            make(l, LinearSite::GATE_UP, 0, I, E, p + "mlp.gate_proj");
            make(l, LinearSite::GATE_UP, I, 2 * I, E, p + "mlp.up_proj");
            make(l, LinearSite::DOWN, 0, E, I, p + "mlp.down_proj");
        }
    }
    if (has("head")) make(-1, LinearSite::HEAD, 0, V, E, "lm_head");
}

const std::vector<size_t>& Lora::at(int layer, LinearSite site) const {
    static const std::vector<size_t> none;
    auto it = index_.find({layer, int(site)});
    return it == index_.end() ? none : it->second;
}

void Lora::add(int layer, LinearSite site, const Tensor& x, Tensor& y) const {
    for (size_t i : at(layer, site)) {
        const LoraAdapter& a = adapters_[i];
        Tensor t = ops::linear(x, a.A, y.dtype());  // (..., r)
        Tensor yc = cols(y, a.col0, a.col1);
        grad::mm_(yc, t, a.B.transpose(0, 1), scale(), 1.0f);
    }
}

void Lora::backward(int layer, LinearSite site, const Tensor& x, const Tensor& dy, Tensor& dx) const {
    const auto& list = at(layer, site);
    if (list.empty()) return;
    Tensor x2 = grad::rows2d(x);
    Tensor dx2 = dx.reshape({x2.size(0), x2.size(1)});
    for (size_t i : list) {
        const LoraAdapter& a = adapters_[i];
        Tensor dyc = grad::rows2d(cols(dy, a.col0, a.col1));  // (rows, out)
        Tensor t = ops::linear(x2, a.A, dy.dtype());          // (rows, r), recomputed
        Tensor dB = a.dB, dA = a.dA;
        ops::matmul_(dB, dyc.transpose(0, 1), t, scale(), 1.0f);  // dB += s dy^T t
        Tensor dt = ops::matmul(dyc, a.B, dy.dtype());            // (rows, r) = dy B
        ops::scale_(dt, dt, scale());
        ops::matmul_(dA, dt.transpose(0, 1), x2, 1.0f, 1.0f);  // dA += dt^T x
        ops::matmul_(dx2, dt, a.A, 1.0f, 1.0f);                // dx += dt A
    }
}

void Lora::zero_grad() {
    for (auto& a : adapters_) {
        a.dA.fill(0.0);
        a.dB.fill(0.0);
    }
}

TensorMap Lora::state_dict() const {
    TensorMap m;
    for (const auto& a : adapters_) {
        m["base_model.model." + a.module + ".lora_A.weight"] = a.A;
        m["base_model.model." + a.module + ".lora_B.weight"] = a.B;
    }
    return m;
}

void Lora::load_state_dict(const TensorMap& tensors) {
    for (auto& a : adapters_) {
        for (auto [suffix, dst] : {std::pair<const char*, Tensor*>{".lora_A.weight", &a.A}, {".lora_B.weight", &a.B}}) {
            const std::string name = "base_model.model." + a.module + suffix;
            auto it = tensors.find(name);
            if (it == tensors.end()) throw Error(str("LoRA adapters: missing tensor '", name, "'"));
            if (it->second.shape() != dst->shape())
                throw Error(str("LoRA adapters: tensor '", name, "' has shape ", it->second.shape().str(), ", expected ",
                                dst->shape().str(), " (r = ", cfg_.r, ")"));
            dst->copy_from(it->second.device() == dst->device() ? it->second : it->second.to(dst->device()));
        }
    }
}

int64_t Lora::parameter_count() const {
    int64_t n = 0;
    for (const auto& a : adapters_) n += a.A.numel() + a.B.numel();
    return n;
}

}  // namespace kv
