#!/usr/bin/env bash
# Bytes on the x axis (issue 43): a sweep that varies the buffer or sets a byte budget draws
# its figure against the KV bytes the buffers store (kv_physical_bytes), and so does
# `kvlab plot` without --x; budgets are x values, not experiments, and distinct runs are never
# one point; a sweep of lengths with one buffer keeps the cache length.
# usage: plot_bytes.sh KVLAB WORKDIR
. "$(dirname "$0")/test_start.sh"
common="--data repeat --data.repeat_length 16 --data.repeat_distance 64 --data.seq_length 256 --data.num_samples 1 --kv_cache.chunk_size 16 --threads 1"
s="$work/bytes.kvlab"
"$kvlab" sweep tiny $common --kv_cache.name h2o-q8,h2o-turboquant --kv_cache.budget_bytes 12000,20000 --session "$s" \
  >"$work/sweep.out" 2>"$work/sweep.err" || { cat "$work/sweep.err"; fail "sweep over buffers and budgets"; }
grep -q -- "--x kv_physical_bytes" "$work/sweep.err" || { cat "$work/sweep.err"; fail "the sweep does not name bytes as its x axis"; }
grep -q "kvlab sweep: figure " "$work/sweep.err" || { cat "$work/sweep.err"; fail "the sweep drew no figure"; }
"$kvlab" plot "$s" --y mean_loss -o "$work/bytes.svg" 2>"$work/plot.err" || { cat "$work/plot.err"; fail "plot without --x"; }
grep -q "x axis kv_physical_bytes" "$work/plot.err" || { cat "$work/plot.err"; fail "plot's default x is not bytes"; }
grep -q "runs differ" "$work/plot.err" && { cat "$work/plot.err"; fail "budgets were taken for separate experiments"; }
grep -q "repeated runs" "$work/plot.err" && { cat "$work/plot.err"; fail "distinct runs were averaged into one point"; }
# One buffer, lengths only: slots are the axis.
s2="$work/len.kvlab"
"$kvlab" sweep tiny $common --kv_cache.name h2o-q8 --kv_cache.cache_length 64,128 --session "$s2" --figure none \
  >"$work/len.out" 2>"$work/len.err" || { cat "$work/len.err"; fail "sweep over lengths"; }
grep -q -- "--x kv_cache.cache_length" "$work/len.err" || { cat "$work/len.err"; fail "a length sweep does not keep the cache length"; }
"$kvlab" plot "$s2" --y mean_loss -o "$work/len.svg" 2>"$work/len_plot.err" || { cat "$work/len_plot.err"; fail "plot of lengths"; }
grep -q "x axis kv_cache.cache_length" "$work/len_plot.err" || { cat "$work/len_plot.err"; fail "plot's default x is not the length"; }
echo "plot_bytes: ok"
