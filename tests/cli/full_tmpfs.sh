#!/usr/bin/env bash
# A real full disk (issue 17), as the issue found it: a 1.5 MiB tmpfs, mounted in a private
# mount namespace (unshare -rm, no root needed). The first run's telemetry fills it: the run
# stops (exit 1) and its end is recorded as `failed` with the cause; a second run with
# --telemetry.on_error continue finishes `degraded` (exit 3) although the file system is full;
# `runs` lists both with their causes. Without the space reserve (storage/space_reserve.h) an
# end record could find no room. SKIPPED (77) where user namespaces are not permitted;
# tests/cli/faults.sh checks the same with a file-size limit everywhere.
# usage: full_tmpfs.sh KVLAB WORKDIR
set -u
kvlab="$1"
work="$2"
rm -rf "$work"
mkdir -p "$work/mnt"
if ! unshare -rm true 2>/dev/null; then
  echo "SKIPPED: unshare -rm (user namespaces) is not permitted here; cli.faults covers this with a file-size limit"
  exit 77
fi
exec unshare -rm bash -s "$kvlab" "$work" <<'INNER'
set -u
kvlab="$1"
work="$2"
fail() {
  echo "FAIL: $*"
  exit 1
}
mount -t tmpfs -o size=1536k kvlab-full "$work/mnt" || fail "cannot mount a tmpfs in the namespace"
s="$work/mnt/full.kvlab"
common=(tiny --kv_cache.name h2o-default --kv_cache.cache_length 64 --kv_cache.chunk_size 16 --threads 1
        --telemetry.score_interval 1 --data.seq_length 4096 --data.num_samples 2 --session "$s")
"$kvlab" eval_long "${common[@]}" >"$work/stop.log" 2>&1
rc=$?
tail -2 "$work/stop.log"
[ "$rc" -eq 1 ] || fail "the run that filled the disk exited $rc, expected 1"
"$kvlab" eval_long "${common[@]}" --telemetry.on_error continue >"$work/continue.log" 2>&1
rc=$?
tail -2 "$work/continue.log"
[ "$rc" -eq 3 ] || fail "--telemetry.on_error continue on a full disk exited $rc, expected 3 (degraded)"
! grep -q "its end could not be recorded\|summary could not be written" "$work/stop.log" "$work/continue.log" ||
  fail "a run's end record did not fit on the full disk"
"$kvlab" runs "$s" >"$work/runs.log" 2>&1 || { cat "$work/runs.log"; fail "runs on the full disk"; }
cat "$work/runs.log"
grep -q "^run 1 failed: disk full while writing session $s: [0-9]* telemetry events\? lost" "$work/runs.log" ||
  fail "runs does not show run 1 failed with the cause"
grep -q "^run 2 degraded: disk full while writing session $s: [0-9]* telemetry events\? lost" "$work/runs.log" ||
  fail "runs does not show run 2 degraded with the cause"
echo "full_tmpfs: ok"
INNER
