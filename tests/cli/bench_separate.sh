#!/usr/bin/env bash
# The kvlab executable holds no benchmark code (issue 36): it defines no symbol of the bench
# library (kv::bench, the storage benches, the view benches) while kvlab-bench beside it does;
# `kvlab bench` runs kvlab-bench with the same arguments; and a kvlab with no kvlab-bench beside
# it says so in one message and exits non-zero.
# Usage: bench_separate.sh KVLAB SCRATCH_DIR
set -euo pipefail
kvlab="$1"
scratch="$2"
fail() { echo "bench_separate: FAIL: $*" >&2; exit 1; }
bench="$(dirname "$kvlab")/kvlab-bench"
[ -x "$bench" ] || fail "no kvlab-bench beside $kvlab"
# Benchmark entry points by name (the bench library's namespace and every *_bench function).
pattern=' kv::bench::| kv::[a-z_:]*run_[a-z_]*bench\(| kv::views::'
bench_syms="$(nm -C --defined-only "$bench" | grep -E "$pattern" | wc -l)"
[ "$bench_syms" -gt 0 ] || fail "kvlab-bench defines no benchmark symbol; the pattern no longer finds them"
kvlab_syms="$(nm -C --defined-only "$kvlab" | grep -E "$pattern" || true)"
[ -z "$kvlab_syms" ] || fail "kvlab defines benchmark code: $(head -n 3 <<<"$kvlab_syms")"
echo "kvlab-bench: $bench_syms benchmark symbols; kvlab: none"

out="$("$kvlab" bench frob 2>&1)" && fail "kvlab bench frob exited 0: $out"
grep -q "bench: unknown benchmark 'frob'" <<<"$out" || fail "kvlab bench did not reach kvlab-bench: $out"

rm -rf "$scratch"
mkdir -p "$scratch"
cp "$kvlab" "$scratch/kvlab"
set +e
out="$("$scratch/kvlab" bench ops --quick 2>&1)"
rc=$?
set -e
[ "$rc" -ne 0 ] || fail "kvlab bench without kvlab-bench exited 0: $out"
grep -q "the benchmarks are the program kvlab-bench, expected beside kvlab at $scratch/kvlab-bench" <<<"$out" ||
  fail "unexpected message without kvlab-bench: $out"
rm -rf "$scratch"
echo "bench_separate: ok"
