// Multi-head latent attention (DeepSeek-V2, MiniCPM3; ModelConfig::latent_attention): the
// projections that turn a normalised hidden state into per-head rotated queries, keys and
// values, and the loading of their weights. Two forms reach the LayerAttention (the cache),
// chosen by LatentAttention::cache: EXPANDED hands it keys and values decompressed per head
// (latent_qkv), LATENT one shared vector [k_pe ; c_kv] per token with W_kv_b absorbed
// (latent_attend).
//
//   c_kv = RMSNorm(W_kv_a x)[:kv_lora_rank]       the latent (kv_a_layernorm)
//   k_pe = RoPE(W_kv_a x)[kv_lora_rank:]           one rotated key, shared by every head
//   [k_nope ; v] = W_kv_b c_kv                     per head
//   k = [k_pe ; k_nope], q = [RoPE(q_pe) ; q_nope]  (rotated channels first, see below)
//   q = W_q x, or W_q_b RMSNorm(W_q_a x) with q_lora_rank
//
// Checkpoints lay each head out [nope ; pe] with pe's pairs interleaved (transformers'
// DeepSeek-V2 rotates (x_2d, x_2d+1) as one complex number). The loader permutes the rows of
// W_q and of W_kv_a's k_pe part to [pe pairs (d, d + R/2) ; nope], kvlab's partial rotate-half
// layout (Phi-3's), applying the same permutation to q and k, so q.k is unchanged. Values are
// cached padded with zeros to head_dim (the cache holds one head size for K and V), and
// W_o's columns are padded to match, so y's padding multiplies zeros.
#pragma once

#include <string>

#include "engine/core/model_config.h"
#include "engine/model/model_grads.h"
#include "engine/model/rope.h"
#include "engine/model/transformer.h"

namespace kv {

// Layer weights from their checkpoint names (prefix "model.layers.L."): wq_a, q_a_norm, wq,
// wkv_a, wkv_b, kv_a_norm permuted as above, and wo padded to (E, NH * head_dim). Throws
// kv::Error naming a missing or mis-shaped tensor.
void load_latent_attention(const ModelConfig& cfg, const TensorMap& w, const std::string& prefix, DType dtype, Device device,
                           LayerWeights& L);

// h (B, n, E) at positions input_pos.. -> qr, kr, v (B, NH, n, head_dim), q and k rotated with
// rt (n_rot = qk_rope_head_dim), v's channels past v_head_dim zero. Adapters (LoRA) add to W_q
// (LinearSite::QKV), W_kv_a (KV_A) and W_kv_b (KV_B) of layer `layer`; with `save`, keeps q_a,
// q_in, ckv and c for latent_qkv_backward.
void latent_qkv(const ModelConfig& cfg, const LayerWeights& L, const Tensor& h, const RopeTables& rt, int64_t input_pos,
                DType act, Tensor& qr, Tensor& kr, Tensor& v, int layer = 0, const LinearAdapters* adapters = nullptr,
                BlockActivations* save = nullptr);

// The smallest chunk of queries latent_attend offers to run in the expanded form
// (LatentExpansion::min_queries): from the work counts with LatentAttention::ChunkForm::AUTO,
// 0 with EXPANDED, -1 (never) with ABSORBED or where expanding never saves work.
int64_t latent_expand_min_queries(const ModelConfig& cfg);

// The latent form of the layer's attention: the cache gets one KV head per token, k~ =
// [RoPE(k_pe) ; c_kv] (qk_rope_head_dim + kv_lora_rank), as key and as value; each head's query
// is q~_h = [RoPE(q_pe) ; W_uk_h^T q_nope] (W_uk_h: head h's k_nope rows of W_kv_b), so
// q~_h . k~ is the expanded score; y_h = W_uv_h (sum_j p_j c_j) (W_uv_h: its value rows). y
// (B, n, NH, head_dim) gets the expanded form's output, zeros past v_head_dim. Inference only
// (no activations kept): adapters on W_kv_b are folded into the map it absorbs.
// A chunk of at least latent_expand_min_queries(cfg) queries is offered to the attention in the
// expanded form (LayerAttention::attend_latent, latent_expansion.h): a cache that takes it still
// stores the latents, decompresses the held ones per head and writes the same y.
void latent_attend(const ModelConfig& cfg, const LayerWeights& L, const Tensor& h, const RopeTables& rt, int64_t input_pos,
                   DType act, LayerAttention& attention, float scale, int window, Tensor& y, int layer = 0,
                   const LinearAdapters* adapters = nullptr);

// Reverse of latent_qkv given dqr, dkr, dv (B, NH, n, head_dim; dv's padding is ignored): dh
// (B, n, E), the gradient w.r.t. latent_qkv's input a.h1. Weight gradients accumulate into g's
// latent tensors when given; adapter gradients through `adapters`.
Tensor latent_qkv_backward(const ModelConfig& cfg, const LayerWeights& L, const BlockActivations& a, const RopeTables& rt,
                           int64_t input_pos, const Tensor& dqr, const Tensor& dkr, const Tensor& dv, int layer,
                           const LinearAdapters* adapters, LayerGrads* g);

// The layer's latent-attention weights under their checkpoint names (prefix "model.layers.L.")
// and in the checkpoint's layout (the loader's row permutations undone, W_o without its
// padding): new tensors in the weights' dtype, what load_latent_attention reads back.
TensorMap latent_state_dict(const ModelConfig& cfg, const LayerWeights& L, const std::string& prefix);

// Parameters of the checkpoint's latent-attention tensors of one layer (wo without padding).
int64_t latent_parameter_count(const ModelConfig& cfg, const LayerWeights& L);

}  // namespace kv
