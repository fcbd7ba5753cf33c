#!/usr/bin/env python3
"""Cross-check of the gemma3n_text fixture against transformers' own Gemma 3n code.

transformers 4.57 needs torch >= 2.1 and the reference environment runs Debian's torch 1.13, so,
as deepseek_v2_check.py does, this script does not import transformers: it reads
models/gemma3n/modeling_gemma3n.py from a transformers 4.57.1 source tree (a wheel unpacked with
`pip download transformers==4.57.1 --no-deps` and unzip), takes its text-decoder classes and
functions as written (Gemma3nRMSNorm, Gemma3nTextScaledWordEmbedding, Gemma3nTextLaurelBlock,
Gemma3nTextMLP, Gemma3nTextAltUp, Gemma3nTextRotaryEmbedding, the rotary and attention helpers,
Gemma3nTextAttention, Gemma3nTextDecoderLayer, and Gemma3nTextModel's get_per_layer_inputs and
project_per_layer_inputs), executes them with stand-ins for the library plumbing (decorators,
the default RoPE initialiser, ACT2FN's gelu_pytorch_tanh, a cache object that hands each layer
its own keys back and keeps the sources' in shared_layers, as DynamicCache does over one pass),
and stacks them as Gemma3nTextModel.forward and Gemma3nForCausalLM do (AltUp streams, the masks
per layer type, unembedding, final norm, tied head, soft-cap), in float64 with eager attention.
It asserts that its logits equal gemma3n_reference.py's within --tol of max |logit|: 3e-5 as
transformers runs (it computes RMSNorm, the router's tanh, RoPE and the attention softmax in
float32 whatever the model's dtype; 2.9e-6 on the fixture's weight draw, 2.05e-5 on seed 3000's,
which amplifies rounding more), 1.1e-14 with --float64 (those islands in float64).

    /usr/bin/python3 tools/reference/gemma3n_check.py --transformers /tmp/tf [--float64] tests/fixtures/models/gemma3n_text
"""

import argparse
import ast
import copy
import json
import math
import os
import sys
import types
from typing import Any, Callable, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

TAKEN = ["Gemma3nRMSNorm", "Gemma3nTextScaledWordEmbedding", "Gemma3nTextLaurelBlock", "Gemma3nTextMLP", "Gemma3nTextAltUp",
         "Gemma3nTextRotaryEmbedding", "rotate_half", "repeat_kv", "eager_attention_forward", "apply_rotary_pos_emb",
         "Gemma3nTextAttention", "Gemma3nTextDecoderLayer"]
MODEL_METHODS = ["get_per_layer_inputs", "project_per_layer_inputs"]


def default_rope(config, device=None):
    """modeling_rope_utils._compute_default_rope_parameters as transformers 4.57 writes it."""
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim))
    return inv_freq, 1.0


def load_classes(root):
    path = os.path.join(root, "transformers", "models", "gemma3n", "modeling_gemma3n.py")
    tree = ast.parse(open(path).read())
    body = [n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name in TAKEN]
    missing = set(TAKEN) - {n.name for n in body}
    if missing:
        raise SystemExit(f"{path}: no {sorted(missing)}")
    model = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Gemma3nTextModel")
    methods = [n for n in model.body if isinstance(n, ast.FunctionDef) and n.name in MODEL_METHODS]
    identity_factory = lambda *a, **k: (lambda f: f)  # noqa: E731

    class _Unpack:  # typing's Unpack[...] in signatures
        def __class_getitem__(cls, item):
            return dict

    ns = {
        "torch": torch, "nn": nn, "F": F, "math": math, "copy": copy, "Optional": Optional, "Callable": Callable, "Union": Union,
        "Any": Any, "Unpack": _Unpack, "FlashAttentionKwargs": dict, "TransformersKwargs": dict, "Cache": object,
        "deprecate_kwarg": identity_factory, "dynamic_rope_update": lambda f: f, "auto_docstring": lambda f: f,
        "ROPE_INIT_FUNCTIONS": {"default": default_rope}, "ACT2FN": {"gelu_pytorch_tanh": nn.GELU(approximate="tanh")},
        "ALL_ATTENTION_FUNCTIONS": {}, "GradientCheckpointingLayer": nn.Module, "Gemma3nTextConfig": object,
    }
    exec(compile(ast.Module(body=body, type_ignores=[]), path, "exec"), ns)
    mns = dict(ns)
    exec(compile(ast.Module(body=methods, type_ignores=[]), path, "exec"), mns)
    return ns, {m: mns[m] for m in MODEL_METHODS}


def load_file(path):
    """The safetensors files model_reference.py writes (F32, F64, I64), read back."""
    import struct
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    dtypes = {"F32": torch.float32, "F64": torch.float64, "I64": torch.int64}
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        buf = bytearray(raw[8 + n + a:8 + n + b])
        out[name] = torch.frombuffer(buf, dtype=dtypes[e["dtype"]]).reshape(e["shape"]).clone()
    return out


class OnePassCache:
    """What the layers ask of DynamicCache over one pass from position 0: update() hands the
    layer's keys and values back; the sources' are kept in shared_layers by the layers."""

    def update(self, k, v, layer_idx, cache_kwargs=None):
        return k, v


def float64_everywhere(ns):
    """--float64: the few places transformers computes in float32 whatever the model's dtype
    (RMSNorm's .float(), the router's tanh, RoPE's tables, eager attention's softmax, the
    Phi^-1 of the gaussian top-k), replaced by the same expressions in float64, so the
    comparison shows the definitions agree to rounding (the module code is otherwise unchanged)."""
    ns["Gemma3nRMSNorm"].forward = lambda self, x: self._norm(x) * self.weight.to(x.dtype)
    ns["Gemma3nTextAltUp"].compute_router_modalities = lambda self, x: torch.tanh(
        self.modality_router(self.router_norm(x) * self.router_input_scale))

    def rope(self, x, pos):
        d = self.config.head_dim
        inv = 1.0 / (self.config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        f = pos[..., None].double() * inv
        emb = torch.cat((f, f), -1)
        return emb.cos(), emb.sin()
    ns["Gemma3nTextRotaryEmbedding"].forward = rope

    def topk(self, g):
        mult = math.sqrt(2.0) * torch.erfinv(torch.tensor(2.0 * self.activation_sparsity - 1.0, dtype=torch.float64)).item()
        mult = float(torch.tensor(mult, dtype=torch.float32))  # the float32 quantile both sides use
        mean = g.mean(-1, keepdim=True)
        return torch.relu(g - (mean + g.std(-1, keepdim=True, unbiased=False) * mult))
    ns["Gemma3nTextMLP"]._gaussian_topk = topk

    def eager(module, query, key, value, attention_mask, dropout=0.0, scaling=None, softcap=None, **kw):
        k, v = ns["repeat_kv"](key, module.num_key_value_groups), ns["repeat_kv"](value, module.num_key_value_groups)
        w = torch.matmul(query, k.transpose(2, 3)) * scaling + attention_mask[:, :, :, :k.shape[-2]]
        w = torch.softmax(w, dim=-1)
        return torch.matmul(w, v).transpose(1, 2).contiguous(), w
    ns["eager_attention_forward"] = eager


def run(d, ns, methods, tol, exact=False):
    cfg = json.load(open(os.path.join(d, "config.json")))
    c = types.SimpleNamespace(**cfg)
    c._attn_implementation = "eager"
    c.attention_dropout = 0.0
    L, E, P, A = c.num_hidden_layers, c.hidden_size, c.hidden_size_per_layer_input, c.altup_num_inputs
    W = {k: v.double() for k, v in load_file(os.path.join(d, "model.safetensors")).items()}
    layers = nn.ModuleList([ns["Gemma3nTextDecoderLayer"](c, i) for i in range(L)]).double()
    for i, layer in enumerate(layers):
        sd = {k[len(f"model.layers.{i}."):]: v for k, v in W.items() if k.startswith(f"model.layers.{i}.")}
        layer.load_state_dict(sd, strict=True)
    m = nn.Module()
    m.config = c
    m.hidden_size_per_layer_input = P
    m.embed_tokens = ns["Gemma3nTextScaledWordEmbedding"](c.vocab_size, E, c.pad_token_id, embed_scale=E ** 0.5)
    m.embed_tokens_per_layer = ns["Gemma3nTextScaledWordEmbedding"](c.vocab_size_per_layer_input, L * P, c.pad_token_id,
                                                                    embed_scale=P ** 0.5)
    m.per_layer_model_projection = nn.Linear(E, L * P, bias=False)
    m.per_layer_projection_norm = ns["Gemma3nRMSNorm"](P, eps=c.rms_norm_eps)
    m.altup_projections = nn.ModuleList([nn.Linear(E, E, bias=False) for _ in range(1, A)])
    m.altup_unembed_projections = nn.ModuleList([nn.Linear(E, E, bias=False) for _ in range(1, A)])
    m.norm = ns["Gemma3nRMSNorm"](E, eps=c.rms_norm_eps)
    m.register_buffer("per_layer_projection_scale", torch.tensor(E ** -0.5), persistent=False)
    m.register_buffer("per_layer_input_scale", torch.rsqrt(torch.tensor(2.0)), persistent=False)
    m = m.double()
    if exact:  # the constants transformers keeps as float32 buffers, in float64
        m.embed_tokens.embed_scale = torch.tensor(E ** 0.5, dtype=torch.float64)
        m.embed_tokens_per_layer.embed_scale = torch.tensor(P ** 0.5, dtype=torch.float64)
        m.per_layer_projection_scale = torch.tensor(E ** -0.5, dtype=torch.float64)
        m.per_layer_input_scale = torch.tensor(2 ** -0.5, dtype=torch.float64)
        for layer in layers:
            layer.altup.router_input_scale = torch.tensor(1.0 / E, dtype=torch.float64)
    m.load_state_dict({k[len("model."):]: v for k, v in W.items() if not k.startswith("model.layers.")}, strict=True)
    rotary = ns["Gemma3nTextRotaryEmbedding"](c)
    lc = copy.deepcopy(c)
    lc.rope_theta = c.rope_local_base_freq
    lc.rope_scaling = {"rope_type": "default"}
    rotary_local = ns["Gemma3nTextRotaryEmbedding"](lc)
    expected = load_file(os.path.join(d, "expected.safetensors"))
    out, j = {}, 0
    while f"input_ids.{j}" in expected:
        ids = expected[f"input_ids.{j}"]
        B, T = ids.shape
        with torch.no_grad():
            # Gemma3nTextModel.forward
            x0 = m.embed_tokens(ids)
            pli = methods["project_per_layer_inputs"](m, x0, methods["get_per_layer_inputs"](m, ids))
            pos = torch.arange(T)[None, :].expand(B, T)
            pe_global, pe_local = rotary(x0, pos), rotary_local(x0, pos)
            i_, j_ = torch.arange(T)[:, None], torch.arange(T)[None, :]
            full = torch.zeros(T, T, dtype=torch.float64).masked_fill(j_ > i_, float("-inf"))[None, None]
            sliding = full.masked_fill((j_ <= i_ - c.sliding_window)[None, None], float("-inf"))
            target = torch.mean(x0 ** 2, dim=-1, keepdim=True) ** 0.5
            eps = torch.tensor(1e-5)
            hs = [x0]
            for i in range(1, A):
                p = m.altup_projections[i - 1](x0)
                mag = torch.sqrt(torch.maximum(torch.mean(p ** 2, dim=-1, keepdim=True), eps))
                hs.append(p * target / mag)
            h = torch.stack(hs, dim=0)
            cache = OnePassCache()
            for layer in layers:
                mask = sliding if layer.attention_type == "sliding_attention" else full
                h = layer(h, pe_global, pe_local, pli[:, :, layer.layer_idx, :], attention_mask=mask, position_ids=pos,
                          past_key_values=cache, cache_position=torch.arange(T))[0]
            target = torch.mean(h[0] ** 2, dim=-1, keepdim=True) ** 0.5
            hs = [h[0]]
            for i in range(1, A):
                p = m.altup_unembed_projections[i - 1](h[i])
                mag = torch.sqrt(torch.maximum(torch.mean(p ** 2, dim=-1, keepdim=True), eps))
                hs.append(p * target / mag)
            hfin = m.norm(torch.mean(torch.stack(hs), dim=0))
            # Gemma3nForCausalLM: tied head, soft-cap
            z = hfin @ W["model.embed_tokens.weight"].T
            cap = c.final_logit_softcapping
            if cap is not None:
                z = torch.tanh(z / cap) * cap
        want = expected[f"logits.{j}"].double()
        err = (z - want).abs().max().item() / want.abs().max().item()
        print(f"{d} input {j} {tuple(ids.shape)}: transformers' Gemma 3n code vs gemma3n_reference {err:.3g} of max |logit|")
        if err > tol:
            raise SystemExit(f"{d}: transformers' code and gemma3n_reference.py disagree ({err:.3g})")
        out[f"logits.{j}"] = z
        j += 1
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--transformers", required=True, help="root of an unpacked transformers 4.57.1 wheel")
    ap.add_argument("--tol", type=float, default=None, help="default 3e-5, or 1e-12 with --float64")
    ap.add_argument("--float64", action="store_true", help="replace transformers' float32 islands by float64 (float64_everywhere)")
    ap.add_argument("dirs", nargs="+")
    args = ap.parse_args()
    torch.set_num_threads(2)
    ns, methods = load_classes(args.transformers)
    if args.float64:
        float64_everywhere(ns)
    tol = args.tol if args.tol is not None else (1e-12 if args.float64 else 3e-5)
    for d in args.dirs:
        run(d, ns, methods, tol, args.float64)


if __name__ == "__main__":
    main()
