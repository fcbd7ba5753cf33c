#!/usr/bin/env python3
"""Cross-check of the DeepSeek-V2 fixtures against transformers' own modelling code.

transformers' DeepseekV2ForCausalLM (4.54 and later) needs torch >= 2.1, and the reference
environment runs Debian's torch 1.13. So this script does not import transformers: it reads
transformers' source file models/deepseek_v2/modeling_deepseek_v2.py (from a transformers
>= 4.57 installed in /work/venv-mla, a venv whose .pth file points at /work/venv-ref's packages
and Debian's torch), takes its classes and functions as written (DeepseekV2RMSNorm,
DeepseekV2RotaryEmbedding, apply_rotary_emb, eager_attention_forward, DeepseekV2Attention,
DeepseekV2MLP, DeepseekV2DecoderLayer), executes them with stand-ins for the library plumbing
around them (decorators that only register kernels or rename arguments, the default RoPE
initialiser of modeling_rope_utils, ACT2FN's silu), and stacks them into the causal LM the way
DeepseekV2Model does (embedding, decoder layers with a causal mask, final norm, lm_head), in
float64 with eager attention. It asserts that its logits equal model_reference.py's within
--tol of max |logit| (transformers rotates q_pe and k_pe in float32: apply_rotary_emb calls
.float(), so ~1e-7 here) and writes them as transformers.safetensors beside the fixture.

    python3 -m venv /work/venv-mla
    echo /work/venv-ref/lib/python3.11/site-packages > /work/venv-mla/lib/python3.11/site-packages/ref.pth
    echo /usr/lib/python3/dist-packages >> /work/venv-mla/lib/python3.11/site-packages/ref.pth
    /work/venv-mla/bin/pip install --no-deps transformers==4.57.1
    /work/venv-mla/bin/python tools/reference/deepseek_v2_check.py tests/fixtures/models/deepseek_v2_mla ...
"""

import ast
import importlib.util
import json
import os
import sys
import types
import warnings
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_reference import write_safetensors  # noqa: E402

TAKEN = ["DeepseekV2MLP", "DeepseekV2RMSNorm", "DeepseekV2RotaryEmbedding", "repeat_kv", "eager_attention_forward",
         "apply_rotary_emb", "DeepseekV2Attention", "DeepseekV2DecoderLayer"]


def transformers_source():
    spec = importlib.util.find_spec("transformers")  # locates the package without importing it
    root = spec.submodule_search_locations[0]
    path = os.path.join(root, "models", "deepseek_v2", "modeling_deepseek_v2.py")
    version = "?"
    for line in open(os.path.join(root, "__init__.py")):
        if line.startswith("__version__"):
            version = line.split("=")[1].strip().strip('"')
    return path, version


def default_rope(config, device=None):
    """modeling_rope_utils._compute_default_rope_parameters as transformers 4.57 writes it."""
    base = config.rope_theta
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    dim = int(head_dim * getattr(config, "partial_rotary_factor", 1.0))
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim))
    return inv_freq, 1.0


def load_classes():
    path, version = transformers_source()
    tree = ast.parse(open(path).read())
    body = [n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name in TAKEN]
    missing = set(TAKEN) - {n.name for n in body}
    if missing:
        raise SystemExit(f"{path}: no {sorted(missing)}")
    identity_factory = lambda *a, **k: (lambda f: f)  # noqa: E731
    ns = {
        "torch": torch, "nn": nn, "F": F, "Optional": Optional, "Callable": Callable, "warnings": warnings,
        "TransformersKwargs": dict, "Cache": object,
        "use_kernel_forward_from_hub": identity_factory, "deprecate_kwarg": identity_factory,
        "dynamic_rope_update": lambda f: f, "ROPE_INIT_FUNCTIONS": {"default": default_rope},
        "ACT2FN": {"silu": nn.SiLU()}, "ALL_ATTENTION_FUNCTIONS": {}, "GradientCheckpointingLayer": nn.Module,
        "DeepseekV2Config": object, "DeepseekV2MoE": None,
    }

    class _Unpack:  # typing's Unpack[...] in signatures
        def __class_getitem__(cls, item):
            return dict
    ns["Unpack"] = _Unpack
    exec(compile(ast.Module(body=body, type_ignores=[]), path, "exec"), ns)
    return ns, version


def run(d, ns, tol):
    cfg = json.load(open(os.path.join(d, "config.json")))
    c = types.SimpleNamespace(**cfg)
    c._attn_implementation = "eager"
    c.attention_dropout = 0.0
    c.mlp_bias = cfg.get("mlp_bias", False)
    c.rope_scaling = cfg.get("rope_scaling")
    c.attention_bias = cfg.get("attention_bias", False)
    assert c.first_k_dense_replace >= c.num_hidden_layers, "every layer must be dense"
    from safetensors.torch import load_file
    W = {k: v.double() for k, v in load_file(os.path.join(d, "model.safetensors")).items()}
    layers = nn.ModuleList([ns["DeepseekV2DecoderLayer"](c, i) for i in range(c.num_hidden_layers)]).double()
    for i, layer in enumerate(layers):
        sd = {k[len(f"model.layers.{i}."):]: v for k, v in W.items() if k.startswith(f"model.layers.{i}.")}
        layer.load_state_dict(sd, strict=True)
    norm = ns["DeepseekV2RMSNorm"](c.hidden_size, eps=c.rms_norm_eps).double()
    norm.weight.data = W["model.norm.weight"]
    rotary = ns["DeepseekV2RotaryEmbedding"](c)
    head = W["lm_head.weight"] if "lm_head.weight" in W else W["model.embed_tokens.weight"]
    expected = load_file(os.path.join(d, "expected.safetensors"))
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
                x = layer(x, attention_mask=mask, position_ids=pos, position_embeddings=pe)
                x = x[0] if isinstance(x, tuple) else x
            z = norm(x) @ head.T
        want = expected[f"logits.{j}"].double()
        err = (z - want).abs().max().item() / want.abs().max().item()
        print(f"{d} input {j} {tuple(ids.shape)}: transformers' DeepSeek-V2 code vs model_reference {err:.3g} of max |logit|")
        if err > tol:
            raise SystemExit(f"{d}: transformers' code and model_reference.py disagree ({err:.3g})")
        out[f"logits.{j}"] = z
        j += 1
    return out


def main():
    args = sys.argv[1:]
    tol = 1e-6
    if args[:1] == ["--tol"]:
        tol, args = float(args[1]), args[2:]
    ns, version = load_classes()
    for d in args:
        out = run(d, ns, tol)
        meta = {"generator": "tools/reference/deepseek_v2_check.py", "transformers": version,
                "source": "models/deepseek_v2/modeling_deepseek_v2.py", "torch": torch.__version__,
                "attn_implementation": "eager", "dtype": "float64"}
        write_safetensors(os.path.join(d, "transformers.safetensors"), out, meta)


if __name__ == "__main__":
    main()
