#!/usr/bin/env bash
# Experiments never merge in `kvlab plot` (issue 37): two sweeps of one task at two sequence
# lengths are two lines each, a cell run twice is one point (mean, standard-error bar), and the
# command says both; `kvlab plot --help` offers only a figure's options.
# usage: plot_experiments.sh KVLAB WORKDIR
. "$(dirname "$0")/test_start.sh"
s="$work/exp.kvlab"
for len in 256 320; do
  "$kvlab" sweep tiny --data repeat --data.repeat_length 16 --data.repeat_distance 64 --data.seq_length $len --data.num_samples 1 \
    --kv_cache.name h2o --kv_cache.cache_length 64,128 --kv_cache.chunk_size 16 --threads 1 --session "$s" --figure none \
    >"$work/sweep$len.out" 2>&1 || { cat "$work/sweep$len.out"; fail "sweep at $len tokens"; }
done
"$kvlab" plot "$s" --y mean_loss -o "$work/two.svg" 2>"$work/two.err" || { cat "$work/two.err"; fail "plot of two experiments"; }
grep -q "runs differ in data.seq_length: one line each" "$work/two.err" || { cat "$work/two.err"; fail "no word of the two experiments"; }
grep -q "repeated runs" "$work/two.err" && { cat "$work/two.err"; fail "no cell was repeated yet"; }
# The same cell once more (eval_long with the sweep's options): one point of two runs.
"$kvlab" eval_long tiny --data repeat --data.repeat_length 16 --data.repeat_distance 64 --data.seq_length 256 --data.num_samples 1 \
  --kv_cache.name h2o-default --kv_cache.cache_length 64 --kv_cache.chunk_size 16 --threads 1 --session "$s" >"$work/again.out" 2>&1 ||
  { cat "$work/again.out"; fail "eval_long again"; }
"$kvlab" plot "$s" --y mean_loss -o "$work/rep.svg" 2>"$work/rep.err" || { cat "$work/rep.err"; fail "plot with a repeated cell"; }
grep -q "1 point is the mean of repeated runs; bars: +-1 standard error" "$work/rep.err" || { cat "$work/rep.err"; fail "the repeated cell is not reported"; }
# Only the 256-token runs: one experiment, no split.
"$kvlab" plot "$s" --y mean_loss --where data.seq_length=256 -o "$work/one.svg" 2>"$work/one.err" || { cat "$work/one.err"; fail "plot of one experiment"; }
grep -q "runs differ" "$work/one.err" && { cat "$work/one.err"; fail "one experiment was split"; }
"$kvlab" plot --help >"$work/help.out" 2>&1
grep -q -- "--threads\|--device\|--memory.budget" "$work/help.out" && { cat "$work/help.out"; fail "plot --help offers run options"; }
grep -q -- "--facet" "$work/help.out" || { cat "$work/help.out"; fail "plot --help lacks its own options"; }
echo "plot_experiments: ok"
