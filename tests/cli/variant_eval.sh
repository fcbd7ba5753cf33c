#!/usr/bin/env bash
# CPU kernel variants end to end: a short `kvlab eval_long` with the variant chosen at
# start-up and again with the lowest one forced (KVLAB_CPU_VARIANT=base, SSE4.2 only) gives
# the same mean loss (full precision, from `kvlab runs --json`) within 1e-6 relative. The
# variants do the same f32 operations (no FP contraction in ISO C++ mode); what differs is
# the summation order of vectorized reductions (4, 8 or 16 lanes): 1.7e-9 relative measured
# between avx2 and base on an AMD EPYC. 1e-6 (about 8 f32 ulps of the loss) is far above
# that and far below what any broken kernel does to the loss. The session records which
# variant each run used, and the forced one must be recorded.
# Also: an unknown variant, and one this CPU cannot execute (when there is one), are refused
# with a clear message.
# Usage: variant_eval.sh KVLAB SCRATCH_DIR
set -euo pipefail
kvlab="$1"
scratch="$2"
fail() { echo "variant_eval: FAIL: $*" >&2; exit 1; }
mkdir -p "$scratch"
rm -f "$scratch"/variant_eval.kvlab*
args=(eval_long tiny --data passkey --data.seq_length 1024 --kv_cache.name h2o-default --kv_cache.cache_length 256
      --kv_cache.chunk_size 64 --threads 2 --session "$scratch/variant_eval.kvlab")

unset KVLAB_CPU_VARIANT
version="$("$kvlab" version)"
echo "$version" | grep '^cpu'
default_out="$("$kvlab" "${args[@]}" 2>&1)" || fail "default variant run failed: $default_out"
base_out="$(KVLAB_CPU_VARIANT=base "$kvlab" "${args[@]}" 2>&1)" || fail "base variant run failed: $base_out"
runs="$("$kvlab" runs "$scratch/variant_eval.kvlab" --json)" || fail "kvlab runs --json failed"
losses=($(grep -o '"mean_loss": *[-0-9.eE+]*' <<<"$runs" | sed 's/.*: *//'))
kernels=($(grep -o '"cpu_kernels": *"[a-z0-9]*' <<<"$runs" | sed 's/.*"//'))
[ ${#losses[@]} -eq 2 ] || fail "expected two mean losses in kvlab runs --json, got: ${losses[*]:-none}"
[ ${#kernels[@]} -eq 2 ] || fail "expected the kernel variant of both runs in kvlab runs --json, got: ${kernels[*]:-none}"
[ "${kernels[1]}" = base ] || fail "run 2 was forced to the base variant but recorded ${kernels[1]}"
echo "mean loss: ${kernels[0]} variant ${losses[0]}, ${kernels[1]} variant ${losses[1]}"
awk -v a="${losses[0]}" -v b="${losses[1]}" 'BEGIN { d = a - b; if (d < 0) d = -d; m = a < 0 ? -a : a; if (m < 1) m = 1;
  printf "relative difference %.3g (bound 1e-6)\n", d / m; exit !(d / m <= 1e-6) }' || fail "losses differ by more than 1e-6 relative"

set +e
out="$(KVLAB_CPU_VARIANT=sse9 "$kvlab" version 2>&1)"; rc=$?
set -e
[ $rc -ne 0 ] || fail "KVLAB_CPU_VARIANT=sse9 was accepted"
echo "$out" | grep -q "KVLAB_CPU_VARIANT=sse9: unknown kernel variant; expected one of avx512bf16, avx512, avx2, base" ||
  fail "unexpected message for an unknown variant: $out"

unrunnable="$(echo "$version" | sed -n 's/^cpu variants: //p' | tr ',' '\n' | sed -n 's/^ *\([a-z0-9]*\) (not this CPU).*/\1/p' | head -n 1)"
if [ -n "$unrunnable" ]; then
  set +e
  out="$(KVLAB_CPU_VARIANT="$unrunnable" "$kvlab" version 2>&1)"; rc=$?
  set -e
  [ $rc -ne 0 ] || fail "KVLAB_CPU_VARIANT=$unrunnable was accepted on a CPU that cannot run it"
  echo "$out" | grep -q "KVLAB_CPU_VARIANT=$unrunnable: this CPU cannot run it (it lacks " || fail "unexpected refusal: $out"
  echo "refused as expected: $out"
else
  echo "every variant runs on this CPU; no refusal to check"
fi
echo "variant_eval: ok"
