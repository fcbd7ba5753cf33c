#!/usr/bin/python3
"""Independent PyTorch reference for kvlab's transformer forward pass.

Builds tiny Llama / Mistral / Qwen2 / Qwen3 models with seeded random weights, writes each as a Hugging
Face folder (config.json + model.safetensors, written by the small writer below, not by
kvlab), and computes in float64 the logits for a few inputs plus greedy continuations. The
C++ tests (tests/engine/model_fixture_test.cpp) load the same folders with kvlab's loaders and
compare. Attention is written out (torch 1.13 has no fused SDPA); RoPE/YaRN follow
shared/reference/keys_values.md section 6 literally. Sliding windows follow transformers'
masking_utils.sliding_window_overlay (query i sees key j iff j <= i and j > i - window) and the
layer choice of its Qwen2Config (windowed iff use_sliding_window and i >= max_window_layers;
Mistral: every layer).

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
def rope_inv_freq(cfg, context_width, mode):
    """theta'_d and the attention scale (keys_values section 6)."""
    head_dim = cfg["head_dim"]
    m = head_dim  # partial_rotary_factor 1
    inv = [cfg["rope_theta"] ** (-2.0 * d / m) for d in range(m // 2)]
    scale = 1.0 / math.sqrt(head_dim)
    if mode == "yarn":
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
        scale = (0.1 * math.log(s) + 1.0) ** 2 / math.sqrt(head_dim)
    return torch.tensor(inv, dtype=torch.float64), scale


def rms_norm(x, w, eps):
    return x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + eps) * w


def apply_rope(x, pos, inv_freq):
    # x (B, H, T, D); rotate-half: pairs (i, i + D/2)
    ang = pos[:, None].double() * inv_freq[None, :]  # (T, D/2)
    cos, sin = torch.cos(ang), torch.sin(ang)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def layer_window(cfg, layer):
    """The sliding window of a layer (0 = full causal attention), read from the config the way
    transformers does."""
    if cfg["model_type"] == "mistral":
        return cfg.get("sliding_window") or 0
    if cfg["model_type"] in ("qwen2", "qwen3") and cfg.get("use_sliding_window"):
        return cfg["sliding_window"] if layer >= cfg["max_window_layers"] else 0
    return 0


def attention_mask(T, window):
    """(T, T) bool, True where query i may attend key j."""
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    m = j <= i
    if window > 0:
        m = m & (i - j < window)
    return m


def forward(cfg, W, ids, context_width, mode):
    """Logits (B, T, V) in float64 for ids (B, T) starting at position 0."""
    B, T = ids.shape
    E, NH, G, HS = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps = cfg["rms_norm_eps"]
    inv_freq, scale = rope_inv_freq(cfg, context_width, mode)
    pos = torch.arange(T)
    x = W["model.embed_tokens.weight"][ids]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        mask = attention_mask(T, layer_window(cfg, l))
        h = rms_norm(x, W[p + "input_layernorm.weight"], eps)
        q = h @ W[p + "self_attn.q_proj.weight"].T
        k = h @ W[p + "self_attn.k_proj.weight"].T
        v = h @ W[p + "self_attn.v_proj.weight"].T
        if p + "self_attn.q_proj.bias" in W:
            q = q + W[p + "self_attn.q_proj.bias"]
            k = k + W[p + "self_attn.k_proj.bias"]
            v = v + W[p + "self_attn.v_proj.bias"]
        q = q.view(B, T, NH, HS)
        k = k.view(B, T, G, HS)
        v = v.view(B, T, G, HS)
        if p + "self_attn.q_norm.weight" in W:
            q = rms_norm(q, W[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, W[p + "self_attn.k_norm.weight"], eps)
        q = apply_rope(q.transpose(1, 2), pos, inv_freq)  # (B, NH, T, HS)
        k = apply_rope(k.transpose(1, 2), pos, inv_freq)  # (B, G, T, HS)
        v = v.transpose(1, 2)
        R = NH // G
        k = k.repeat_interleave(R, dim=1)
        v = v.repeat_interleave(R, dim=1)
        s = (q @ k.transpose(-1, -2)) * scale
        s = s.masked_fill(~mask, float("-inf"))
        a = torch.softmax(s, dim=-1) @ v  # (B, NH, T, HS)
        a = a.transpose(1, 2).reshape(B, T, NH * HS)
        x = x + a @ W[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, W[p + "post_attention_layernorm.weight"], eps)
        g = h @ W[p + "mlp.gate_proj.weight"].T
        u = h @ W[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(g) * u) @ W[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, W["model.norm.weight"], eps)
    head = W["lm_head.weight"] if "lm_head.weight" in W else W["model.embed_tokens.weight"]
    return x @ head.T


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
        W[name] = 1.0 + 0.2 * torch.randn(n, generator=gen, dtype=torch.float64)

    lin("model.embed_tokens.weight", V, E)
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        norm(p + "input_layernorm.weight", E)
        lin(p + "self_attn.q_proj.weight", Q, E)
        lin(p + "self_attn.k_proj.weight", K, E)
        lin(p + "self_attn.v_proj.weight", K, E)
        if cfg.get("_qkv_bias"):
            lin(p + "self_attn.q_proj.bias", Q)
            lin(p + "self_attn.k_proj.bias", K)
            lin(p + "self_attn.v_proj.bias", K)
        if cfg["model_type"] == "qwen3":
            norm(p + "self_attn.q_norm.weight", cfg["head_dim"])
            norm(p + "self_attn.k_norm.weight", cfg["head_dim"])
        lin(p + "self_attn.o_proj.weight", E, Q)
        norm(p + "post_attention_layernorm.weight", E)
        lin(p + "mlp.gate_proj.weight", I, E)
        lin(p + "mlp.up_proj.weight", I, E)
        lin(p + "mlp.down_proj.weight", E, I)
    norm("model.norm.weight", E)
    if not cfg["tie_word_embeddings"]:
        lin("lm_head.weight", V, E)
    # Round to the storage dtype; the reference computes from exactly the stored values.
    stored = {k: v.to(store_dtype) for k, v in W.items()}
    return stored, {k: v.double() for k, v in stored.items()}


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
        stored, W = make_weights(cfg, 1000 + i, store_dtype)
        write_safetensors(os.path.join(d, "model.safetensors"), stored, {"format": "pt"})
        public = {k: v for k, v in cfg.items() if not k.startswith("_")}
        if cfg.get("_qkv_bias") and cfg["model_type"] == "llama":
            public["attention_bias"] = True
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(public, f, indent=2)
        gen = torch.Generator().manual_seed(77 + i)
        expected = {}
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
        write_safetensors(os.path.join(d, "expected.safetensors"), expected, meta)
        print(f"{name}: {len(stored)} tensors, inputs {shapes}, greedy {expected['greedy.tokens'].tolist()}")


if __name__ == "__main__":
    main()
