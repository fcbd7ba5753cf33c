#!/usr/bin/env python3
"""Comparisons of the GPU kit (scripts/gpu/run.sh, docs/GPU.md). Standard library only: it runs
on the device machine's python3 and on this one's. Each subcommand prints what it compared and
exits 0 when the check passes, 1 when it fails, 2 on bad input.

  eval CPU.kvlab GPU.kvlab [--rtol R] [--expect-device cuda:0]
                                             one eval_long run each: mean loss within R relative,
                                             identical cache decisions (cache_steps.replay_log)
                                             up to a first difference that is a tie in the scores
                                             (then loss within 1e-3 only);
                                             the second run's memory was on that device
  train CPU.kvlab GPU.kvlab CPU_DIR GPU_DIR [--expect-device cuda:0]
                                             one finetune run each: loss and grad norm per step,
                                             the saved weights (*.safetensors) after the last step
  cupti SESSION EXPORT_DIR                   a traced CUDA run: kernel, memcpy and memory records,
                                             their links to engine spans, allocator peak, exports
  bench BENCH.json [TORCH.json]              summary lines of kvlab_gpu_bench (+ torch_sdpa.py)
  profile SESSION                            a traced CUDA run's kernels by time, GPU busy fraction,
                                             copies (a diagnosis; fails only without records)
"""
import csv
import glob
import json
import math
import os
import pickle
import sqlite3
import struct
import sys


def fail(msg):
    print("FAIL: " + msg)
    return 1


def open_session(path):
    if not os.path.isfile(path):
        raise SystemExit(f"gpu_checks: session file '{path}' does not exist")
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    return db


def only_run(db, path):
    rows = db.execute("SELECT id, status, summary FROM runs ORDER BY id").fetchall()
    if len(rows) != 1:
        raise SystemExit(f"gpu_checks: '{path}' holds {len(rows)} runs; expected exactly one")
    rid, status, summary = rows[0]
    return rid, status, json.loads(summary or "{}")


def devices_used(summary):
    """Devices with recorded memory: the run's own memory stats or the writer's peak bytes."""
    return set((summary.get("memory") or {}).keys()) | set((summary.get("peak_bytes") or {}).keys())


def rel(a, b):
    return abs(a - b) / max(abs(a), abs(b), 1e-30)


def score_rows(db, rid):
    """(layer, chunk, pass) -> list of (B*G) rows of slot scores after that step (float32 blobs;
    NULL -> None)."""
    out = {}
    for l, c, p, b, g, t, blob in db.execute(
            "SELECT layer, chunk, pass, B, G, T, scores FROM score_snapshots WHERE run_id=?", (rid,)):
        if blob is None or t <= 0:
            out[(l, c, p)] = None
            continue
        v = struct.unpack(f"<{len(blob) // 4}f", blob)
        out[(l, c, p)] = [v[i:i + t] for i in range(0, len(v), t)]
    return out


def plan_targets(blob):
    """A cache step's replay-log blob (engine/telemetry/replay_plan.cpp, version 1) -> the slots
    its new tokens were written to, one set per row (a shared range: one row)."""
    magic, version, flags = struct.unpack_from("<IHH", blob, 0)
    if version != 1:
        raise SystemExit(f"gpu_checks: replay log version {version}; this script reads version 1")
    _, n, rows, moves, _ = struct.unpack_from("<5q", blob, 8)
    if flags & 1:
        start = struct.unpack_from("<q", blob, 48)[0]
        return [set(range(start, start + n))]
    t = struct.unpack_from(f"<{rows * n}I", blob, 48)
    return [set(t[r * n:(r + 1) * n]) for r in range(rows)]


def tie_at(step, prev_scores, plans, rtol=1e-3):
    """Whether two different decisions of one step pick among tied slots: every slot one side
    evicted and the other kept has, in the scores the decision was made from (the step before,
    same layer), a score within rtol (of the row's largest magnitude) of every other such slot.
    Returns (True, detail) or (False, why)."""
    if prev_scores is None:
        return False, "no scores recorded before the step"
    ta, tb = (plan_targets(p) for p in plans)
    if len(ta) != len(tb):
        return False, "the plans cover different rows"
    rows = prev_scores if len(ta) > 1 else prev_scores[:1]
    worst = 0.0
    for r, (sa, sb) in enumerate(zip(ta, tb)):
        sym = sa ^ sb
        if not sym:
            continue
        row = rows[r] if r < len(rows) else None
        if row is None or max(sym) >= len(row):
            return False, f"row {r}: slot {max(sym)} had no score"
        vals = [row[j] for j in sym]
        if not all(math.isfinite(x) for x in vals):
            return False, f"row {r}: a differing slot's score is not finite"
        scale = max([abs(x) for x in row if math.isfinite(x)] or [1.0]) or 1.0
        spread = (max(vals) - min(vals)) / scale
        worst = max(worst, spread)
        if spread > rtol:
            return False, f"row {r}: the differing slots' scores span {spread:.2e} of the row's scale (> {rtol:g})"
    return True, f"differing slots' scores within {worst:.1e} of the row's scale"


def cmd_eval(args):
    rtol = 1e-4
    if "--rtol" in args:
        i = args.index("--rtol")
        rtol = float(args[i + 1])
        del args[i:i + 2]
    device = None
    if "--expect-device" in args:
        i = args.index("--expect-device")
        device = args[i + 1]
        del args[i:i + 2]
    if len(args) != 2:
        raise SystemExit("usage: gpu_checks.py eval CPU.kvlab GPU.kvlab [--rtol R] [--expect-device DEV]")
    dbs = [open_session(p) for p in args]
    runs = [only_run(db, p) for db, p in zip(dbs, args)]
    for (rid, status, _), p in zip(runs, args):
        if status != "done":
            err = dbs[args.index(p)].execute("SELECT error FROM runs WHERE id=?", (rid,)).fetchone()
            return fail(f"{p}: run {rid} is '{status}' ({err[0] if err else ''})")
    if device and device not in devices_used(runs[1][2]):
        return fail(f"{args[1]}: the run recorded no memory on {device}: it did not run there "
                    f"(memory on {sorted(devices_used(runs[1][2]))})")
    la, lb = runs[0][2].get("mean_loss"), runs[1][2].get("mean_loss")
    if la is None or lb is None or not all(map(math.isfinite, (la, lb))):
        return fail(f"mean loss missing or not finite: cpu {la}, gpu {lb}")
    steps = []
    for db, (rid, _, _) in zip(dbs, runs):
        steps.append({(l, c, p): blob for l, c, p, blob in db.execute(
            "SELECT layer, chunk, pass, replay_log FROM cache_steps WHERE run_id=? ORDER BY layer, chunk, pass", (rid,))})
    if set(steps[0]) != set(steps[1]):
        return fail(f"cache steps differ: cpu {len(steps[0])}, gpu {len(steps[1])} (layer, chunk, pass) keys")
    # In execution order (chunk by chunk, layers in turn): the first step that decides
    # differently. Where scores tie in exact math rounding decides, and the CPU and the GPU may
    # break a tie differently (knorm on repeated text: RoPE keeps a key's norm, so identical
    # tokens tie). Such a first divergence must be a tie in the scores it was made from; from
    # there on the two caches hold different tokens and only the loss is compared (1e-3).
    order = sorted(steps[0], key=lambda k: (k[2], k[1], k[0]))
    differ = [k for k in order if steps[0][k] != steps[1][k]]
    tie_note = ""
    if differ:
        l, c, p = first = differ[0]
        earlier = [k for k in order if k[0] == l and k[2] == p and k[1] < c]
        scores = score_rows(dbs[0], runs[0][0])
        ok, why = tie_at(first, scores.get(earlier[-1]) if earlier else None, (steps[0][first], steps[1][first]))
        if not ok:
            return fail(f"{len(differ)} cache steps decide differently, first at layer {l} chunk {c} pass {p}, "
                        f"and it is not a tie: {why}")
        tie_note = f"; first difference at layer {l} chunk {c}: a tie ({why})"
    loss_tol = rtol if not differ else max(rtol, 1e-3)
    r = rel(la, lb)
    print(f"mean loss cpu {la:.9g} gpu {lb:.9g} rel {r:.2e} (<= {loss_tol:g}); "
          f"{len(steps[0]) - len(differ)} of {len(steps[0])} cache steps with identical decisions{tie_note}")
    if r > loss_tol:
        return fail(f"mean loss differs by {r:.3e} relative (> {loss_tol:g})")
    if not steps[0]:
        print("note: no cache steps recorded (dense or telemetry off)")
    return 0


def metric_series(db, rid, name):
    return [v for _, v in db.execute("SELECT step, value FROM metrics WHERE run_id=? AND name=? ORDER BY step", (rid, name))]


def read_safetensors(path):
    """name -> list of floats (F32, BF16, F16 only)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = data[a:b]
        dt = info["dtype"]
        if dt == "F32":
            out[name] = list(struct.unpack(f"<{len(raw) // 4}f", raw))
        elif dt == "BF16":
            out[name] = [struct.unpack("<f", b"\0\0" + raw[i:i + 2])[0] for i in range(0, len(raw), 2)]
        elif dt == "F16":
            out[name] = list(struct.unpack(f"<{len(raw) // 2}e", raw))
    return out


def cmd_train(args):
    device = None
    if "--expect-device" in args:
        i = args.index("--expect-device")
        device = args[i + 1]
        del args[i:i + 2]
    if len(args) != 4:
        raise SystemExit("usage: gpu_checks.py train CPU.kvlab GPU.kvlab CPU_DIR GPU_DIR [--expect-device DEV]")
    dbs = [open_session(p) for p in args[:2]]
    runs = [only_run(db, p) for db, p in zip(dbs, args[:2])]
    for (rid, status, _), p in zip(runs, args[:2]):
        if status != "done":
            return fail(f"{p}: run {rid} is '{status}'")
    if device and device not in devices_used(runs[1][2]):
        return fail(f"{args[1]}: the run recorded no memory on {device}: it did not run there "
                    f"(memory on {sorted(devices_used(runs[1][2]))})")
    bad = []
    for name in ("loss", "grad_norm"):
        a, b = (metric_series(db, r[0], name) for db, r in zip(dbs, runs))
        if not a or len(a) != len(b):
            return fail(f"{name}: cpu has {len(a)} steps, gpu {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            # The first step's gradients come from identical weights: 1e-4. Later steps start from
            # weights that already differ by the rounding of earlier updates: 1e-3.
            tol = 1e-4 if i == 0 else 1e-3
            if not (math.isfinite(x) and math.isfinite(y)) or rel(x, y) > tol:
                bad.append(f"{name} step {i + 1}: cpu {x:.9g} gpu {y:.9g} rel {rel(x, y):.2e} > {tol:g}")
        print(f"{name} per step: cpu {[round(v, 7) for v in a]} gpu {[round(v, 7) for v in b]}")
    files = [sorted(glob.glob(os.path.join(d, "**", "*.safetensors"), recursive=True)) for d in args[2:]]
    rels = [[os.path.relpath(f, d) for f in fs] for fs, d in zip(files, args[2:])]
    if not files[0] or rels[0] != rels[1]:
        bad.append(f"saved weights differ in files: cpu {rels[0]}, gpu {rels[1]}")
    else:
        worst = (0.0, "")
        for fa, fb, name in zip(files[0], files[1], rels[0]):
            ta, tb = read_safetensors(fa), read_safetensors(fb)
            if set(ta) != set(tb):
                bad.append(f"{name}: tensors differ: {sorted(set(ta) ^ set(tb))[:5]}")
                continue
            for t in ta:
                scale = max((abs(v) for v in ta[t]), default=0.0) or 1.0
                d = max((abs(x - y) for x, y in zip(ta[t], tb[t])), default=0.0) / scale
                if d > worst[0]:
                    worst = (d, f"{name}:{t}")
        print(f"saved weights: {sum(len(r) for r in rels[:1])} files, largest difference {worst[0]:.2e} of the "
              f"tensor's largest value ({worst[1] or '-'})")
        if worst[0] > 1e-3:
            bad.append(f"saved weights differ by {worst[0]:.2e} of their scale at {worst[1]} (> 1e-3)")
    if bad:
        return fail("; ".join(bad[:4]))
    return 0


def cmd_cupti(args):
    if len(args) != 2:
        raise SystemExit("usage: gpu_checks.py cupti SESSION EXPORT_DIR")
    path, exp = args
    db = open_session(path)
    rid, status, summary = only_run(db, path)
    bad = []
    if status != "done":
        return fail(f"run {rid} is '{status}'")
    n = {t: db.execute(f"SELECT count(*) FROM {t} WHERE run_id=?", (rid,)).fetchone()[0]
         for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
                   "CUDA_GPU_MEMORY_USAGE_EVENTS", "CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION")}
    print("records: " + ", ".join(f"{k} {v}" for k, v in n.items()))
    for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUDA_GPU_MEMORY_USAGE_EVENTS"):
        if n[t] == 0:
            bad.append(f"no {t} records")
    # Kernel launches vs what the backend issued: every kernel must map (external correlation)
    # to an engine span that launched it, and every GPU op span must have launched something.
    orphan = db.execute(
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k WHERE k.run_id=? AND NOT EXISTS ("
        " SELECT 1 FROM CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION e JOIN spans s ON s.run_id=e.run_id AND "
        " s.correlation_id=e.externalId WHERE e.run_id=k.run_id AND e.correlationId=k.correlationId)", (rid,)).fetchone()[0]
    spans_gpu = db.execute("SELECT count(*) FROM spans WHERE run_id=? AND correlation_id>0", (rid,)).fetchone()[0]
    silent = db.execute(
        "SELECT count(*) FROM spans s WHERE s.run_id=? AND s.correlation_id>0 AND NOT EXISTS ("
        " SELECT 1 FROM CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION e WHERE e.run_id=s.run_id AND e.externalId=s.correlation_id)",
        (rid,)).fetchone()[0]
    print(f"kernels without a launching span: {orphan} of {n['CUPTI_ACTIVITY_KIND_KERNEL']}; "
          f"spans with a correlation id: {spans_gpu}, of which without any GPU activity: {silent}")
    if orphan:
        bad.append(f"{orphan} kernels map to no engine span")
    if spans_gpu == 0:
        bad.append("no engine span carries a correlation id")
    # Device memory: CUPTI's device allocations (type 1) minus releases (type 2) over time, against the
    # tracked allocator's peak on cuda:0 (the tracker counts tensors; CUPTI also sees cuBLAS'
    # workspace and any pooling, so CUPTI's peak may be higher, never lower).
    live = peak = 0
    # memKind 3 = CUPTI_ACTIVITY_MEMORY_KIND_DEVICE (pinned host memory is not cuda:0's).
    for op, b in db.execute("SELECT memoryOperationType, bytes FROM CUDA_GPU_MEMORY_USAGE_EVENTS WHERE run_id=? "
                            "AND memKind=3 ORDER BY start", (rid,)):
        live += b if op == 1 else -b if op == 2 else 0
        peak = max(peak, live)
    tracked = ((summary.get("memory") or {}).get("cuda:0") or {}).get("peak_total")
    print(f"device memory peak: CUPTI {peak} bytes, tracked allocator {tracked} bytes")
    if not tracked:
        bad.append("the run summary has no cuda:0 peak")
    elif peak < tracked:
        bad.append(f"CUPTI's device memory peak {peak} is below the tracked allocator's {tracked}")
    elif peak > tracked + (512 << 20):
        bad.append(f"CUPTI's device memory peak {peak} exceeds the tracked {tracked} by more than 512 MiB")
    # Exports: the memory timeline (CSV), the Chrome trace and the PyTorch snapshot.
    try:
        with open(os.path.join(exp, "trace.json")) as f:
            tr = json.load(f)
        ev = tr["traceEvents"] if isinstance(tr, dict) else tr
        cats = {}
        for e in ev:
            cats[e.get("cat")] = cats.get(e.get("cat"), 0) + 1
        print(f"chrome trace: {cats.get('kernel', 0)} kernel, {cats.get('memcpy', 0)} memcpy events")
        if cats.get("kernel", 0) != n["CUPTI_ACTIVITY_KIND_KERNEL"]:
            bad.append(f"chrome trace holds {cats.get('kernel', 0)} kernels, the session {n['CUPTI_ACTIVITY_KIND_KERNEL']}")
        if not cats.get("memcpy"):
            bad.append("chrome trace holds no memcpy")
    except (OSError, ValueError, KeyError) as e:
        bad.append(f"chrome trace unreadable: {e}")
    try:
        with open(os.path.join(exp, "memory.csv"), newline="") as f:
            devs = {row["device"] for row in csv.DictReader(f)}
        print(f"memory timeline devices: {sorted(devs)}")
        if not any(d.startswith("cuda") for d in devs):
            bad.append("memory timeline has no GPU rows")
    except (OSError, ValueError) as e:
        bad.append(f"memory timeline unreadable: {e}")
    try:
        with open(os.path.join(exp, "snapshot.pickle"), "rb") as f:
            snap = pickle.load(f)
        names = snap.get("kvlab_devices", [])
        traces = snap.get("device_traces", [])
        gpu = [i for i, d in enumerate(names) if str(d).startswith("cuda")]
        print(f"torch snapshot devices: {names}, events per trace {[len(t) for t in traces]}")
        if not gpu or not any(len(traces[i]) for i in gpu if i < len(traces)):
            bad.append("torch snapshot has no cuda device trace")
    except Exception as e:  # noqa: BLE001 -- any unpickling failure is the finding
        bad.append(f"torch snapshot unreadable: {e}")
    if bad:
        return fail("; ".join(bad))
    return 0


def cmd_profile(args):
    """Where a CUDA run's GPU time goes, from its own CUPTI records: the kernels by total time,
    how busy the GPU was between the first and the last kernel, and the copies. A diagnosis
    for docs/GPU.md, not a pass/fail check (it fails only when the records are missing)."""
    if len(args) != 1:
        raise SystemExit("usage: gpu_checks.py profile SESSION")
    db = open_session(args[0])
    rid, status, _ = only_run(db, args[0])
    if status != "done":
        return fail(f"run {rid} is '{status}'")
    rows = db.execute(
        "SELECT s.value, count(*), sum(k.\"end\" - k.start), min(k.start), max(k.\"end\"), "
        " max(k.gridX * k.gridY * k.gridZ), max(k.blockX * k.blockY * k.blockZ) "
        "FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName "
        "WHERE k.run_id=? GROUP BY s.value ORDER BY 3 DESC", (rid,)).fetchall()
    if not rows:
        return fail("no CUPTI kernel records")
    busy = sum(r[2] for r in rows)
    t0, t1 = min(r[3] for r in rows), max(r[4] for r in rows)
    n = sum(r[1] for r in rows)
    print(f"kernels: {n} launches of {len(rows)} kernels, {busy / 1e6:.2f} ms on the GPU in a {(t1 - t0) / 1e6:.2f} ms "
          f"window: busy {100.0 * busy / max(t1 - t0, 1):.1f}%, mean {busy / n / 1e3:.1f} us per launch")
    for name, cnt, tot, _, _, grid, block in rows[:15]:
        print(f"  {100.0 * tot / busy:5.1f}%  {tot / 1e6:9.3f} ms  {cnt:7d} x {tot / cnt / 1e3:9.1f} us  "
              f"grid<= {grid} block<= {block}  {name[:90]}")
    # The same time by the engine span that launched each kernel (external correlation), the
    # innermost one: which op of the model the time belongs to.
    span_name = dict(db.execute("SELECT s.correlation_id, n.value FROM spans s JOIN StringIds n ON n.id = s.name_id "
                                "WHERE s.run_id=? AND s.correlation_id > 0", (rid,)))
    ext = dict(db.execute("SELECT correlationId, externalId FROM CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION WHERE run_id=?",
                          (rid,)))
    by = {}
    for corr, name, dur, grid in db.execute(
            "SELECT k.correlationId, n.value, k.\"end\" - k.start, k.gridX * k.gridY * k.gridZ "
            "FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds n ON n.id = k.shortName WHERE k.run_id=?", (rid,)):
        key = (span_name.get(ext.get(corr), "(no span)"), name, grid)
        c, t = by.get(key, (0, 0))
        by[key] = (c + 1, t + dur)
    print("by launching span, kernel and grid:")
    for (span, name, grid), (cnt, tot) in sorted(by.items(), key=lambda kv: -kv[1][1])[:15]:
        print(f"  {100.0 * tot / busy:5.1f}%  {tot / 1e6:9.3f} ms  {cnt:7d} x {tot / cnt / 1e3:9.1f} us  grid {grid:<8d} "
              f"{span[:28]:28s} {name[:60]}")
    for kind, name in ((1, "host to device"), (2, "device to host"), (8, "device to device")):
        c, b, t = db.execute("SELECT count(*), coalesce(sum(bytes), 0), coalesce(sum(\"end\" - start), 0) FROM "
                             "CUPTI_ACTIVITY_KIND_MEMCPY WHERE run_id=? AND copyKind=?", (rid, kind)).fetchone()
        if c:
            print(f"copies {name}: {c}, {b / 2**20:.2f} MiB, {t / 1e6:.2f} ms")
            spans = {}
            for corr, nbytes in db.execute("SELECT correlationId, bytes FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE run_id=? AND "
                                           "copyKind=?", (rid, kind)):
                key = span_name.get(ext.get(corr), "(no span)")
                n0, b0 = spans.get(key, (0, 0))
                spans[key] = (n0 + 1, b0 + nbytes)
            for key, (n0, b0) in sorted(spans.items(), key=lambda kv: -kv[1][0])[:5]:
                print(f"    {n0:6d} x  {b0 / 2**20:9.2f} MiB  under {key}")
    return 0


def cmd_bench(args):
    if not 1 <= len(args) <= 2:
        raise SystemExit("usage: gpu_checks.py bench BENCH.json [TORCH.json]")
    with open(args[0]) as f:
        bench = json.load(f)
    lines = []
    for r in bench["rows"]:
        op = ">=" if r["higher_is_better"] else "<="
        name = "bench." + r["key"]
        lines.append((("PASS" if r["pass"] else "FAIL"), name,
                      f"{r['name']}: {r['ratio']:.3f}x (target {op} {r['target']}x; ours {r['ours']:.4g} vs "
                      f"{r['baseline']:.4g} {r['unit']}, {r['basis']})"))
    if len(args) == 2:
        with open(args[1]) as f:
            torch_rows = json.load(f)
        for t in torch_rows:
            ratio = t["torch_ms"] / t["ours_ms"] if t["ours_ms"] > 0 else 0.0
            ok = ratio >= t["target"]
            lines.append((("PASS" if ok else "FAIL"), f"bench.sdpa_vs_torch_{t['dtype']}_{t['queries']}x{t['keys']}",
                          f"our SDPA at {ratio:.3f}x PyTorch's speed (target >= {t['target']}x; ours {t['ours_ms']:.4g} ms, "
                          f"torch {t['torch_ms']:.4g} ms, {t['torch_backend']})"))
    for s, n, d in lines:
        print(f"{s} {n} {d}")
    return 0


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in ("eval", "train", "cupti", "bench", "profile"):
        print(__doc__, file=sys.stderr)
        return 2
    return {"eval": cmd_eval, "train": cmd_train, "cupti": cmd_cupti, "bench": cmd_bench, "profile": cmd_profile}[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
