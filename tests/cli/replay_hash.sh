#!/usr/bin/env bash
# Behaviour unchanged by refactors: the demo sweep's cells (scripts/run.sh: h2o, lastrec, tova
# x cache 256 and 512, chunk 64, the repeat task, 1024 tokens; on the random `tiny` model so it
# needs no asset) are run again and the SHA-256 of every run's replay log (each layer x chunk
# plan, as stored) must equal the hash committed in tests/fixtures/replay/demo_sweep_tiny.txt.
# The lowest CPU kernel variant and one thread make the float sums the policies rank by the
# same on every machine (AVX2 and AVX-512 sum in different orders). A change that alters a
# decision must say so by regenerating the fixture:
#     tests/cli/replay_hash.sh build/bin/kvlab /tmp/rh --update
# Usage: replay_hash.sh KVLAB SCRATCH_DIR [--update]
set -euo pipefail
kvlab="$1"
scratch="$2"
update="${3:-}"
here="$(cd "$(dirname "$0")" && pwd)"
fixture="$here/../fixtures/replay/demo_sweep_tiny.txt"
fail() { echo "replay_hash: FAIL: $*" >&2; exit 1; }
mkdir -p "$scratch"
session="$scratch/replay_hash.kvlab"
rm -f "$session" "$session"-wal "$session"-shm
KVLAB_CPU_VARIANT=base "$kvlab" sweep tiny --data repeat --data.repeat_length 64 --data.repeat_distance 384 \
  --data.seq_length 1024 --data.num_samples 1 --kv_cache.name h2o,lastrec,tova --kv_cache.cache_length 256,512 \
  --kv_cache.chunk_size 64 --threads 1 --session "$session" --figure none >/dev/null || fail "the demo sweep failed"

# One line per run: its cache name, cache length, layer x chunk steps, and the hash of its plans.
actual="$scratch/actual.txt"
: >"$actual"
runs=$("$kvlab" sql "$session" "SELECT DISTINCT run_id FROM cache_steps ORDER BY run_id" --format csv | tail -n +2)
[ -n "$runs" ] || fail "the sweep recorded no replay log"
for r in $runs; do
  name=$("$kvlab" sql "$session" "SELECT json_extract(config, '\$.kv_cache.name') || ' ' || json_extract(config, '\$.kv_cache.cache_length') FROM runs WHERE id = $r" --format csv | tail -n +2 | tr -d '"')
  steps=$("$kvlab" sql "$session" "SELECT count(*) FROM cache_steps WHERE run_id = $r" --format csv | tail -n +2)
  hash=$("$kvlab" sql "$session" "SELECT layer, chunk, pass, input_pos, num_tokens, cache_length, hex(replay_log) FROM cache_steps WHERE run_id = $r ORDER BY pass, layer, chunk" --format csv | sha256sum | cut -d' ' -f1)
  echo "$name $steps $hash" >>"$actual"
done
sort -o "$actual" "$actual"
if [ "$update" = --update ]; then
  cp "$actual" "$fixture"
  echo "replay_hash: wrote $fixture"
  exit 0
fi
[ -f "$fixture" ] || fail "no fixture $fixture (run with --update to write it)"
if ! diff -u "$fixture" "$actual"; then
  fail "a replay log differs from the committed one (above: - committed, + now); if the change is meant, regenerate with --update and say why in the commit"
fi
echo "replay_hash: ok ($(wc -l <"$actual") runs identical)"
