#!/usr/bin/env python3
"""Float64 reference of LFM2 (Liquid AI, model_type "lfm2"), a hybrid of attention and short
convolution layers, and its cross-check against transformers' own modelling code.

The forward below is written from transformers' models/lfm2/modeling_lfm2.py (4.57):
- embeddings, then per layer x += mixer(operator_norm(x)); x += w2(silu(w1 h) * w3 h) with
  h = ffn_norm(x); final RMSNorm model.embedding_norm; lm_head (tied by default).
- attention layers (layer_types "full_attention"): q/k/v projections, per-head RMSNorm on q and
  k (q_layernorm / k_layernorm) before rotate-half RoPE over head_dim, GQA, scale head_dim^-1/2,
  out_proj.
- short convolution layers ("conv"): in_proj x -> (B, C, x) chunks of hidden_size channels;
  Bx = B * x; a causal depthwise conv1d of kernel L = conv_L_cache over time,
  out_t = sum_k w[c, k] Bx[t - (L - 1) + k] (zeros before the sequence); y = C * out; out_proj.
- the MLP width: with block_auto_adjust_ff_dim, int(2 I / 3), times block_ffn_dim_multiplier,
  rounded up to block_multiple_of.

It writes the fixture as model_reference.py writes its own (config.json, model.safetensors,
expected.safetensors with logits of a few inputs and a greedy continuation). With --check it
then runs transformers' classes (Lfm2RMSNorm, Lfm2RotaryEmbedding, Lfm2Attention,
Lfm2ShortConv's slow path, Lfm2MLP, Lfm2DecoderLayer, taken from the source file as
deepseek_v2_check.py does, under torch 1.13) in float64 and writes transformers.safetensors.

    /usr/bin/python3 tools/reference/lfm2_reference.py --out tests/fixtures/models
    /work/venv-mla/bin/python tools/reference/lfm2_reference.py --out tests/fixtures/models --check
"""

import argparse
import ast
import importlib.util
import json
import os
import sys
import types
from typing import Any, Callable, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_reference import FIXTURE_MAGIC, FIXTURE_VERSION, apply_rope, rms_norm, write_safetensors  # noqa: E402


def mlp_width(cfg):
    I = cfg["intermediate_size"]
    if cfg.get("block_auto_adjust_ff_dim", True):
        I = int(2 * I / 3)
        if cfg.get("block_ffn_dim_multiplier") is not None:
            I = int(cfg["block_ffn_dim_multiplier"] * I)
            m = cfg["block_multiple_of"]
            I = m * ((I + m - 1) // m)
    return I


def head_dim(cfg):
    return cfg["hidden_size"] // cfg["num_attention_heads"]


def short_conv(W, p, h, L):
    """One short-convolution mixer, h (B, T, E) -> (B, T, E), from position 0."""
    B, T, E = h.shape
    bcx = h @ W[p + "conv.in_proj.weight"].T
    b, c, x = bcx[..., :E], bcx[..., E:2 * E], bcx[..., 2 * E:]
    bx = b * x
    w = W[p + "conv.conv.weight"][:, 0, :]  # (E, L)
    out = torch.zeros_like(bx)
    for t in range(T):
        for k in range(L):
            s = t - (L - 1) + k
            if s >= 0:
                out[:, t, :] += w[:, k] * bx[:, s, :]
    return (c * out) @ W[p + "conv.out_proj.weight"].T


def forward(cfg, W, ids):
    B, T = ids.shape
    NH, G, HS = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim(cfg)
    eps = cfg["norm_eps"]
    inv = torch.tensor([cfg["rope_theta"] ** (-2.0 * d / HS) for d in range(HS // 2)], dtype=torch.float64)
    pos = torch.arange(T)
    mask = torch.arange(T)[None, :] <= torch.arange(T)[:, None]
    x = W["model.embed_tokens.weight"][ids]
    for l, kind in enumerate(cfg["layer_types"]):
        p = f"model.layers.{l}."
        h = rms_norm(x, W[p + "operator_norm.weight"], eps)
        if kind == "conv":
            x = x + short_conv(W, p, h, cfg["conv_L_cache"])
        else:
            q = (h @ W[p + "self_attn.q_proj.weight"].T).view(B, T, NH, HS)
            k = (h @ W[p + "self_attn.k_proj.weight"].T).view(B, T, G, HS)
            v = (h @ W[p + "self_attn.v_proj.weight"].T).view(B, T, G, HS).transpose(1, 2)
            q = rms_norm(q, W[p + "self_attn.q_layernorm.weight"], eps).transpose(1, 2)
            k = rms_norm(k, W[p + "self_attn.k_layernorm.weight"], eps).transpose(1, 2)
            q, k = apply_rope(q, pos, inv), apply_rope(k, pos, inv)
            k, v = k.repeat_interleave(NH // G, dim=1), v.repeat_interleave(NH // G, dim=1)
            s = (q @ k.transpose(-1, -2)) * HS ** -0.5
            a = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1) @ v
            x = x + a.transpose(1, 2).reshape(B, T, NH * HS) @ W[p + "self_attn.out_proj.weight"].T
        h = rms_norm(x, W[p + "ffn_norm.weight"], eps)
        g = torch.nn.functional.silu(h @ W[p + "feed_forward.w1.weight"].T) * (h @ W[p + "feed_forward.w3.weight"].T)
        x = x + g @ W[p + "feed_forward.w2.weight"].T
    x = rms_norm(x, W["model.embedding_norm.weight"], eps)
    head = W["lm_head.weight"] if "lm_head.weight" in W else W["model.embed_tokens.weight"]
    return x @ head.T


def make_weights(cfg, seed):
    gen = torch.Generator().manual_seed(seed)
    E, V, I, L = cfg["hidden_size"], cfg["vocab_size"], mlp_width(cfg), cfg["conv_L_cache"]
    NH, G, HS = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim(cfg)
    W = {}

    def lin(name, *shape, std=0.2):
        W[name] = torch.randn(*shape, generator=gen, dtype=torch.float64) * std

    def norm(name, n):
        W[name] = 1.0 + 0.2 * torch.randn(n, generator=gen, dtype=torch.float64)

    lin("model.embed_tokens.weight", V, E)
    for l, kind in enumerate(cfg["layer_types"]):
        p = f"model.layers.{l}."
        norm(p + "operator_norm.weight", E)
        if kind == "conv":
            lin(p + "conv.in_proj.weight", 3 * E, E)
            # taps of order 1 so the earlier tokens' share of each output is not small
            lin(p + "conv.conv.weight", E, 1, L, std=0.7)
            lin(p + "conv.out_proj.weight", E, E)
        else:
            lin(p + "self_attn.q_proj.weight", NH * HS, E)
            lin(p + "self_attn.k_proj.weight", G * HS, E)
            lin(p + "self_attn.v_proj.weight", G * HS, E)
            norm(p + "self_attn.q_layernorm.weight", HS)
            norm(p + "self_attn.k_layernorm.weight", HS)
            lin(p + "self_attn.out_proj.weight", E, NH * HS)
        norm(p + "ffn_norm.weight", E)
        lin(p + "feed_forward.w1.weight", I, E)
        lin(p + "feed_forward.w3.weight", I, E)
        lin(p + "feed_forward.w2.weight", E, I)
    norm("model.embedding_norm.weight", E)
    if not cfg["tie_word_embeddings"]:
        lin("lm_head.weight", V, E)
    stored = {k: v.float() for k, v in W.items()}
    return stored, {k: v.double() for k, v in stored.items()}


def lfm2_cfg(**kw):
    cfg = {"model_type": "lfm2", "architectures": ["Lfm2ForCausalLM"], "vocab_size": 97, "hidden_size": 32,
           "intermediate_size": 60, "block_auto_adjust_ff_dim": True, "block_ffn_dim_multiplier": 1.0, "block_multiple_of": 16,
           "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
           "norm_eps": 1e-5, "rope_theta": 1000000.0, "conv_L_cache": 3, "conv_bias": False, "tie_word_embeddings": True,
           "layer_types": ["conv", "full_attention", "conv", "full_attention"], "torch_dtype": "float32",
           "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
    cfg.update(kw)
    return cfg


# name, config, input shapes (B, T); the seeds continue model_reference.py's numbering
FIXTURES = [
    # 4 layers: conv, attention, conv, attention; GQA 4/2; MLP width 60 -> int(40) -> 48 (multiple of 16)
    ("lfm2_hybrid", lfm2_cfg(), [(2, 13), (1, 37)]),
]


# ---------------------------------------------------------------------------------------------
# transformers' own classes (see deepseek_v2_check.py for the approach)
# ---------------------------------------------------------------------------------------------
TAKEN = ["Lfm2RMSNorm", "Lfm2RotaryEmbedding", "Lfm2MLP", "rotate_half", "apply_rotary_pos_emb", "repeat_kv",
         "eager_attention_forward", "Lfm2Attention", "apply_mask_to_padding_states", "Lfm2ShortConv", "Lfm2DecoderLayer"]


def load_classes():
    spec = importlib.util.find_spec("transformers")
    root = spec.submodule_search_locations[0]
    path = os.path.join(root, "models", "lfm2", "modeling_lfm2.py")
    version = "?"
    for line in open(os.path.join(root, "__init__.py")):
        if line.startswith("__version__"):
            version = line.split("=")[1].strip().strip('"')
    tree = ast.parse(open(path).read())
    body = [n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name in TAKEN]
    missing = set(TAKEN) - {n.name for n in body}
    if missing:
        raise SystemExit(f"{path}: no {sorted(missing)}")

    def default_rope(config, device=None):
        dim = config.hidden_size // config.num_attention_heads
        inv = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        return inv, 1.0

    identity_factory = lambda *a, **k: (lambda f: f)  # noqa: E731

    class _Unpack:
        def __class_getitem__(cls, item):
            return dict

    ns = {"torch": torch, "nn": nn, "F": F, "Optional": Optional, "Callable": Callable, "Any": Any, "Union": Union,
          "TransformersKwargs": dict, "Cache": object, "Unpack": _Unpack, "Lfm2Config": object, "Lfm2HybridConvCache": object,
          "use_kernel_forward_from_hub": identity_factory, "deprecate_kwarg": identity_factory,
          "dynamic_rope_update": lambda f: f, "ROPE_INIT_FUNCTIONS": {"default": default_rope},
          "ALL_ATTENTION_FUNCTIONS": {}, "GradientCheckpointingLayer": nn.Module, "is_fast_path_available": False}
    exec(compile(ast.Module(body=body, type_ignores=[]), path, "exec"), ns)
    return ns, version


def transformers_logits(d, ns, expected):
    from safetensors.torch import load_file
    cfg = json.load(open(os.path.join(d, "config.json")))
    c = types.SimpleNamespace(**cfg)
    c._attn_implementation = "eager"
    W = {k: v.double() for k, v in load_file(os.path.join(d, "model.safetensors")).items()}
    layers = nn.ModuleList([ns["Lfm2DecoderLayer"](c, i) for i in range(c.num_hidden_layers)]).double()
    for i, layer in enumerate(layers):
        sd = {k[len(f"model.layers.{i}."):]: v for k, v in W.items() if k.startswith(f"model.layers.{i}.")}
        layer.load_state_dict(sd, strict=True)
    norm = ns["Lfm2RMSNorm"](c.hidden_size, eps=c.norm_eps).double()
    norm.weight.data = W["model.embedding_norm.weight"]
    rotary = ns["Lfm2RotaryEmbedding"](c)
    head = W.get("lm_head.weight", W["model.embed_tokens.weight"])
    out, j = {}, 0
    while f"input_ids.{j}" in expected:
        ids = expected[f"input_ids.{j}"]
        B, T = ids.shape
        with torch.no_grad():
            x = W["model.embed_tokens.weight"][ids]
            pos = torch.arange(T)[None, :].expand(B, T)
            pe = rotary(x, pos)
            mask = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)[None, None]
            for layer in layers:
                x = layer(x, position_embeddings=pe, attention_mask=mask, position_ids=pos)
            out[f"logits.{j}"] = norm(x) @ head.T
        j += 1
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--check", action="store_true", help="also run transformers' Lfm2 classes and write transformers.safetensors")
    ap.add_argument("--tol", type=float, default=1e-6)
    args = ap.parse_args()
    torch.set_num_threads(2)
    for i, (name, cfg, shapes) in enumerate(FIXTURES):
        d = os.path.join(args.out, name)
        os.makedirs(d, exist_ok=True)
        stored, W = make_weights(cfg, 3000 + i)
        write_safetensors(os.path.join(d, "model.safetensors"), stored, {"format": "pt"})
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
        gen = torch.Generator().manual_seed(3077 + i)
        expected = {}
        for j, (B, T) in enumerate(shapes):
            ids = torch.randint(0, cfg["vocab_size"], (B, T), generator=gen)
            expected[f"input_ids.{j}"] = ids.to(torch.int64)
            expected[f"logits.{j}"] = forward(cfg, W, ids)
        prompt = torch.randint(0, cfg["vocab_size"], (1, 5), generator=gen)
        ids, toks, margins = prompt.clone(), [], []
        for _ in range(8):
            z = forward(cfg, W, ids)[0, -1]
            top = torch.topk(z, 2).values
            toks.append(int(torch.argmax(z)))
            margins.append(float(top[0] - top[1]))
            ids = torch.cat([ids, torch.tensor([[toks[-1]]])], dim=1)
        expected["greedy.prompt"] = prompt.to(torch.int64)
        expected["greedy.tokens"] = torch.tensor(toks, dtype=torch.int64)
        expected["greedy.margins"] = torch.tensor(margins, dtype=torch.float64)
        meta = {"magic": FIXTURE_MAGIC, "version": str(FIXTURE_VERSION), "rope_mode": "yarn",
                "context_width": str(cfg["max_position_embeddings"]), "inputs": str(len(shapes)),
                "generator": "tools/reference/lfm2_reference.py", "torch": torch.__version__}
        write_safetensors(os.path.join(d, "expected.safetensors"), expected, meta)
        print(f"{name}: {len(stored)} tensors, MLP width {mlp_width(cfg)}, inputs {shapes}, greedy {toks}")
        if args.check:
            ns, version = load_classes()
            got = transformers_logits(d, ns, expected)
            for k, z in got.items():
                want = expected[k]
                err = ((z - want).abs().max() / want.abs().max()).item()
                print(f"{name} {k}: transformers {version} Lfm2 classes vs this reference {err:.3g} of max |logit|")
                if err > args.tol:
                    raise SystemExit(f"{name}: transformers' code and this reference disagree ({err:.3g})")
            write_safetensors(os.path.join(d, "transformers.safetensors"), got,
                              {"generator": "tools/reference/lfm2_reference.py --check", "transformers": version,
                               "source": "models/lfm2/modeling_lfm2.py", "torch": torch.__version__,
                               "attn_implementation": "eager", "dtype": "float64"})


if __name__ == "__main__":
    main()
