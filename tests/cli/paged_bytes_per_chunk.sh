#!/usr/bin/env bash
# Physical truth per chunk (issue 43): a paged h2o run records the KV bytes every layer keeps
# (kv_logical_bytes) and holds (kv_physical_bytes) after each chunk, as metrics at the tokens
# through the chunk; `kvlab plot --x step` draws both. Expected values are computed here from
# tiny's shapes (2 layers, 2 KV heads, head_dim 16, f32): with T = min(tokens, L) slots filled,
# logical = layers * G * T * 2 * D * 4 and physical = layers * ceil(T / bs) * G * bs * 2 * D * 4,
# so physical >= logical and, with or without compaction, less than one block per layer apart.
# usage: paged_bytes_per_chunk.sh KVLAB WORKDIR
. "$(dirname "$0")/test_start.sh"
s="$work/paged.kvlab"
L=40 bs=16 chunk=8 T=200
for compact in false true; do
  "$kvlab" eval_long tiny --data repeat --data.repeat_length 16 --data.repeat_distance 64 --data.seq_length $T --data.num_samples 1 \
    --kv_cache.name h2o-default --kv_cache.cache_length $L --kv_cache.paged_block_size $bs --kv_cache.compact $compact \
    --kv_cache.chunk_size $chunk --threads 1 --session "$s" > "$work/run.$compact.out" 2>&1 ||
    { cat "$work/run.$compact.out"; fail "paged h2o run (compact $compact)"; }
done
for run in 1 2; do
  "$kvlab" sql "$s" "SELECT a.step, a.value, b.value FROM metrics a JOIN metrics b ON b.run_id = a.run_id AND b.step = a.step
                     WHERE a.run_id = $run AND a.name = 'kv_logical_bytes' AND b.name = 'kv_physical_bytes' ORDER BY a.step" \
    --format csv > "$work/run$run.csv" 2> "$work/sql.err" || { cat "$work/sql.err"; fail "sql over the metrics of run $run"; }
  awk -F, -v L=$L -v bs=$bs -v chunk=$chunk -v T=$T -v run=$run '
    NR == 1 { next }  # header
    { n++
      t = $1 < L ? $1 : L
      logical = 2 * 2 * t * 2 * 16 * 4
      block = 2 * bs * 2 * 16 * 4
      physical = 2 * int((t + bs - 1) / bs) * block
      # the run'"'"'s first chunk fills the cache (L tokens), the others are chunk tokens each
      if ($1 != L + (n - 1) * chunk) { print "FAIL: run " run ": step " $1 " of chunk " n "; expected " L + (n - 1) * chunk; bad = 1 }
      if ($2 != logical) { print "FAIL: run " run " at " $1 " tokens: logical " $2 "; expected " logical; bad = 1 }
      if ($3 != physical) { print "FAIL: run " run " at " $1 " tokens: physical " $3 "; expected " physical; bad = 1 }
      if ($3 < $2 || $3 - $2 >= 2 * block) { print "FAIL: run " run " at " $1 ": physical " $3 " vs logical " $2; bad = 1 } }
    END { if (n != 1 + (T - L) / chunk) { print "FAIL: run " run ": " n " chunks recorded; expected " 1 + (T - L) / chunk; bad = 1 }
          if (!bad) print "run " run ": " n " chunks as expected"; exit bad }' "$work/run$run.csv" || fail "per-chunk bytes of run $run"
done
"$kvlab" plot "$s" --x step --y kv_logical_bytes,kv_physical_bytes --facet kv_cache.compact -o "$work/paged.svg" 2> "$work/plot.err" ||
  { cat "$work/plot.err"; fail "plot --x step"; }
[ -s "$work/paged.svg" ] || fail "plot --x step wrote no figure"
"$kvlab" plot "$s" --y kv_logical_bytes,kv_physical_bytes -o "$work/bad.svg" > "$work/bad.out" 2>&1 && fail "several --y without --x step were taken"
grep -q "several metrics need --x step" "$work/bad.out" || { cat "$work/bad.out"; fail "no clear message for several --y without --x step"; }
echo "paged_bytes_per_chunk: ok"
