#!/usr/bin/env bash
# Reproduces docs/RESULTS.md: SmolLM2-135M (GGUF, assets/cache) on real English text and on
# passkey retrieval, dense vs every cache policy x buffer x cache length, all recorded in one
# session file; then tools/results/make_results_table.py writes the perplexity and passkey tables,
# and kvlab sweep / kvlab plot the repeat task's tables and figure.
#   scripts/results.sh [SESSION]       (default results/results.kvlab; runs already in it are skipped)
# About 2 hours on 2 cores. Needs the build (scripts/setup.sh) and the model (scripts/fetch_assets.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
KVLAB=${KVLAB:-build/bin/kvlab}
SESSION=${1:-results/results.kvlab}
mkdir -p "$(dirname "$SESSION")"
TEXT=/usr/share/common-licenses/GPL-3,/usr/share/common-licenses/GFDL-1.3  # GPL-3 is 7640 tokens; GFDL tops it up to 8192
# smart-lastrec is left out: it protects a prompt prefix found by a regex, which plain text has not.
POLICIES="lastrec h2o h2o-orig h2o-vlen qh2o qh2o-vlen streaming tova snapkv knorm"

have_run() {  # name
  [ -f "$SESSION" ] && "$KVLAB" runs "$SESSION" --json | python3 -c "import json,sys; n=sys.argv[1]; sys.exit(0 if any(r['name']==n and r['status']=='done' for r in json.load(sys.stdin)) else 1)" "$1"
}

run() {  # name, then eval_long arguments
  local name=$1; shift
  if have_run "$name"; then echo "results: $name already in $SESSION"; return; fi
  echo "results: $name"
  "$KVLAB" eval_long smollm2-135m "$@" --session "$SESSION" --name "$name" --telemetry.enabled false 2>&1 | grep -E "^result|error" || true
}

# Perplexity on 8192 tokens of license text, chunk size 128.
for buf in default q8 q4; do
  run "ppl dense-$buf" --data text --data.files "$TEXT" --data.seq_length 8192 --data.num_samples 1 \
      --kv_cache.name "dense-$buf" --kv_cache.chunk_size 128
done
for L in 512 1024 2048; do
  for buf in default q8 q4; do
    for pol in $POLICIES; do
      case "$pol-$buf" in qh2o-default|qh2o-vlen-default) continue ;; esac  # qh2o needs quantized buffers
      run "ppl $pol-$buf L=$L" --data text --data.files "$TEXT" --data.seq_length 8192 --data.num_samples 1 \
          --kv_cache.name "$pol-$buf" --kv_cache.cache_length "$L" --kv_cache.chunk_size 128
    done
  done
done

# Passkey retrieval: 4 samples per length, cache 1024 (dense: the whole sequence).
for T in 2048 8192; do
  run "passkey dense T=$T" --data passkey --data.seq_length "$T" --data.num_samples 4 --kv_cache.name dense-default \
      --kv_cache.chunk_size 128
  for pol in lastrec h2o snapkv; do
    run "passkey $pol T=$T" --data passkey --data.seq_length "$T" --data.num_samples 4 --kv_cache.name "$pol-default" \
        --kv_cache.cache_length 1024 --kv_cache.chunk_size 128
  done
done

# Repeat task (docs/RESULTS.md, "Repeat task"): one kvlab sweep into the same session (cells it
# already holds are skipped), its tables as Markdown and the figure.
repeat=(smollm2-135m --data repeat --data.seq_length 1024 --data.num_samples 2 --data.repeat_length 64
        --data.repeat_distance 384,896 --kv_cache.name h2o,lastrec,tova,snapkv --kv_cache.cache_length 256,512
        --kv_cache.chunk_size 64 --telemetry.enabled false --session "$SESSION")
"$KVLAB" sweep "${repeat[@]}" --format md --figure none > results/repeat.copy.md
"$KVLAB" sweep "${repeat[@]}" --format md --figure none --metric mean_loss > results/repeat.loss.md
"$KVLAB" sweep smollm2-135m --data repeat --data.seq_length 1024 --data.num_samples 2 --data.repeat_length 64 \
  --data.repeat_distance 384 --data.seed 7,99 --kv_cache.name h2o,lastrec,tova,snapkv --kv_cache.cache_length 256,512 \
  --kv_cache.chunk_size 64 --telemetry.enabled false --session "$SESSION" --format md --figure none > results/repeat.seeds.md
"$KVLAB" sweep smollm2-135m --data repeat --data.seq_length 1024,2048,4096 --data.num_samples 2 --data.repeat_length 64 \
  --data.repeat_distance 384,-1 --kv_cache.name dense --kv_cache.chunk_size 64 --telemetry.enabled false \
  --session "$SESSION" --format md --figure none > results/repeat.dense_lengths.md
"$KVLAB" plot "$SESSION" --y copy_token_accuracy --facet data.repeat_distance --where "data.seed=1234;data.seq_length=1024;data.repeat_distance=384|896" \
  --title "SmolLM2-135M, repeat task (1024 tokens, 64-token passage)" -o docs/figures/repeat_smollm2.svg
echo "results: repeat tables in results/repeat.copy.md, results/repeat.loss.md, results/repeat.seeds.md, results/repeat.dense_lengths.md; figure docs/figures/repeat_smollm2.svg"

python3 tools/results/make_results_table.py "$SESSION" --kvlab "$KVLAB" > results/RESULTS.tables.md
echo "results: tables in results/RESULTS.tables.md (session $SESSION)"
