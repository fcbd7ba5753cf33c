#!/usr/bin/env bash
# Faults that must be loud (issue 17), end to end through the CLI: a file-size limit (ulimit -f,
# standing in for a full disk) while a run records telemetry stops the run with one line naming
# the cause and a non-zero exit; with --telemetry.on_error continue the run finishes `degraded`
# (exit 3); `runs` and `compare` list the session under the same limit; `export` refuses the
# incomplete run unless --allow-incomplete; the earlier run is unchanged.
# usage: faults.sh KVLAB WORKDIR
set -u
kvlab="$1"
work="$2"
rm -rf "$work"
mkdir -p "$work"
s="$work/full.kvlab"
fail() {
  echo "FAIL: $*"
  exit 1
}
common=(tiny --kv_cache.name h2o-default --kv_cache.cache_length 64 --kv_cache.chunk_size 16 --threads 1
        --telemetry.score_interval 1)
"$kvlab" eval_long "${common[@]}" --data.seq_length 256 --data.num_samples 1 --session "$s" >"$work/first.log" 2>&1 ||
  { cat "$work/first.log"; fail "the first run failed"; }
"$kvlab" runs "$s" --json >"$work/before.json" || fail "runs (before)"
cp "$s" "$work/first.kvlab"
size=$(stat -c %s "$s")
limit_kib=$(( size / 1024 + ${KVLAB_FAULTS_SLACK_KIB:-96} ))
# Under the limit: SIGXFSZ ignored (kvlab ignores it too) so writes fail with EFBIG.
limited() { ( trap '' XFSZ; ulimit -f "$limit_kib"; exec "$kvlab" "$@" ); }

limited eval_long "${common[@]}" --data.seq_length 4096 --data.num_samples 2 --session "$s" >"$work/stop.log" 2>&1
rc=$?
cat "$work/stop.log" | tail -3
[ "$rc" -ne 0 ] || fail "a run that lost its telemetry exited 0"
grep -q "disk full\( or I/O error\)\? while writing session $s\(: \| (.*): \)[0-9]* telemetry events\? lost" "$work/stop.log" ||
  fail "no line naming the cause (stop)"

# --telemetry.on_error continue on a copy of the session as it was after run 1 (the stop run
# above filled the original up to its limit): the run finishes degraded with exit 3. Its end
# record always fits: telemetry stops while the space reserve is still free
# (storage/space_reserve.h), so neither run may end "its end could not be recorded".
c="$work/continue.kvlab"
cp "$work/first.kvlab" "$c"
limited eval_long "${common[@]}" --data.seq_length 4096 --data.num_samples 2 --telemetry.on_error continue \
  --session "$c" >"$work/continue.log" 2>&1
rc=$?
cat "$work/continue.log" | tail -3
cause="disk full\( or I/O error\)\? while writing session $c\(: \| (.*): \)[0-9]* telemetry events\? lost"
! grep -q "its end could not be recorded\|summary could not be written" "$work/stop.log" "$work/continue.log" ||
  fail "a run's end record did not fit (the space reserve did not hold)"
[ "$rc" -eq 3 ] || fail "--telemetry.on_error continue: exit $rc, expected 3 (degraded)"
grep -q "run 2 degraded: $cause" "$work/continue.log" || fail "no line naming the cause (continue)"
grep -q "^result: " "$work/continue.log" || fail "the degraded run printed no result"

# Read-only paths need no space: list and compare under the same limit.
limited runs "$s" >"$work/runs.log" 2>&1 || { cat "$work/runs.log"; fail "runs under the limit"; }
cat "$work/runs.log"
grep -Eq "^ +2 .* failed " "$work/runs.log" || fail "runs does not show run 2 failed"
grep -q "^run 2 failed: disk full" "$work/runs.log" || fail "runs does not say why run 2 failed"
limited runs "$c" >"$work/runs_c.log" 2>&1 || { cat "$work/runs_c.log"; fail "runs under the limit (continue)"; }
cat "$work/runs_c.log"
grep -Eq "^ +2 .* degraded " "$work/runs_c.log" || fail "runs does not show run 2 degraded"
grep -q "^run 2 degraded: disk full" "$work/runs_c.log" || fail "runs does not say why run 2 is degraded"
limited compare "$c" 1 2 >"$work/compare.log" 2>&1 || { cat "$work/compare.log"; fail "compare under the limit"; }
grep -q "degraded" "$work/compare.log" || fail "compare does not show the degraded status"
limited compare "$s" 1 2 >"$work/compare_s.log" 2>&1 || { cat "$work/compare_s.log"; fail "compare under the limit (stop)"; }
grep -Eq "^2 +failed " "$work/compare_s.log" || fail "compare does not show run 2 failed"

# Export refuses a run with lost events (run 2 of the stopped session).
"$kvlab" export "$s" --run 2 --what memory --format csv -o "$work/x.csv" >"$work/export.log" 2>&1
rc=$?
[ "$rc" -ne 0 ] || fail "export of an incomplete run exited 0"
grep -q "run 2 of session '$s' is incomplete: [0-9]* telemetry events lost" "$work/export.log" ||
  { cat "$work/export.log"; fail "export does not name what is missing"; }
[ ! -e "$work/x.csv" ] || fail "export wrote a file although it refused"
"$kvlab" export "$s" --run 2 --what memory --format csv -o "$work/x.csv" --allow-incomplete >"$work/export2.log" 2>&1 ||
  { cat "$work/export2.log"; fail "export --allow-incomplete"; }
grep -q "warning: run 2 is incomplete" "$work/export2.log" || fail "export --allow-incomplete did not warn"

# The earlier run is unchanged.
"$kvlab" runs "$s" --json >"$work/after.json" || fail "runs (after)"
python3 - "$work/before.json" "$work/after.json" <<'PY' || fail "the earlier run changed"
import json, sys
a = json.load(open(sys.argv[1]))[0]
b = json.load(open(sys.argv[2]))[0]
assert a == b, (a, b)
PY
echo "faults: ok"
