#!/usr/bin/env python3
"""Compares two fine-tuning runs for tests/dist: per-step losses (metrics CSV from `kvlab export`)
and the tensors of two safetensors checkpoints, against the stated reassociation bounds.
usage: compare_runs.py LOSSES_A.csv LOSSES_B.csv A.safetensors B.safetensors LOSS_REL_TOL WEIGHT_TOL
Exit 0 when within bounds, 1 otherwise (with the worst offender named)."""
import csv, json, struct, sys
from array import array


def losses(path):
    out = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            if row.get("name") == "loss":
                out[int(float(row["step"]))] = float(row["value"])
    return out


def tensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t["dtype"] != "F32":
            sys.exit(f"{path}: tensor {name} is {t['dtype']}; this check reads F32 only")
        a = array("f")
        b, e = t["data_offsets"]
        a.frombytes(data[b:e])
        out[name] = a
    return out


la, lb = losses(sys.argv[1]), losses(sys.argv[2])
ta, tb = tensors(sys.argv[3]), tensors(sys.argv[4])
loss_tol, w_tol = float(sys.argv[5]), float(sys.argv[6])
ok = True
if not la or sorted(la) != sorted(lb):
    print(f"FAIL: the runs logged different steps: {sorted(la)} vs {sorted(lb)}")
    sys.exit(1)
worst = max(abs(la[s] - lb[s]) / abs(la[s]) for s in la)
print(f"losses over {len(la)} steps: max relative difference {worst:.3e} (bound {loss_tol:.1e})")
ok &= worst <= loss_tol
if sorted(ta) != sorted(tb):
    print("FAIL: the checkpoints hold different tensors")
    sys.exit(1)
wmax, wname, scale = 0.0, "", 0.0
for k in ta:
    for x, y in zip(ta[k], tb[k]):
        d = abs(x - y)
        scale = max(scale, abs(x))
        if d > wmax:
            wmax, wname = d, k
print(f"weights: {len(ta)} tensors, max |difference| {wmax:.3e} in {wname} (bound {w_tol:.1e}; max |w| {scale:.3e})")
ok &= wmax <= w_tol
changed = any(x != 0 for k in ta for x in ta[k]) and scale > 0
if not changed:
    print("FAIL: the checkpoint is all zeros (nothing was trained)")
    ok = False
print("OK" if ok else "FAIL: beyond the bound")
sys.exit(0 if ok else 1)
