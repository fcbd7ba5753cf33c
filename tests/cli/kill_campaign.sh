#!/usr/bin/env bash
# SIGKILL at random points of CLI runs into one session (issue 17): after N kills (default 100)
# the session passes PRAGMA integrity_check, no run is left queued or running (each killed run
# is marked crashed, or done when it finished before the kill), and the earlier runs are
# unchanged. usage: kill_campaign.sh KVLAB WORKDIR [KILLS]
set -u
kvlab="$1"
work="$2"
kills="${3:-100}"
rm -rf "$work"
mkdir -p "$work"
s="$work/killed.kvlab"
fail() {
  echo "FAIL: $*"
  exit 1
}
args=(eval_long tiny --data.seq_length 256 --data.num_samples 1 --kv_cache.name h2o-default --kv_cache.cache_length 32
      --kv_cache.chunk_size 16 --threads 1 --session "$s")
"$kvlab" "${args[@]}" >"$work/first.log" 2>&1 || { cat "$work/first.log"; fail "the first run failed"; }
"$kvlab" runs "$s" --json >"$work/before.json" || fail "runs (before)"
start=$(date +%s)
RANDOM=17  # the same kill points every time
for i in $(seq 1 "$kills"); do
  "$kvlab" "${args[@]}" >/dev/null 2>&1 &
  pid=$!
  # 0 .. 0.6 s: before the session opens, while queued, loading, running, finishing.
  sleep "0.$(printf '%03d' $(( RANDOM % 600 )))"
  kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
done
echo "kill_campaign: $kills kills in $(( $(date +%s) - start )) s"
"$kvlab" runs "$s" --json >"$work/after.json" 2>"$work/runs.err" || { cat "$work/runs.err"; fail "runs (after)"; }
python3 - "$s" "$work/before.json" "$work/after.json" <<'PY' || fail "session checks"
import json, sqlite3, sys
path, before, after = sys.argv[1], json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
ok = db.execute("PRAGMA integrity_check").fetchone()[0]
assert ok == "ok", f"integrity_check: {ok}"
assert after[0] == before[0], f"the earlier run changed:\n{before[0]}\n{after[0]}"
statuses = {}
for r in after[1:]:
    statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    assert r["status"] in ("crashed", "done"), f"run {r['id']} is {r['status']} after the kills"
    if r["status"] == "crashed":
        assert "ended" in r.get("error", ""), f"run {r['id']} crashed without saying how: {r}"
print(f"kill_campaign: {len(after) - 1} runs recorded after the kills: {statuses}")
PY
# The table names where a killed run stopped ("crashed at N% (...)"), never a bare percentage.
"$kvlab" runs "$s" >"$work/runs.txt" 2>&1 || fail "runs (text)"
python3 - "$work/after.json" "$work/runs.txt" <<'PY' || fail "runs table"
import json, re, sys
after, text = json.load(open(sys.argv[1])), open(sys.argv[2]).read()
seen = 0
for r in after:
    p = r.get("progress") or {}
    if r["status"] != "crashed" or not p.get("tokens_total"):
        continue
    line = next(l for l in text.splitlines() if re.match(rf"^ *{r['id']} ", l))
    pct = int(100 * p["tokens_done"] / p["tokens_total"])  # floored, as the table prints it
    assert f"crashed at {pct}% (" in line, f"run {r['id']}: {line!r}"
    seen += 1
print(f"kill_campaign: {seen} crashed runs with progress say where they stopped")
PY
echo "kill_campaign: ok"
