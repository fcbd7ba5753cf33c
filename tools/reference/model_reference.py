#!/usr/bin/python3
"""Independent PyTorch reference for kvlab's transformer forward pass.

Builds tiny Llama / Mistral / Qwen2 / Qwen3 / Gemma 2 / Gemma 3 / SmolLM3 / Phi-3 / OLMo 2 models (Gemma 2 also soft-capped) with seeded random weights, writes each as a Hugging
Face folder (config.json + model.safetensors, written by the small writer below, not by
kvlab), and computes in float64 the logits for a few inputs plus greedy continuations. The
C++ tests (tests/engine/model_fixture_test.cpp) load the same folders with kvlab's loaders and
compare. Attention is written out (torch 1.13 has no fused SDPA); RoPE/YaRN follow
shared/reference/keys_values.md section 6 literally. Sliding windows follow transformers'
masking_utils.sliding_window_overlay (query i sees key j iff j <= i and j > i - window) and the
layer choice of its Qwen2Config (windowed iff use_sliding_window and i >= max_window_layers;
Mistral: every layer). Gemma follows transformers' modeling_gemma2.py / modeling_gemma3.py:
(1 + w) RMSNorms before and after attention and MLP, GELU-tanh gated MLP, embeddings times
sqrt(hidden), scores times query_pre_attn_scalar^-1/2, layer i sliding iff (i + 1) % pattern != 0
(Gemma 3: local layers rotated with rope_local_base_freq), q/k norm (Gemma 3), soft-capping.
SmolLM3: no RoPE in layers with no_rope_layers[i] = 0 (default int((i + 1) % 4 != 0)). Phi-3:
partial_rotary_factor (rotate-half on the first head_dim * factor channels), fused qkv_proj and
gate_up_proj in the checkpoint, sliding_window in every layer. OLMo 2: RMSNorm on the attention
and MLP outputs (no input norms), q/k RMSNorm over the whole projection before the head split.
gpt-oss attention (transformers' modeling_gpt_oss.py eager_attention_forward): a learned sink
logit per query head appended to every row's scores before the softmax and dropped after it
(softmax([scores, sink])[:-1]), q/k/v and o_proj biases, layer_types alternating
sliding_attention and full_attention; the MLP is dense SwiGLU with num_local_experts 0 (kvlab's
own form), else gpt-oss's mixture of experts (transformers' GptOssMLP: GptOssTopKRouter and
GptOssExperts): router logits z = W_r h + b_r, the num_experts_per_tok largest selected and
weighted by the softmax over those logits alone, each selected expert's gate_up_proj (stored
(experts, hidden, 2 intermediate) for h @ W, gate and up in alternate columns) plus bias, gate
clamped above at swiglu_limit and up to [-limit, limit], (up + 1) * gate * sigmoid(alpha gate),
down_proj plus bias, and the weighted sum.
DeepSeek-V2 multi-head latent attention (transformers' modeling_deepseek_v2.py, 4.57): q from
q_proj, or q_b_proj(RMSNorm(q_a_proj x)) with q_lora_rank; kv_a_proj_with_mqa x split into the
latent (kv_lora_rank, RMSNorm'd by kv_a_layernorm, expanded per head by kv_b_proj into k_nope
and v) and one k_pe shared by the heads; q_pe and k_pe rotated as transformers' apply_rotary_emb
does (consecutive channel pairs as complex numbers times e^{i p theta_d}, theta_d =
base^(-2d/qk_rope_head_dim)); q = [q_nope ; q_pe], k = [k_nope ; k_pe], scale
(qk_nope + qk_rope)^-1/2, v of v_head_dim; the latent norms use DeepseekV2RMSNorm's default eps
1e-6 whatever rms_norm_eps is. Every layer's MLP is dense (first_k_dense_replace = layers).

Regenerate (Debian's python3-torch, never needed by the build or CI):
    /usr/bin/python3 tools/reference/model_reference.py --out tests/fixtures/models
(--only NAME ... regenerates just those fixtures.)
"""

import argparse
import json
import math
import os
import struct

import torch

FIXTURE_MAGIC = "kvlab-model-fixture"
FIXTURE_VERSION = 1

DTYPE_NAMES = {torch.float32: "F32", torch.float64: "F64", torch.bfloat16: "BF16", torch.float16: "F16",
               torch.int64: "I64", torch.int32: "I32"}


# ---------------------------------------------------------------------------------------------
# safetensors writer/reader (format: u64 LE header length, JSON header, raw little-endian data)
# ---------------------------------------------------------------------------------------------
def tensor_bytes(t):
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().tobytes()
    return t.numpy().tobytes()


def write_safetensors(path, tensors, metadata=None):
    header = {}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name]
        b = tensor_bytes(t)
        header[name] = {"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


# ---------------------------------------------------------------------------------------------
# The model, in float64
# ---------------------------------------------------------------------------------------------
def is_gemma(cfg):
    return cfg["model_type"] in ("gemma2", "gemma3_text")


def rope_inv_freq(cfg, context_width, mode, theta=None, scaled=True):
    """theta'_d and the attention scale (keys_values section 6)."""
    head_dim = cfg["head_dim"]
    m = int(head_dim * cfg.get("partial_rotary_factor", 1.0)) // 2 * 2  # rotated channels
    theta = cfg["rope_theta"] if theta is None else theta
    inv = [theta ** (-2.0 * d / m) for d in range(m // 2)]
    scale = 1.0 / math.sqrt(cfg.get("query_pre_attn_scalar", head_dim))
    rs = cfg.get("rope_scaling") or {}
    if rs.get("type", rs.get("rope_type")) == "longrope" and scaled:
        # per-pair factors: short up to original_max_position_embeddings, long beyond (the
        # sequence length transformers sees, here the context width)
        fac = rs["long_factor"] if context_width > cfg["original_max_position_embeddings"] else rs["short_factor"]
        return torch.tensor([th / f for th, f in zip(inv, fac)], dtype=torch.float64), scale
    if mode == "yarn" and scaled:
        L_train = cfg["max_position_embeddings"]
        s = max(1.0, context_width / L_train)
        alpha, beta = 1.0, 32.0
        if s > 1.0:
            out = []
            for th in inv:
                lam = 2.0 * math.pi / th
                r = L_train / lam
                gamma = min(max((r - alpha) / (beta - alpha), 0.0), 1.0)
                out.append((1.0 - gamma) * th / s + gamma * th)
            inv = out
        scale = (0.1 * math.log(s) + 1.0) ** 2 * scale
    return torch.tensor(inv, dtype=torch.float64), scale


def rms_norm(x, w, eps, offset=0.0):
    return x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + eps) * (offset + w)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def softcap(x, cap):
    return cap * torch.tanh(x / cap) if cap else x


def longrope_magnitude(cfg):
    """LongRoPE's attention factor (transformers' _compute_longrope_parameters), which
    multiplies cos and sin: sqrt(1 + ln(s) / ln(original)), s = max / original (1 if s <= 1)."""
    rs = cfg.get("rope_scaling") or {}
    if rs.get("type", rs.get("rope_type")) != "longrope":
        return 1.0
    if rs.get("attention_factor"):
        return rs["attention_factor"]
    orig = cfg["original_max_position_embeddings"]
    s = cfg["max_position_embeddings"] / orig
    return 1.0 if s <= 1.0 else math.sqrt(1 + math.log(s) / math.log(orig))


def apply_rope(x, pos, inv_freq, magnitude=1.0):
    # x (B, H, T, D); rotate-half over the first m = 2 len(inv_freq) channels: pairs (i, i + m/2);
    # channels from m on pass through (Phi-3's partial rotary); LongRoPE scales cos and sin
    ang = pos[:, None].double() * inv_freq[None, :]  # (T, m/2)
    cos, sin = torch.cos(ang) * magnitude, torch.sin(ang) * magnitude
    half = inv_freq.shape[0]
    x1, x2, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)


def uses_rope(cfg, layer):
    """SmolLM3Config.no_rope_layers: 1 where the layer rotates."""
    if cfg["model_type"] != "smollm3":
        return True
    rope = cfg.get("no_rope_layers") or [int((i + 1) % cfg.get("no_rope_layer_interval", 4) != 0)
                                          for i in range(cfg["num_hidden_layers"])]
    return bool(rope[layer])


def layer_window(cfg, layer):
    """The sliding window of a layer (0 = full causal attention), read from the config the way
    transformers does."""
    if cfg["model_type"] in ("mistral", "phi3"):
        return cfg.get("sliding_window") or 0
    if cfg["model_type"] in ("qwen2", "qwen3") and cfg.get("use_sliding_window"):
        return cfg["sliding_window"] if layer >= cfg["max_window_layers"] else 0
    if is_gemma(cfg):
        return cfg["sliding_window"] if gemma_sliding(cfg, layer) else 0
    if cfg["model_type"] == "gpt_oss":
        return cfg["sliding_window"] if cfg["layer_types"][layer] == "sliding_attention" else 0
    return 0


def kv_sources(cfg):
    """{shared layer: source layer} (Gemma 3n's rule, transformers' Gemma3nTextAttention): the
    last _kv_shared_layers layers read the keys and values of the last earlier layer of their
    attention type. gemma3_text has no key for it: the private _kv_shared_layers gives the count
    and the C++ test sets the same sources on the loaded config."""
    n = cfg.get("_kv_shared_layers", 0)
    L = cfg["num_hidden_layers"]
    first = L - n
    if n <= 0 or first <= 0:
        return {}
    out = {}
    for l in range(first, L):
        same = [j for j in range(first) if gemma_sliding(cfg, j) == gemma_sliding(cfg, l)]
        out[l] = same[-1]
    return out


def gemma_sliding(cfg, layer):
    """Gemma2Config / Gemma3TextConfig layer_types: sliding iff (i + 1) % pattern."""
    pattern = cfg.get("sliding_window_pattern", 6) if cfg["model_type"] == "gemma3_text" else 2
    return (layer + 1) % pattern != 0


def layer_rope(cfg, layer, context_width, mode):
    """Gemma 3 rotates local (sliding) layers with rope_local_base_freq, unscaled."""
    if cfg["model_type"] == "gemma3_text" and gemma_sliding(cfg, layer):
        return rope_inv_freq(cfg, context_width, mode, cfg["rope_local_base_freq"], scaled=False)
    return rope_inv_freq(cfg, context_width, mode)


def attention_mask(T, window):
    """(T, T) bool, True where query i may attend key j."""
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    m = j <= i
    if window > 0:
        m = m & (i - j < window)
    return m


def rope_interleaved(x, pos, inv_freq):
    """transformers' DeepSeek-V2 apply_rotary_emb: channels (2d, 2d + 1) form one complex number
    turned by p * theta_d."""
    ang = pos[:, None].double() * inv_freq[None, :]  # (T, R/2)
    freqs_cis = torch.polar(torch.ones_like(ang), ang)
    xc = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())
    return torch.view_as_real(xc * freqs_cis).flatten(-2)


def mla_attention(cfg, W, p, h, pos, mask):
    """Multi-head latent attention of one layer: h (B, T, E) -> o (B, T, E)."""
    B, T, _ = h.shape
    NH = cfg["num_attention_heads"]
    D, R, VD, r = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]
    lat_eps = 1e-6  # DeepseekV2RMSNorm(q_lora_rank) / (kv_lora_rank): the class default
    if cfg.get("q_lora_rank"):
        q = rms_norm(h @ W[p + "self_attn.q_a_proj.weight"].T, W[p + "self_attn.q_a_layernorm.weight"], lat_eps)
        q = q @ W[p + "self_attn.q_b_proj.weight"].T
    else:
        q = h @ W[p + "self_attn.q_proj.weight"].T
    q = q.view(B, T, NH, D + R).transpose(1, 2)
    q_nope, q_pe = q[..., :D], q[..., D:]
    ckv = h @ W[p + "self_attn.kv_a_proj_with_mqa.weight"].T
    c, k_pe = ckv[..., :r], ckv[..., r:]
    kv = (rms_norm(c, W[p + "self_attn.kv_a_layernorm.weight"], lat_eps) @ W[p + "self_attn.kv_b_proj.weight"].T)
    kv = kv.view(B, T, NH, D + VD).transpose(1, 2)
    k_nope, v = kv[..., :D], kv[..., D:]
    inv = torch.tensor([cfg["rope_theta"] ** (-2.0 * d / R) for d in range(R // 2)], dtype=torch.float64)
    q_pe = rope_interleaved(q_pe, pos, inv)
    k_pe = rope_interleaved(k_pe.reshape(B, 1, T, R), pos, inv).expand(B, NH, T, R)
    q = torch.cat([q_nope, q_pe], dim=-1)
    k = torch.cat([k_nope, k_pe], dim=-1)
    s = (q @ k.transpose(-1, -2)) * (D + R) ** -0.5
    s = s.masked_fill(~mask, float("-inf"))
    a = torch.softmax(s, dim=-1) @ v  # (B, NH, T, VD)
    return a.transpose(1, 2).reshape(B, T, NH * VD) @ W[p + "self_attn.o_proj.weight"].T


def moe_mlp(cfg, W, p, h):
    """gpt-oss's mixture of experts on h (B, T, E); also the smallest gap between a token's
    top-k-th and next router logit (a near-tie would make the selection rounding-dependent)."""
    N, K = cfg["num_local_experts"], cfg["num_experts_per_tok"]
    limit, alpha = cfg.get("swiglu_limit", 7.0), cfg.get("swiglu_alpha", 1.702)
    z = h @ W[p + "mlp.router.weight"].T + W[p + "mlp.router.bias"]  # (B, T, N)
    top, idx = torch.topk(z, K, dim=-1)
    weights = torch.softmax(top, dim=-1)  # over the selected logits only
    ordered = torch.sort(z, dim=-1, descending=True).values
    gap = float((ordered[..., K - 1] - ordered[..., K]).min()) if K < N else math.inf
    out = torch.zeros_like(h)
    clamped = 0
    for e in range(N):
        gu = h @ W[p + "mlp.experts.gate_up_proj"][e] + W[p + "mlp.experts.gate_up_proj_bias"][e]
        gate, up = gu[..., 0::2], gu[..., 1::2]
        sel = (idx == e).any(dim=-1, keepdim=True)  # the tokens routed to e
        clamped += int(((gate > limit) & sel).sum()) + int(((up.abs() > limit) & sel).sum())
        gate = gate.clamp(max=limit)
        up = up.clamp(min=-limit, max=limit)
        y = ((up + 1) * gate * torch.sigmoid(alpha * gate)) @ W[p + "mlp.experts.down_proj"][e] + W[p + "mlp.experts.down_proj_bias"][e]
        w_e = (weights * (idx == e)).sum(dim=-1, keepdim=True)  # 0 where e was not selected
        out = out + w_e * y
    CLAMPED.append(clamped)
    return out, gap


ROUTER_GAPS = []  # the smallest routing gap of every MoE call of a fixture's forward passes
CLAMPED = []  # the clamped gate and up entries of the selected experts, per MoE call


def forward(cfg, W, ids, context_width, mode):
    """Logits (B, T, V) in float64 for ids (B, T) starting at position 0."""
    B, T = ids.shape
    E, NH, G, HS = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps = cfg["rms_norm_eps"]
    gemma = is_gemma(cfg)
    off = 1.0 if gemma else 0.0  # Gemma's RMSNorm multiplies by (1 + w)
    pos = torch.arange(T)
    x = W["model.embed_tokens.weight"][ids]
    if gemma:
        x = x * math.sqrt(E)
    kv_of = {}  # layer -> its rotated k, v (B, G, T, HS), for the layers that share them
    sources = kv_sources(cfg)
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        inv_freq, scale = layer_rope(cfg, l, context_width, mode)
        mask = attention_mask(T, layer_window(cfg, l))
        olmo = cfg["model_type"] == "olmo2"
        h = x if olmo else rms_norm(x, W[p + "input_layernorm.weight"], eps, off)
        if cfg["model_type"] == "deepseek_v2":
            x = x + mla_attention(cfg, W, p, h, pos, mask)
            h = rms_norm(x, W[p + "post_attention_layernorm.weight"], eps)
            g = h @ W[p + "mlp.gate_proj.weight"].T
            u = h @ W[p + "mlp.up_proj.weight"].T
            x = x + (torch.nn.functional.silu(g) * u) @ W[p + "mlp.down_proj.weight"].T
            continue
        q = h @ W[p + "self_attn.q_proj.weight"].T
        k = h @ W[p + "self_attn.k_proj.weight"].T
        v = h @ W[p + "self_attn.v_proj.weight"].T
        if olmo:  # over the whole projection, before the head split
            q = rms_norm(q, W[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, W[p + "self_attn.k_norm.weight"], eps)
        if p + "self_attn.q_proj.bias" in W:
            q = q + W[p + "self_attn.q_proj.bias"]
            k = k + W[p + "self_attn.k_proj.bias"]
            v = v + W[p + "self_attn.v_proj.bias"]
        q = q.view(B, T, NH, HS)
        k = k.view(B, T, G, HS)
        v = v.view(B, T, G, HS)
        if p + "self_attn.q_norm.weight" in W and not olmo:
            q = rms_norm(q, W[p + "self_attn.q_norm.weight"], eps, off)
            k = rms_norm(k, W[p + "self_attn.k_norm.weight"], eps, off)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # (B, NH, T, HS), (B, G, T, HS)
        if uses_rope(cfg, l):
            mag = longrope_magnitude(cfg)
            q, k = apply_rope(q, pos, inv_freq, mag), apply_rope(k, pos, inv_freq, mag)
        v = v.transpose(1, 2)
        if l in sources:  # cross-layer KV sharing: the source's keys and values, this layer's queries
            k, v = kv_of[sources[l]]
        kv_of[l] = (k, v)
        R = NH // G
        k = k.repeat_interleave(R, dim=1)
        v = v.repeat_interleave(R, dim=1)
        s = (q @ k.transpose(-1, -2)) * scale
        s = softcap(s, cfg.get("attn_logit_softcapping"))
        s = s.masked_fill(~mask, float("-inf"))
        if p + "self_attn.sinks" in W:  # gpt-oss: the sink joins the softmax, then is dropped
            sink = W[p + "self_attn.sinks"].reshape(1, NH, 1, 1).expand(B, NH, T, 1)
            probs = torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :-1]
        else:
            probs = torch.softmax(s, dim=-1)
        a = probs @ v  # (B, NH, T, HS)
        a = a.transpose(1, 2).reshape(B, T, NH * HS)
        o = a @ W[p + "self_attn.o_proj.weight"].T
        if p + "self_attn.o_proj.bias" in W:
            o = o + W[p + "self_attn.o_proj.bias"]
        if gemma:  # norms on both sides of attention and MLP
            x = x + rms_norm(o, W[p + "post_attention_layernorm.weight"], eps, off)
            h = rms_norm(x, W[p + "pre_feedforward_layernorm.weight"], eps, off)
        elif olmo:  # norms on the outputs only
            x = x + rms_norm(o, W[p + "post_attention_layernorm.weight"], eps)
            h = x
        else:
            x = x + o
            h = rms_norm(x, W[p + "post_attention_layernorm.weight"], eps)
        if p + "mlp.router.weight" in W:
            d, gap = moe_mlp(cfg, W, p, h)
            ROUTER_GAPS.append(gap)
            x = x + d
            continue
        g = h @ W[p + "mlp.gate_proj.weight"].T
        u = h @ W[p + "mlp.up_proj.weight"].T
        act = gelu_tanh(g) if gemma else torch.nn.functional.silu(g)
        d = (act * u) @ W[p + "mlp.down_proj.weight"].T
        x = x + (rms_norm(d, W[p + "post_feedforward_layernorm.weight"], eps, off) if gemma or olmo else d)
    x = rms_norm(x, W["model.norm.weight"], eps, off)
    head = W["lm_head.weight"] if "lm_head.weight" in W else W["model.embed_tokens.weight"]
    return softcap(x @ head.T, cfg.get("final_logit_softcapping"))


def greedy(cfg, W, prompt, steps, context_width, mode):
    """Greedy tokens and, per step, the gap between the best and second-best logit (a test
    may only demand an exact match where that gap exceeds its numerical tolerance)."""
    ids = prompt.clone()
    out, margins = [], []
    for _ in range(steps):
        logits = forward(cfg, W, ids, context_width, mode)
        top = torch.topk(logits[0, -1], 2).values
        nxt = int(torch.argmax(logits[0, -1]))
        out.append(nxt)
        margins.append(float(top[0] - top[1]))
        ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    return out, margins


# ---------------------------------------------------------------------------------------------
# Fixture models
# ---------------------------------------------------------------------------------------------
def make_weights(cfg, seed, store_dtype):
    gen = torch.Generator().manual_seed(seed)
    E, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    Q = cfg["num_attention_heads"] * cfg["head_dim"]
    K = cfg["num_key_value_heads"] * cfg["head_dim"]
    W = {}

    def lin(name, *shape):
        # std 0.2 (larger than a real init) so attention patterns and logits are far from flat
        W[name] = torch.randn(*shape, generator=gen, dtype=torch.float64) * 0.2

    def norm(name, n):
        # Gemma stores w of (1 + w): its weights scatter around 0, the others' around 1
        W[name] = (0.0 if is_gemma(cfg) else 1.0) + 0.2 * torch.randn(n, generator=gen, dtype=torch.float64)

    lin("model.embed_tokens.weight", V, E)
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        if cfg["model_type"] != "olmo2":
            norm(p + "input_layernorm.weight", E)
        if cfg["model_type"] == "deepseek_v2":
            NH, D, R, VD, r = (cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"],
                               cfg["kv_lora_rank"])
            if cfg.get("q_lora_rank"):
                lin(p + "self_attn.q_a_proj.weight", cfg["q_lora_rank"], E)
                norm(p + "self_attn.q_a_layernorm.weight", cfg["q_lora_rank"])
                lin(p + "self_attn.q_b_proj.weight", NH * (D + R), cfg["q_lora_rank"])
            else:
                lin(p + "self_attn.q_proj.weight", NH * (D + R), E)
            lin(p + "self_attn.kv_a_proj_with_mqa.weight", r + R, E)
            norm(p + "self_attn.kv_a_layernorm.weight", r)
            lin(p + "self_attn.kv_b_proj.weight", NH * (D + VD), r)
            lin(p + "self_attn.o_proj.weight", E, NH * VD)
            norm(p + "post_attention_layernorm.weight", E)
            lin(p + "mlp.gate_proj.weight", I, E)
            lin(p + "mlp.up_proj.weight", I, E)
            lin(p + "mlp.down_proj.weight", E, I)
            continue
        lin(p + "self_attn.q_proj.weight", Q, E)
        lin(p + "self_attn.k_proj.weight", K, E)
        lin(p + "self_attn.v_proj.weight", K, E)
        if cfg.get("_qkv_bias"):
            lin(p + "self_attn.q_proj.bias", Q)
            lin(p + "self_attn.k_proj.bias", K)
            lin(p + "self_attn.v_proj.bias", K)
        if cfg["model_type"] in ("qwen3", "gemma3_text"):
            norm(p + "self_attn.q_norm.weight", cfg["head_dim"])
            norm(p + "self_attn.k_norm.weight", cfg["head_dim"])
        if cfg["model_type"] == "olmo2":
            norm(p + "self_attn.q_norm.weight", Q)
            norm(p + "self_attn.k_norm.weight", K)
        lin(p + "self_attn.o_proj.weight", E, Q)
        if cfg["model_type"] == "gpt_oss":
            lin(p + "self_attn.o_proj.bias", E)
            # sink logits of the scores' size and above (0.5 + 1.5 N(0, 1)): they take real mass
            W[p + "self_attn.sinks"] = 0.5 + 1.5 * torch.randn(cfg["num_attention_heads"], generator=gen, dtype=torch.float64)
        norm(p + "post_attention_layernorm.weight", E)
        if is_gemma(cfg):
            norm(p + "pre_feedforward_layernorm.weight", E)
        if is_gemma(cfg) or cfg["model_type"] == "olmo2":
            norm(p + "post_feedforward_layernorm.weight", E)
        if cfg.get("num_local_experts"):
            N = cfg["num_local_experts"]
            lin(p + "mlp.router.weight", N, E)
            lin(p + "mlp.router.bias", N)
            # gate/up of std 0.6 (pre-activations of a few units): both clamps at +-7 act
            lin(p + "mlp.experts.gate_up_proj", N, E, 2 * I)
            W[p + "mlp.experts.gate_up_proj"] *= 3.0
            lin(p + "mlp.experts.gate_up_proj_bias", N, 2 * I)
            lin(p + "mlp.experts.down_proj", N, I, E)
            W[p + "mlp.experts.down_proj"] *= 0.25
            lin(p + "mlp.experts.down_proj_bias", N, E)
            continue
        lin(p + "mlp.gate_proj.weight", I, E)
        lin(p + "mlp.up_proj.weight", I, E)
        lin(p + "mlp.down_proj.weight", E, I)
    norm("model.norm.weight", E)
    if not cfg["tie_word_embeddings"]:
        lin("lm_head.weight", V, E)
    # Round to the storage dtype; the reference computes from exactly the stored values.
    stored = {k: v.to(store_dtype) for k, v in W.items()}
    reference = {k: v.double() for k, v in stored.items()}
    if cfg["model_type"] == "phi3":  # the checkpoint stores the projections fused (rows q|k|v, gate|up)
        for l in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{l}."
            stored[p + "self_attn.qkv_proj.weight"] = torch.cat([stored.pop(p + f"self_attn.{n}_proj.weight") for n in "qkv"])
            stored[p + "mlp.gate_up_proj.weight"] = torch.cat([stored.pop(p + f"mlp.{n}_proj.weight") for n in ("gate", "up")])
    return stored, reference


def deepseek_v2_cfg(**kw):
    """A DeepseekV2Config as transformers writes it: head_dim is qk_rope_head_dim (its RoPE
    width), every layer dense (first_k_dense_replace = num_hidden_layers: no experts)."""
    cfg = llama_cfg(model_type="deepseek_v2", architectures=["DeepseekV2ForCausalLM"], num_key_value_heads=4,
                    hidden_size=32, num_hidden_layers=3, first_k_dense_replace=3, n_routed_experts=4, n_shared_experts=1,
                    moe_intermediate_size=16, num_experts_per_tok=2, kv_lora_rank=12, q_lora_rank=16, qk_nope_head_dim=8,
                    qk_rope_head_dim=8, v_head_dim=6, head_dim=8, attention_bias=False, rope_scaling=None)
    cfg.update(kw)
    return cfg


def llama_cfg(**kw):
    cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 97, "hidden_size": 32,
           "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 8, "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "tie_word_embeddings": False, "hidden_act": "silu", "torch_dtype": "float32",
           "bos_token_id": 1, "eos_token_id": 2}
    cfg.update(kw)
    return cfg


FIXTURES = [
    # name, config, storage dtype, rope mode, context width, input shapes (B, T)
    ("llama_gqa", llama_cfg(), torch.float32, "yarn", 64, [(2, 11), (1, 37)]),
    ("llama_yarn", llama_cfg(), torch.float32, "yarn", 256, [(1, 45)]),
    ("qwen2_bias_mqa", llama_cfg(model_type="qwen2", architectures=["Qwen2ForCausalLM"], num_key_value_heads=1,
                                 tie_word_embeddings=True, rope_theta=1000000.0, rms_norm_eps=1e-6, _qkv_bias=True),
     torch.float32, "yarn", 64, [(2, 9)]),
    ("qwen3_qknorm", llama_cfg(model_type="qwen3", architectures=["Qwen3ForCausalLM"], head_dim=12,
                               tie_word_embeddings=True, rope_theta=1000000.0, rms_norm_eps=1e-6),
     torch.float32, "yarn", 64, [(2, 10)]),
    ("llama_bf16", llama_cfg(torch_dtype="bfloat16"), torch.bfloat16, "yarn", 64, [(1, 13)]),
    # Windows shorter than the sequences, so the mask changes the logits of every later position.
    ("mistral_window", llama_cfg(model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=5),
     torch.float32, "yarn", 64, [(2, 13), (1, 23)]),
    # Layer 0 full, layers 1 and 2 windowed (max_window_layers 1).
    ("qwen2_window", llama_cfg(model_type="qwen2", architectures=["Qwen2ForCausalLM"], num_hidden_layers=3,
                               use_sliding_window=True, sliding_window=4, max_window_layers=1,
                               tie_word_embeddings=True, rope_theta=1000000.0, rms_norm_eps=1e-6, _qkv_bias=True),
     torch.float32, "yarn", 64, [(1, 17)]),
    # Gemma 3: pattern 3 over 4 layers (0, 1, 3 sliding with window 5 and base 1e4; 2 full with
    # base 1e6), query_pre_attn_scalar 24 != head_dim 16, q/k norm, tied; sequences > window.
    ("gemma3_interleaved", llama_cfg(model_type="gemma3_text", architectures=["Gemma3ForCausalLM"], num_hidden_layers=4,
                                     head_dim=16, sliding_window=5, sliding_window_pattern=3, query_pre_attn_scalar=24,
                                     rope_theta=1000000.0, rope_local_base_freq=10000.0, rms_norm_eps=1e-6,
                                     tie_word_embeddings=True, hidden_act=None, hidden_activation="gelu_pytorch_tanh",
                                     final_logit_softcapping=None, attn_logit_softcapping=None),
     torch.float32, "yarn", 64, [(2, 13), (1, 37)]),
    # Gemma 2 without soft-capping: layers alternate sliding (0, 2; window 4) and full (1),
    # no q/k norm, query_pre_attn_scalar 12 != head_dim 8.
    ("gemma2_alternating", llama_cfg(model_type="gemma2", architectures=["Gemma2ForCausalLM"], num_hidden_layers=3,
                                     sliding_window=4, query_pre_attn_scalar=12, rms_norm_eps=1e-6, tie_word_embeddings=True,
                                     hidden_act=None, hidden_activation="gelu_pytorch_tanh",
                                     final_logit_softcapping=None, attn_logit_softcapping=None),
     torch.float32, "yarn", 64, [(1, 37)]),
    # SmolLM3: default no_rope_layer_interval 4 over 5 layers: layer 3 has no RoPE.
    ("smollm3_nope", llama_cfg(model_type="smollm3", architectures=["SmolLM3ForCausalLM"], num_hidden_layers=5,
                               rope_theta=5000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True),
     torch.float32, "yarn", 64, [(2, 19)]),
    # Phi-3 / Phi-4-mini: partial_rotary_factor 0.5 (8 of 16 channels rotated), fused
    # projections, a window of 6 in every layer.
    ("phi3_partial", llama_cfg(model_type="phi3", architectures=["Phi3ForCausalLM"], head_dim=16, hidden_size=64,
                               partial_rotary_factor=0.5, sliding_window=6),
     torch.float32, "yarn", 64, [(1, 21)]),
    # OLMo 2: output norms, q/k norm over the whole projection, MHA.
    ("olmo2_postnorm", llama_cfg(model_type="olmo2", architectures=["Olmo2ForCausalLM"], num_key_value_heads=4,
                                 rope_theta=500000.0, rms_norm_eps=1e-6),
     torch.float32, "yarn", 64, [(2, 15)]),
    # Gemma 2 with soft-capping: caps small enough that tanh saturates for these weights
    # (attention 0.5, final logits 2.0); checked against transformers' eager Gemma2 by
    # tools/reference/transformers_check.py (transformers.safetensors beside the fixture).
    ("gemma2_softcap", llama_cfg(model_type="gemma2", architectures=["Gemma2ForCausalLM"], num_hidden_layers=3,
                                 sliding_window=4, query_pre_attn_scalar=12, rms_norm_eps=1e-6, tie_word_embeddings=True,
                                 hidden_act=None, hidden_activation="gelu_pytorch_tanh",
                                 final_logit_softcapping=2.0, attn_logit_softcapping=0.5),
     torch.float32, "yarn", 64, [(2, 13), (1, 37)]),
    # gpt-oss attention: sinks, q/k/v/o biases, layers sliding (window 5), full, sliding, full;
    # a dense SwiGLU MLP in place of the experts (num_local_experts 0).
    ("gpt_oss_sinks", llama_cfg(model_type="gpt_oss", architectures=["GptOssForCausalLM"], num_hidden_layers=4,
                                sliding_window=5, attention_bias=True, num_local_experts=0, _qkv_bias=True,
                                layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"]),
     torch.float32, "yarn", 64, [(2, 13), (1, 37)]),
    # Gemma layouts as llama.cpp runs them (the GGUF tests convert these folders): Gemma 3 with
    # its fixed pattern 6 over 7 layers (5 and 6 as a full then a sliding layer), Gemma 2 with
    # caps; both with query_pre_attn_scalar = head_dim (llama.cpp's scale outside the 27B models).
    ("gemma3_gguf_layout", llama_cfg(model_type="gemma3_text", architectures=["Gemma3ForCausalLM"], num_hidden_layers=7,
                                     head_dim=16, sliding_window=5, sliding_window_pattern=6, query_pre_attn_scalar=16,
                                     rope_theta=1000000.0, rope_local_base_freq=10000.0, rms_norm_eps=1e-6,
                                     tie_word_embeddings=True, hidden_act=None, hidden_activation="gelu_pytorch_tanh",
                                     final_logit_softcapping=None, attn_logit_softcapping=None),
     torch.float32, "yarn", 64, [(1, 21)]),
    ("gemma2_gguf_layout", llama_cfg(model_type="gemma2", architectures=["Gemma2ForCausalLM"], num_hidden_layers=3,
                                     sliding_window=4, query_pre_attn_scalar=8, rms_norm_eps=1e-6, tie_word_embeddings=True,
                                     hidden_act=None, hidden_activation="gelu_pytorch_tanh",
                                     final_logit_softcapping=3.0, attn_logit_softcapping=1.5),
     torch.float32, "yarn", 64, [(1, 21)]),
    # Phi-3 LongRoPE: 4 rotated pairs (head_dim 16, partial 0.5), original length 32 of 256 (so
    # q and k's rotated channels grow by sqrt(1 + ln 8 / ln 32)); the short factors within a
    # context of 32, the long ones in a context of 64.
    ("phi3_longrope_short", llama_cfg(model_type="phi3", architectures=["Phi3ForCausalLM"], head_dim=16, hidden_size=64,
                                      partial_rotary_factor=0.5, sliding_window=None, max_position_embeddings=256,
                                      original_max_position_embeddings=32,
                                      rope_scaling={"type": "longrope", "short_factor": [1.0, 1.3, 2.1, 3.0],
                                                    "long_factor": [1.5, 4.0, 9.0, 17.0]}),
     torch.float32, "yarn", 32, [(1, 21)]),
    ("phi3_longrope_long", llama_cfg(model_type="phi3", architectures=["Phi3ForCausalLM"], head_dim=16, hidden_size=64,
                                     partial_rotary_factor=0.5, sliding_window=None, max_position_embeddings=256,
                                     original_max_position_embeddings=32,
                                     rope_scaling={"type": "longrope", "short_factor": [1.0, 1.3, 2.1, 3.0],
                                                   "long_factor": [1.5, 4.0, 9.0, 17.0]}),
     torch.float32, "yarn", 64, [(1, 37)]),
    # LongRoPE over every channel (8 pairs), the form transformers 4.44's Phi3 runs, for
    # transformers_check.py: its sequence of 37 > 32 takes the long factors, as the width 64 does.
    ("phi3_longrope_full", llama_cfg(model_type="phi3", architectures=["Phi3ForCausalLM"], head_dim=16, hidden_size=64, pad_token_id=0,
                                     sliding_window=None, max_position_embeddings=256, original_max_position_embeddings=32,
                                     rope_scaling={"type": "longrope", "short_factor": [1.0, 1.1, 1.3, 1.6, 2.1, 2.5, 3.0, 3.2],
                                                   "long_factor": [1.5, 2.5, 4.0, 6.0, 9.0, 12.0, 17.0, 20.0]}),
     torch.float32, "yarn", 64, [(1, 37)]),
    # DeepSeek-V2 latent attention: query latent 16, KV latent 12, keys of 8 + 8 rotated channels
    # per head, values of 6 (!= 16), rms_norm_eps 1e-5 beside the latent norms' 1e-6; and the
    # DeepSeek-V2-Lite form without the query latent (q_lora_rank null).
    ("deepseek_v2_mla", deepseek_v2_cfg(), torch.float32, "yarn", 64, [(2, 13), (1, 37)]),
    ("deepseek_v2_lite_mla", deepseek_v2_cfg(q_lora_rank=None, num_hidden_layers=2, first_k_dense_replace=2, qk_nope_head_dim=4,
                                             qk_rope_head_dim=4, head_dim=4, v_head_dim=8, rope_theta=500.0),
     torch.float32, "yarn", 64, [(1, 37)]),
    # Cross-layer KV sharing on Gemma 3 layers (appended last: seeds follow the list's order):
    # 6 layers, pattern 3 (2 and 5 full), the last 3 shared: 3 and 4 (sliding) read layer 1's
    # keys and values, 5 (full) reads layer 2's.
    ("gemma3_kv_shared", llama_cfg(model_type="gemma3_text", architectures=["Gemma3ForCausalLM"], num_hidden_layers=6,
                                   head_dim=16, sliding_window=5, sliding_window_pattern=3, query_pre_attn_scalar=24,
                                   rope_theta=1000000.0, rope_local_base_freq=10000.0, rms_norm_eps=1e-6,
                                   tie_word_embeddings=True, hidden_act=None, hidden_activation="gelu_pytorch_tanh",
                                   final_logit_softcapping=None, attn_logit_softcapping=None, _kv_shared_layers=3),
     torch.float32, "yarn", 64, [(2, 13), (1, 37)]),
    # gpt-oss with its mixture of experts: 4 experts of width 48, 2 per token, the attention of
    # gpt_oss_sinks. It was generated as the entry after deepseek_v2_lite_mla, the same index as
    # gemma3_kv_shared (the two were added side by side), so it keeps that seed (_seed_index).
    ("gpt_oss_moe", llama_cfg(model_type="gpt_oss", architectures=["GptOssForCausalLM"], num_hidden_layers=4,
                              sliding_window=5, attention_bias=True, num_local_experts=4, num_experts_per_tok=2,
                              swiglu_limit=7.0, swiglu_alpha=1.702, _qkv_bias=True,
                              layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
                              _seed_index=21),
     torch.float32, "yarn", 64, [(2, 13), (1, 37)]),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", nargs="*", help="fixture names to regenerate (default: all)")
    args = ap.parse_args()
    torch.set_num_threads(2)
    for i, (name, cfg, store_dtype, mode, width, shapes) in enumerate(FIXTURES):
        if args.only and name not in args.only:
            continue  # seeds depend on the index i, so skipping leaves the others unchanged
        d = os.path.join(args.out, name)
        os.makedirs(d, exist_ok=True)
        i = cfg.get("_seed_index", i)  # an entry generated at another index keeps that index's seeds
        stored, W = make_weights(cfg, 1000 + i, store_dtype)
        write_safetensors(os.path.join(d, "model.safetensors"), stored, {"format": "pt"})
        public = {k: v for k, v in cfg.items() if not k.startswith("_") and not (k == "hidden_act" and v is None)}
        if cfg["model_type"] == "deepseek_v2":  # DeepseekV2Config writes null for these
            public["q_lora_rank"] = cfg.get("q_lora_rank")
        if cfg.get("_qkv_bias") and cfg["model_type"] == "llama":
            public["attention_bias"] = True
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(public, f, indent=2)
        gen = torch.Generator().manual_seed(77 + i)
        expected = {}
        ROUTER_GAPS.clear()
        CLAMPED.clear()
        for j, (B, T) in enumerate(shapes):
            ids = torch.randint(0, cfg["vocab_size"], (B, T), generator=gen)
            expected[f"input_ids.{j}"] = ids.to(torch.int64)
            expected[f"logits.{j}"] = forward(cfg, W, ids, width, mode)
        prompt = torch.randint(0, cfg["vocab_size"], (1, 5), generator=gen)
        expected["greedy.prompt"] = prompt.to(torch.int64)
        toks, margins = greedy(cfg, W, prompt, 8, width, mode)
        expected["greedy.tokens"] = torch.tensor(toks, dtype=torch.int64)
        expected["greedy.margins"] = torch.tensor(margins, dtype=torch.float64)
        meta = {"magic": FIXTURE_MAGIC, "version": str(FIXTURE_VERSION), "rope_mode": mode, "context_width": str(width),
                "inputs": str(len(shapes)), "generator": "tools/reference/model_reference.py", "torch": torch.__version__}
        if ROUTER_GAPS:  # f32 routing must select what float64 selects
            assert min(ROUTER_GAPS) > 1e-3, f"{name}: a router near-tie ({min(ROUTER_GAPS)}); pick another seed"
            assert sum(CLAMPED) > 0, f"{name}: no clamp acted"
            print(f"{name}: smallest router gap {min(ROUTER_GAPS):.4f}, {sum(CLAMPED)} clamped entries")
        write_safetensors(os.path.join(d, "expected.safetensors"), expected, meta)
        print(f"{name}: {len(stored)} tensors, inputs {shapes}, greedy {expected['greedy.tokens'].tolist()}")


if __name__ == "__main__":
    main()
