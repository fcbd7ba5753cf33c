#!/usr/bin/python3
"""Independent float64 reference for Gemma 3n's text decoder (Gemma3nForCausalLM, model_type
gemma3n_text), written from the definitions in transformers 4.57's modeling_gemma3n.py (read for
the facts, not copied):

- Embeddings times sqrt(E); per-layer inputs: embed_tokens_per_layer(ids) * sqrt(P) (P =
  hidden_size_per_layer_input) plus RMSNorm_P(per_layer_model_projection(x) * E^-1/2), the sum
  times 2^-1/2, one (P) slice per layer.
- AltUp over altup_num_inputs streams: stream 0 is the embedding, stream i the embedding through
  altup_projections[i-1] rescaled to the embedding's RMS (RMS floored at sqrt(1e-5)). A layer
  predicts every stream (pred_i = x_i + sum_k r_ik x_k, r = prediction_coefs(tanh(router(
  RMSNorm(x_active) / E)))), runs the block on pred_active, then corrects each stream by
  (1 + correction_coefs(tanh(router(RMSNorm(out) / E))))_i (out - pred_active); streams 1..
  get the per-layer input's contribution RMSNorm(W_proj(gelu(W_gate(corrected_active *
  correct_output_scale)) * per_layer_input)).
- The block: h = RMSNorm(pred_active); LAUREL: h + RMSNorm(W_right W_left h); attention with
  per-head q/k RMSNorm, v RMSNorm without weight, RoPE (rope_local_base_freq on sliding layers),
  scores scaled by 1.0, sliding windows from layer_types; (pred_active + RMSNorm(o) + laurel) /
  sqrt(2); GELU-tanh gated MLP with the gate passed through gaussian top-k (relu(g - mean - std *
  Phi^-1(sparsity)), Phi^-1 rounded to float32 as transformers computes it) where
  activation_sparsity_pattern[l] > 0; post-feedforward norm; residual.
- Cross-layer KV sharing: the last num_kv_shared_layers layers reuse the keys and values of the
  last earlier non-shared layer of the same type (sliding / full).
- Final: streams 1.. through altup_unembed_projections rescaled to stream 0's RMS, the mean of
  the streams, RMSNorm, tied lm_head, logits soft-capped (final_logit_softcapping).
RMSNorms multiply by w (not 1 + w).

Regenerate (Debian's python3-torch, never needed by the build or CI):
    /usr/bin/python3 tools/reference/gemma3n_reference.py --out tests/fixtures/models
"""

import argparse
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_reference import FIXTURE_MAGIC, FIXTURE_VERSION, attention_mask, gelu_tanh, write_safetensors  # noqa: E402


def rms(x, w, eps):
    return x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + eps) * w


def rope(x, pos, theta):
    # rotate-half over the whole head: pairs (i, i + D/2) turn by p * theta^(-2i/D)
    D = x.shape[-1]
    inv = torch.tensor([theta ** (-2.0 * d / D) for d in range(D // 2)], dtype=torch.float64)
    ang = pos[:, None].double() * inv[None, :]
    c, s = torch.cos(ang), torch.sin(ang)
    x1, x2 = x[..., :D // 2], x[..., D // 2:]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def layer_types(cfg):
    return cfg.get("layer_types") or ["full_attention" if (i + 1) % 5 == 0 else "sliding_attention"
                                      for i in range(cfg["num_hidden_layers"])]


def kv_sources(cfg):
    """{shared layer: source}: layers >= first = L - num_kv_shared_layers (when first > 0) read the
    last layer before `first` of their own type."""
    L, types = cfg["num_hidden_layers"], layer_types(cfg)
    first = L - cfg.get("num_kv_shared_layers", 0)
    if first <= 0 or first >= L:
        return {}
    return {l: max(j for j in range(first) if types[j] == types[l]) for l in range(first, L)}


def magnitude_matched(y, target):
    return y * target / torch.sqrt(torch.clamp((y * y).mean(dim=-1, keepdim=True), min=1e-5))


def gaussian_topk(g, sparsity):
    mult = math.sqrt(2.0) * torch.erfinv(torch.tensor(2.0 * sparsity - 1.0, dtype=torch.float64)).item()
    mult = float(torch.tensor(mult, dtype=torch.float32))  # transformers evaluates Phi^-1 in float32
    mean = g.mean(dim=-1, keepdim=True)
    std = ((g - mean) ** 2).mean(dim=-1, keepdim=True).sqrt()
    return torch.relu(g - (mean + std * mult))


def forward(cfg, W, ids, at=None):
    """Logits in float64. `at(name, tensor)`, when given, sees (and may replace) the named
    intermediates (gemma3n_sensitivity.py perturbs them one at a time)."""
    at = at or (lambda name, t: t)
    B, T = ids.shape
    E, NH, G, HS = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    L, P, A, act = cfg["num_hidden_layers"], cfg["hidden_size_per_layer_input"], cfg["altup_num_inputs"], cfg["altup_active_idx"]
    eps = cfg["rms_norm_eps"]
    types = layer_types(cfg)
    sources = kv_sources(cfg)
    sparsity = cfg["activation_sparsity_pattern"]
    pos = torch.arange(T)
    x0 = at("x0", W["model.embed_tokens.weight"][ids] * math.sqrt(E))
    pl = W["model.embed_tokens_per_layer.weight"][ids].reshape(B, T, L, P) * math.sqrt(P)
    proj = (x0 @ W["model.per_layer_model_projection.weight"].T * E ** -0.5).reshape(B, T, L, P)
    pli = at("pli", (rms(proj, W["model.per_layer_projection_norm.weight"], eps) + pl) * 2 ** -0.5)
    target = (x0 * x0).mean(dim=-1, keepdim=True).sqrt()
    xs = [x0] + [magnitude_matched(x0 @ W[f"model.altup_projections.{i - 1}.weight"].T, target) for i in range(1, A)]
    kv_of = {}
    for l in range(L):
        p = f"model.layers.{l}."

        def router(z):
            return torch.tanh((rms(z, W[p + "altup.router_norm.weight"], eps) / E) @ W[p + "altup.modality_router.weight"].T)

        r = at("r", router(xs[act]) @ W[p + "altup.prediction_coefs.weight"].T).reshape(B, T, A, A)  # r[..., i, k]
        pred = [at("pred", xs[i] + sum(r[..., i, k:k + 1] * xs[k] for k in range(A))) for i in range(A)]
        a = pred[act]
        h = at("h", rms(a, W[p + "input_layernorm.weight"], eps))
        laurel = h + rms(h @ W[p + "laurel.linear_left.weight"].T @ W[p + "laurel.linear_right.weight"].T,
                         W[p + "laurel.post_laurel_norm.weight"], eps)
        sliding = types[l] == "sliding_attention"
        theta = cfg["rope_local_base_freq"] if sliding else cfg["rope_theta"]
        q = rms((h @ W[p + "self_attn.q_proj.weight"].T).view(B, T, NH, HS), W[p + "self_attn.q_norm.weight"], eps)
        q = at("q", rope(q.transpose(1, 2), pos, theta))
        if l in sources:
            k, v = kv_of[sources[l]]
        else:
            k = rms((h @ W[p + "self_attn.k_proj.weight"].T).view(B, T, G, HS), W[p + "self_attn.k_norm.weight"], eps)
            k = at("k", rope(k.transpose(1, 2), pos, theta))
            v = at("v", rms((h @ W[p + "self_attn.v_proj.weight"].T).view(B, T, G, HS), 1.0, eps).transpose(1, 2))
            kv_of[l] = (k, v)
        kk, vv = k.repeat_interleave(NH // G, dim=1), v.repeat_interleave(NH // G, dim=1)
        s = at("scores", q @ kk.transpose(-1, -2))  # scaling 1.0
        s = s.masked_fill(~attention_mask(T, cfg["sliding_window"] if sliding else 0), float("-inf"))
        o = at("o", (torch.softmax(s, dim=-1) @ vv).transpose(1, 2).reshape(B, T, NH * HS) @ W[p + "self_attn.o_proj.weight"].T)
        y = at("y", (a + rms(o, W[p + "post_attention_layernorm.weight"], eps) + laurel) * 2 ** -0.5)
        m = rms(y, W[p + "pre_feedforward_layernorm.weight"], eps)
        g = at("gate", m @ W[p + "mlp.gate_proj.weight"].T)
        if sparsity[l] > 0:
            g = gaussian_topk(g, sparsity[l])
        d = at("mlp", (gelu_tanh(g) * (m @ W[p + "mlp.up_proj.weight"].T)) @ W[p + "mlp.down_proj.weight"].T)
        out = y + rms(d, W[p + "post_feedforward_layernorm.weight"], eps)
        c = at("c", router(out) @ W[p + "altup.correction_coefs.weight"].T + 1.0)  # (B, T, A)
        innov = out - a
        xs = [at("corrected", pred[i] + c[..., i:i + 1] * innov) for i in range(A)]
        first = xs[act]
        if cfg.get("altup_correct_scale", True):
            first = first * W[p + "altup.correct_output_scale"]
        gate = gelu_tanh(first @ W[p + "per_layer_input_gate.weight"].T) * pli[:, :, l, :]
        add = at("per_layer", rms(gate @ W[p + "per_layer_projection.weight"].T, W[p + "post_per_layer_input_norm.weight"], eps))
        xs = [xs[0]] + [xi + add for xi in xs[1:]]
    target = (xs[0] * xs[0]).mean(dim=-1, keepdim=True).sqrt()
    outs = [xs[0]] + [magnitude_matched(xs[i] @ W[f"model.altup_unembed_projections.{i - 1}.weight"].T, target) for i in range(1, A)]
    hfin = rms(torch.stack(outs).mean(dim=0), W["model.norm.weight"], eps)
    z = at("z", hfin @ W["model.embed_tokens.weight"].T)
    cap = cfg.get("final_logit_softcapping")
    return cap * torch.tanh(z / cap) if cap else z


def make_weights(cfg, seed):
    gen = torch.Generator().manual_seed(seed)
    E, V, L, P, A = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"], cfg["hidden_size_per_layer_input"], cfg["altup_num_inputs"]
    NH, G, HS, R = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], cfg["laurel_rank"]
    W = {}

    def lin(name, o, i, scale=1.0):
        W[name] = torch.randn(o, i, generator=gen, dtype=torch.float64) * scale / math.sqrt(i)

    def norm(name, n):
        W[name] = 1.0 + 0.2 * torch.randn(n, generator=gen, dtype=torch.float64)

    W["model.embed_tokens.weight"] = torch.randn(V, E, generator=gen, dtype=torch.float64) * 0.05
    W["model.embed_tokens_per_layer.weight"] = torch.randn(cfg["vocab_size_per_layer_input"], L * P, generator=gen, dtype=torch.float64) * 0.2
    lin("model.per_layer_model_projection.weight", L * P, E)
    norm("model.per_layer_projection_norm.weight", P)
    for i in range(A - 1):
        lin(f"model.altup_projections.{i}.weight", E, E)
        lin(f"model.altup_unembed_projections.{i}.weight", E, E)
    for l in range(L):
        p = f"model.layers.{l}."
        I = cfg["intermediate_size"][l] if isinstance(cfg["intermediate_size"], list) else cfg["intermediate_size"]
        lin(p + "self_attn.q_proj.weight", NH * HS, E)
        lin(p + "self_attn.k_proj.weight", G * HS, E)
        lin(p + "self_attn.v_proj.weight", G * HS, E)
        lin(p + "self_attn.o_proj.weight", E, NH * HS)
        norm(p + "self_attn.q_norm.weight", HS)
        norm(p + "self_attn.k_norm.weight", HS)
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm",
                  "post_per_layer_input_norm", "laurel.post_laurel_norm", "altup.router_norm"):
            norm(p + n + ".weight", E)
        lin(p + "mlp.gate_proj.weight", I, E)
        lin(p + "mlp.up_proj.weight", I, E)
        lin(p + "mlp.down_proj.weight", E, I)
        lin(p + "laurel.linear_left.weight", R, E)
        lin(p + "laurel.linear_right.weight", E, R)
        lin(p + "altup.modality_router.weight", A, E, 4.0)
        lin(p + "altup.prediction_coefs.weight", A * A, A, 0.5)
        lin(p + "altup.correction_coefs.weight", A, A, 0.5)
        W[p + "altup.correct_output_scale"] = 1.0 + 0.3 * torch.randn(E, generator=gen, dtype=torch.float64)
        lin(p + "per_layer_input_gate.weight", P, E)
        lin(p + "per_layer_projection.weight", E, P)
    norm("model.norm.weight", E)
    stored = {k: v.float() for k, v in W.items()}
    return stored, {k: v.double() for k, v in stored.items()}


def gemma3n_cfg(**kw):
    cfg = {"model_type": "gemma3n_text", "architectures": ["Gemma3nForCausalLM"], "vocab_size": 97,
           "vocab_size_per_layer_input": 97, "hidden_size": 32, "hidden_size_per_layer_input": 8,
           "intermediate_size": [48] * 6, "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 16, "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
           "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "rope_scaling": None, "sliding_window": 5,
           "layer_types": ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
                           "sliding_attention", "full_attention"],
           "final_logit_softcapping": 2.0, "altup_active_idx": 0, "altup_coef_clip": 120.0, "altup_correct_scale": True,
           "altup_num_inputs": 3, "num_kv_shared_layers": 3, "laurel_rank": 4,
           "activation_sparsity_pattern": [0.95, 0.95, 0.0, 0.0, 0.0, 0.0], "attention_bias": False,
           "tie_word_embeddings": True, "torch_dtype": "float32", "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 1}
    cfg.update(kw)
    return cfg


# The fixture's weight draw. Gemma 3n's random tiny decoder amplifies rounding by a factor that
# varies from draw to draw: a forward that rounds every site to f32 exactly once (every sum exact,
# the floor of any f32 forward) is 1.0e-6 to 1.8e-5 of max |logit| away over seeds 3000-3007
# (gemma3n_sensitivity.py prints them). The fixture uses the first seed from 3000 whose floor is
# below 2.5e-6 on both inputs (3001: 2.44e-6, 6.6e-7), which leaves the tests' f32 bound
# (tests/engine/fixture_bounds.h, 3e-5) a margin over kvlab's kernels (1.2e-5 at worst, AVX-512). Seed 3000 (8.3e-6,
# so transformers' own f32 code is 2.05e-5 off) stays in the sensitivity script's table.
WEIGHT_SEED = 3001

FIXTURES = [
    # 6 layers (sliding window 5 in 0, 1, 3, 4; full in 2, 5), the last 3 sharing K/V (3, 4 -> 1;
    # 5 -> 2), 3 AltUp streams, LAUREL rank 4, per-layer inputs of 8, gaussian top-k at 0.95 in
    # layers 0 and 1, logits capped at 2.0.
    ("gemma3n_text", gemma3n_cfg(), [(2, 13), (1, 37)]),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(2)
    for i, (name, cfg, shapes) in enumerate(FIXTURES):
        d = os.path.join(args.out, name)
        os.makedirs(d, exist_ok=True)
        stored, W = make_weights(cfg, WEIGHT_SEED + i)
        write_safetensors(os.path.join(d, "model.safetensors"), stored, {"format": "pt"})
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
            f.write("\n")
        gen = torch.Generator().manual_seed(3077 + i)
        expected = {}
        for j, (B, T) in enumerate(shapes):
            ids = torch.randint(0, cfg["vocab_size"], (B, T), generator=gen)
            expected[f"input_ids.{j}"] = ids.to(torch.int64)
            expected[f"logits.{j}"] = forward(cfg, W, ids)
        meta = {"magic": FIXTURE_MAGIC, "version": str(FIXTURE_VERSION), "rope_mode": "yarn", "context_width": "64",
                "inputs": str(len(shapes)), "generator": "tools/reference/gemma3n_reference.py", "torch": torch.__version__}
        write_safetensors(os.path.join(d, "expected.safetensors"), expected, meta)
        print(name, {k: tuple(v.shape) for k, v in expected.items()})


if __name__ == "__main__":
    main()
