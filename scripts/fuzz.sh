#!/usr/bin/env bash
# Build the libFuzzer targets with clang (separate project in build/fuzz) and run one or all
# of them for a bounded time: scripts/fuzz.sh [NAME] [SECONDS] [RUNS]. With RUNS, each target
# executes exactly that many inputs (the suite's fixed count: the same work on every machine),
# SECONDS still capping it. Exit 0 when clean.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
name="${1:-all}"
secs="${2:-20}"
runs="${3:-}"
bdir="${KVLAB_FUZZ_BUILD:-$root/build/fuzz}"
if ! command -v clang++ >/dev/null 2>&1; then
  echo "fuzz: clang++ not found; install clang (scripts/setup.sh does)" >&2
  exit 1
fi
# One configure/build at a time (ctest may start several fuzz tests in parallel).
exec 9>"$bdir.lock" 2>/dev/null || { mkdir -p "$(dirname "$bdir")"; exec 9>"$bdir.lock"; }
flock 9
if [ ! -f "$bdir/CMakeCache.txt" ]; then
  CXX=clang++ cmake -S "$root/fuzz" -B "$bdir" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
cmake --build "$bdir" -j "$(nproc)" >/dev/null
flock -u 9
run_one() {
  local n="$1"
  local corpus="$root/fuzz/corpus/$n"
  local work
  work=$(mktemp -d)
  [ -d "$corpus" ] && cp -r "$corpus/." "$work/" 2>/dev/null || true
  local limit=(-max_total_time="$secs")
  if [ -n "$runs" ]; then
    limit+=(-runs="$runs" -seed=1)
    echo "fuzz: $n for $runs inputs (at most ${secs}s)"
  else
    echo "fuzz: $n for ${secs}s"
  fi
  "$bdir/$n" "${limit[@]}" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 "$work" 2>&1 | tail -4
  rm -rf "$work"
}
if [ "$name" = "all" ]; then
  for f in "$bdir"/*_fuzz; do run_one "$(basename "$f")"; done
else
  run_one "$name"
fi
