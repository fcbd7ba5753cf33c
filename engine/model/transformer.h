// The decoder-only transformer forward pass (Llama, Mistral, Qwen2/2.5, Qwen3, Gemma 2/3, DeepSeek-V2's
// latent attention in latent_attention.h): blocks
// with RMSNorm before and/or after attention and MLP (ModelConfig::norm_placement), fused q/k/v
// projection (+ bias), optional per-head q/k RMSNorm, RoPE or YaRN with each layer's base and
// rotated fraction (LayerSpec), grouped-query attention through a LayerAttention with each
// layer's window, gated MLP (SiLU or GELU-tanh) or gpt-oss's mixture of experts (moe_mlp.h), final
// norm, lm_head.
// Weights arrive with Hugging Face names; f32 or bf16 storage (bf16: activations bf16,
// accumulation f32). The driver calls embed / block / head so it can loop cell -> layer -> chunk.
//
// Index
//   [SECTION] options and weights
//   [SECTION] Transformer
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "adapters.h"
#include "attention.h"
#include "engine/core/model_config.h"
#include "rope.h"

namespace kv {

// =========================================================================================
// [SECTION] options and weights
// =========================================================================================
struct ModelOptions {
    DType dtype = DType::F32;  // weight and activation storage: F32, BF16 (F64 for reference checks)
    Device device{};
    RopeMode rope = RopeMode::YARN;
    bool verify_checksum = false;  // load_model: check a model file against FILE.sha256 first
    // GGUF weights (--model.weights): "packed" keeps quantized matrices in their block format
    // (CPU with f32 activations; elsewhere it means "f32"), "f32" dequantizes them at load to
    // the model dtype, "bf16" dequantizes to bf16 (the model then runs in bf16).
    std::string weights = "packed";
    // Latent-attention models (--model.mla_cache): what the KV cache holds, set on the loaded
    // config by load_model (LatentAttention::cache); unset keeps the config's (latent).
    std::optional<LatentAttention::Cache> mla_cache;
};

// One layer's weights as the forward pass uses them (PyTorch Linear layout [out, in]).
struct LayerWeights {
    Tensor attn_norm;  // (E) before attention; undefined for NormPlacement::POST
    Tensor wqkv;       // ((NH + 2G) HS, E): q_proj, k_proj, v_proj stacked
    Tensor bqkv;       // ((NH + 2G) HS) or undefined
    Tensor q_norm;     // (HS) Qwen3, else undefined
    Tensor k_norm;     // (HS)
    Tensor wo;         // (E, NH HS)
    Tensor bo;         // (E) or undefined
    Tensor attn_post_norm;  // (E) on the attention output (NormPlacement POST, BOTH), else undefined
    Tensor mlp_norm;   // (E) before the MLP; undefined for NormPlacement::POST
    Tensor mlp_post_norm;   // (E) on the MLP output (POST, BOTH), else undefined
    Tensor w_gate_up;  // (2 I, E): gate_proj then up_proj
    Tensor w_down;     // (E, I)
    Tensor sinks;      // (NH) learned sink logits (gpt-oss's self_attn.sinks), or undefined
    // Multi-head latent attention (ModelConfig::latent_attention; wqkv undefined, wo padded to
    // (E, NH HS); engine/model/latent_attention.h):
    Tensor wq_a;       // (q_lora_rank, E) or undefined (queries straight from wq)
    Tensor q_a_norm;   // (q_lora_rank)
    Tensor wq;         // (NH HS, q_lora_rank or E): each head's rows [rotated ; nope]
    Tensor wkv_a;      // (kv_lora_rank + qk_rope_head_dim, E): the latent, then k_pe
    Tensor kv_a_norm;  // (kv_lora_rank)
    Tensor wkv_b;      // (NH (qk_nope_head_dim + v_head_dim), kv_lora_rank)
    // Gated short convolution in place of attention (ModelConfig::short_conv_layer; wqkv and wo
    // undefined; engine/model/short_conv.h):
    Tensor conv_in;    // (3E, E): b, c, x rows (conv.in_proj)
    Tensor conv_taps;  // (E, conv_kernel) depthwise taps (conv.conv)
    Tensor conv_out;   // (E, E) (conv.out_proj)
    Tensor v_norm;     // (HS) ones: the values' RMSNorm without weight (ModelConfig::v_norm), else undefined
    // Gemma 3n (ModelConfig::altup_enabled; engine/model/altup.h), else undefined:
    Tensor laurel_left;        // (R, E) laurel.linear_left
    Tensor laurel_right;       // (E, R) laurel.linear_right
    Tensor laurel_norm;        // (E) laurel.post_laurel_norm
    Tensor altup_router_norm;  // (E) altup.router_norm
    Tensor altup_router;       // (A, E) altup.modality_router
    Tensor altup_pred;         // (A A, A) altup.prediction_coefs
    Tensor altup_corr;         // (A, A) altup.correction_coefs, clamped to altup_coef_clip
    Tensor altup_out_scale;    // (E) altup.correct_output_scale
    Tensor pli_gate;           // (P, E) per_layer_input_gate
    Tensor pli_proj;           // (E, P) per_layer_projection
    Tensor pli_norm;           // (E) post_per_layer_input_norm
    Tensor kv_unread;          // (2 G HS, E) a KV-shared layer's k_proj, v_proj rows as loaded: never read, written back on save
    // Mixture of experts in the MLP's place (ModelConfig::experts_layer; w_gate_up and w_down
    // undefined; engine/model/moe_mlp.h), N experts of width I, each in Linear layout:
    Tensor router;                // (N, E) (mlp.router)
    Tensor router_bias;           // (N)
    Tensor experts_gate_up;       // (N, 2I, E): each expert's gate rows, then its up rows
    Tensor experts_gate_up_bias;  // (N, 2I), in the same order
    Tensor experts_down;          // (N, E, I)
    Tensor experts_down_bias;     // (N, E)
};

// Gemma 3n's model-level tensors (engine/model/altup.h).
struct AltUpWeights {
    Tensor embed_per_layer;       // (per_layer_vocab, L P) model.embed_tokens_per_layer
    Tensor per_layer_proj;        // (L P, E) model.per_layer_model_projection
    Tensor per_layer_norm;        // (P) model.per_layer_projection_norm
    std::vector<Tensor> proj;     // A - 1 of (E, E): model.altup_projections.i
    std::vector<Tensor> unembed;  // A - 1 of (E, E): model.altup_unembed_projections.i
};

// What a gradient pass keeps from a block's forward over one chunk (engine/grad reads it).
// Tensors are this chunk's (B, n, ...) activations in the activation dtype.
struct AltUpCoefs;  // engine/model/altup.h

struct BlockActivations {
    Tensor h1;    // attention-norm output (B, n, E)
    Tensor qkv;   // projection output after bias (B, n, (NH + 2G) HS), before q/k norm
    Tensor qr;    // rotated queries (B, NH, n, HS)
    Tensor kr;    // rotated keys (B, G, n, HS)
    Tensor v;     // values (B, G, n, HS)
    Tensor y;     // attention output (B, n, NH, HS)
    Tensor o;     // attention projection before its post-norm (B, n, E); only with attn_post_norm
    Tensor out1;  // x + attention projection (B, n, E)
    Tensor h2;    // MLP-norm output (B, n, E)
    Tensor gu;    // gate and up projections (B, n, 2I)
    Tensor a;     // act(gate) * up (B, n, I)
    Tensor d;     // MLP output before its post-norm (B, n, E); only with mlp_post_norm
    // Latent attention only (latent_attention.h; qkv stays undefined):
    Tensor q_a;   // W_q_a h before its norm (B, n, q_lora_rank); only with q_lora_rank
    Tensor q_in;  // W_q's input: RMSNorm(q_a), or h1 (B, n, q_lora_rank or E)
    Tensor ckv;   // W_kv_a h (B, n, kv_lora_rank + qk_rope_head_dim): the latent before its norm, then k_pe
    Tensor c;     // the normalised latent, W_kv_b's input (B, n, kv_lora_rank)
    // Short convolution only (short_conv.h; h1 is the mixer's input, o and out1 as above):
    Tensor conv_bcx;  // in_proj output [b ; c ; x] (B, n, 3E), adapters included
    Tensor conv_u;    // u = b * x over the state's conv_kernel - 1 positions, then the chunk's n (B, L - 1 + n, E)
    Tensor conv_s;    // the convolution's output s (B, n, E)
    Tensor conv_y;    // c * s, out_proj's input (B, n, E)
    // Mixture of experts only (moe_mlp.h): gu and a hold the selected (token, expert) rows in
    // dispatch order, (B n top_k, 2I) and (B n top_k, I), beside
    Tensor moe_logits;  // router logits (B n, N)
    Tensor moe_out;     // each selected expert's output, dispatch order (B n top_k, E)
    // Gemma 3n (altup.h): every stream predicted (B n, A, E) in the host dtype, the block core's
    // input and output (B, n, E); LAUREL's W_left h (B, n, R) and W_right W_left h (B, n, E);
    // the MLP gate before its gaussian top-k (B, n, I) (gu holds it after)
    Tensor altup_pred, altup_active, altup_out;
    Tensor laurel_left, laurel_r;
    Tensor gate_pre;
};

// =========================================================================================
// [SECTION] Transformer
// =========================================================================================
class Transformer {
   public:
    // Takes weights with HF names (any float dtype; converted to opt.dtype on opt.device).
    // Throws kv::Error naming missing or mis-shaped tensors.
    Transformer(const ModelConfig& cfg, const TensorMap& weights, const ModelOptions& opt);
    // The same, taking the map over: tensors already in the model's form (dtype or packed
    // format, device, contiguous, category weights; q/k/v and gate/up back to back in one
    // buffer) are adopted without a copy, so loading never holds two copies of the weights.
    // Packed weights (engine/model/packed_weight.h) stay packed on the CPU with f32
    // activations and are dequantized otherwise (bf16, f64, CUDA).
    Transformer(const ModelConfig& cfg, TensorMap&& weights, const ModelOptions& opt);

    const ModelConfig& config() const { return cfg_; }
    // A latent-attention model's cache form (LatentAttention::cache): the same weights computed
    // with a latent or an expanded cache (training switches to the expanded form).
    void set_mla_cache(LatentAttention::Cache c) { cfg_.latent.cache = c; }
    const ModelOptions& options() const { return opt_; }
    DType act_dtype() const { return opt_.dtype; }

    // The context width drives YaRN (scale s = width / training length). Keys are cached
    // rotated, so the driver sets it once per sequence (e.g. to the sequence length).
    void set_context_width(int64_t width);
    int64_t context_width() const { return ropes_[0].context_width; }
    // Layer l's RoPE tables and attention scale (layers with the same LayerSpec share them);
    // rope() is layer 0's.
    const RopeTables& rope(int layer) const { return ropes_[layer_rope_[size_t(layer)]]; }
    const RopeTables& rope() const { return rope(0); }

    // ids int32/int64 (B, T) -> x (B, T, E) in the activation dtype: the table's rows times
    // embedding_multiplier().
    Tensor embed(const Tensor& ids) const;
    // ModelConfig::embedding_scale as applied: rounded to bf16 for bf16 activations, as
    // transformers casts Gemma's sqrt(hidden) to the weights' dtype (33.94 -> 34).
    float embedding_multiplier() const;
    // One block over n new tokens at positions input_pos.. ; x (B, n, W) -> (B, n, W), W =
    // ModelConfig::residual_width() (E, or Gemma 3n's packed streams and per-layer inputs).
    // With `save`, keeps what the block's backward needs.
    Tensor block(int layer, const Tensor& x, int64_t input_pos, LayerAttention& attention,
                 BlockActivations* save = nullptr) const;
    // Final RMSNorm (B, n, W) -> (B, n, E) (Gemma 3n: the streams merged first).
    Tensor final_norm(const Tensor& x) const;
    // lm_head on normalised states (B, n, E) of positions input_pos.. -> logits f32 (B, n, V).
    // The positions matter only to adapters (LoRA dropout in a training pass).
    Tensor lm_head(const Tensor& h, int64_t input_pos = 0) const;
    // Final-logit soft-capping's share of the backward (Gemma 2; nothing without a cap):
    // dlogits (contiguous, as lm_head's logits) *= 1 - (logits / cap)^2.
    void final_softcap_backward_(Tensor& dlogits, const Tensor& logits) const;
    // Whole forward of ids at input_pos through every layer -> logits f32 (B, T, V).
    // With attention = nullptr, PlainAttention (no cache; input_pos must be 0).
    Tensor forward(const Tensor& ids, int64_t input_pos = 0, LayerAttention* attention = nullptr) const;

    const LayerWeights& layer(int l) const { return layers_[size_t(l)]; }
    // Training updates weights in place (full fine-tuning).
    LayerWeights& mutable_layer(int l) { return layers_[size_t(l)]; }
    Tensor& mutable_embedding() { return embed_; }
    Tensor& mutable_lm_head_weight() { return lm_head_; }
    Tensor& mutable_final_norm_weight() { return norm_; }
    bool tied_embeddings() const { return lm_head_.storage() == embed_.storage(); }
    // Adapters on the linear maps (LoRA); nullptr = none. Not owned.
    void set_adapters(const LinearAdapters* a) { adapters_ = a; }
    const LinearAdapters* adapters() const { return adapters_; }
    const Tensor& embedding() const { return embed_; }
    const Tensor& lm_head_weight() const { return lm_head_; }
    const Tensor& final_norm_weight() const { return norm_; }
    int64_t parameter_count() const;
    size_t weight_bytes() const;  // as stored: packed weights count their block bytes
    // Whether any weight is kept packed (engine/model/packed_weight.h): those are frozen.
    bool has_packed_weights() const;

    const AltUpWeights& altup_weights() const { return altup_; }
    AltUpWeights& mutable_altup_weights() { return altup_; }

   private:
    void init(const TensorMap& weights, bool adopt);
    // The block on one residual stream x (B, n, E); Gemma 3n's block() wraps it in AltUp.
    // coefs (Gemma 3n, f32): the MLP's residual add also makes AltUp's correction coefficients.
    Tensor block_core(int layer, const Tensor& x, int64_t input_pos, LayerAttention& attention, BlockActivations* save,
                      AltUpCoefs* coefs = nullptr) const;
    // forward()'s loop for Gemma 3n with f32 activations: block() of every layer, each AltUp
    // correction making the next layer's prediction (altup_correct's follow).
    Tensor altup_blocks(const Tensor& x, int64_t input_pos, LayerAttention& attention) const;
    AltUpWeights altup_;
    ModelConfig cfg_;
    ModelOptions opt_;
    Tensor embed_;    // (V, E)
    Tensor norm_;     // (E)
    Tensor lm_head_;  // (V, E) (the embedding when tied)
    std::vector<LayerWeights> layers_;
    std::vector<RopeTables> ropes_;   // one per distinct layer RoPE (theta, fraction, scaled)
    std::vector<size_t> layer_rope_;  // layer -> index into ropes_
    const LinearAdapters* adapters_ = nullptr;
};

}  // namespace kv
