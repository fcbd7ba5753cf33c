// LoRA adapters (see lora.h). The branch is evaluated as two thin matmuls, t = xd A^T (r wide)
// and y += s t B^T with xd = x * mask (dropout); the backward recomputes mask and t instead of
// keeping them (r << in).
#include "lora.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "engine/core/error.h"
#include "engine/ops/ops.h"
#include "engine/model/grad_math.h"

namespace kv {

namespace {

// Output columns of a view along the last dim (y may be any strided tensor).
Tensor cols(const Tensor& y, int64_t c0, int64_t c1) {
    return y.slice(y.ndim() - 1, c0, c1);
}

// SplitMix64's output function: a bijection of 64-bit words with full avalanche.
uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;

// Hash of everything but the column: one per (row, position) of a site's input.
uint64_t dropout_row_key(uint64_t seed, uint64_t pass, int layer, LinearSite site, int64_t row, int64_t position) {
    uint64_t h = mix64(seed ^ 0x4c6f526144726f70ull);  // "LoRaDrop"
    for (uint64_t v : {pass, uint64_t(int64_t(layer)), uint64_t(site), uint64_t(row), uint64_t(position)}) h = mix64(h + mix64(v + kGolden));
    return h;
}

// The column's draw: SplitMix64's sequence started at the row key.
double dropout_uniform(uint64_t row_key, int64_t column) {
    return double(mix64(row_key + uint64_t(column + 1) * kGolden) >> 11) * 0x1.0p-53;
}

}  // namespace

double lora_dropout_uniform(uint64_t seed, uint64_t pass, int layer, LinearSite site, int64_t row, int64_t position,
                            int64_t column) {
    return dropout_uniform(dropout_row_key(seed, pass, layer, site, row, position), column);
}

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
    if (!(cfg.dropout >= 0.0 && cfg.dropout < 1.0)) throw Error(str("--lora.dropout: ", cfg.dropout, " is not in [0, 1)"));
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
        if (mc.short_conv_layer(l)) {
            // A short convolution has one input projection, in_proj (b, c, x) and one output
            // projection, out_proj: PEFT's target_modules for LFM2 name these two. Any of q, k, v
            // adapts in_proj once, proj adapts out_proj (short_conv.h).
            if (has("q") || has("k") || has("v")) make(l, LinearSite::QKV, 0, 3 * E, E, p + "conv.in_proj");
            if (has("proj")) make(l, LinearSite::O, 0, E, E, p + "conv.out_proj");
        } else {
            if (mc.latent_attention()) {
                // Latent attention has no k_proj or v_proj: q adapts the query projection, k the
                // latent's W_kv_a (latent and k_pe), v the decompression W_kv_b (k_nope and v per head).
                const LatentAttention& la = mc.latent;
                const int64_t qin = la.q_lora_rank > 0 ? la.q_lora_rank : E;
                if (has("q"))
                    make(l, LinearSite::QKV, 0, Q, qin, p + (la.q_lora_rank > 0 ? "self_attn.q_b_proj" : "self_attn.q_proj"));
                if (has("k"))
                    make(l, LinearSite::KV_A, 0, la.kv_lora_rank + la.qk_rope_head_dim, E, p + "self_attn.kv_a_proj_with_mqa");
                if (has("v"))
                    make(l, LinearSite::KV_B, 0, mc.num_heads * (la.qk_nope_head_dim + la.v_head_dim), la.kv_lora_rank,
                         p + "self_attn.kv_b_proj");
            } else {
                if (has("q")) make(l, LinearSite::QKV, 0, Q, E, p + "self_attn.q_proj");
                // A KV-shared layer (Gemma 3n) has no k_proj or v_proj: its source's adapters take k and v.
                if (has("k") && !mc.kv_shared(l)) make(l, LinearSite::QKV, Q, Q + K, E, p + "self_attn.k_proj");
                if (has("v") && !mc.kv_shared(l)) make(l, LinearSite::QKV, Q + K, Q + 2 * K, E, p + "self_attn.v_proj");
            }
            if (has("proj")) make(l, LinearSite::O, 0, E, Q, p + "self_attn.o_proj");
        }
        if (has("mlp") && mc.experts_layer(l))  // the experts are (N, E, 2I) parameters, not Linear modules
            throw Error(str("--lora.targets: 'mlp' adapts the gated MLP's Linear maps, but layer ", l, " of ", mc.name,
                            " is a mixture of ", mc.moe.num_experts, " experts (gpt-oss), which takes no adapters"),
                        "expected targets among q, k, v, proj, head for this model");
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

void Lora::begin_training_pass(uint64_t pass) {
    training_ = true;
    pass_ = pass;
}

void Lora::end_training_pass() { training_ = false; }

Tensor Lora::dropout_mask(int layer, LinearSite site, const Tensor& x, int64_t input_pos) const {
    if (!training_ || cfg_.dropout <= 0.0) return {};
    if (x.ndim() != 3) throw Error(str("LoRA dropout: adapter input of shape ", x.shape().str(), "; expected (B, n, in)"));
    const int64_t B = x.size(0), n = x.size(1), in = x.size(2);
    const double p = cfg_.dropout, keep_scale = 1.0 / (1.0 - p);
    std::vector<double> m((size_t)(B * n * in));
    for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < n; ++t) {
            const uint64_t key = dropout_row_key(cfg_.seed, pass_, layer, site, b, input_pos + t);
            double* row = m.data() + (b * n + t) * in;
            for (int64_t c = 0; c < in; ++c) row[c] = dropout_uniform(key, c) >= p ? keep_scale : 0.0;
        }
    return Tensor::from_f64({B, n, in}, m, x.dtype(), {x.device(), MemCategory::WORKSPACE, "lora dropout mask"});
}

void Lora::add(int layer, LinearSite site, const Tensor& x, int64_t input_pos, Tensor& y) const {
    const auto& list = at(layer, site);
    if (list.empty()) return;
    const Tensor mask = dropout_mask(layer, site, x, input_pos);
    const Tensor xd = mask.defined() ? ops::mul(x, mask) : x;  // (B, n, in)
    for (size_t i : list) {
        const LoraAdapter& a = adapters_[i];
        Tensor t = ops::linear(xd, a.A, y.dtype());  // (B, n, r)
        Tensor yc = cols(y, a.col0, a.col1);
        grad::mm_(yc, t, a.B.transpose(0, 1), scale(), 1.0f);
    }
}

void Lora::backward(int layer, LinearSite site, const Tensor& x, int64_t input_pos, const Tensor& dy, Tensor& dx) const {
    const auto& list = at(layer, site);
    if (list.empty()) return;
    const Tensor mask = dropout_mask(layer, site, x, input_pos);  // the forward's mask, drawn again
    Tensor x2 = grad::rows2d(mask.defined() ? ops::mul(x, mask) : x);  // (rows, in): the branch's input xd
    Tensor dx2 = dx.reshape({x2.size(0), x2.size(1)});
    // With dropout the branch's dxd is gathered first, then dx += dxd * mask.
    Tensor dxd = mask.defined() ? Tensor::zeros(x2.shape(), dx.dtype(), {dx.device(), MemCategory::WORKSPACE, "lora dxd"}) : dx2;
    for (size_t i : list) {
        const LoraAdapter& a = adapters_[i];
        Tensor dyc = grad::rows2d(cols(dy, a.col0, a.col1));  // (rows, out)
        Tensor t = ops::linear(x2, a.A, dy.dtype());          // (rows, r), recomputed
        Tensor dB = a.dB, dA = a.dA;
        ops::matmul_(dB, dyc.transpose(0, 1), t, scale(), 1.0f);  // dB += s dy^T t
        Tensor dt = ops::matmul(dyc, a.B, dy.dtype());            // (rows, r) = dy B
        ops::scale_(dt, dt, scale());
        ops::matmul_(dA, dt.transpose(0, 1), x2, 1.0f, 1.0f);  // dA += dt^T xd
        ops::matmul_(dxd, dt, a.A, 1.0f, 1.0f);                // dxd += dt A
    }
    if (mask.defined()) {
        ops::mul_(dxd, dxd, grad::rows2d(mask));
        ops::add_(dx2, dx2, dxd);
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
