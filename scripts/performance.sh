#!/usr/bin/env bash
# Regenerates docs/PERFORMANCE.md: runs every `kvlab bench` benchmark once with the sizes below
# (about 20 minutes on 2 cores) and assembles their Markdown sections (`--md`) under a fixed
# introduction. A benchmark that needs what this machine lacks (a CUDA device, mpirun, the
# SmolLM2 model file) gets one "not measured here" line instead of a table.
#   scripts/performance.sh [--quick] [--out FILE]
#     --quick     tiny sizes (seconds; the ctest cli.performance_doc checks the assembly with it)
#     --out FILE  write there instead of docs/PERFORMANCE.md
# KVLAB (default build/bin/kvlab) names the binary; KVLAB_ASSETS where the model file is.
set -euo pipefail
QUICK=0
OUT=
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --out) OUT=${2:?--out: expected a file path}; shift ;;
    *) echo "performance.sh: unknown argument '$1'; expected --quick or --out FILE" >&2; exit 2 ;;
  esac
  shift
done
# Paths given by the caller are relative to where it ran; the rest to the repository.
[ -n "${KVLAB:-}" ] && KVLAB=$(realpath -m "$KVLAB")
[ -n "$OUT" ] && OUT=$(realpath -m "$OUT")
cd "$(dirname "$0")/.."
KVLAB=${KVLAB:-build/bin/kvlab}
OUT=${OUT:-docs/PERFORMANCE.md}
[ -x "$KVLAB" ] || { echo "performance.sh: $KVLAB is not an executable; build kvlab first or set KVLAB" >&2; exit 2; }
# The caption's commit: the tree measured, even if the build was configured at an older one.
KVLAB_COMMIT=$(git describe --always --dirty 2>/dev/null || echo unknown)
export KVLAB_COMMIT
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
MD=$WORK/sections.md
: > "$MD"
FAILED=0

# Sizes: the full set, or --quick's tiny one (same benchmarks, same assembly).
if [ $QUICK = 1 ]; then
  OPS=(--quick --min_seconds 0.01)
  MODEL=(--model tiny --dtype f32 --prefill_tokens 64 --decode_context 128 --min_seconds 0.01)
  CACHE=(--model tiny --context 512 --cache_length 128 --chunk 32 --min_seconds 0.01)
  POLICIES=(--model tiny --tokens 96 --cache_length 32 --chunk 16 --repeats 1 --cache h2o,snapkv)
  KIVI=(--quick --min_seconds 0.01 --repeats 1)
  QUEST=(--quick --min_seconds 0.01)
  TELEMETRY=(--quick --repeats 1 --query_rows 20000 --dir "$WORK")
  GRAD=(--model tiny --tokens 128 --cache_length 64 --chunk 16)
  FIDELITY=(--model tiny --tokens 128 --chunk 16 --cache h2o-default --cache_length 32 --repeats 1 --dir "$WORK")
  SWEEP=(--model tiny --tokens 128 --chunk 16 --cache_length 32 --repeats 1 --dir "$WORK")
  DIST=(--model tiny --tokens 256 --steps 1 --sizes 64KiB --min_seconds 0.01)
  TRACE=(--quick)
  GUI_TRACE=(--bench-spans 100000 --frames 5)
  FAMILIES=(--quick)
  GGUF_MODEL=(--dtype packed --prefill_tokens 32 --decode_context 64 --min_seconds 0.01)
else
  OPS=(--min_seconds 0.3)
  MODEL=(--model qwen2.5-0.5b --dtype f32,bf16 --prefill_tokens 512 --decode_context 2048)
  CACHE=(--model qwen2.5-0.5b --context 8192 --cache_length 2048 --chunk 256)
  POLICIES=(--repeats 3)  # its defaults: SmolLM2-135M, 2048 tokens, cache 512, chunk 128
  KIVI=()
  QUEST=()
  TELEMETRY=(--repeats 2 --query_rows 2000000 --dir "$WORK")
  GRAD=(--model small --tokens 4096 --cache_length 1024 --chunk 256)
  FIDELITY=(--model small --tokens 2048 --chunk 128 --cache h2o-default --cache_length 512 --repeats 2 --dir "$WORK")
  SWEEP=(--model small --tokens 2048 --chunk 128 --cache_length 512 --repeats 2 --dir "$WORK")
  DIST=(--model tiny --tokens 256 --steps 3 --sizes 64KiB,1MiB,16MiB)
  TRACE=()
  GUI_TRACE=()
  FAMILIES=(--model small --tokens 512 --repeats 5)
  GGUF_MODEL=(--dtype f32,packed --prefill_tokens 512 --decode_context 2048)
fi

# One benchmark: its section, then the command that produced it (a failure becomes a line too).
bench() {
  local title=$1; shift
  # The command as the doc shows it: the binary as `kvlab`, the temporary folder as /tmp.
  local shown="$*"
  shown=${shown//$KVLAB/kvlab}
  shown=${shown//$WORK//tmp}
  echo "performance.sh: $shown" >&2
  local start=$SECONDS
  if "$@" --md "$MD" > "$WORK/last.txt" 2> "$WORK/last.err"; then
    printf 'Command: `%s`\n\n' "$shown" >> "$MD"
    echo "performance.sh:   $((SECONDS - start)) s" >&2
  else
    FAILED=1
    local why
    why=$(grep -m 1 'error' "$WORK/last.err" || tail -n 1 "$WORK/last.err")
    printf '## %s\n\nnot measured here: `%s` failed: %s\n\n' "$title" "$shown" "$why" >> "$MD"
    echo "performance.sh:   failed: $why" >&2
  fi
}
not_here() { printf '## %s\n\nnot measured here: %s\n\n' "$1" "$2" >> "$MD"; }

bench "Ops" "$KVLAB" bench ops "${OPS[@]}"
bench "Model prefill and decode" "$KVLAB" bench model "${MODEL[@]}"
ASSETS=${KVLAB_ASSETS:-assets/cache}
if [ -f "$ASSETS/SmolLM2-135M-Instruct.Q4_1.gguf" ]; then
  KVLAB_ASSETS=$ASSETS bench "Model prefill and decode, GGUF" "$KVLAB" bench model smollm2-135m "${GGUF_MODEL[@]}"
else
  not_here "Model prefill and decode, GGUF (SmolLM2-135M Q4_1)" \
    "no $ASSETS/SmolLM2-135M-Instruct.Q4_1.gguf (scripts/fetch_assets.sh, or KVLAB_ASSETS)."
fi
bench "Architecture families" "$KVLAB" bench families "${FAMILIES[@]}"
bench "Cache" "$KVLAB" bench cache "${CACHE[@]}"
bench "KV policies" "$KVLAB" bench policies "${POLICIES[@]}"
bench "KIVI decode attention" "$KVLAB" bench kivi "${KIVI[@]}"
bench "Quest decode attention" "$KVLAB" bench quest "${QUEST[@]}"
bench "Telemetry" "$KVLAB" bench telemetry "${TELEMETRY[@]}"
bench "Gradient step" "$KVLAB" bench grad "${GRAD[@]}"
bench "Fidelity tracking" "$KVLAB" bench fidelity "${FIDELITY[@]}"
bench "Sweep" "$KVLAB" bench sweep "${SWEEP[@]}"
# The trace view on ten million spans: rendered by the app's own OpenGL host (llvmpipe under
# Xvfb) where it can be, else ImGui's CPU side alone (`kvlab bench trace`, the same frames and
# summary without a renderer). The views (and so both) are built with the GUI.
GUI=$(dirname "$KVLAB")/kvlab-gui
if [ ! -x "$GUI" ]; then
  not_here "Trace view (\`kvlab bench trace\`)" "this build has no views (built without Dear ImGui)."
elif ! command -v xvfb-run > /dev/null; then
  bench "Trace view" "$KVLAB" bench trace "${TRACE[@]}"
else
  bench "Trace view, rendered" xvfb-run -a -s "-screen 0 1920x1200x24" "$GUI" --bench-frames --bench-only trace "${GUI_TRACE[@]}"
fi
if ! command -v mpirun > /dev/null; then
  not_here "Data-parallel communication (\`kvlab bench dist\`)" "no mpirun on this machine (docs/DISTRIBUTED.md)."
elif ! "$KVLAB" version | grep -q '^dist backends:.*\bmpi\b'; then
  not_here "Data-parallel communication (\`kvlab bench dist\`)" "this build has no MPI backend (docs/DISTRIBUTED.md)."
else
  # Root may only start ranks when told to (containers, CI).
  ROOT_OK=(); [ "$(id -u)" = 0 ] && ROOT_OK=(--allow-run-as-root)
  bench "Data-parallel communication" mpirun "${ROOT_OK[@]}" --oversubscribe -np 2 "$KVLAB" bench dist "${DIST[@]}"
fi
not_here "GUI frames of the other views (\`kvlab-gui --bench-frames\`)" \
  "the eviction map, memory timeline and live-run frames (target <= 33 ms per frame) print text only; run \`xvfb-run -a kvlab-gui --bench-frames\` by hand."
if "$KVLAB" version | grep -q '^cuda backend: built, [0-9]'; then
  not_here "GPU kernels" "the CUDA benchmark (kvlab_gpu_bench) writes no Markdown table; run it by hand."
else
  not_here "GPU kernels" "no CUDA device ($("$KVLAB" version | sed -n 's/^cuda backend: //p'))."
fi

{
  cat <<'INTRO'
# Performance

Every table below is written by one of kvlab's own benchmarks, which time our code against a
baseline measured in the same run on the same machine (a raw oneDNN matmul, a streaming triad, the
lastrec policy, plain SQLite inserts, an untraced run, a forward-only pass): the ratios are what a
table is about, absolute times only give the scale. Each caption names the CPU, the CPU kernel
variant (`kvlab version`), the date and the commit. `scripts/performance.sh` regenerates this file
(about 20 minutes on 2 cores); under each table is the command that made it, which also prints the
table, writes it as CSV (`--csv FILE`) and appends it as Markdown (`--md FILE`).
INTRO
  echo
  cat "$MD"
} | sed -e :a -e '/^\n*$/{$d;N;ba' -e '}' > "$OUT"
echo "performance.sh: wrote $OUT ($(wc -l < "$OUT") lines)" >&2
exit $FAILED
