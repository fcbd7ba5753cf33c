// The architecture families against a Llama of the same shapes (see family_bench.h).
#include "family_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "engine/kv/kv_cache.h"
#include "engine/kv/kv_config.h"
#include "engine/model/presets.h"
#include "engine/model/transformer.h"

namespace kv::bench {

namespace {

// Each family's particulars on the Llama's shapes: the same matrices, so the same parameter
// count up to the norms (Gemma's four per layer, OLMo 2's q/k norms over the projection);
// latent attention, LFM2's convolutions and gpt-oss's experts have matrices of their own (counts
// in the rows).
ModelConfig family_config(const ModelConfig& llama, const std::string& family) {
    ModelConfig c = llama;
    c.name = family;
    const int64_t L = c.num_layers;
    if (family == "gemma3" || family == "gemma2") {
        c.arch = family == "gemma3" ? Arch::GEMMA3 : Arch::GEMMA2;
        c.norm_placement = NormPlacement::BOTH;
        c.norm_weight_offset = 1.0;
        c.embedding_scale = std::sqrt(double(c.hidden_size));
        c.qk_norm = family == "gemma3";
        c.query_pre_attn_scalar = double(c.head_dim);
        c.mlp_act = MlpAct::GELU_TANH;
        if (family == "gemma2") c.attn_logit_softcap = 50.0, c.final_logit_softcap = 30.0;
        c.layer_specs.resize(size_t(L));
        const int pattern = family == "gemma3" ? 6 : 2;
        for (int64_t l = 0; l < L; ++l) {
            LayerSpec& s = c.layer_specs[size_t(l)];
            s.rope_theta = c.rope_theta;
            if ((l + 1) % pattern != 0) s.attention = AttnKind::SLIDING, s.window = 4096;
        }
    } else if (family == "smollm3") {
        c.arch = Arch::SMOLLM3;
        c.layer_specs.resize(size_t(L));
        for (int64_t l = 0; l < L; ++l) {
            c.layer_specs[size_t(l)].rope_theta = c.rope_theta;
            c.layer_specs[size_t(l)].rotary_fraction = (l + 1) % 4 != 0 ? 1.0 : 0.0;
        }
    } else if (family == "phi3") {
        c.arch = Arch::PHI3;
        c.fused_projections = true;
        c.partial_rotary_factor = 0.75;
    } else if (family == "gpt_oss") {
        // sinks, biases, sliding 128 / full alternating; in every layer 4 experts of half the
        // Llama's MLP width, 2 per token: the Llama's MLP work per token, twice its MLP parameters
        c.arch = Arch::GPT_OSS;
        c.attention_sinks = true;
        c.qkv_bias = c.o_bias = true;
        c.intermediate_size = llama.intermediate_size / 2;
        c.moe.num_experts = 4;
        c.moe.top_k = 2;
        c.layer_specs.resize(size_t(L));
        for (int64_t l = 0; l < L; ++l) {
            c.layer_specs[size_t(l)].rope_theta = c.rope_theta;
            c.layer_specs[size_t(l)].mlp = MlpKind::EXPERTS;
            if (l % 2 == 0) c.layer_specs[size_t(l)].attention = AttnKind::SLIDING, c.layer_specs[size_t(l)].window = 128;
        }
    } else if (family == "deepseek_v2" || family == "deepseek_v2_expanded") {
        // latent attention (DeepSeek-V2-Lite's form: q_proj direct, no q latent), caching the
        // latents (run_family_bench feeds it through a dense cache) or the expanded per-head
        // keys and values (a forward without a cache, like the other families)
        c.arch = Arch::DEEPSEEK_V2;
        if (family == "deepseek_v2_expanded") c.latent.cache = LatentAttention::Cache::EXPANDED;
        c.attn_projection = AttnProjection::LATENT;
        c.num_kv_heads = c.num_heads;  // MLA decompresses keys and values for every head
        c.latent.kv_lora_rank = c.hidden_size / 4;
        c.latent.qk_rope_head_dim = c.head_dim / 4;
        c.latent.qk_nope_head_dim = c.head_dim - c.latent.qk_rope_head_dim;
        c.latent.v_head_dim = c.head_dim;
        c.partial_rotary_factor = double(c.latent.qk_rope_head_dim) / double(c.head_dim);
    } else if (family == "lfm2") {  // hybrid: gated short convolutions (width 3) in two of every three layers
        c.arch = Arch::LFM2;
        c.qk_norm = true;
        c.conv_kernel = 3;
        c.layer_specs.resize(size_t(L));
        for (int64_t l = 0; l < L; ++l) {
            LayerSpec& s = c.layer_specs[size_t(l)];
            s.rope_theta = c.rope_theta;
            if (l % 3 != 2) s.mixer = LayerMixer::SHORT_CONV, s.attention = AttnKind::NONE;
        }
    } else if (family == "gemma3n") {
        // Gemma 3n E2B's layout at the Llama's width: AltUp over 4 streams, LAUREL (rank E/32),
        // per-layer inputs (E/8 per layer), the gaussian top-k gate in the first third of the
        // layers, layer types sliding x2 / full, and the last third reading earlier layers' K/V
        c.arch = Arch::GEMMA3N;
        c.norm_placement = NormPlacement::BOTH;
        c.embedding_scale = std::sqrt(double(c.hidden_size));
        c.qk_norm = c.v_norm = true;
        c.query_pre_attn_scalar = 1.0;
        c.final_logit_softcap = 30.0;
        c.mlp_act = MlpAct::GELU_TANH;
        c.altup.num_inputs = 4;
        c.altup.coef_clip = 120.0;
        c.altup.laurel_rank = std::max<int64_t>(1, c.hidden_size / 32);
        c.altup.per_layer_dim = std::max<int64_t>(1, c.hidden_size / 8);
        c.altup.per_layer_vocab = c.vocab_size;
        c.layer_specs.resize(size_t(L));
        const int64_t first_shared = L - L / 3;
        for (int64_t l = 0; l < L; ++l) {
            LayerSpec& s = c.layer_specs[size_t(l)];
            const bool sliding = (l + 1) % 3 != 0;
            s.rope_theta = sliding ? 10000.0 : c.rope_theta;
            s.rope_scaled = !sliding;
            if (sliding) s.attention = AttnKind::SLIDING, s.window = 512;
            s.activation_sparsity = l < L / 3 ? 0.95 : 0.0;
            if (l >= first_shared)  // the last earlier layer of its type keeps the K/V it reads
                for (int64_t j = first_shared - 1; j >= 0 && s.kv_source < 0; --j)
                    if (((j + 1) % 3 != 0) == sliding) s.kv_source = j;
        }
    } else if (family == "olmo2") {
        c.arch = Arch::OLMO2;
        c.norm_placement = NormPlacement::POST;
        c.qk_norm = c.qk_norm_whole = true;
    }
    c.model_type = arch_name(c.arch);
    return c;
}

// The parameters one token's forward multiplies by: all but the lookup tables (the token
// embedding unless it is also the output layer, Gemma 3n's per-layer embeddings) and the experts
// the router leaves out (a token runs top_k of num_experts). The issue's "a Llama of the same
// parameter count" is read as this count: a mixture's idle experts and a table lookup cost no
// arithmetic, every other parameter costs one multiply-add per token.
int64_t active_parameters(const Transformer& m, const ModelConfig& c) {
    int64_t n = m.parameter_count();
    if (!m.tied_embeddings()) n -= m.embedding().numel();
    if (m.altup_weights().embed_per_layer.defined()) n -= m.altup_weights().embed_per_layer.numel();
    for (int64_t l = 0; l < c.num_layers; ++l) {
        const LayerWeights& L = m.layer(int(l));
        if (!L.experts_gate_up.defined() || c.moe.num_experts <= 0) continue;
        int64_t e = 0;
        for (const Tensor* t : {&L.experts_gate_up, &L.experts_gate_up_bias, &L.experts_down, &L.experts_down_bias})
            if (t->defined()) e += t->numel();
        n -= e * (c.moe.num_experts - c.moe.top_k) / c.moe.num_experts;
    }
    return n;
}

// The Llama of `active` active parameters: the preset's shapes with the MLP width moved (each
// unit of width is 3 E weights per layer), to a multiple of 16 so its matrices keep the kernels'
// preferred shapes. Returns the preset itself when that is the nearest.
ModelConfig matched_llama(const ModelConfig& llama, int64_t llama_active, int64_t active) {
    ModelConfig c = llama;
    const double per_unit = 3.0 * double(llama.hidden_size) * double(llama.num_layers);
    const double width = double(llama.intermediate_size) + double(active - llama_active) / per_unit;
    c.intermediate_size = std::max<int64_t>(16, int64_t(std::llround(width / 16.0)) * 16);
    if (c.intermediate_size != llama.intermediate_size) c.name = str("llama-mlp", c.intermediate_size);
    return c;
}

}  // namespace

const std::vector<std::string>& family_names() {
    static const std::vector<std::string> names = {"gemma3", "gemma2",      "smollm3",
                                                   "phi3",   "olmo2",       "gpt_oss",
                                                   "deepseek_v2", "deepseek_v2_expanded", "lfm2",
                                                   "gemma3n"};
    return names;
}

std::vector<CacheBenchRow> run_family_bench(const FamilyBenchOptions& opt, const std::function<void(int, int, const std::string&)>& progress) {
    const ModelConfig llama = preset_config(opt.model);
    std::vector<std::string> families;
    for (const std::string& n : opt.families.empty() ? family_names() : opt.families) {
        if (std::find(family_names().begin(), family_names().end(), n) == family_names().end()) {
            std::string all;
            for (const std::string& k : family_names()) all += (all.empty() ? "" : ", ") + k;
            throw Error(str("bench families: unknown family '", n, "'; expected one of ", all));
        }
        families.push_back(n);
    }
    // Model 0 is the Llama of the preset's shapes; each family is compared with it (same shapes)
    // and, where its active parameter count differs by at least one step of MLP width, with a
    // Llama of that count too (matched[f]: the model index of its Llama).
    struct Entry {
        std::string name;
        ModelConfig cfg;
    };
    std::vector<Entry> entries = {{"llama", llama}};
    std::vector<std::unique_ptr<Transformer>> models;
    std::vector<std::unique_ptr<KVCache>> caches;
    auto add = [&](const ModelConfig& c) {
        models.push_back(std::make_unique<Transformer>(c, random_weights(c, 7, DType::F32), ModelOptions{}));
        // The latent row measures the latent cache's path: its forward writes the latents into a
        // dense cache of the whole sequence (a forward without a cache stores nothing, so it runs expanded).
        caches.push_back(c.latent_cache() ? std::make_unique<KVCache>(KVCacheConfig{}, c, Device{}, DType::F32, opt.tokens) : nullptr);
    };
    add(llama);
    const int64_t llama_active = active_parameters(*models[0], llama);
    std::vector<size_t> family_model, matched;
    std::vector<int64_t> active;
    for (const std::string& n : families) {
        const ModelConfig c = family_config(llama, n);
        add(c);
        entries.push_back({n, c});
        family_model.push_back(models.size() - 1);
        active.push_back(active_parameters(*models.back(), c));
        const ModelConfig m = matched_llama(llama, llama_active, active.back());
        size_t at = 0;
        if (m.intermediate_size != llama.intermediate_size) {
            for (size_t e = 0; e < entries.size() && at == 0; ++e)
                if (entries[e].name == m.name) at = e;
            if (at == 0) add(m), entries.push_back({m.name, m}), at = models.size() - 1;
        }
        matched.push_back(at);
    }
    std::vector<int32_t> ids(size_t(opt.tokens));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 7919) % size_t(llama.vocab_size));
    const Tensor x = Tensor::from_i32({1, opt.tokens}, ids);
    std::vector<double> best(models.size(), 1e300);
    const int total = opt.repeats * int(models.size());
    for (int r = 0; r < opt.repeats; ++r)
        for (size_t m = 0; m < models.size(); ++m) {  // interleaved: load drifts hit every model alike
            progress(r * int(models.size()) + int(m), total, entries[m].name);
            const auto t0 = std::chrono::steady_clock::now();
            if (caches[m]) models[m]->forward(x, 0, caches[m].get());  // input position 0: a new sequence
            else models[m]->forward(x);
            best[m] = std::min(best[m], std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
    auto speed = [&](size_t m) { return double(opt.tokens) / best[m]; };
    auto millions = [](int64_t n) { return str(std::round(double(n) / 1e4) / 100.0, " M"); };
    std::vector<CacheBenchRow> rows;
    for (size_t f = 0; f < families.size(); ++f) {
        const size_t fm = family_model[f], lm = matched[f];
        const int64_t ref_active = lm == 0 ? llama_active : active_parameters(*models[lm], entries[lm].cfg);
        CacheBenchRow row;
        row.name = str(families[f], " vs ", entries[lm].name, " (active ", millions(active[f]), " vs ", millions(ref_active), ")");
        row.a = speed(fm);
        row.b = speed(lm);
        row.unit = "tokens/s";
        row.ratio = row.a / row.b;
        row.target = 1.0 / 1.2;
        rows.push_back(row);
        if (lm != 0) {  // the same shapes as well, without a target: the family's extra arithmetic included
            CacheBenchRow same;
            same.name = str(families[f], " vs llama, same shapes (active ", millions(active[f]), " vs ", millions(llama_active), ")");
            same.a = speed(fm);
            same.b = speed(0);
            same.unit = "tokens/s";
            same.ratio = same.a / same.b;
            rows.push_back(same);
        }
    }
    return rows;
}

}  // namespace kv::bench
