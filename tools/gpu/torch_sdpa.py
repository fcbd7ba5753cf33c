#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention on the SDPA shapes kvlab_gpu_bench measured (its JSON,
"sdpa_shapes"), with the same masking (query i of n sees keys 0 .. T-n+i) and grouped KV heads.
Writes [{..., "torch_ms", "torch_backend", "target"}] for gpu_checks.py bench.
  torch_sdpa.py BENCH.json OUT.json
Exit 77 (SKIPPED) when PyTorch or its CUDA device is missing."""
import json
import sys
import time

TARGET = 0.5  # our SDPA at least half PyTorch's speed (chosen, docs/GPU.md)


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        print(f"SKIPPED: PyTorch is not importable: {e}")
        return 77
    if not torch.cuda.is_available():
        print("SKIPPED: torch.cuda.is_available() is False")
        return 77
    with open(sys.argv[1]) as f:
        shapes = json.load(f)["sdpa_shapes"]
    out = []
    for s in shapes:
        dt = torch.bfloat16 if s["dtype"] == "bf16" else torch.float32
        g = torch.Generator(device="cuda").manual_seed(0)
        nh, kvh, n, T, hs = s["heads"], s["kv_heads"], s["queries"], s["keys"], s["head_dim"]
        q = torch.rand(1, nh, n, hs, device="cuda", generator=g).sub_(0.5).to(dt)
        k = torch.rand(1, kvh, T, hs, device="cuda", generator=g).sub_(0.5).to(dt)
        v = torch.rand(1, kvh, T, hs, device="cuda", generator=g).sub_(0.5).to(dt)
        qpos = torch.arange(T - n, T, device="cuda")[:, None]
        mask = torch.arange(T, device="cuda")[None, :] <= qpos  # (n, T) True = visible
        try:
            fn = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)  # noqa: E731
            fn()
            backend = "enable_gqa"
        except TypeError:  # older PyTorch: repeat the KV heads
            kr, vr = k.repeat_interleave(nh // kvh, 1), v.repeat_interleave(nh // kvh, 1)
            fn = lambda: F.scaled_dot_product_attention(q, kr, vr, attn_mask=mask)  # noqa: E731
            backend = "repeated kv heads"
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        best = float("inf")
        # Timed as kvlab_gpu_bench times ours: wall clock of one call plus a synchronize, best of many.
        for _ in range(50):
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            best = min(best, 1e3 * (time.perf_counter() - t0))
        out.append(dict(s, torch_ms=best, torch_backend=f"torch {torch.__version__}, {backend}, bool mask", target=TARGET))
        print(f"sdpa {s['dtype']} {n}x{T}: torch {best:.4f} ms, ours {s['ours_ms']:.4f} ms")
    with open(sys.argv[2], "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
