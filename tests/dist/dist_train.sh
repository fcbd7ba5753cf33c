#!/usr/bin/env bash
# Data-parallel fine-tuning under Open MPI (issue 23), end to end through the CLI:
#  1. mpirun -np 2 of finetune_long_lora on `tiny` (bucket all-reduce overlapped with the
#     backward, the default) matches the single-process run with the same
#     global batch, once over shared memory and once over TCP (--mca btl tcp,self): per-step
#     losses within a relative 1e-5 and the final adapters within 1e-6 absolute. Why these
#     bounds: every rank computes the same micro-batches the single process does, with the same
#     loss scales; only the order of the gradient sum changes ((g0+g2)+(g1+g3) instead of
#     ((g0+g1)+g2)+g3), a few f32 ulps (1.2e-7 relative) per element, which Adam turns into
#     update differences of the same relative size times lr (5e-4) per step.
#  2. finetune_long_full (every weight) over shared memory, same bounds.
#  3. The checkpoint rank 0 wrote resumes on N=1, and the N=1 checkpoint resumes on N=2, with
#     matching continuations.
#  4. `kvlab runs` shows the rank count; the summary has the all-reduce share. Both ranks'
#     spans and memory events are in the run's session (rank 1's as run 2, a rank run); the
#     all-reduce share equals the all-reduce spans' sum over the step spans' sum (both ranks);
#     the Chrome trace has one process per rank, each with its all-reduce spans.
#  5. A rank killed at step 2 makes the other exit within the collective timeout with a message
#     naming the rank, and the session marks the run failed and keeps rank 0's records; nothing hangs.
# Exit 77 (skipped) when this kvlab was built without MPI or mpirun is missing.
# usage: dist_train.sh KVLAB WORKDIR
set -u
kvlab="$1"
work="$2"
here="$(cd "$(dirname "$0")" && pwd)"
rm -rf "$work"
mkdir -p "$work"
cd "$work"
fail() {
  echo "FAIL: $*"
  exit 1
}
command -v mpirun >/dev/null || { echo "SKIP: no mpirun"; exit 77; }
"$kvlab" version | grep -q "dist backends: .*mpi" || { echo "SKIP: kvlab built without MPI"; exit 77; }

mpi=(mpirun -np 2 --oversubscribe --allow-run-as-root)
common=(tiny --data.seq_length 256 --kv_cache.name h2o-default --kv_cache.cache_length 64 --kv_cache.chunk_size 16
        --data.num_samples 10 --data.val_split_fraction 0.2 --threads 1 --train.micro_batch_size 1
        --train.global_batch_size 4 --train.save_interval 0)
loss_tol=1e-5
w_tol=1e-6

run() {  # run NAME TIMEOUT CMD...: output in NAME.log, fails the test on a non-zero exit
  local name="$1" t="$2"
  shift 2
  timeout "$t" "$@" >"$name.log" 2>&1 || { tail -20 "$name.log"; fail "$name exited $?"; }
}
losses() { "$kvlab" export "$1" --run "${2:-1}" --what metrics --format csv -o "$3" >/dev/null || fail "export of $1"; }

# ---- 1. LoRA: one process vs two ranks (shared memory, then TCP) ----
run ref 120 "$kvlab" finetune_long_lora "${common[@]}" --train.max_steps 3 --session ref.kvlab --out_dir ref
run shm 120 "${mpi[@]}" "$kvlab" finetune_long_lora "${common[@]}" --train.max_steps 3 --session shm.kvlab --out_dir shm
run tcp 120 "${mpi[@]}" --mca btl tcp,self "$kvlab" finetune_long_lora "${common[@]}" --train.max_steps 3 --session tcp.kvlab --out_dir tcp
losses ref.kvlab 1 ref.csv
losses shm.kvlab 1 shm.csv
losses tcp.kvlab 1 tcp.csv
echo "shared memory:"
python3 "$here/compare_runs.py" ref.csv shm.csv ref/final/adapter_model.safetensors shm/final/adapter_model.safetensors $loss_tol $w_tol ||
  fail "2 ranks over shared memory differ from one process beyond the bound"
echo "tcp:"
python3 "$here/compare_runs.py" ref.csv tcp.csv ref/final/adapter_model.safetensors tcp/final/adapter_model.safetensors $loss_tol $w_tol ||
  fail "2 ranks over TCP differ from one process beyond the bound"
grep -q "2 ranks (mpi), all-reduce" shm.log || { cat shm.log; fail "the result line does not name the ranks and the all-reduce share"; }
[ "$(grep -c '^result:' shm.log)" = 1 ] || fail "rank 1 printed a result too (only rank 0 reports)"

# ---- 2. full fine-tuning, shared memory ----
run ref_full 120 "$kvlab" finetune_long_full "${common[@]}" --train.max_steps 2 --session ref_full.kvlab --out_dir ref_full
run shm_full 120 "${mpi[@]}" "$kvlab" finetune_long_full "${common[@]}" --train.max_steps 2 --session shm_full.kvlab --out_dir shm_full
losses ref_full.kvlab 1 ref_full.csv
losses shm_full.kvlab 1 shm_full.csv
echo "full fine-tuning:"
python3 "$here/compare_runs.py" ref_full.csv shm_full.csv ref_full/final/model.safetensors shm_full/final/model.safetensors $loss_tol $w_tol ||
  fail "full fine-tuning on 2 ranks differs from one process beyond the bound"

# ---- 3. checkpoints resume on any N ----
run resume1 120 "$kvlab" finetune_long_lora "${common[@]}" --train.max_steps 5 --resume shm/final --session resume.kvlab --out_dir resume1
run resume2 120 "${mpi[@]}" "$kvlab" finetune_long_lora "${common[@]}" --train.max_steps 5 --resume ref/final --session resume.kvlab --out_dir resume2
grep -q "2 steps (resumed at step 3)" resume1.log || { cat resume1.log; fail "rank 0's checkpoint did not resume on one process"; }
grep -q "2 steps (resumed at step 3)" resume2.log || { cat resume2.log; fail "a one-process checkpoint did not resume on 2 ranks"; }
losses resume.kvlab 1 resume1.csv
losses resume.kvlab 2 resume2.csv
echo "resumed (N=1 from the N=2 checkpoint vs N=2 from the N=1 checkpoint):"
python3 "$here/compare_runs.py" resume1.csv resume2.csv resume1/final/adapter_model.safetensors resume2/final/adapter_model.safetensors $loss_tol $w_tol ||
  fail "the resumed runs differ beyond the bound"

# ---- 4. the session knows the ranks ----
"$kvlab" runs resume.kvlab >runs.txt 2>&1 || fail "kvlab runs"
grep -q "ranks" runs.txt && grep -Eq "done .* 2$" runs.txt && grep -Eq "done .* 1$" runs.txt || { cat runs.txt; fail "kvlab runs does not show the rank counts"; }
"$kvlab" runs shm.kvlab --json >runs.json || fail "kvlab runs --json"
python3 - runs.json <<'PY' || fail "the summary lacks the all-reduce figures"
import json, sys
r = json.load(open(sys.argv[1]))[0]
d = r["summary"]["dist"]
assert r["config"]["dist"]["ranks"] == 2, r["config"]["dist"]
assert d["ranks"] == 2 and d["backend"] == "mpi", d
assert len(d["rank_allreduce_seconds"]) == 2 and len(d["rank_step_seconds"]) == 2, d
assert 0 < d["allreduce_share"] < 1, d
assert d["allreduce_bytes_per_step"] > 0 and d["replica_checks"] >= 2, d
# overlap (default): LoRA's one bucket holds layers only, so it starts during the backward
assert d["overlap"] is True and d["allreduce_overlapped_buckets"] == d["allreduce_buckets"] == 1, d
print("summary.dist:", {k: d[k] for k in ("ranks", "backend", "allreduce_bytes_per_step", "allreduce_share", "replica_checks")})
PY

# ---- 4b. every rank's telemetry is in the run's session (one process per rank in the trace) ----
"$kvlab" runs shm.kvlab >shm_runs.txt 2>&1 || fail "kvlab runs shm.kvlab"
grep -q "1 rank run of data-parallel runs not listed" shm_runs.txt || { cat shm_runs.txt; fail "the rank run is listed as a run of its own"; }
for r in 1 2; do
  "$kvlab" export shm.kvlab --run $r --what spans --format csv -o spans$r.csv >/dev/null || fail "spans export of run $r"
  "$kvlab" export shm.kvlab --run $r --what memory --format csv -o memory$r.csv >/dev/null || fail "memory export of run $r"
done
"$kvlab" export shm.kvlab --run 1 --what all --format chrome-trace -o trace.json >/dev/null || fail "chrome trace export"
python3 - runs.json spans1.csv spans2.csv memory1.csv memory2.csv trace.json <<'PY' || fail "the session does not hold both ranks' telemetry"
import csv, json, sys
runs_json, s1, s2, m1, m2, trace = sys.argv[1:]
runs = {r["id"]: r for r in json.load(open(runs_json))}
assert runs[1]["rank_runs"] == [1, 2], runs[1].get("rank_runs")
assert runs[2]["config"]["dist"]["rank"] == 1 and runs[2]["config"]["dist"]["rank_of"] == 1, runs[2]["config"]["dist"]
def spans(path):
    return list(csv.DictReader(open(path)))
comm = step = 0
for rank, path in ((0, s1), (1, s2)):
    rows = spans(path)
    ar = [int(r["dur_ns"]) for r in rows if r["name"] == "allreduce"]
    st = [int(r["dur_ns"]) for r in rows if r["name"] == "train_step"]
    # 3 optimizer steps: one step span each, and all-reduce spans (the bucket launched during
    # the backward, then the wait at the step's end), on every rank
    assert len(st) == 3 and len(ar) >= 3, (rank, len(ar), len(st))
    assert any(r["category"] == "attention" for r in rows), rank  # the model's own spans too
    comm += sum(ar); step += sum(st)
    mem = list(csv.DictReader(open((m1, m2)[rank])))
    assert len(mem) > 100, (rank, len(mem))
share = runs[1]["summary"]["dist"]["allreduce_share"]
assert abs(share - comm / step) <= 1e-9 * max(1.0, share), (share, comm / step)
t = json.load(open(trace))["traceEvents"]
pids = {e["pid"] for e in t if e.get("ph") == "X"}
assert pids == {1, 1001}, pids
names = {e["pid"]: e["args"]["name"] for e in t if e.get("ph") == "M" and e["name"] == "process_name"}
assert "rank 0" in names[1] and "rank 1" in names[1001], names
for pid in (1, 1001):
    assert sum(1 for e in t if e.get("ph") == "X" and e["pid"] == pid and e["name"] == "allreduce") >= 3, pid
    assert any(e.get("ph") == "C" and e["pid"] == pid and e["name"].startswith("memory") for e in t), pid
print("both ranks in the session: all-reduce share %.4f = spans %.4f; trace pids %s" % (share, comm / step, sorted(pids)))
PY
grep -q "rank 1's telemetry is run 2 of the session" shm.log || { cat shm.log; fail "rank 0 did not say where rank 1's telemetry went"; }

# ---- 5. a rank dies: the other names it and exits; the run is marked failed ----
start=$(date +%s)
KVLAB_DIST_KILL=1:2 timeout 90 "${mpi[@]}" --enable-recovery -x KVLAB_DIST_KILL "$kvlab" finetune_long_lora "${common[@]}" \
  --train.max_steps 4 --dist.timeout 5 --session kill.kvlab >kill.log 2>&1
rc=$?
elapsed=$(( $(date +%s) - start ))
cat kill.log | grep -v "^ *step\|^ *validation" | tail -8
[ "$rc" -ne 124 ] || fail "the job hung (killed by timeout after 90 s)"
grep -q "rank 1 (of 2) did not reach all-reduce" kill.log || fail "no message naming the dead rank"
"$kvlab" runs kill.kvlab >kill_runs.txt 2>&1
grep -Eq "failed" kill_runs.txt && grep -q "rank 1 (of 2) did not reach" kill_runs.txt || { cat kill_runs.txt; fail "the session does not mark the run failed with the reason"; }
# Rank 0's own records survive the dead rank (its first step ran before rank 1 died).
"$kvlab" export kill.kvlab --run 1 --what spans --format csv --allow-incomplete -o kill_spans.csv >/dev/null || fail "spans export of the failed run"
grep -q ",train_step," kill_spans.csv && grep -q ",allreduce," kill_spans.csv || fail "rank 0's spans were lost when rank 1 died"
echo "killed rank: the survivor stopped after ${elapsed} s"
echo "PASS"
