#include "grad_test_util.h"

#include "engine/core/error.h"

namespace kv::test {

ModelConfig grad_test_config(const std::string& arch, int64_t layers) {
    ModelConfig c = preset_config("tiny");
    c.name = "grad-test-" + arch;
    c.vocab_size = 48;
    c.hidden_size = 32;
    c.intermediate_size = 48;
    c.num_layers = layers;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = 8;
    c.max_position_embeddings = 64;  // shorter than the tests' sequences: YaRN scaling is on
    if (arch == "qwen2") {
        c.arch = Arch::QWEN2;
        c.model_type = arch_name(c.arch);
        c.qkv_bias = true;
        c.tie_word_embeddings = true;
    } else if (arch == "qwen3") {
        c.arch = Arch::QWEN3;
        c.model_type = arch_name(c.arch);
        c.qk_norm = true;
    } else if (arch == "smollm3") {  // every second layer NoPE (SmolLM3 has every fourth)
        c.arch = Arch::SMOLLM3;
        c.model_type = arch_name(c.arch);
        c.layer_specs.resize(size_t(layers));
        for (int64_t l = 0; l < layers; ++l) c.layer_specs[size_t(l)].rotary_fraction = (l + 1) % 2 != 0 ? 1.0 : 0.0;
    } else if (arch == "phi3") {  // fused projections, half the channels rotated
        c.arch = Arch::PHI3;
        c.model_type = arch_name(c.arch);
        c.fused_projections = true;
        c.partial_rotary_factor = 0.5;
    } else if (arch == "geglu") {  // Gemma's GELU-tanh gated MLP in Llama blocks
        c.mlp_act = MlpAct::GELU_TANH;
    } else if (arch == "gemma3") {  // Gemma 3 blocks without windows (gradients refuse windows), RoPE base per layer
        c.arch = Arch::GEMMA3;
        c.model_type = arch_name(c.arch);
        c.norm_placement = NormPlacement::BOTH;
        c.norm_weight_offset = 1.0;
        // Gemma's factor is sqrt(hidden) (5.7 here); 2 tests the same path while keeping the
        // finite differences' truncation error at an embedding entry below the tolerance.
        c.embedding_scale = 2.0;
        c.qk_norm = true;
        c.query_pre_attn_scalar = 12;
        c.mlp_act = MlpAct::GELU_TANH;
        c.tie_word_embeddings = true;
        c.layer_specs.resize(size_t(layers));
        for (int64_t l = 0; l < layers; ++l) c.layer_specs[size_t(l)].rope_theta = l % 2 == 0 ? 10000.0 : 1000000.0;
    } else if (arch == "gemma3_window") {  // as "gemma3", layer 0 sliding with a window of 5
        c = grad_test_config("gemma3", layers);
        c.layer_specs[0].attention = AttnKind::SLIDING;
        c.layer_specs[0].window = 5;
    } else if (arch == "gemma2_softcap") {  // Gemma 2 blocks with both soft-caps small enough to saturate
        c = grad_test_config("gemma3", layers);
        c.arch = Arch::GEMMA2;
        c.model_type = arch_name(c.arch);
        c.qk_norm = false;
        c.attn_logit_softcap = 0.7;
        c.final_logit_softcap = 1.5;
    } else if (arch == "qwen2_window") {  // Qwen2 with use_sliding_window: layers >= max_window_layers (1) windowed (5)
        c = grad_test_config("qwen2", layers);
        c.sliding_window = 5;
        c.window_from_layer = 1;
    } else if (arch == "mistral") {  // every layer windowed
        c.arch = Arch::MISTRAL;
        c.model_type = arch_name(c.arch);
        c.sliding_window = 6;
    } else if (arch == "gpt_oss") {  // sinks, q/k/v/o biases, layer 0 sliding (window 5), layer 1 full
        c.arch = Arch::GPT_OSS;
        c.model_type = arch_name(c.arch);
        c.attention_sinks = true;
        c.qkv_bias = c.o_bias = true;
        c.layer_specs.resize(size_t(layers));
        for (int64_t l = 0; l < layers; ++l) {
            c.layer_specs[size_t(l)].rope_theta = c.rope_theta;
            if (l % 2 == 0) c.layer_specs[size_t(l)].attention = AttnKind::SLIDING, c.layer_specs[size_t(l)].window = 5;
        }
    } else if (arch == "gpt_oss_moe") {  // as "gpt_oss", with gpt-oss's experts in every layer: 4 of them, 2 per token
        c = grad_test_config("gpt_oss", layers);
        c.moe.num_experts = 4;
        c.moe.top_k = 2;
        for (LayerSpec& s : c.layer_specs) s.mlp = MlpKind::EXPERTS;
    } else if (arch == "mla" || arch == "mla_qlora") {
        // DeepSeek-V2 latent attention: keys of 6 + 4 rotated channels and values of 6 from a
        // latent of 8 (v_head_dim < head_dim: values padded); "mla_qlora" also compresses the
        // queries through a normalised latent of 12 (q_lora_rank), "mla" projects them directly.
        c.arch = Arch::DEEPSEEK_V2;
        c.model_type = arch_name(c.arch);
        c.attn_projection = AttnProjection::LATENT;
        c.num_kv_heads = c.num_heads;
        c.head_dim = 10;
        c.latent.q_lora_rank = arch == "mla_qlora" ? 12 : 0;
        c.latent.kv_lora_rank = 8;
        c.latent.qk_nope_head_dim = 6;
        c.latent.qk_rope_head_dim = 4;
        c.latent.v_head_dim = 6;
        c.partial_rotary_factor = 0.4;
        c.latent.cache = LatentAttention::Cache::EXPANDED;  // gradients run through the expanded form
    } else if (arch == "lfm2") {
        // LFM2's hybrid: gated short convolutions of width 3 in the even layers (0, 2, ...), attention
        // with per-head q/k norm in the odd ones, tied embeddings (as the tiny-lfm2 preset)
        c.arch = Arch::LFM2;
        c.model_type = arch_name(c.arch);
        c.qk_norm = true;
        c.tie_word_embeddings = true;
        c.conv_kernel = 3;
        c.layer_specs.resize(size_t(layers));
        for (int64_t l = 0; l < layers; ++l) {
            LayerSpec& s = c.layer_specs[size_t(l)];
            s.rope_theta = c.rope_theta;
            if (l % 2 == 0) s.mixer = LayerMixer::SHORT_CONV, s.attention = AttnKind::NONE;
        }
    } else if (arch == "gemma3n") {
        // Gemma 3n's particulars in miniature: AltUp over 3 streams (active 0, corrected output
        // scaled), LAUREL of rank 4, per-layer inputs of 4 channels, v norm, final soft-cap; layers
        // sliding (window 5) / full alternating (2 layers: both sliding), the gaussian top-k gate
        // (0.8) in layer 0, and the second half reading the K/V of the last earlier layer of its type
        c.arch = Arch::GEMMA3N;
        c.model_type = arch_name(c.arch);
        c.norm_placement = NormPlacement::BOTH;
        c.embedding_scale = 2.0;  // sqrt(hidden) in the model; 2 keeps the differences' truncation small (as "gemma3")
        c.qk_norm = c.v_norm = true;
        c.query_pre_attn_scalar = 4.0;
        c.final_logit_softcap = 3.0;
        c.mlp_act = MlpAct::GELU_TANH;
        c.tie_word_embeddings = true;
        c.altup.num_inputs = 3;
        c.altup.active_idx = 0;
        c.altup.coef_clip = 120.0;
        c.altup.correct_scale = true;
        c.altup.laurel_rank = 4;
        c.altup.per_layer_dim = 4;
        c.altup.per_layer_vocab = c.vocab_size;
        c.layer_specs.resize(size_t(layers));
        const int64_t first_shared = (layers + 1) / 2;
        for (int64_t l = 0; l < layers; ++l) {
            LayerSpec& s = c.layer_specs[size_t(l)];
            const bool sliding = layers == 2 || l % 2 == 0;
            s.rope_theta = sliding ? 10000.0 : 1000000.0;
            if (sliding) s.attention = AttnKind::SLIDING, s.window = 5;
            s.activation_sparsity = l == 0 ? 0.8 : 0.0;
            if (l >= first_shared)
                for (int64_t j = first_shared - 1; j >= 0 && s.kv_source < 0; --j)
                    if ((layers == 2 || j % 2 == 0) == sliding) s.kv_source = j;
        }
    } else if (arch == "olmo2") {  // output norms, q/k norm over the whole projection
        c.arch = Arch::OLMO2;
        c.model_type = arch_name(c.arch);
        c.norm_placement = NormPlacement::POST;
        c.qk_norm = c.qk_norm_whole = true;
    }
    return c;
}

std::unique_ptr<Transformer> grad_test_model(const ModelConfig& cfg, DType dtype, uint64_t seed) {
    ModelOptions o;
    o.dtype = dtype;
    TensorMap w = random_weights(cfg, seed, DType::F64);
    return std::make_unique<Transformer>(cfg, w, o);
}

GradData grad_test_data(const ModelConfig& cfg, int64_t B, int64_t T, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<int32_t> ids((size_t)(B * T));
    for (auto& x : ids) x = int32_t(rng() % uint64_t(cfg.vocab_size));
    GradData d;
    d.ids = Tensor::from_i32({B, T}, ids);
    d.head.kind = HeadKind::NEXT_TOKEN;
    d.head.B = B;
    d.head.T = T;
    d.head.token_targets.assign(size_t(B * T), -100);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t + 1 < T; ++t)
            if (rng() % 5 != 0) d.head.token_targets[size_t(b * T + t)] = ids[size_t(b * T + t + 1)];
    return d;
}

ChunkPlan grad_test_plan(const ModelConfig& cfg, int64_t T, int64_t L, int64_t chunk, double multiplier) {
    ChunkPlanOptions po;
    po.chunk_size = chunk;
    po.cell_factor = cell_factor(cfg);
    po.chunks_per_cell_multiplier = multiplier;
    return plan_chunks(T, std::vector<int64_t>(size_t(cfg.num_layers), L), po);
}

double get_elem(const Tensor& t, int64_t i) {
    if (!t.is_contiguous() || !t.device().is_cpu()) throw Error("get_elem: contiguous CPU tensor expected");
    if (t.dtype() == DType::F64) return static_cast<const double*>(t.data_ptr())[i];
    if (t.dtype() == DType::F32) return static_cast<const float*>(t.data_ptr())[i];
    throw Error("get_elem: f32/f64 expected");
}

void set_elem(Tensor& t, int64_t i, double v) {
    if (t.dtype() == DType::F64) static_cast<double*>(t.data_ptr())[i] = v;
    else if (t.dtype() == DType::F32) static_cast<float*>(t.data_ptr())[i] = float(v);
    else throw Error("set_elem: f32/f64 expected");
}

double central_difference(Tensor& t, int64_t i, double h, const std::function<double()>& loss) {
    const double x = get_elem(t, i);
    set_elem(t, i, x + h);
    const double lp = loss();
    set_elem(t, i, x - h);
    const double lm = loss();
    set_elem(t, i, x);
    return (lp - lm) / (2 * h);
}

}  // namespace kv::test
