#!/usr/bin/python3
"""Independent PyTorch autograd reference for kvlab's gradient pipeline (replayed KV-cache forward).

Reads a "kvlab-grad-case" JSON written by kvlab's C++ side, replays its per-layer, per-chunk slot
plans literally (moves, scatter into K/V/position buffers, masked attention over the cache), computes
the head's loss and, by plain autograd, the gradient of every parameter and of the input embeddings,
and writes them to a safetensors fixture. Never part of the build or CI (Debian's python3-torch only).

    /usr/bin/python3 tools/reference/grad_reference.py --case CASE.json --out OUT.safetensors
    /usr/bin/python3 tools/reference/grad_reference.py --self-test
    /usr/bin/python3 tools/reference/grad_reference.py --write-examples tests/fixtures/grad/examples

Semantics: shared/reference/keys_values.md sections 5.7, 6, 8, 9; the case format is restated in
[SECTION] CASE FORMAT below.
"""

# Index (grep the banners):
#   [SECTION] CASE FORMAT         input JSON fields and the ambiguities this script resolves
#   [SECTION] SAFETENSORS READER
#   [SECTION] MODEL               HF folder -> autograd leaves, LoRA, class head, RoPE/YaRN tables
#   [SECTION] REPLAY FORWARD      per layer, per chunk: moves, scatter, masked attention over slots
#   [SECTION] HEADS AND LOSS
#   [SECTION] RUN A CASE          load, forward, backward, output fixture
#   [SECTION] PLAN BUILDERS       dense, lastrec ring, per-row random evictions with grace moves
#   [SECTION] SELF-TEST           dense vs model_reference, chunked vs unchunked, visibility-mask
#                                 equivalence, finite differences, f32 vs f64
#   [SECTION] EXAMPLES            tests/fixtures/grad/examples
#   [SECTION] MAIN

import argparse
import hashlib
import json
import math
import os
import struct
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_reference as mr  # noqa: E402  (safetensors writer, rope_inv_freq, rms_norm, forward)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CASE_FORMAT, CASE_VERSION = "kvlab-grad-case", 1
FIXTURE_FORMAT, FIXTURE_VERSION = "kvlab-grad-fixture", 1
IGNORE_INDEX = -100
HEADS = ("next_token_prediction", "seq_classification_on_logits", "seq_classification")

# =================================================================================================
# [SECTION] CASE FORMAT
# =================================================================================================
# Fields (all required unless marked optional):
#   format "kvlab-grad-case", version 1
#   model               HF folder (config.json + model.safetensors), relative to the repo root
#   dtype               "f64" | "f32": compute precision here and dtype of every output tensor
#   rope_context_width  RoPE/YaRN tables are built for positions [0, width)
#   B, T, ids (B x T)
#   head                next_token_prediction | seq_classification_on_logits | seq_classification
#   targets (B x T)     next_token_prediction only; target of input position t, -100 = none
#   labels (B)          classification heads; class_tokens (C) for seq_classification_on_logits
#   class_head          seq_classification: safetensors with "weight" (C, E), optional "bias" (C)
#   chunks              chunk sizes, sum = T
#   cache_length        L per layer
#   lora                null | {"r", "alpha", "targets" subset of q,k,v,proj,mlp,head, "tensors"}
#   plans[layer][chunk] {"input_pos","n","rows","targets","moves","move_from","move_to","length_after"}
#
# Ambiguities resolved here (see the report that introduced this file):
#   - RoPE mode is always YaRN (keys_values section 6, as model_reference.py builds every fixture),
#     L_train = max_position_embeddings, s = max(1, width / L_train). The YaRN attention factor
#     enters as one multiplier on the scores, scale = (0.1 ln s + 1)^2 / sqrt(head_dim), exactly as
#     model_reference.rope_inv_freq returns it (equivalent to HF scaling cos and sin by
#     0.1 ln s + 1). cos/sin are computed in float64 and rounded to the compute dtype.
#   - LoRA tensor names are read with or without PEFT's "base_model.model." prefix; the output
#     names them without it: grad.lora.model.layers.{l}.self_attn.q_proj.lora_A.weight, ...
#   - Relative side-file paths (class_head, lora.tensors) are looked up next to the case file first,
#     then under the repo root. The model path is relative to the repo root (absolute paths as is).
#   - next_token_prediction: a row without any target contributes loss 0 and still counts in the
#     mean over B (normalizer max(count, 1)); such a row never produces NaN.
#   - Slots with P >= length_after are ignored by attention (only [0, length_after) is scanned);
#     holes (P = -1) inside that range are simply masked. A query with no allowed slot is an error.
#   - Duplicate slots inside one row's targets, or inside one row's move_to, are errors.
#   - Parameters the loss does not reach (lm_head for seq_classification) get zero gradients.
#   - The embedding table's gradient includes the lookup (scatter-add of grad.input_embeddings) and,
#     with tied embeddings, the lm_head use.

LORA_MODULES = {  # LoRA target flag -> HF module names (per layer unless "head")
    "q": ["self_attn.q_proj"], "k": ["self_attn.k_proj"], "v": ["self_attn.v_proj"],
    "proj": ["self_attn.o_proj"], "mlp": ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"],
    "head": ["lm_head"],
}


def resolve_path(path, case_dir, prefer_case_dir):
    if os.path.isabs(path):
        return path
    bases = [case_dir, REPO_ROOT] if prefer_case_dir else [REPO_ROOT, case_dir]
    for base in bases:
        p = os.path.join(base, path)
        if os.path.exists(p):
            return p
    raise FileNotFoundError(f"'{path}' found neither under {bases[0]} nor under {bases[1]}")


# =================================================================================================
# [SECTION] SAFETENSORS READER
# =================================================================================================
ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
             "I64": torch.int64, "I32": torch.int32}


def read_safetensors(path):
    """Returns ({name: tensor}, metadata dict). Layout: u64 LE header length, JSON, raw LE data."""
    with open(path, "rb") as f:
        data = f.read()
    (hlen,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + hlen])
    meta = header.pop("__metadata__", {})
    base = 8 + hlen
    out = {}
    for name, info in header.items():
        dt = ST_DTYPES[info["dtype"]]
        a, b = info["data_offsets"]
        buf = bytearray(data[base + a:base + b])
        if len(buf) == 0:
            t = torch.zeros(0, dtype=dt)
        elif dt == torch.bfloat16:
            t = torch.frombuffer(buf, dtype=torch.int16).view(torch.bfloat16)
        else:
            t = torch.frombuffer(buf, dtype=dt)
        out[name] = t.reshape(info["shape"]).clone()
    return out, meta


# =================================================================================================
# [SECTION] MODEL
# =================================================================================================
def leaf(t, dtype):
    return t.detach().to(dtype).clone().requires_grad_(True)


class Model:
    """Tiny HF Llama/Qwen2/Qwen3 whose weights are autograd leaves in the compute dtype."""

    def __init__(self, folder, dtype, width):
        with open(os.path.join(folder, "config.json")) as f:
            self.cfg = json.load(f)
        cfg = self.cfg
        weights, _ = read_safetensors(os.path.join(folder, "model.safetensors"))
        self.dtype = dtype
        self.params = {k: leaf(v, dtype) for k, v in sorted(weights.items())}
        self.E, self.NH = cfg["hidden_size"], cfg["num_attention_heads"]
        self.G, self.D = cfg["num_key_value_heads"], cfg.get("head_dim", self.E // self.NH)
        self.V, self.n_layer, self.eps = cfg["vocab_size"], cfg["num_hidden_layers"], cfg["rms_norm_eps"]
        self.tied = "lm_head.weight" not in self.params
        self.width = width
        inv_freq, self.scale = mr.rope_inv_freq(dict(cfg, head_dim=self.D), width, "yarn")
        ang = torch.arange(width, dtype=torch.float64)[:, None] * inv_freq[None, :]  # (width, D/2)
        self.cos, self.sin = torch.cos(ang).to(dtype), torch.sin(ang).to(dtype)
        self.lora = {}          # module prefix -> (A (r, in), B (out, r)) leaves
        self.lora_names = {}    # PEFT tensor name -> leaf
        self.lora_scale = 0.0
        self.class_head = {}    # "weight" (C, E), optional "bias" (C)

    # ---- optional trainables -------------------------------------------------------------------
    def attach_lora(self, spec, path):
        tensors, _ = read_safetensors(path)
        # accept PEFT's saved form too ("base_model.model." prefix, as engine/grad/lora.cpp writes)
        tensors = {k[len("base_model.model."):] if k.startswith("base_model.model.") else k: v
                   for k, v in tensors.items()}
        r, alpha = int(spec["r"]), float(spec["alpha"])
        self.lora_scale = alpha / r
        for flag in spec["targets"]:
            if flag not in LORA_MODULES:
                raise ValueError(f"lora.targets: unknown target '{flag}' (expected one of {list(LORA_MODULES)})")
            for mod in LORA_MODULES[flag]:
                prefixes = ["lm_head"] if mod == "lm_head" else [f"model.layers.{l}.{mod}" for l in range(self.n_layer)]
                for p in prefixes:
                    wname = "model.embed_tokens.weight" if (p == "lm_head" and self.tied) else p + ".weight"
                    out_f, in_f = self.params[wname].shape
                    A = tensors.get(p + ".lora_A.weight")
                    Bm = tensors.get(p + ".lora_B.weight")
                    if A is None or Bm is None:
                        raise ValueError(f"{path}: missing {p}.lora_A.weight / {p}.lora_B.weight")
                    if tuple(A.shape) != (r, in_f) or tuple(Bm.shape) != (out_f, r):
                        raise ValueError(f"{path}: {p} LoRA shapes A{tuple(A.shape)} B{tuple(Bm.shape)}, "
                                         f"expected A({r}, {in_f}) B({out_f}, {r})")
                    a, b = leaf(A, self.dtype), leaf(Bm, self.dtype)
                    self.lora[p] = (a, b)
                    self.lora_names[p + ".lora_A.weight"] = a
                    self.lora_names[p + ".lora_B.weight"] = b

    def attach_class_head(self, path):
        tensors, _ = read_safetensors(path)
        w = tensors["weight"]
        if w.dim() != 2 or w.shape[1] != self.E:
            raise ValueError(f"{path}: class head weight has shape {tuple(w.shape)}, expected (C, {self.E})")
        self.class_head["weight"] = leaf(w, self.dtype)
        if "bias" in tensors:
            self.class_head["bias"] = leaf(tensors["bias"], self.dtype)

    # ---- building blocks -----------------------------------------------------------------------
    def linear(self, x, prefix, weight=None):
        """y = x W^T (+ b) (+ alpha/r * (x A^T) B^T)."""
        w = self.params[prefix + ".weight"] if weight is None else weight
        y = x @ w.T
        bias = self.params.get(prefix + ".bias")
        if bias is not None:
            y = y + bias
        ab = self.lora.get(prefix)
        if ab is not None:
            y = y + self.lora_scale * ((x @ ab[0].T) @ ab[1].T)
        return y

    def rope(self, x, pos):
        """x (B, H, n, D) at absolute positions pos (n,); rotate-half pairs (i, i + D/2)."""
        if int(pos.max()) >= self.width:
            raise ValueError(f"position {int(pos.max())} outside rope_context_width {self.width}")
        cos, sin = self.cos[pos], self.sin[pos]  # (n, D/2)
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    def embed(self, ids):
        return self.params["model.embed_tokens.weight"][ids]  # (B, T, E)

    def qkv(self, l, xc, pos):
        """Layer input rows xc (B, n, E) -> roped q (B, NH, n, D), roped k (B, G, n, D), v (B, G, n, D)."""
        B, n, _ = xc.shape
        p = f"model.layers.{l}."
        h = mr.rms_norm(xc, self.params[p + "input_layernorm.weight"], self.eps)
        q = self.linear(h, p + "self_attn.q_proj").view(B, n, self.NH, self.D)
        k = self.linear(h, p + "self_attn.k_proj").view(B, n, self.G, self.D)
        v = self.linear(h, p + "self_attn.v_proj").view(B, n, self.G, self.D)
        if p + "self_attn.q_norm.weight" in self.params:  # Qwen3: per-head RMSNorm before RoPE
            q = mr.rms_norm(q, self.params[p + "self_attn.q_norm.weight"], self.eps)
            k = mr.rms_norm(k, self.params[p + "self_attn.k_norm.weight"], self.eps)
        return self.rope(q.transpose(1, 2), pos), self.rope(k.transpose(1, 2), pos), v.transpose(1, 2)

    def attend(self, q, K, V, bias):
        """q (B, NH, n, D); K, V (B, G, S, D); bias (B, G, n, S) added to the scaled scores.
        Query head h reads KV group h // (NH / G)."""
        B, NH, n, D = q.shape
        G = K.shape[1]
        s = torch.einsum("bgrnd,bgsd->bgrns", q.reshape(B, G, NH // G, n, D), K) * self.scale
        s = s + bias[:, :, None]
        a = torch.einsum("bgrns,bgsd->bgrnd", torch.softmax(s, dim=-1), V)
        return a.reshape(B, NH, n, D)

    def finish_block(self, l, xc, att):
        """xc (B, n, E) layer input rows, att (B, NH, n, D) -> layer output rows (B, n, E)."""
        B, n, _ = xc.shape
        p = f"model.layers.{l}."
        x = xc + self.linear(att.transpose(1, 2).reshape(B, n, self.NH * self.D), p + "self_attn.o_proj")
        h = mr.rms_norm(x, self.params[p + "post_attention_layernorm.weight"], self.eps)
        g = self.linear(h, p + "mlp.gate_proj")
        u = self.linear(h, p + "mlp.up_proj")
        return x + self.linear(torch.nn.functional.silu(g) * u, p + "mlp.down_proj")

    def lm_head(self, xf):
        w = self.params["model.embed_tokens.weight"] if self.tied else None
        return self.linear(xf, "lm_head", weight=w)


# =================================================================================================
# [SECTION] REPLAY FORWARD
# =================================================================================================
def plan_rows(plan, key, width, B, G, what):
    """Per-row slot lists of a plan field -> long tensor (B, G, width)."""
    rows = plan["rows"]
    vals = plan[key]
    if rows not in (1, B * G):
        raise ValueError(f"{what}: rows = {rows}, expected 1 or B*G = {B * G}")
    if len(vals) != rows * width:
        raise ValueError(f"{what}: {key} has {len(vals)} entries, expected rows*{width} = {rows * width}")
    t = torch.tensor(vals, dtype=torch.long).view(rows, width)
    return t.expand(B * G, width).reshape(B, G, width) if rows == 1 else t.view(B, G, width)


def check_distinct(idx, L, what):
    if idx.numel() == 0:
        return
    if int(idx.min()) < 0 or int(idx.max()) >= L:
        raise ValueError(f"{what}: slot outside [0, {L})")
    srt = idx.sort(dim=-1).values
    if bool((srt[..., 1:] == srt[..., :-1]).any()):
        raise ValueError(f"{what}: a row names the same slot twice")


def validate_plans(case, n_layer):
    starts = [sum(case["chunks"][:c]) for c in range(len(case["chunks"]))]
    if sum(case["chunks"]) != case["T"]:
        raise ValueError(f"chunks sum to {sum(case['chunks'])}, expected T = {case['T']}")
    if len(case["plans"]) != n_layer or len(case["cache_length"]) != n_layer:
        raise ValueError(f"plans / cache_length need one entry per layer ({n_layer})")
    for l, layer in enumerate(case["plans"]):
        if len(layer) != len(case["chunks"]):
            raise ValueError(f"plans[{l}] has {len(layer)} chunks, expected {len(case['chunks'])}")
        for c, plan in enumerate(layer):
            if plan["input_pos"] != starts[c] or plan["n"] != case["chunks"][c]:
                raise ValueError(f"plans[{l}][{c}]: input_pos/n = {plan['input_pos']}/{plan['n']}, "
                                 f"expected {starts[c]}/{case['chunks'][c]}")
            if not 0 < plan["length_after"] <= case["cache_length"][l]:
                raise ValueError(f"plans[{l}][{c}]: length_after {plan['length_after']} outside (0, L]")


def replay_layer(model, l, x, plans, L):
    """One layer over all chunks of its plan. x (B, T, E) layer input -> layer output (B, T, E).
    K, V (B, G, L, D) and P (B, G, L) are rebuilt out of place per chunk, so autograd routes the
    gradient of every slot to whichever chunk wrote the content it holds."""
    B, T, _ = x.shape
    G, D = model.G, model.D
    K = torch.zeros(B, G, L, D, dtype=model.dtype)
    V = torch.zeros(B, G, L, D, dtype=model.dtype)
    P = torch.full((B, G, L), -1, dtype=torch.long)
    bg = (torch.arange(B)[:, None, None], torch.arange(G)[None, :, None])
    outs = []
    for c, plan in enumerate(plans):
        what = f"plans[{l}][{c}]"
        ip, n, m = plan["input_pos"], plan["n"], plan["moves"]
        pos = torch.arange(ip, ip + n)
        xc = x[:, ip:ip + n]
        q, k, v = model.qkv(l, xc, pos)
        if m > 0:
            src = plan_rows(plan, "move_from", m, B, G, what)
            dst = plan_rows(plan, "move_to", m, B, G, what)
            check_distinct(dst, L, what + ".move_to")
            check_distinct(src, L, what + ".move_from")
            # all reads (of the old buffers) happen before all writes
            K = K.index_put((bg[0], bg[1], dst), K[bg[0], bg[1], src])
            V = V.index_put((bg[0], bg[1], dst), V[bg[0], bg[1], src])
            P = P.index_put((bg[0], bg[1], dst), P[bg[0], bg[1], src])
        tgt = plan_rows(plan, "targets", n, B, G, what)
        check_distinct(tgt, L, what + ".targets")
        K = K.index_put((bg[0], bg[1], tgt), k)
        V = V.index_put((bg[0], bg[1], tgt), v)
        P = P.index_put((bg[0], bg[1], tgt), pos.expand(B, G, n).contiguous())
        S = plan["length_after"]
        Ps = P[:, :, None, :S]  # (B, G, 1, S)
        allowed = (Ps >= 0) & (Ps <= pos[None, None, :, None])  # (B, G, n, S)
        if not bool(allowed.any(dim=-1).all()):
            raise ValueError(f"{what}: some query has no slot it may attend")
        bias = torch.zeros(allowed.shape, dtype=model.dtype).masked_fill(~allowed, float("-inf"))
        att = model.attend(q, K[:, :, :S], V[:, :, :S], bias)
        outs.append(model.finish_block(l, xc, att))
    return torch.cat(outs, dim=1)


def replay_forward(model, case, x0):
    """x0 (B, T, E) -> (final layer output (B, T, E), [layer outputs])."""
    x, layer_outputs = x0, []
    for l in range(model.n_layer):
        x = replay_layer(model, l, x, case["plans"][l], case["cache_length"][l])
        layer_outputs.append(x)
    return x, layer_outputs


# =================================================================================================
# [SECTION] HEADS AND LOSS
# =================================================================================================
def ce_rows(logits, labels):
    """Per-row cross entropy; logits (N, C), labels (N,)."""
    return -torch.log_softmax(logits, dim=-1).gather(-1, labels[:, None]).squeeze(-1)


def loss_from_logits(case, logits):
    """Per-row losses (B,) of the two lm_head-based heads from logits (B, T, V)."""
    head = case["head"]
    if head == "next_token_prediction":
        y = torch.tensor(case["targets"], dtype=torch.long)  # (B, T)
        mask = y != IGNORE_INDEX
        lp = torch.log_softmax(logits, dim=-1)
        nll = -(lp.gather(-1, y.clamp(min=0)[..., None]).squeeze(-1) * mask.to(lp.dtype)).sum(dim=1)
        return nll / mask.sum(dim=1).clamp(min=1).to(lp.dtype)
    if head == "seq_classification_on_logits":
        z = logits[:, -1, torch.tensor(case["class_tokens"], dtype=torch.long)]  # (B, C)
        return ce_rows(z, torch.tensor(case["labels"], dtype=torch.long))
    raise ValueError(f"head '{head}' does not read lm_head logits")


def head_forward(model, case, x_final):
    """x_final (B, T, E) -> dict(loss (), loss_rows (B,), logits_last (B, V), class_logits (B, C)?)."""
    xf = mr.rms_norm(x_final, model.params["model.norm.weight"], model.eps)
    out = {}
    if case["head"] == "seq_classification":
        hc = model.class_head
        z = xf[:, -1] @ hc["weight"].T
        if "bias" in hc:
            z = z + hc["bias"]
        out["class_logits"] = z
        rows = ce_rows(z, torch.tensor(case["labels"], dtype=torch.long))
        with torch.no_grad():
            out["logits_last"] = model.lm_head(xf[:, -1])  # debugging only, not on the loss path
    else:
        logits = model.lm_head(xf)
        rows = loss_from_logits(case, logits)
        out["logits_last"] = logits[:, -1]
        if case["head"] == "seq_classification_on_logits":
            out["class_logits"] = logits[:, -1, torch.tensor(case["class_tokens"], dtype=torch.long)]
    out["loss_rows"] = rows
    out["loss"] = rows.mean()
    return out


# =================================================================================================
# [SECTION] RUN A CASE
# =================================================================================================
def load_case(case_path):
    """-> (case dict, Model with LoRA/class head attached, ids (B, T))."""
    with open(case_path) as f:
        case = json.load(f)
    if case.get("format") != CASE_FORMAT or case.get("version") != CASE_VERSION:
        raise ValueError(f"{case_path}: format/version {case.get('format')}/{case.get('version')}, "
                         f"expected {CASE_FORMAT}/{CASE_VERSION}")
    dtype = {"f64": torch.float64, "f32": torch.float32}[case["dtype"]]
    if case["head"] not in HEADS:
        raise ValueError(f"head '{case['head']}' unknown (expected one of {HEADS})")
    case_dir = os.path.dirname(os.path.abspath(case_path))
    model = Model(resolve_path(case["model"], case_dir, False), dtype, case["rope_context_width"])
    if case.get("lora"):
        model.attach_lora(case["lora"], resolve_path(case["lora"]["tensors"], case_dir, True))
    if case["head"] == "seq_classification":
        model.attach_class_head(resolve_path(case["class_head"], case_dir, True))
    ids = torch.tensor(case["ids"], dtype=torch.long)
    if tuple(ids.shape) != (case["B"], case["T"]):
        raise ValueError(f"ids shape {tuple(ids.shape)}, expected ({case['B']}, {case['T']})")
    validate_plans(case, model.n_layer)
    return case, model, ids


def trainables(model):
    """Output name -> leaf, for every tensor that gets a gradient in the fixture."""
    named = {"grad." + k: v for k, v in model.params.items()}
    named.update({"grad.lora." + k: v for k, v in model.lora_names.items()})
    named.update({"grad.class_head." + k: v for k, v in model.class_head.items()})
    return named


def evaluate(case, model, ids, x0=None, backward=True):
    """Forward (and backward). x0 overrides the embedding output (finite differences)."""
    if x0 is None:
        x0 = model.embed(ids)
    else:
        x0 = x0.detach().clone().requires_grad_(backward)
    if backward:
        x0.retain_grad()
    for t in trainables(model).values():
        t.grad = None
    x, layer_outputs = replay_forward(model, case, x0)
    out = head_forward(model, case, x)
    out["layer_outputs"] = layer_outputs
    if backward:
        out["loss"].backward()
        out["grads"] = {k: (v.grad if v.grad is not None else torch.zeros_like(v)).detach().clone()
                        for k, v in trainables(model).items()}
        out["grads"]["grad.input_embeddings"] = x0.grad.detach().clone()
    return out


def fixture_tensors(out, dtype):
    res = {"loss": out["loss"].detach().reshape(1), "loss_rows": out["loss_rows"].detach(),
           "logits_last": out["logits_last"].detach()}
    if "class_logits" in out:
        res["class_logits"] = out["class_logits"].detach()
    for l, y in enumerate(out["layer_outputs"]):
        res[f"layer_outputs.{l}"] = y.detach()
    res.update(out["grads"])
    return {k: v.to(dtype).contiguous() for k, v in res.items()}


def run_case(case_path, out_path):
    case, model, ids = load_case(case_path)
    out = evaluate(case, model, ids)
    with open(case_path, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    meta = {"format": FIXTURE_FORMAT, "version": str(FIXTURE_VERSION), "case_sha256": sha,
            "torch": torch.__version__, "generator": "tools/reference/grad_reference.py",
            "model": case["model"], "head": case["head"], "dtype": case["dtype"],
            "attention_scale": repr(model.scale)}
    tensors = fixture_tensors(out, model.dtype)
    mr.write_safetensors(out_path, tensors, meta)
    return case, tensors


# =================================================================================================
# [SECTION] PLAN BUILDERS
# =================================================================================================
# These only make cases for the self-test and the examples; kvlab's C++ side writes real ones.
def chunk_plan(ip, n, rows, targets, length_after, move_from=(), move_to=(), moves=0):
    return {"input_pos": ip, "n": n, "rows": rows, "targets": list(targets), "moves": moves,
            "move_from": list(move_from), "move_to": list(move_to), "length_after": length_after}


def cat_phase(ip, n, L):
    """Slots while the cache is not full, or None once it is. A chunk may not straddle L."""
    if ip + n <= L:
        return chunk_plan(ip, n, 1, range(ip, ip + n), ip + n)
    if ip < L:
        raise ValueError(f"chunk [{ip}, {ip + n}) straddles cache length {L}")
    return None


def dense_plans(chunks):
    ip, out = 0, []
    for n in chunks:
        out.append(chunk_plan(ip, n, 1, range(ip, ip + n), ip + n))
        ip += n
    return out


def lastrec_plans(chunks, L, grace):
    """keys_values 4.2: slots [0, grace) kept, ring over [grace, L) once the cache is full."""
    ip, ptr, out = 0, None, []
    for n in chunks:
        p = cat_phase(ip, n, L)
        if p is None:
            if ptr is None or ptr == L:
                ptr = grace
            slots = [grace + (ptr - grace + t) % (L - grace) for t in range(n)]
            ptr = grace + (ptr - grace + n) % (L - grace)
            p = chunk_plan(ip, n, 1, slots, L)
        out.append(p)
        ip += n
    return out


def random_evict_plans(chunks, L, rows, moves, gen, chain=False):
    """H2O-like per-row choices with grace-style moves (keys_values 5.7): each full chunk evicts a
    random set I (n slots) per row, moves the content of m other slots J into I[:m] and writes the
    n new tokens into I[m:] + J in a random order. chain=True instead shifts J[0] -> J[1] -> ... ->
    J[m-1] -> I[0] (move_to overlaps move_from, so only reads-before-writes gives the right result)
    and writes the new tokens into I[1:] + [J[0]]. Move pairs are listed in random order."""
    ip, out = 0, []
    for n in chunks:
        p = cat_phase(ip, n, L)
        if p is None:
            tg, mf, mt = [], [], []
            for _ in range(rows):
                perm = torch.randperm(L, generator=gen).tolist()
                I, J = perm[:n], perm[n:n + moves]
                if chain:
                    src, dst, new = J, J[1:] + I[:1], I[1:] + J[:1]
                else:
                    src, dst, new = J, I[:moves], I[moves:] + J
                order = torch.randperm(n, generator=gen).tolist()
                tg += [new[i] for i in order]
                pairs = torch.randperm(moves, generator=gen).tolist()
                mf += [src[i] for i in pairs]
                mt += [dst[i] for i in pairs]
            p = chunk_plan(ip, n, rows, tg, L, mf, mt, moves)
        out.append(p)
        ip += n
    return out


def ntp_targets(ids, skip):
    """Target of position t = ids[t+1]; the first skip[b] positions and the last are -100."""
    B, T = len(ids), len(ids[0])
    return [[IGNORE_INDEX if (t < skip[b] or t == T - 1) else ids[b][t + 1] for t in range(T)] for b in range(B)]


def make_case(model, dtype, B, T, chunks, plans, cache_length, head, gen, width=None, **extra):
    with open(os.path.join(REPO_ROOT, model, "config.json")) as f:
        V = json.load(f)["vocab_size"]
    ids = torch.randint(0, V, (B, T), generator=gen).tolist()
    case = {"format": CASE_FORMAT, "version": CASE_VERSION, "model": model, "dtype": dtype,
            "rope_context_width": width or T, "B": B, "T": T, "ids": ids, "head": head}
    if head == "next_token_prediction":
        case["targets"] = ntp_targets(ids, extra.pop("skip", [0] * B))
    lora = extra.pop("lora", None)
    case.update(extra)
    case.update({"chunks": chunks, "cache_length": cache_length, "lora": lora, "plans": plans})
    return case


def dump_case(case):
    """JSON with one line per field and one line per chunk plan."""
    lines = []
    for k, v in case.items():
        if k == "plans":
            layers = ["    [\n" + ",\n".join("      " + json.dumps(c, separators=(",", ":")) for c in layer)
                      + "\n    ]" for layer in v]
            lines.append('  "plans": [\n' + ",\n".join(layers) + "\n  ]")
        else:
            lines.append("  " + json.dumps(k) + ": " + json.dumps(v, separators=(",", ":")))
    return "{\n" + ",\n".join(lines) + "\n}\n"


def write_case(folder, name, case):
    path = os.path.join(folder, name + ".case.json")
    with open(path, "w") as f:
        f.write(dump_case(case))
    return path


def write_lora_init(path, model_dir, r, targets, gen):
    """PEFT-named A (r, in) and B (out, r); B is random (not PEFT's zeros) so every A gets a gradient."""
    with open(os.path.join(REPO_ROOT, model_dir, "config.json")) as f:
        cfg = json.load(f)
    E, D, I, V = cfg["hidden_size"], cfg.get("head_dim"), cfg["intermediate_size"], cfg["vocab_size"]
    Q, KV = cfg["num_attention_heads"] * D, cfg["num_key_value_heads"] * D
    dims = {"self_attn.q_proj": (Q, E), "self_attn.k_proj": (KV, E), "self_attn.v_proj": (KV, E),
            "self_attn.o_proj": (E, Q), "mlp.gate_proj": (I, E), "mlp.up_proj": (I, E),
            "mlp.down_proj": (E, I), "lm_head": (V, E)}
    t = {}
    for flag in targets:
        for mod in LORA_MODULES[flag]:
            prefixes = ["lm_head"] if mod == "lm_head" else \
                [f"model.layers.{l}.{mod}" for l in range(cfg["num_hidden_layers"])]
            out_f, in_f = dims[mod]
            for p in prefixes:
                t[p + ".lora_A.weight"] = (torch.rand(r, in_f, generator=gen, dtype=torch.float64) * 2 - 1) / math.sqrt(in_f)
                t[p + ".lora_B.weight"] = torch.randn(out_f, r, generator=gen, dtype=torch.float64) * 0.1
    mr.write_safetensors(path, {k: v.float() for k, v in t.items()})


def write_class_head(path, C, E, gen):
    mr.write_safetensors(path, {"weight": (torch.randn(C, E, generator=gen, dtype=torch.float64) * 0.3).float(),
                                "bias": (torch.randn(C, generator=gen, dtype=torch.float64) * 0.1).float()})


# =================================================================================================
# [SECTION] SELF-TEST
# =================================================================================================
def rel_err(a, b):
    """max |a - b| / max(max |b|, tiny); 0 for two all-zero tensors."""
    a, b = a.double(), b.double()
    den = float(b.abs().max()) if b.numel() else 0.0
    num = float((a - b).abs().max()) if b.numel() else 0.0
    return num / den if den > 0 else num


def compare_dicts(got, ref, keys=None):
    """-> (worst relative error, its key)."""
    worst, where = 0.0, None
    for k in keys or sorted(ref):
        e = rel_err(got[k], ref[k])
        if e > worst:
            worst, where = e, k
    return worst, where


def visibility_bias(case, l, G):
    B, T, L = case["B"], case["T"], case["cache_length"][l]
    M = torch.zeros(B, G, T, T, dtype=torch.float64)
    slots = [[-1] * L for _ in range(B * G)]
    for plan in case["plans"][l]:
        ip, n, m, rows = plan["input_pos"], plan["n"], plan["moves"], plan["rows"]
        for r in range(B * G):
            pr = 0 if rows == 1 else r
            old = list(slots[r])
            for i in range(m):
                slots[r][plan["move_to"][pr * m + i]] = old[plan["move_from"][pr * m + i]]
            for t in range(n):
                slots[r][plan["targets"][pr * n + t]] = ip + t
            b, g = divmod(r, G)
            for t in range(ip, ip + n):
                for p in slots[r][:plan["length_after"]]:
                    if 0 <= p <= t:
                        M[b, g, t, p] += 1
    return torch.log(M)  # log multiplicity: -inf for invisible, log 2 for a duplicated slot


def masked_dense_evaluate(case, model, ids):
    """Full-sequence forward with per-(b, g) visibility from visibility_bias: no cache buffers, no
    scatter. Equal to the replay in exact arithmetic, loss and gradients alike."""
    for t in trainables(model).values():
        t.grad = None
    x0 = model.embed(ids)
    x0.retain_grad()
    x, pos, layer_outputs = x0, torch.arange(case["T"]), []
    for l in range(model.n_layer):
        bias = visibility_bias(case, l, model.G).to(model.dtype)
        q, k, v = model.qkv(l, x, pos)
        x = model.finish_block(l, x, model.attend(q, k, v, bias))
        layer_outputs.append(x)
    out = head_forward(model, case, x)
    out["loss"].backward()
    out["layer_outputs"] = layer_outputs
    out["grads"] = {k: (v.grad if v.grad is not None else torch.zeros_like(v)).detach().clone()
                    for k, v in trainables(model).items()}
    out["grads"]["grad.input_embeddings"] = x0.grad.detach().clone()
    return out


def finite_difference(case, model, ids, out, gen, per_tensor=2, eps=1e-5):
    """Central differences on random entries of a few tensors (and of x0) vs autograd.
    -> (max abs error, max relative error, number of entries)."""
    named = trainables(model)
    picks = [k for k in sorted(named) if "layers.0." in k and ("k_proj" in k or "v_proj" in k or "q_norm" in k)]
    picks += [k for k in sorted(named) if "layers.1.self_attn.q_proj" in k or "lora" in k or "class_head" in k
              or k == "grad.model.embed_tokens.weight"]
    x0 = model.embed(ids).detach()
    worst_abs = worst_rel = 0.0
    count = 0

    def loss_at(xx=None):
        with torch.no_grad():
            return float(evaluate(case, model, ids, x0=xx, backward=False)["loss"])

    for key in picks + ["grad.input_embeddings"]:
        for _ in range(per_tensor):
            if key == "grad.input_embeddings":  # early positions: their K/V get evicted later
                b = int(torch.randint(0, case["B"], (1,), generator=gen))
                t = int(torch.randint(0, case["chunks"][0], (1,), generator=gen))
                e = int(torch.randint(0, model.E, (1,), generator=gen))
                xp, xm = x0.clone(), x0.clone()
                xp[b, t, e] += eps
                xm[b, t, e] -= eps
                fd = (loss_at(xp) - loss_at(xm)) / (2 * eps)
                ag = float(out["grads"][key][b, t, e])
            else:
                ten = named[key]
                if key == "grad.model.embed_tokens.weight":
                    row = ids.view(-1)[int(torch.randint(0, ids.numel(), (1,), generator=gen))]
                    i = int(row) * model.E + int(torch.randint(0, model.E, (1,), generator=gen))
                else:
                    i = int(torch.randint(0, ten.numel(), (1,), generator=gen))
                flat = ten.data.view(-1)
                orig = float(flat[i])
                flat[i] = orig + eps
                lp = loss_at()
                flat[i] = orig - eps
                lm = loss_at()
                flat[i] = orig
                fd = (lp - lm) / (2 * eps)
                ag = float(out["grads"][key].reshape(-1)[i])
            err = abs(fd - ag)
            worst_abs = max(worst_abs, err)
            worst_rel = max(worst_rel, err / max(abs(ag), 1e-6))
            count += 1
    return worst_abs, worst_rel, count


def nontrivial_plan(case, G):
    """(query rows that cannot see some earlier token, chunk plans with moves, of which chained)."""
    hidden = moves = chained = 0
    for l in range(len(case["plans"])):
        vis = torch.isfinite(visibility_bias(case, l, G))
        causal = torch.tril(torch.ones(case["T"], case["T"], dtype=torch.bool))
        hidden += int((causal & ~vis).any(dim=-1).sum())
        moves += sum(1 for p in case["plans"][l] if p["moves"] > 0)
        for p in case["plans"][l]:
            m = p["moves"]
            chained += any(set(p["move_from"][r * m:(r + 1) * m]) & set(p["move_to"][r * m:(r + 1) * m])
                           for r in range(p["rows"])) if m else 0
    return hidden, moves, chained


def self_test():
    torch.set_num_threads(2)
    gen = torch.Generator().manual_seed(1234)
    failures = []

    def check(name, value, tol):
        ok = value <= tol
        print(f"  {'ok  ' if ok else 'FAIL'} {name}: {value:.3e} (tol {tol:.0e})")
        if not ok:
            failures.append(name)

    with tempfile.TemporaryDirectory() as tmp:
        # 1 + 3: dense replay vs model_reference.forward; chunked vs unchunked
        print("[1] dense replay (chunks 32,16,16,16,16) vs model_reference.forward, f64, T=96 (YaRN s=1.5)")
        print("[3] chunked dense replay vs one-chunk replay: layer outputs and all gradients")
        for mdl in ["llama_gqa", "qwen2_bias_mqa", "qwen3_qknorm"]:
            mdir = "tests/fixtures/models/" + mdl
            chunks = [32, 16, 16, 16, 16]
            base = make_case(mdir, "f64", 2, 96, chunks, None, None, "next_token_prediction", gen, skip=[5, 30])
            with open(os.path.join(REPO_ROOT, mdir, "config.json")) as f:
                n_layer = json.load(f)["num_hidden_layers"]
            base["plans"], base["cache_length"] = [dense_plans(chunks)] * n_layer, [96] * n_layer
            case, model, ids = load_case(write_case(tmp, mdl + "_dense", base))
            got = evaluate(case, model, ids)
            # model_reference path: its own embedding/attention/head math on the same leaves
            for t in trainables(model).values():
                t.grad = None
            logits = mr.forward(model.cfg, model.params, ids, case["rope_context_width"], "yarn")
            ref_loss = loss_from_logits(case, logits).mean()
            ref_loss.backward()
            ref = {"grad." + k: v.grad for k, v in model.params.items()}
            check(f"{mdl} |loss - ref| (loss {float(got['loss']):.6f})", abs(float(got["loss"]) - float(ref_loss)), 1e-12)
            worst, where = compare_dicts(got["grads"], ref)
            check(f"{mdl} param grads max rel err ({where})", worst, 1e-12)
            # 3: one chunk
            one = dict(base, chunks=[96], plans=[dense_plans([96])] * n_layer)
            case1, model1, ids1 = load_case(write_case(tmp, mdl + "_one", one))
            got1 = evaluate(case1, model1, ids1)
            lo = max(rel_err(a, b) for a, b in zip(got["layer_outputs"], got1["layer_outputs"]))
            check(f"{mdl} chunked vs unchunked layer outputs rel err", lo, 1e-12)
            worst, where = compare_dicts(got["grads"], got1["grads"])
            check(f"{mdl} chunked vs unchunked grads (incl. input_embeddings) rel err ({where})", worst, 1e-12)

        # 2: evictions and moves: visibility-mask equivalence and finite differences
        print("[2] evicting/moving plans: replay vs independent visibility-mask forward, and finite differences (f64)")
        cases = []
        ch = [16] + [8] * 8  # T = 80 > 64: YaRN s = 1.25
        c = make_case("tests/fixtures/models/llama_gqa", "f64", 2, 80, ch,
                      [lastrec_plans(ch, 24, 2), lastrec_plans(ch, 16, 2)], [24, 16],
                      "next_token_prediction", gen, skip=[3, 20])
        cases.append(("llama_gqa lastrec ring L=24/16 grace 2 rows=1", write_case(tmp, "ring", c)))
        ch = [16] + [8] * 6
        lora = {"r": 2, "alpha": 4.0, "targets": ["q", "k", "v", "proj", "mlp", "head"], "tensors": "lora_b.safetensors"}
        write_lora_init(os.path.join(tmp, "lora_b.safetensors"), "tests/fixtures/models/qwen3_qknorm", 2, lora["targets"], gen)
        write_class_head(os.path.join(tmp, "head_b.safetensors"), 3, 32, gen)
        c = make_case("tests/fixtures/models/qwen3_qknorm", "f64", 2, 64, ch,
                      [random_evict_plans(ch, 16, 4, 2, gen), random_evict_plans(ch, 24, 4, 3, gen, chain=True)], [16, 24],
                      "seq_classification", gen, labels=[2, 0], class_head="head_b.safetensors", lora=lora)
        cases.append(("qwen3 per-row evictions+moves (layer 1 chained) rows=B*G LoRA(all) seq_classification", write_case(tmp, "rows", c)))
        c = make_case("tests/fixtures/models/qwen2_bias_mqa", "f64", 2, 64, ch,
                      [random_evict_plans(ch, 16, 1, 3, gen, chain=True), lastrec_plans(ch, 24, 4)], [16, 24],
                      "seq_classification_on_logits", gen, labels=[1, 3], class_tokens=[5, 17, 42, 60])
        cases.append(("qwen2 tied MQA rows=1 evictions+chained moves seq_classification_on_logits", write_case(tmp, "mqa", c)))
        for title, path in cases:
            case, model, ids = load_case(path)
            hidden, moves, chained = nontrivial_plan(case, model.G)
            print(f"  -- {title}: {hidden} query rows lose some earlier token, "
                  f"{moves} chunk plans with moves ({chained} chained)")
            got = evaluate(case, model, ids)
            ref = masked_dense_evaluate(case, model, ids)
            check("|loss - visibility-mask loss|", abs(float(got["loss"]) - float(ref["loss"])), 1e-12)
            lo = max(rel_err(a, b) for a, b in zip(got["layer_outputs"], ref["layer_outputs"]))
            check("layer outputs rel err", lo, 1e-12)
            worst, where = compare_dicts(got["grads"], ref["grads"])
            check(f"all grads rel err ({where})", worst, 1e-11)
            fa, fr, n = finite_difference(case, model, ids, got, gen)
            check(f"finite differences, {n} entries, max abs err", fa, 1e-8)
            check(f"finite differences, {n} entries, max rel err (|g| floor 1e-6)", fr, 1e-5)

        # 4: f32 path agrees with f64
        print("[4] f32 vs f64 on the rows=B*G case")
        with open(cases[1][1]) as f:
            c32 = json.load(f)
        c32["dtype"] = "f32"
        case32, model32, ids32 = load_case(write_case(tmp, "rows32", c32))
        got32 = evaluate(case32, model32, ids32)
        case, model, ids = load_case(cases[1][1])
        got = evaluate(case, model, ids)
        check("f32 vs f64 loss rel err", abs(float(got32["loss"]) / float(got["loss"]) - 1), 1e-5)
        worst, where = compare_dicts(got32["grads"], got["grads"])
        check(f"f32 vs f64 grads rel err ({where})", worst, 1e-4)

    print("self-test:", "FAILED " + ", ".join(failures) if failures else "all passed")
    return 1 if failures else 0


# =================================================================================================
# [SECTION] EXAMPLES
# =================================================================================================
def write_examples(folder):
    """Two small end-to-end examples of the file format (case JSON + side files + output)."""
    torch.set_num_threads(2)
    os.makedirs(folder, exist_ok=True)
    gen = torch.Generator().manual_seed(2024)
    ch = [32, 16, 16, 16, 16]
    # dense, f32, llama GQA with YaRN (T = 96 > 64), per-row target counts differ
    c = make_case("tests/fixtures/models/llama_gqa", "f32", 2, 96, ch, [dense_plans(ch)] * 2, [96, 96],
                  "next_token_prediction", gen, skip=[10, 40])
    paths = [write_case(folder, "dense_llama_gqa", c)]
    # evictions + grace moves, per-row plans (rows = B*G), per-layer L, LoRA on q, v, proj, mlp
    lora = {"r": 2, "alpha": 4.0, "targets": ["q", "v", "proj", "mlp"],
            "tensors": "evict_qwen3_lora.lora_init.safetensors"}
    write_lora_init(os.path.join(folder, lora["tensors"]), "tests/fixtures/models/qwen3_qknorm", 2, lora["targets"], gen)
    c = make_case("tests/fixtures/models/qwen3_qknorm", "f64", 2, 96, ch,
                  [random_evict_plans(ch, 32, 4, 2, gen), random_evict_plans(ch, 48, 4, 3, gen, chain=True)], [32, 48],
                  "next_token_prediction", gen, skip=[0, 25], lora=lora)
    paths.append(write_case(folder, "evict_qwen3_lora", c))
    for p in paths:
        out = p.replace(".case.json", ".out.safetensors")
        case, tensors = run_case(p, out)
        print(f"{os.path.relpath(out, REPO_ROOT)}: loss {float(tensors['loss'][0]):.10f}, {len(tensors)} tensors")


# =================================================================================================
# [SECTION] MAIN
# =================================================================================================
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", help="kvlab-grad-case JSON")
    ap.add_argument("--out", help="output safetensors (with --case)")
    ap.add_argument("--self-test", action="store_true", help="run the built-in checks")
    ap.add_argument("--write-examples", metavar="DIR", help="(re)write the example cases and outputs into DIR")
    args = ap.parse_args()
    torch.set_num_threads(2)
    if args.self_test:
        return self_test()
    if args.write_examples:
        write_examples(args.write_examples)
        return 0
    if not (args.case and args.out):
        ap.error("need --case and --out (or --self-test / --write-examples)")
    case, tensors = run_case(args.case, args.out)
    print(f"{args.out}: loss {float(tensors['loss'][0]):.12g}, {len(tensors)} tensors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
