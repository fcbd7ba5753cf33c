#!/usr/bin/env bash
# Distributed sweeps (issue 23): `mpirun -np 2 kvlab sweep` spreads the cells over the ranks,
# rank 1's runs land in the target session (its own file keeps their telemetry), the table
# equals a one-process sweep's, and rerunning the command runs nothing (resumable as before).
# Exit 77 (skipped) when this kvlab was built without MPI or mpirun is missing.
# usage: dist_sweep.sh KVLAB WORKDIR
set -u
kvlab="$1"
work="$2"
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
grid=(tiny --kv_cache.name h2o,lastrec --kv_cache.cache_length 32,64 --kv_cache.chunk_size 16 --data.seq_length 256
      --data.num_samples 1 --threads 1 --figure none --format csv --metric mean_loss)

timeout 120 "$kvlab" sweep "${grid[@]}" --session one.kvlab >one.csv 2>one.log || { cat one.log; fail "one-process sweep"; }
timeout 120 "${mpi[@]}" "$kvlab" sweep "${grid[@]}" --session two.kvlab >two.csv 2>two.log || { cat two.log; fail "2-rank sweep"; }
cat two.log | grep "rank"
grep -q "rank 1 of 2: [1-9][0-9]* cells to run" two.log || fail "rank 1 ran no cells"
# The table, printed once by rank 0, equals the one-process table (evaluation is deterministic)
# but for the run ids (column 3: the order runs were recorded in differs).
table() { cut -d, -f1,2,4- "$1"; }
diff <(table one.csv) <(table two.csv) || fail "the 2-rank sweep's table differs from the one-process sweep's"
[ "$(wc -l <one.csv)" -ge 5 ] || { cat one.csv; fail "the table has fewer rows than cells"; }
[ -f two.rank1.kvlab ] || fail "rank 1's own session file is missing"
"$kvlab" runs two.kvlab --json >runs.json || fail "kvlab runs"
python3 - runs.json <<'PY' || fail "the target session does not hold rank 1's runs"
import json, sys
runs = json.load(open(sys.argv[1]))
assert len(runs) == 5, [r["name"] for r in runs]
assert all(r["status"] == "done" for r in runs), [(r["name"], r["status"]) for r in runs]
remote = [r for r in runs if r["summary"].get("dist", {}).get("rank") == 1]
assert remote and all(r["summary"]["dist"]["session"].endswith("two.rank1.kvlab") for r in remote), runs
print(f"{len(runs)} runs in the target, {len(remote)} of them run by rank 1")
PY
# Rerunning finds every cell done.
timeout 120 "${mpi[@]}" "$kvlab" sweep "${grid[@]}" --session two.kvlab >again.csv 2>again.log || { cat again.log; fail "rerun"; }
grep -q "rank 0 of 2: 0 cells to run" again.log && grep -q "rank 1 of 2: 0 cells to run" again.log || { cat again.log; fail "the rerun ran cells again"; }
diff <(table one.csv) <(table again.csv) || fail "the rerun's table differs"
echo "PASS"
