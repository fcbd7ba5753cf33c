#!/usr/bin/env python3
"""The Python policy boundary's cost: the Python knorm (python/examples/knorm.py) against the
built-in knorm, eval_long runs alternated in one process, and the time per score() call.

    PYTHONPATH=build/python /usr/bin/python3 bench/python_policy_bench.py MODEL [--tokens 1024]
        [--chunk 64] [--cache 256] [--repeats 3] [--threads 0]

Prints each run's wall time and its policy-pass seconds (summary phase_seconds), the median
ratio Python / C++, and (Python - C++) / score() calls as the per-call overhead."""
import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time

import kvlab

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--cache", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()

    calls = [0]
    knorm_file = os.path.join(HERE, "..", "python", "examples", "knorm.py")
    s = importlib.util.spec_from_file_location("knorm_example", knorm_file)
    mod = importlib.util.module_from_spec(s)
    s.loader.exec_module(mod)

    class CountingKNorm(mod.KNorm):
        def score(self, f):
            calls[0] += 1
            return super().score(f)

    kvlab.register_policy("knorm_py", CountingKNorm)
    opts = {"data.seq_length": a.tokens, "data.num_samples": 1, "kv_cache.chunk_size": a.chunk,
            "kv_cache.cache_length": a.cache, "threads": a.threads, "telemetry.enabled": False}
    times = {"knorm-default": [], "knorm_py-default": []}
    policy = {"knorm-default": [], "knorm_py-default": []}
    with tempfile.TemporaryDirectory() as d:
        session = os.path.join(d, "bench.kvlab")
        for rep in range(a.repeats + 1):  # the first round warms caches and is not counted
            for name in times:
                before = calls[0]
                t = time.perf_counter()
                r = kvlab.eval_long(a.model, session=session, options=dict(opts, **{"kv_cache.name": name}))
                dt = time.perf_counter() - t
                summ = json.loads(r["summary"] or "{}")
                ps = summ.get("phase_seconds", {}).get("policy pass", float("nan"))
                n_calls = calls[0] - before
                print("%s round %d: %.3f s wall, policy pass %.3f s, %d score() calls" % (name, rep, dt, ps, n_calls))
                if rep:
                    times[name].append(dt)
                    policy[name].append(ps)
                    if name == "knorm_py-default":
                        per_run_calls = n_calls
    # The boundary alone: score() calls as the engine makes them (another thread takes the GIL,
    # features as views, the result copied back), for the knorm example and a no-op scorer.
    class Noop:
        def score(self, f):
            return f.key_norm

    rows, n = 3, a.chunk  # SmolLM2: 3 KV heads
    t_knorm = kvlab._kvlab._time_score_calls(mod.KNorm(), rows, n, 20000)
    t_noop = kvlab._kvlab._time_score_calls(Noop(), rows, n, 20000)
    print("boundary per score() call (%d x %d key norms): knorm %.1f us, returning its input %.1f us" % (rows, n, t_knorm * 1e6, t_noop * 1e6))
    c, p = statistics.median(times["knorm-default"]), statistics.median(times["knorm_py-default"])
    cp, pp = statistics.median(policy["knorm-default"]), statistics.median(policy["knorm_py-default"])
    print("median wall: C++ %.3f s, Python %.3f s, ratio %.3f" % (c, p, p / c))
    print("median policy pass: C++ %.3f s, Python %.3f s, ratio %.3f" % (cp, pp, pp / cp))
    print("score() calls per run: %d; overhead per call (policy pass difference / calls): %.1f us"
          % (per_run_calls, (pp - cp) / max(per_run_calls, 1) * 1e6))


if __name__ == "__main__":
    sys.exit(main())
