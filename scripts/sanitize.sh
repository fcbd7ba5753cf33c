#!/usr/bin/env bash
# The sanitizer job (issue 17): an AddressSanitizer + UndefinedBehaviorSanitizer build (build/asan,
# or $KVLAB_ASAN_BUILD) of the CLI and the engine, storage, sessions and CLI-unit suites, then
# those suites and CLI runs under the sanitizers: a recorded tiny-model session round trip
# (eval, paged eval, generate, runs, compare, export) and the full-disk fault script
# (tests/cli/faults.sh). CI (.ci/run) runs all of it. Portable, like a release build, so the
# code under test is the same on every CPU and every kernel path the CPU runs is exercised: the
# x86-64-v2 baseline, the avx2 / avx512 / avx512bf16 kernel variant libraries the CPU can run
# (only those are built; each op case of each against the f64 reference), the policies' ISA levels, and their
# products compiled as one AVX-512 unit (what -march=native makes on an AVX-512 CPU; issue 45).
# The kernels part prints which paths ran. Lean otherwise, to fit CI: no CUDA, no GUI, -O1 -g1
# (line tables: enough for the reports' stack traces), only the targets it runs; the engine
# suite leaves out the cases that load the 135M model, time themselves or check gradients by
# finite differences (ENGINE_SKIP). The fuzz targets are sanitized builds of their own
# (scripts/fuzz.sh: clang, ASan + UBSan + libFuzzer) and run in the main suite (ctest -L fuzz).
# KVLAB_SANITIZE_SUITES picks parts (default "storage sessions kernels engine cli").
# usage: scripts/sanitize.sh [GTEST_FILTER]. Exit 0 when clean; any sanitizer report fails it
# (halt_on_error, and ctest's FAIL_REGULAR_EXPRESSION when run as sanitize.asan_ubsan). The last
# line is a summary with the build and test times.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bdir="${KVLAB_ASAN_BUILD:-$root/build/asan}"
filter="${1:-*}"
start=$(date +%s)
cpu_has() {  # FLAG...: the CPU reports every flag
  local f; for f in "$@"; do grep -qw "$f" /proc/cpuinfo 2>/dev/null || return 1; done
}
# The kernel variant libraries this CPU may run (its flags include the variant's): the others
# could never load here, so the sanitized build leaves them out (on a CPU without AVX-512, two
# of the three).
cpu_variants=()
cpu_has avx512f avx512bw avx512cd avx512dq avx512vl avx512_bf16 && cpu_variants+=(avx512bf16)
cpu_has avx512f avx512bw avx512cd avx512dq avx512vl && cpu_variants+=(avx512)
cpu_has avx avx2 fma f16c bmi1 bmi2 && cpu_variants+=(avx2)
variant_list=$(IFS=';'; echo "${cpu_variants[*]}")
# A tree configured by an earlier version of this script (-DKVLAB_NATIVE=ON) is reconfigured.
if [ ! -f "$bdir/CMakeCache.txt" ] || grep -q '^KVLAB_NATIVE:BOOL=ON' "$bdir/CMakeCache.txt"; then
  cmake -S "$root" -B "$bdir" -DKVLAB_SANITIZE=ON -DKVLAB_NATIVE=OFF -DKVLAB_CUDA=OFF -DKVLAB_GUI=OFF \
    -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS="-O1 -g1 -fno-sanitize-recover=undefined" \
    -DKVLAB_CPU_VARIANTS="$variant_list" >/dev/null
elif ! grep -qx "KVLAB_CPU_VARIANTS:STRING=$variant_list" "$bdir/CMakeCache.txt"; then
  cmake -S "$root" -B "$bdir" -DKVLAB_CPU_VARIANTS="$variant_list" >/dev/null
fi
suites=" ${KVLAB_SANITIZE_SUITES:-storage sessions kernels engine cli} "
want() { [[ "$suites" == *" $1 "* ]]; }
targets=()
want storage && targets+=(kvlab_storage_tests)
want sessions && targets+=(kvlab_sessions_tests kvlab)  # its sweep and fidelity cases run the CLI
# The kernel variant libraries are loaded at run time by every suite that computes.
variants=()
for v in "${cpu_variants[@]}"; do variants+=("kvlab_cpu_$v"); done
want kernels && targets+=(kvlab_kernel_tests kvlab kvlab_policy_math_v4_tests "${variants[@]}")
want engine && targets+=(kvlab_engine_tests "${variants[@]}")
want cli && targets+=(kvlab kvlab_cli_unit_tests "${variants[@]}")
[ ${#targets[@]} -gt 0 ] || { echo "sanitize: KVLAB_SANITIZE_SUITES='$suites' names no suite; expected storage, sessions, kernels, engine or cli" >&2; exit 2; }
mapfile -t targets < <(printf '%s\n' "${targets[@]}" | awk '!seen[$0]++')
if ! cmake --build "$bdir" -j "$(nproc 2>/dev/null || echo 2)" --target "${targets[@]}" >"$bdir/build.log" 2>&1; then
  grep -E "error|Error" "$bdir/build.log" | head -40 >&2
  echo "sanitize: the sanitized build failed (log: $bdir/build.log)" >&2
  exit 1
fi
built=$(date +%s)
# Leaks too; the first report stops the process with a non-zero exit.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export LSAN_OPTIONS="suppressions=$root/scripts/sanitize.supp:print_suppressions=0"
export OMP_WAIT_POLICY=PASSIVE KVLAB_NO_REEXEC=1
times=""
mark=$built
phase() {  # PART: seconds since the last phase, kept for the summary line
  local now; now=$(date +%s)
  echo "sanitize: $1 done ($((now - mark)) s)"
  times="$times, $1 $((now - mark)) s"
  mark=$now
}
current="the build"
# The suites' cases are independent (ctest runs them two at a time in the main suite), so each
# suite runs as one gtest shard per core: the sanitized cases are single-threaded arithmetic,
# and one process at a time left half of a two-core machine idle.
shards=$(nproc 2>/dev/null || echo 2); [ "$shards" -ge 1 ] || shards=1
gtest_sharded() {  # BINARY FILTER: the suite's shards in parallel; their output in order, then the status
  local bin=$1 filt=$2 i rc=0 out; out=$(mktemp -d)
  local pids=()
  for ((i = 0; i < shards; i++)); do
    GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i "$bin" --gtest_filter="$filt" --gtest_brief=1 \
      >"$out/$i" 2>&1 &
    pids+=($!)
  done
  for ((i = 0; i < shards; i++)); do wait "${pids[$i]}" || rc=$?; done
  for ((i = 0; i < shards; i++)); do cat "$out/$i"; done
  rm -rf "$out"
  return $rc
}
summary() {  # RC: the exit status
  local rc=$1 now; now=$(date +%s)
  local parts; parts=$(echo $suites)
  if [ "$rc" -eq 0 ]; then
    echo "sanitize: clean ($parts): build $((built - start)) s, tests $((now - built)) s (${times#, })"
  elif [ -n "${built:-}" ]; then
    echo "sanitize: FAILED in $current (exit $rc; $parts): build $((built - start)) s, tests $((now - built)) s" >&2
  fi
}
trap 'summary $?' EXIT

if want storage; then
  current="the storage suite"
  # The storage benchmark sizes itself for a release build; it adds nothing here.
  gtest_sharded "$bdir/bin/kvlab_storage_tests" "$filter:-StorageBench*"
  phase storage
fi
if want sessions; then
  current="the sessions suite"
  gtest_sharded "$bdir/bin/kvlab_sessions_tests" "$filter"
  phase sessions
fi
# Left out: cases on the 135M model (SmolLM2*, PolicyOnSmollm2*: minutes under ASan, the latter
# 200 s for one forward and 19 methods' f64 references; the CLI runs cover the loaders and the
# policies run on tiny here), self-timing benchmarks, and gradient checks by finite differences
# (pure arithmetic over many full passes, already covered by the release suite, and slow under ASan).
ENGINE_SKIP="SmolLM2*:PolicyOnSmollm2*:*Speed*:*Gradient*:GradFixture*:GradLossNormalisation*:TrainLoop*"
if want kernels; then
  current="the kernels suite"
  # Each op case of every kernel variant the CPU runs against the f64 reference, the variants'
  # bit-identity where the ops promise it, and the start-up choice (finite-difference checks
  # left out, as in the engine suite).
  gtest_sharded "$bdir/bin/kvlab_kernel_tests" "$filter:-BackwardFd*"
  # The policies' products as one AVX-512 unit: only a CPU with AVX-512 can run it.
  if cpu_has avx512f avx512bw avx512cd avx512dq avx512vl; then
    current="the policy products as one AVX-512 unit"
    gtest_sharded "$bdir/bin/kvlab_policy_math_v4_tests" "$filter"
    whole_v4="and as one AVX-512 unit"
  else
    whole_v4="(not as one AVX-512 unit: this CPU lacks AVX-512)"
  fi
  level=2
  if cpu_has avx512f avx512bw avx512dq avx512vl; then level=4; elif cpu_has avx2 fma bmi2; then level=3; fi
  info=$("$bdir/bin/kvlab" version)
  ran=$(sed -n 's/^cpu variants: //p' <<<"$info" | tr ',' '\n' | grep -v 'not this CPU\|not built' | tr -d ' ' | paste -sd, -)
  chosen=$(sed -n 's/^cpu kernels: \([a-z0-9]*\).*/\1/p' <<<"$info")
  echo "sanitize: kernel paths exercised: variants ${ran//,/, } (every op case against the f64 reference; the other suites run $chosen); policy products at ISA levels plain, 2 to $level $whole_v4"
  phase kernels
fi
if want engine; then
  current="the engine suite"
  gtest_sharded "$bdir/bin/kvlab_engine_tests" "$filter:-$ENGINE_SKIP"
  phase engine
fi
want cli || exit 0
current="the CLI unit suite"
gtest_sharded "$bdir/bin/kvlab_cli_unit_tests" "$filter"

work=$(mktemp -d)
trap 'rc=$?; rm -rf "$work"; summary $rc' EXIT
kv="$bdir/bin/kvlab"
s="$work/asan.kvlab"
current="the CLI round trip"
"$kv" eval_long tiny --data.seq_length 256 --data.num_samples 1 --kv_cache.name h2o-default --kv_cache.cache_length 64 \
  --kv_cache.chunk_size 16 --threads 2 --session "$s" >/dev/null
"$kv" eval_long tiny --data.seq_length 256 --data.num_samples 1 --kv_cache.name lastrec-default --kv_cache.cache_length 64 \
  --kv_cache.chunk_size 16 --kv_cache.paged_block_size 8 --threads 2 --session "$s" >/dev/null
"$kv" generate tiny --prompt hello --max_new_tokens 8 --threads 2 --session "$s" >/dev/null
"$kv" runs "$s" >/dev/null
"$kv" compare "$s" 1 2 >/dev/null
"$kv" export "$s" --run 1 --what all --format chrome-trace -o "$work/t.json" >/dev/null
if "$kv" compare "$s" 999 >/dev/null 2>&1; then echo "sanitize: compare of an unknown run exited 0" >&2; exit 1; fi
# Full disk through the CLI: writer faults, the end-record reserve, read-only listing, export refusal.
current="the CLI faults"
"$root/tests/cli/faults.sh" "$kv" "$work/faults" >"$work/faults.log" 2>&1 || { cat "$work/faults.log"; exit 1; }
phase cli
