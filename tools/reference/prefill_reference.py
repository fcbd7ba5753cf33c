#!/usr/bin/python3
"""Long-prefill timing reference: kvlab against PyTorch's CPU forward on the `tiny` model's shapes.

The `tiny` preset's weights come from a C++ generator PyTorch cannot reproduce, so this script
draws weights the same way (uniform, std 0.02; norms around 1), writes them as a Hugging Face
folder with tiny's config (model_reference.py's writer) and both sides read those weights: kvlab
as `kvlab eval_long FOLDER` (no tokenizer.json: the byte tokenizer, as `tiny`), PyTorch here. The
model code is model_reference.py's (RoPE/YaRN, RMSNorm, weight names), run in float32.

PyTorch's attention: torch.nn.functional.scaled_dot_product_attention where this torch has it
(2.0+). Debian bookworm's python3-torch is 1.13 and has none, so two written-out forms are timed
instead: `written`, model_reference.py's softmax over all T x T scores, and `blocked`, the same
per block of --block queries against only the keys they can see (the best plain PyTorch gets
here). That torch calls the system BLAS; Debian's default, the reference BLAS, is ~6x slower
than OpenBLAS, so PyTorch's processes load OpenBLAS (--blas-dir, package libopenblas0-pthread)
through LD_LIBRARY_PATH without touching the system's choice.

Measured per round, interleaved, so drifting load hits both sides alike:
  PyTorch  a fresh process per measurement (OpenMP and BLAS threads = the thread count), one
           warm-up forward, then the median of --reps forwards; CPU time at 1 thread, wall at 2
  kvlab    `eval_long FOLDER --kv_cache.name dense-default` (cache length 0: the whole sequence in one
           chunk) over 1 and over 1 + --reps samples of --tokens tokens; the difference over
           --reps is the cost of one warm sample (startup and the cold first sample cancel):
           CPU time at --threads 1, wall time (the runs' own evaluation seconds) at --threads 2
--check first compares kvlab's per-token losses on a text window with model_reference.forward in
float64 on the same ids: the same weights and model on both sides.

Not part of the product, setup or CI. Needs Debian's python3-torch (and libopenblas0-pthread):
    /usr/bin/python3 tools/reference/prefill_reference.py --kvlab build/bin/kvlab --check
"""

import argparse
import csv
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_reference as ref  # noqa: E402

BYTE_BOS, BYTE_EOS, BYTE_PAD, BYTE_VOCAB = 256, 257, 258, 264  # engine/model/presets.h


def tiny_config():
    # engine/model/presets.cpp "tiny": width 64, MLP 128, 2 layers, 4 heads / 2 KV heads of 16
    return ref.llama_cfg(vocab_size=BYTE_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
                         rope_theta=10000.0, rms_norm_eps=1e-6, bos_token_id=BYTE_BOS, eos_token_id=BYTE_EOS,
                         pad_token_id=BYTE_PAD)


def tiny_weights(cfg, seed):
    """float32 weights drawn like kvlab's random_weights: uniform with std 0.02, norms 1 +- 0.1."""
    gen = torch.Generator().manual_seed(seed)
    E, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    Q = cfg["num_attention_heads"] * cfg["head_dim"]
    K = cfg["num_key_value_heads"] * cfg["head_dim"]
    a = 0.02 * math.sqrt(3.0)
    W = {}

    def lin(name, *shape):
        W[name] = (torch.rand(*shape, generator=gen, dtype=torch.float64) * 2 - 1).mul(a).float()

    def norm(name, n):
        W[name] = (1.0 + 0.1 * (torch.rand(n, generator=gen, dtype=torch.float64) * 2 - 1)).float()

    lin("model.embed_tokens.weight", V, E)
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        norm(p + "input_layernorm.weight", E)
        lin(p + "self_attn.q_proj.weight", Q, E)
        lin(p + "self_attn.k_proj.weight", K, E)
        lin(p + "self_attn.v_proj.weight", K, E)
        lin(p + "self_attn.o_proj.weight", E, Q)
        norm(p + "post_attention_layernorm.weight", E)
        lin(p + "mlp.gate_proj.weight", I, E)
        lin(p + "mlp.up_proj.weight", I, E)
        lin(p + "mlp.down_proj.weight", E, I)
    norm("model.norm.weight", E)
    lin("lm_head.weight", V, E)
    return W


def write_folder(folder, cfg, W):
    os.makedirs(folder, exist_ok=True)
    ref.write_safetensors(os.path.join(folder, "model.safetensors"), W, {"format": "pt"})
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({k: v for k, v in cfg.items() if not k.startswith("_")}, f, indent=2)


HAVE_SDPA = hasattr(torch.nn.functional, "scaled_dot_product_attention")
ATTENTION = {"sdpa": "torch.nn.functional.scaled_dot_product_attention (is_causal)",
             "written": "written out as model_reference.py has it: softmax(masked QK^T) V over all T x T scores",
             "blocked": "written out per block of BLOCK queries against only the keys they can see (causal block "
                        "skipping by slicing; T x BLOCK scores live at a time)"}


def attend(kind, q, k, v, scale, block):
    """Causal attention (B, H, T, HS) with every query seeing keys 0..itself."""
    T = q.shape[2]
    if kind == "sdpa":  # its default scale is 1/sqrt(HS); YaRN's may differ, so scale q instead
        return torch.nn.functional.scaled_dot_product_attention(q * (scale * math.sqrt(q.shape[-1])), k, v, is_causal=True)
    if kind == "written":
        s = (q @ k.transpose(-1, -2)) * scale
        s = s.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool)), float("-inf"))
        return torch.softmax(s, dim=-1) @ v
    out = torch.empty_like(q)
    upper = torch.triu(torch.ones(block, block, dtype=torch.bool), diagonal=1)
    for i0 in range(0, T, block):
        i1 = min(T, i0 + block)
        s = (q[:, :, i0:i1] @ k[:, :, :i1].transpose(-1, -2)) * scale
        s[..., i0:i1].masked_fill_(upper[: i1 - i0, : i1 - i0], float("-inf"))
        out[:, :, i0:i1] = torch.softmax(s, dim=-1) @ v[:, :, :i1]
    return out


def forward_f32(cfg, W, ids, context_width, attention="written", block=256):
    """model_reference.forward in float32 with the chosen attention; returns the next-token
    log-probabilities (B, T, V), as kvlab's eval computes a loss at every position."""
    B, T = ids.shape
    NH, G, HS = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps = cfg["rms_norm_eps"]
    inv_freq, scale = ref.rope_inv_freq(cfg, context_width, "yarn")
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]
    cos, sin = torch.cos(ang).float(), torch.sin(ang).float()
    half = HS // 2

    def rope(x):
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    x = W["model.embed_tokens.weight"][ids]
    R = NH // G
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = ref.rms_norm(x, W[p + "input_layernorm.weight"], eps)
        q = (h @ W[p + "self_attn.q_proj.weight"].T).view(B, T, NH, HS).transpose(1, 2)
        k = (h @ W[p + "self_attn.k_proj.weight"].T).view(B, T, G, HS).transpose(1, 2)
        v = (h @ W[p + "self_attn.v_proj.weight"].T).view(B, T, G, HS).transpose(1, 2)
        q, k = rope(q), rope(k)
        k = k.repeat_interleave(R, dim=1)
        v = v.repeat_interleave(R, dim=1)
        a = attend(attention, q, k, v, scale, block).transpose(1, 2).reshape(B, T, NH * HS)
        x = x + a @ W[p + "self_attn.o_proj.weight"].T
        h = ref.rms_norm(x, W[p + "post_attention_layernorm.weight"], eps)
        g = h @ W[p + "mlp.gate_proj.weight"].T
        u = h @ W[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(g) * u) @ W[p + "mlp.down_proj.weight"].T
    x = ref.rms_norm(x, W["model.norm.weight"], eps)
    return torch.log_softmax(x @ W["lm_head.weight"].T, dim=-1)


def blas_library():
    """The BLAS shared library this process has mapped (torch's matmuls go through it)."""
    for line in open("/proc/self/maps"):
        name = line.split()[-1]
        if "blas" in os.path.basename(name):
            return name
    return "none mapped"


def worker(args):
    """One PyTorch measurement in its own process (BLAS and OpenMP thread counts are fixed when
    the libraries load): median CPU and wall seconds of --reps forwards after one warm-up."""
    torch.set_num_threads(args.threads_one)
    cfg = tiny_config()
    W = tiny_weights(cfg, args.seed)
    ids = torch.randint(0, 256, (1, args.tokens), generator=torch.Generator().manual_seed(args.seed + 1))
    with torch.no_grad():
        forward_f32(cfg, W, ids, args.tokens, args.worker, args.block)
        cpu, wall = [], []
        for _ in range(args.reps):
            c0, w0 = time.process_time(), time.perf_counter()
            forward_f32(cfg, W, ids, args.tokens, args.worker, args.block)
            cpu.append(time.process_time() - c0)
            wall.append(time.perf_counter() - w0)
    print(json.dumps({"cpu": statistics.median(cpu), "wall": statistics.median(wall), "blas": blas_library()}))


def time_torch(args, attention, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    if args.blas_dir:
        env["LD_LIBRARY_PATH"] = args.blas_dir + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", attention, "--threads-one", str(threads), "--tokens",
           str(args.tokens), "--reps", str(args.reps), "--seed", str(args.seed), "--block", str(args.block)]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_kvlab(kvlab, folder, tokens, samples, threads, session=None, data=("passkey",)):
    """One eval_long process: (CPU seconds, wall seconds, summary JSON)."""
    cmd = [kvlab, "eval_long", folder, "--data", *data, "--data.seq_length", str(tokens), "--data.num_samples",
           str(samples), "--kv_cache.name", "dense-default", "--threads", str(threads), "--format", "json"]
    if session:
        cmd += ["--session", session]
    c0, w0 = children_cpu(), time.perf_counter()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    cpu, wall = children_cpu() - c0, time.perf_counter() - w0
    return cpu, wall, json.loads(out[out.index("{"):])


def time_kvlab(kvlab, folder, tokens, threads, reps, scratch):
    """Warm per-sample (CPU, wall) seconds of a dense single-chunk eval: 1 + reps samples minus 1."""
    ses = [os.path.join(scratch, f"t{threads}_{i}.kvlab") for i in range(2)]
    for s in ses:
        if os.path.exists(s):
            os.remove(s)
    c1, _, s1 = run_kvlab(kvlab, folder, tokens, 1, threads, ses[0])
    cn, _, sn = run_kvlab(kvlab, folder, tokens, 1 + reps, threads, ses[1])
    return (cn - c1) / reps, (sn["summary"]["seconds"] - s1["summary"]["seconds"]) / reps


def check_losses(kvlab, folder, cfg, W, tokens, text, scratch):
    """kvlab's per-token losses on a text window (every position scored) against
    model_reference.forward in float64 on the same ids."""
    session = os.path.join(scratch, "check.kvlab")
    if os.path.exists(session):
        os.remove(session)
    run_kvlab(kvlab, folder, tokens, 1, 2, session, ("text", "--data.files", text))
    out = os.path.join(scratch, "tokens.csv")
    subprocess.run([kvlab, "export", session, "--what", "tokens", "--format", "csv", "-o", out], check=True,
                   capture_output=True)
    rows = list(csv.DictReader(open(out)))
    ids = torch.tensor([[int(r["token_id"]) for r in rows]])
    W64 = {k: v.double() for k, v in W.items()}
    torch.set_num_threads(2)
    with torch.no_grad():
        logp = torch.log_softmax(ref.forward(cfg, W64, ids, ids.shape[1], "yarn"), dim=-1)[0]
    worst, n = 0.0, 0
    for t, r in enumerate(rows[:-1]):
        if r["loss"] == "":
            continue
        want = -float(logp[t, ids[0, t + 1]])  # position t's loss is that of predicting token t + 1
        worst = max(worst, abs(float(r["loss"]) - want) / max(1.0, abs(want)))
        n += 1
    if n == 0:
        sys.exit("check: kvlab's session recorded no per-token losses; expected one per scored position")
    print(f"check: {n} per-token losses of kvlab vs model_reference.forward (float64): worst relative error {worst:.2e}")
    if worst > 1e-4:
        sys.exit(f"check FAILED: worst relative error {worst:.2e} > 1e-4 (expected float32 rounding only)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (>= 1)")
    ap.add_argument("--reps", type=int, default=3, help="timed forwards / warm samples per measurement (>= 3)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--attention", default="sdpa" if HAVE_SDPA else "written,blocked",
                    help="PyTorch attention(s) to time, comma-separated: " + ", ".join(ATTENTION))
    ap.add_argument("--block", type=int, default=128, help="queries per block of the blocked attention")
    ap.add_argument("--blas-dir", default="/usr/lib/x86_64-linux-gnu/openblas-pthread",
                    help="folder whose libblas.so.3 PyTorch loads (LD_LIBRARY_PATH of its processes; Debian's "
                         "python3-torch calls the system BLAS, and the reference BLAS is ~6x slower than "
                         "OpenBLAS (libopenblas0-pthread)); '' = the system default")
    ap.add_argument("--kvlab", default="", help="kvlab binary; without it only PyTorch is timed")
    ap.add_argument("--folder", default=os.path.join(tempfile.gettempdir(), "kvlab_prefill_tiny"),
                    help="where the tiny model folder is written")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--check", action="store_true",
                    help="first compare kvlab's per-token losses on --check-text with float64 PyTorch")
    ap.add_argument("--check-text", default="/usr/share/common-licenses/GPL-3", help="text file of the check")
    ap.add_argument("--worker", default="", help=argparse.SUPPRESS)
    ap.add_argument("--threads-one", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.tokens < 2 or args.rounds < 1 or args.reps < 3 or args.block < 1:
        sys.exit(f"--tokens {args.tokens} --rounds {args.rounds} --reps {args.reps} --block {args.block}: "
                 "expected tokens >= 2, rounds >= 1, reps >= 3, block >= 1")
    attentions = [a for a in args.attention.split(",") if a]
    bad = [a for a in attentions + ([args.worker] if args.worker else []) if a not in ATTENTION]
    if bad or not attentions:
        sys.exit(f"--attention {args.attention}: expected a comma-separated list of {', '.join(ATTENTION)}")
    if "sdpa" in attentions + [args.worker] and not HAVE_SDPA:
        sys.exit(f"--attention sdpa: torch {torch.__version__} has no torch.nn.functional.scaled_dot_product_attention "
                 "(it came with torch 2.0); expected written or blocked")
    if args.worker:
        worker(args)
        return
    threads = [int(t) for t in args.threads.split(",")]
    if args.kvlab and not os.access(args.kvlab, os.X_OK):
        sys.exit(f"--kvlab {args.kvlab}: not an executable file; expected the kvlab binary (build/bin/kvlab)")
    if args.blas_dir and not os.path.exists(os.path.join(args.blas_dir, "libblas.so.3")):
        sys.exit(f"--blas-dir {args.blas_dir}: no libblas.so.3 there; install libopenblas0-pthread or pass --blas-dir ''")

    cfg = tiny_config()
    W = tiny_weights(cfg, args.seed)
    write_folder(args.folder, cfg, W)
    cpu_name = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
    print(f"torch {torch.__version__} ({'has' if HAVE_SDPA else 'no'} fused SDPA); CPU: {cpu_name}")
    for a in attentions:
        print(f"PyTorch attention '{a}': {ATTENTION[a].replace('BLOCK', str(args.block))}")
    print(f"model folder {args.folder}; {args.tokens} tokens, one sequence, one chunk; kvlab: {args.kvlab or '(not timed)'}")
    scratch_dir = tempfile.TemporaryDirectory(prefix="kvlab_prefill_")  # kvlab's sessions, removed at exit
    scratch = scratch_dir.name
    if args.kvlab and args.check:
        check_losses(args.kvlab, args.folder, cfg, W, args.tokens, args.check_text, scratch)

    res = {}  # (side, threads) -> per-round seconds (CPU at 1 thread, wall otherwise)
    blas = set()
    for rnd in range(args.rounds):
        for n in threads:
            load = os.getloadavg()[0]
            what = "CPU" if n == 1 else "wall"
            parts = []
            for a in attentions:
                r = time_torch(args, a, n)
                blas.add(r["blas"])
                t = r["cpu"] if n == 1 else r["wall"]
                res.setdefault((a, n), []).append(t)
                parts.append(f"PyTorch {a} {args.tokens / t:7.0f} tok/s")
            if args.kvlab:
                kc, kw = time_kvlab(args.kvlab, args.folder, args.tokens, n, args.reps, scratch)
                k = kc if n == 1 else kw
                res.setdefault(("kvlab", n), []).append(k)
                best = min(res[(a, n)][-1] for a in attentions)
                parts.append(f"kvlab {args.tokens / k:7.0f} tok/s, kvlab / best PyTorch {best / k:.2f}x")
            print(f"round {rnd + 1} threads {n} ({what} time): " + "; ".join(parts) + f"  [load {load:.1f}]", flush=True)
    print(f"PyTorch's BLAS: {', '.join(sorted(blas))}")
    print("\nsummary: tokens/s (median over rounds); ratios kvlab / PyTorch per round, min / median / max")
    for n in threads:
        line = f"threads {n} ({'CPU' if n == 1 else 'wall'} time):"
        for a in attentions:
            line += f" PyTorch {a} {args.tokens / statistics.median(res[(a, n)]):.0f}"
        if args.kvlab:
            line += f"; kvlab {args.tokens / statistics.median(res[('kvlab', n)]):.0f}"
            for a in attentions:
                r = sorted(x / y for x, y in zip(res[(a, n)], res[("kvlab", n)]))
                line += f"; kvlab/{a} {r[0]:.2f} / {statistics.median(r):.2f} / {r[-1]:.2f}"
        print(line)
    print(f"load average (1, 5, 15 min) at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
