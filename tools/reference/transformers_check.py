#!/usr/bin/env python3
"""Cross-check of model fixtures against transformers' own modelling code.

Loads a fixture folder written by model_reference.py (config.json + model.safetensors) with
transformers' AutoModelForCausalLM in float64 with attn_implementation="eager", runs the
fixture's inputs, asserts that the logits equal model_reference.py's within 1e-6 of max |logit|
(transformers computes RoPE's inverse frequencies in float32, ~4e-7 here; the rest is float64),
and writes them as transformers.safetensors beside the fixture (logits.J, with the versions in
the metadata) for the C++ tests to compare with.

Needs transformers (a venv over Debian's torch 1.13: python3 -m venv --system-site-packages
/work/venv-ref && /work/venv-ref/bin/pip install transformers==4.44.2):
    /work/venv-ref/bin/python tools/reference/transformers_check.py tests/fixtures/models/gemma2_softcap
    /work/venv-ref/bin/python tools/reference/transformers_check.py --tol 3e-6 tests/fixtures/models/phi3_longrope_full
(Phi-3's LongRoPE embedding computes the angles and cos/sin themselves in float32, so positions
up to 36 differ by ~1e-6 of max |logit| from the float64 reference: hence --tol.)
"""

import os
import sys

import torch
import transformers
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_reference import write_safetensors  # noqa: E402


def main():
    args = sys.argv[1:]
    tol = 1e-6
    if args[:1] == ["--tol"]:
        tol, args = float(args[1]), args[2:]
    for d in args:
        model = transformers.AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float64, attn_implementation="eager")
        model.eval()
        expected = load_file(os.path.join(d, "expected.safetensors"))
        out = {}
        j = 0
        while f"input_ids.{j}" in expected:
            ids = expected[f"input_ids.{j}"]
            with torch.no_grad():
                z = model(input_ids=ids, use_cache=False).logits.double()
            want = expected[f"logits.{j}"].double()
            err = (z - want).abs().max().item() / want.abs().max().item()
            print(f"{d} input {j} {tuple(ids.shape)}: transformers vs model_reference {err:.3g} of max |logit|")
            if err > tol:
                raise SystemExit(f"{d}: transformers and model_reference.py disagree ({err:.3g})")
            out[f"logits.{j}"] = z
            j += 1
        meta = {"generator": "tools/reference/transformers_check.py", "transformers": transformers.__version__,
                "torch": torch.__version__, "attn_implementation": "eager", "dtype": "float64"}
        write_safetensors(os.path.join(d, "transformers.safetensors"), out, meta)


if __name__ == "__main__":
    main()
