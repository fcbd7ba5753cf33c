#!/usr/bin/python3
"""How much one f32 rounding at each site of Gemma 3n's forward moves the fixture's logits.

Each run of the float64 reference (gemma3n_reference.py) multiplies one named intermediate, in
every layer, by (1 + u) with u uniform in [-2^-24, 2^-24] per element (an f32 rounding), and
prints max |logits - reference| / max |reference| for each fixture input. It explains the bound
of the f32 fixture test (tests/engine/fixture_bounds.h, f32_fixture_tol): a site whose single
rounding moves the logits by several 1e-6 leaves no room for the ~30 such sites of an f32
forward under 1e-5.

It then prints the floor of a forward with f32 activations: every site rounded to f32 exactly once (a forward
whose every sum were exact), for the fixture's weights (gemma3n_reference.WEIGHT_SEED) and the draws from seed 3000 to 3007 of the
same config on the fixture's inputs, and what rounding only the cached keys and values costs.
    /usr/bin/python3 tools/reference/gemma3n_sensitivity.py
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gemma3n_reference as ref  # noqa: E402

SITES = ["x0", "pli", "r", "pred", "h", "q", "k", "v", "scores", "o", "y", "gate", "mlp", "c", "corrected", "per_layer", "z"]


def main():
    torch.set_num_threads(2)
    for i, (name, cfg, shapes) in enumerate(ref.FIXTURES):
        _, W = ref.make_weights(cfg, ref.WEIGHT_SEED + i)
        gen = torch.Generator().manual_seed(3077 + i)  # the fixture's inputs (gemma3n_reference.main)
        inputs = [torch.randint(0, cfg["vocab_size"], (B, T), generator=gen) for B, T in shapes]
        base = [ref.forward(cfg, W, ids) for ids in inputs]
        print(f"{name}: max |logits error| / max |logits| after one f32 rounding at each site (per input)")
        for site in SITES:
            noise = torch.Generator().manual_seed(1)

            def at(n, t, site=site, noise=noise):
                if n != site:
                    return t
                return t * (1 + 2.0 ** -24 * (2 * torch.rand(t.shape, generator=noise, dtype=torch.float64) - 1))

            errs = [float((ref.forward(cfg, W, ids, at) - b).abs().max() / b.abs().max()) for ids, b in zip(inputs, base)]
            print(f"  {site:10s} " + "  ".join(f"{e:.2e}" for e in errs))
        print(f"{name}: every site rounded to f32 once, max |logits error| / max |logits| (per input)")
        for seed in range(3000 + i, 3008 + i):
            _, Ws = ref.make_weights(cfg, seed)
            errs = []
            for ids in inputs:
                exact = ref.forward(cfg, Ws, ids)
                rounded = ref.forward(cfg, Ws, ids, lambda n, t: t.float().double() if n in SITES else t)
                errs.append(float((rounded - exact).abs().max() / exact.abs().max()))
            print(f"  weights seed {seed}{' (the fixture)' if seed == ref.WEIGHT_SEED + i else ''}: " + "  ".join(f"{e:.2e}" for e in errs))
        # what an f32 cache alone costs: only the keys and values rounded, the rest exact
        kv_only = [float((ref.forward(cfg, W, ids, lambda n, t: t.float().double() if n in ("k", "v") else t) - b).abs().max() / b.abs().max())
                   for ids, b in zip(inputs, base)]
        print(f"{name}: only the cached keys and values rounded to f32: " + "  ".join(f"{e:.2e}" for e in kv_only))


if __name__ == "__main__":
    main()
