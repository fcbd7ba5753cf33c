#!/usr/bin/env bash
# The sanitizer job: an AddressSanitizer + UndefinedBehaviorSanitizer build (build/asan) of the
# storage and sessions test suites and the CLI, then those suites and a CLI session round trip
# (a recorded tiny-model run, a generation, runs, compare, export) under the sanitizers. Lean on
# purpose, to keep the suite's time modest: one native kernel variant, no CUDA, no GUI, -O1; the
# engine is exercised through the sessions tests and the CLI runs rather than its own suite.
# usage: scripts/sanitize.sh [GTEST_FILTER]. Exit 0 when clean.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bdir="${KVLAB_ASAN_BUILD:-$root/build/asan}"
filter="${1:-*}"
start=$(date +%s)
if [ ! -f "$bdir/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$bdir" -DKVLAB_SANITIZE=ON -DKVLAB_NATIVE=ON -DKVLAB_CUDA=OFF -DKVLAB_GUI=OFF \
    -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS="-O1 -g -fno-sanitize-recover=undefined" >/dev/null
fi
cmake --build "$bdir" -j "$(nproc 2>/dev/null || echo 2)" --target kvlab kvlab_storage_tests kvlab_sessions_tests 2>&1 |
  grep -E "error|warning" || true
built=$(date +%s)
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export OMP_WAIT_POLICY=PASSIVE KVLAB_NO_REEXEC=1
# The storage benchmark test sizes itself for a release build; it adds nothing here.
"$bdir/bin/kvlab_storage_tests" --gtest_filter="$filter:-StorageBench*" --gtest_brief=1
"$bdir/bin/kvlab_sessions_tests" --gtest_filter="$filter" --gtest_brief=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
kv="$bdir/bin/kvlab"
s="$work/asan.kvlab"
"$kv" eval_long tiny --data.seq_length 128 --data.num_samples 1 --kv_cache.name h2o-default --kv_cache.cache_length 32 \
  --kv_cache.chunk_size 16 --threads 2 --session "$s" >/dev/null
"$kv" generate tiny --prompt hello --max_new_tokens 8 --threads 2 --session "$s" >/dev/null
"$kv" runs "$s" >/dev/null
"$kv" compare "$s" 1 2 >/dev/null
"$kv" export "$s" --run 1 --what all --format chrome-trace -o "$work/t.json" >/dev/null
if "$kv" compare "$s" 999 >/dev/null 2>&1; then echo "sanitize: compare of an unknown run exited 0" >&2; exit 1; fi
echo "sanitize: clean (build $((built - start)) s, tests $(($(date +%s) - built)) s)"
