#!/usr/bin/env python3
"""kvlab against llama.cpp on the same GGUF file and the same tokens (issue 21, item 5).

Outside the product, setup and CI path: run through tools/reference/llama_cpp_bench.sh, which
makes a scratch venv holding llama-cpp-python. Every measurement is a fresh process on each side
(model load excluded from the timings, included in the peak RSS), interleaved pair by pair and
the order flipped every round, so a drifting machine shifts both sides of a pair alike.

Cases (as in the issue's table): prefill 512 and 2048 tokens of GPL-3, and decode 128 tokens
after a 512-token prompt (greedy, past end-of-sequence), each at every thread count given.
Printed: per case the ratio kvlab / llama.cpp of tokens per second (above 1: kvlab faster) as
min / median / max over rounds, both sides' median tokens/s, the peak RSS of the decode case,
the CPU model, its vector ISA and the load average before and after.
"""
import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time

TEXT = "/usr/share/common-licenses/GPL-3"


def child_llama(a):
    import numpy as np
    from llama_cpp import Llama

    tokens = json.load(open(a.tokens_file))
    llm = Llama(model_path=a.gguf, n_ctx=4096, n_threads=a.threads, n_threads_batch=a.threads, verbose=False)
    out = {"n_prompt": len(tokens)}
    t0 = time.perf_counter()
    llm.eval(tokens)
    out["prefill_s"] = time.perf_counter() - t0
    if a.new_tokens > 0:
        t0 = time.perf_counter()
        n_vocab = llm.n_vocab()
        for _ in range(a.new_tokens):  # greedy on the last position's logits (the only ones computed)
            nxt = int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))))
            llm.eval([nxt])
        out["decode_s"] = time.perf_counter() - t0
        out["n_decode"] = a.new_tokens
    out["maxrss_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps(out))


SUMMARY = re.compile(r"\[(\d+) prompt tokens, (\d+) generated \| prefill ([0-9.]+) tokens/s"
                     r"(?: \| decode ([0-9.]+) tokens/s over (\d+) steps)?")


def run_kvlab(a, text, threads, new_tokens):
    cmd = ["/usr/bin/time", "-f", "maxrss_kib=%M", a.kvlab, "generate", a.gguf, "--prompt", text,
           "--max_new_tokens", str(max(1, new_tokens + (1 if new_tokens else 0))), "--temperature", "0",
           "--ignore_eos", "true", "--threads", str(threads), "--telemetry.enabled", "false"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    log = p.stdout + p.stderr
    m = SUMMARY.search(log)
    if p.returncode != 0 or not m:
        sys.exit(f"llama_cpp_bench: kvlab generate failed (exit {p.returncode}):\n{log[-2000:]}")
    n_prompt = int(m.group(1))
    out = {"n_prompt": n_prompt, "prefill_s": n_prompt / float(m.group(3)),
           "maxrss_kib": int(re.search(r"maxrss_kib=(\d+)", log).group(1))}
    if new_tokens:  # kvlab's decode rate is over the single-token forwards after the prefill
        out["decode_s"] = int(m.group(5)) / float(m.group(4))
        out["n_decode"] = int(m.group(5))
    return out


def run_llama(a, tokens_file, threads, new_tokens):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--gguf", a.gguf, "--tokens_file", tokens_file,
           "--threads", str(threads), "--new_tokens", str(new_tokens)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"llama_cpp_bench: llama.cpp child failed (exit {p.returncode}):\n{(p.stdout + p.stderr)[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def cpu_facts():
    model, flags = "?", set()
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name") and model == "?":
            model = line.split(":", 1)[1].strip()
        if line.startswith("flags"):
            flags |= {f for f in line.split(":", 1)[1].split() if f.startswith(("avx", "fma", "f16c"))}
    return model, " ".join(sorted(flags))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", default="assets/cache/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--kvlab", default="build/bin/kvlab")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prefill", default="512,2048")
    ap.add_argument("--decode", type=int, default=128, help="new tokens after a 512-token prompt (0: no decode case)")
    ap.add_argument("--json", help="also write every measurement to this file")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tokens_file", help=argparse.SUPPRESS)
    ap.add_argument("--new_tokens", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        a.threads = int(a.threads)
        return child_llama(a)
    for path, what in ((a.gguf, "the GGUF model (scripts/fetch_assets.sh)"), (a.kvlab, "kvlab (scripts/build.sh)")):
        if not os.path.exists(path):
            sys.exit(f"llama_cpp_bench: {path} not found; expected {what}")

    from llama_cpp import Llama  # the tokenizer only: the same token ids feed both sides
    vocab = Llama(model_path=a.gguf, vocab_only=True, verbose=False)
    all_ids = vocab.tokenize(open(TEXT, "rb").read(), add_bos=True)
    cases = [(f"prefill {n}", n, 0) for n in map(int, a.prefill.split(","))]
    if a.decode:
        cases.append((f"decode {a.decode} after 512", 512, a.decode))
    prompts = {}
    for _, n, _ in cases:  # a prompt text that both tokenizers turn into the same n tokens
        text = vocab.detokenize(all_ids[:n]).decode("utf-8", errors="ignore")
        ids = vocab.tokenize(text.encode("utf-8"), add_bos=True)
        path = f"/tmp/llama_cpp_bench.{os.getpid()}.{n}.json"
        json.dump(ids, open(path, "w"))
        prompts[n] = (text, path, len(ids))

    model, isa = cpu_facts()
    load0 = os.getloadavg()
    threads = [int(t) for t in a.threads.split(",")]
    rows = []
    total = a.rounds * len(threads) * len(cases)
    done = 0
    for r in range(a.rounds):
        for t in threads:
            for name, n, new in cases:
                text, path, n_ids = prompts[n]
                sides = [("llama", lambda: run_llama(a, path, t, new)), ("kvlab", lambda: run_kvlab(a, text, t, new))]
                if r % 2:
                    sides.reverse()
                got = {side: fn() for side, fn in sides}
                if got["kvlab"]["n_prompt"] != got["llama"]["n_prompt"]:
                    print(f"warning: {name}: kvlab read {got['kvlab']['n_prompt']} prompt tokens, "
                          f"llama.cpp {got['llama']['n_prompt']}", file=sys.stderr)
                rows.append({"round": r, "threads": t, "case": name, **{f"{s}_{k}": v for s, d in got.items() for k, v in d.items()}})
                done += 1
                print(f"\r[{done}/{total}] round {r + 1}, {t} thread(s), {name}      ", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    load1 = os.getloadavg()
    if a.json:
        json.dump(rows, open(a.json, "w"), indent=1)

    def rate(row, side, what):
        if what == "decode":
            return row[f"{side}_n_decode"] / row[f"{side}_decode_s"]
        return row[f"{side}_n_prompt"] / row[f"{side}_prefill_s"]

    print(f"CPU: {model}; ISA: {isa}; load average {load0[0]:.2f} before, {load1[0]:.2f} after; "
          f"{a.rounds} rounds, pairs interleaved")
    print("| case | threads | kvlab / llama.cpp tokens/s: min / median / max | kvlab tokens/s | llama.cpp tokens/s |")
    print("|---|---|---|---|---|")
    for name, n, new in cases:
        what = "decode" if new else "prefill"
        for t in threads:
            sel = [x for x in rows if x["case"] == name and x["threads"] == t]
            ratios = [rate(x, "kvlab", what) / rate(x, "llama", what) for x in sel]
            kv = statistics.median(rate(x, "kvlab", what) for x in sel)
            ll = statistics.median(rate(x, "llama", what) for x in sel)
            print(f"| {name} | {t} | {min(ratios):.2f} / {statistics.median(ratios):.2f} / {max(ratios):.2f} "
                  f"| {kv:.1f} | {ll:.1f} |")
    if a.decode:
        for t in threads:
            sel = [x for x in rows if x["case"].startswith("decode") and x["threads"] == t]
            kv = statistics.median(x["kvlab_maxrss_kib"] for x in sel) / 1024
            ll = statistics.median(x["llama_maxrss_kib"] for x in sel) / 1024
            print(f"peak RSS, 512 + {a.decode} tokens, {t} thread(s): kvlab {kv:.0f} MiB, llama.cpp {ll:.0f} MiB "
                  f"(its Python process included), ratio {kv / ll:.2f}")


if __name__ == "__main__":
    main()
