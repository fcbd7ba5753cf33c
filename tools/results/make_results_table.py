#!/usr/bin/env python3
"""Markdown tables for docs/RESULTS.md from a session written by scripts/results.sh.

Reads `kvlab runs SESSION --json` (run names encode the experiment: "ppl POLICY-BUFFER L=N",
"passkey POLICY T=N") and prints a perplexity table (rows: policy, columns: buffer x cache
length) and a passkey table (rows: policy, columns: sequence length).
"""
import argparse
import json
import re
import subprocess


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("session")
    ap.add_argument("--kvlab", default="build/bin/kvlab")
    a = ap.parse_args()
    runs = json.loads(subprocess.run([a.kvlab, "runs", a.session, "--json"], check=True, capture_output=True, text=True).stdout)
    ppl, dense, passkey = {}, {}, {}
    for r in runs:
        if r.get("status") != "done":
            continue
        s = r.get("summary") or {}
        if isinstance(s, str):
            s = json.loads(s) if s else {}
        name = r["name"]
        m = re.fullmatch(r"ppl (\S+)-(default|q8|q4) L=(\d+)", name)
        if m:
            ppl[(m[1], m[2], int(m[3]))] = s.get("perplexity")
            continue
        m = re.fullmatch(r"ppl dense-(default|q8|q4)", name)
        if m:
            dense[m[1]] = s.get("perplexity")
            continue
        m = re.fullmatch(r"passkey (\S+) T=(\d+)", name)
        if m:
            passkey[(m[1], int(m[2]))] = (s.get("accuracy"), s.get("mean_loss"))
    bufs, Ls = ["default", "q8", "q4"], [512, 1024, 2048]
    print("| policy | " + " | ".join(f"{b} L={L}" for b in bufs for L in Ls) + " |")
    print("|---|" + "---|" * (len(bufs) * len(Ls)))
    print("| dense (full cache) | " + " | ".join(
        (f"{dense[b]:.2f}" if dense.get(b) else "–") for b in bufs for _ in Ls) + " |")
    for pol in sorted({k[0] for k in ppl}):
        cells = []
        for b in bufs:
            for L in Ls:
                v = ppl.get((pol, b, L))
                cells.append(f"{v:.2f}" if v else "–")
        print(f"| {pol} | " + " | ".join(cells) + " |")
    print()
    Ts = sorted({k[1] for k in passkey})
    if not Ts:
        print("(no passkey runs in this session yet)")
        return
    print("| policy (cache 1024) | " + " | ".join(f"T={T}: accuracy (loss)" for T in Ts) + " |")
    print("|---|" + "---|" * len(Ts))

    def cell(v):
        if v is None or v[0] is None:
            return "–"
        return f"{v[0] * 100:.0f}% ({v[1]:.3f})" if v[1] is not None else f"{v[0] * 100:.0f}%"
    for pol in sorted({k[0] for k in passkey}, key=lambda p: (p != "dense", p)):
        print(f"| {pol} | " + " | ".join(cell(passkey.get((pol, T))) for T in Ts) + " |")


if __name__ == "__main__":
    main()
