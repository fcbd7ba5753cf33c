#!/usr/bin/env bash
# Numbers a peer can check (issue 16, CLI part), end to end:
# - eval_long says how many tokens it evaluated and scored, and --format json prints exactly the
#   summary the session stores (stdout is JSON only);
# - `kvlab runs` shows the loss the session holds;
# - generate reports prefill and decode apart: one new token has no decode speed, N tokens have
#   N-1 decode steps; its statistics stand on their own line after the text;
# - a command refused before its run starts (memory check, unknown model) leaves no session file,
#   nor does generate without --session;
# - a mistyped model name gets a did-you-mean; progress lines name their unit.
# usage: truth.sh KVLAB WORKDIR SAMPLE_TEXT_FILE
set -u
kvlab="$1"
work="$2"
text_file="$3"
rm -rf "$work"
mkdir -p "$work"
fail() {
  echo "FAIL: $*"
  exit 1
}

# Text windows: every position but the last has a next-token target, so 2 windows of 128 tokens
# score 2 * 127 of 2 * 128 tokens.
s="$work/eval.kvlab"
ev=(eval_long tiny --data text --data.files "$text_file" --data.seq_length 128 --data.num_samples 2
    --kv_cache.name h2o-default --kv_cache.cache_length 64 --kv_cache.chunk_size 16 --threads 1 --session "$s")
"$kvlab" "${ev[@]}" >"$work/text.out" 2>"$work/text.err" || { cat "$work/text.out" "$work/text.err"; fail "eval_long (text)"; }
grep -q "over 254 scored of 256 tokens" "$work/text.out" || { cat "$work/text.out"; fail "no token counts in the result line"; }
# The tiny model's byte tokenizer prepends no BOS (generate's "hello" is 5 prompt tokens): neither do text windows.
grep -q "no BOS (the tokenizer adds none)" "$work/text.out" || { cat "$work/text.out"; fail "the result does not say whether a BOS was used"; }
# Progress lines name their unit: 2 windows x 5 chunks (128/16 with the 64-slot cache's first
# chunk of 64) x 2 layers of the tiny model; a run under 2 s has no ETA.
grep -q "^eval_long \[20/20 layer × chunk steps " "$work/text.err" || { cat "$work/text.err"; fail "progress without its unit"; }
if grep -q " eta " "$work/text.err"; then fail "an ETA before a stable estimate"; fi
"$kvlab" "${ev[@]}" --format json >"$work/json.out" 2>"$work/json.err" || { cat "$work/json.err"; fail "eval_long --format json"; }
"$kvlab" runs "$s" --json >"$work/runs.json" || fail "runs --json"
"$kvlab" runs "$s" >"$work/runs.txt" || fail "runs"
python3 - "$work/json.out" "$work/runs.json" "$work/runs.txt" <<'EOF' || fail "json summary"
import json, sys
out = json.load(open(sys.argv[1]))          # stdout must be one JSON document
runs = json.load(open(sys.argv[2]))
table = open(sys.argv[3]).read().splitlines()
assert out["run"] == 2 and out["status"] == "done", out
s = out["summary"]
assert s["tokens"] == 256 and s["scored_tokens"] == 254, s
assert s["bos"] is False, s
stored = runs[1]["summary"]
# Bit-identical to the session (Python floats are doubles; json round-trips them).
for k in ("mean_loss", "perplexity", "tokens_per_s", "seconds"):
    assert s[k] == stored[k], (k, s[k], stored[k])
assert len(repr(s["mean_loss"])) > 8, s["mean_loss"]  # more than the text's 4 digits
# The same model, data and seed give the same loss in both runs.
assert runs[0]["summary"]["mean_loss"] == stored["mean_loss"]
header = table[1].split()
assert "loss" in header, table[1]
row = table[3]
assert ("%.4f" % stored["mean_loss"]) in row.split(), (row, stored["mean_loss"])
print("json ok: mean_loss", s["mean_loss"], "tokens", s["tokens"], "scored", s["scored_tokens"])
EOF

# generate: one token comes from the prefill (no decode step), five need four decode steps.
g="$work/gen.kvlab"
"$kvlab" generate tiny --prompt hello --max_new_tokens 1 --temperature 0 --session "$g" >"$work/gen1.log" 2>&1 ||
  { cat "$work/gen1.log"; fail "generate 1"; }
grep -Eq '^\[5 prompt tokens, 1 generated \| prefill [0-9.]+ tokens/s \| decode: no steps' "$work/gen1.log" ||
  { cat "$work/gen1.log"; fail "generate 1: statistics"; }
if grep -Eq 'decode [0-9.]+ tokens/s' "$work/gen1.log"; then fail "generate 1: a decode speed from no decode step"; fi
"$kvlab" generate tiny --prompt hello --max_new_tokens 5 --temperature 0 --session "$g" >"$work/gen5.log" 2>&1 ||
  { cat "$work/gen5.log"; fail "generate 5"; }
line=$(grep -E '^\[[0-9]+ prompt tokens' "$work/gen5.log") || { cat "$work/gen5.log"; fail "generate 5: statistics not on their own line"; }
n=$(sed -E 's/.* ([0-9]+) generated.*/\1/' <<<"$line")
if grep -q "stopped: max_new_tokens" <<<"$line"; then
  [ "$n" -eq 5 ] || fail "generate 5: $line"
  grep -q "decode [0-9.]* tokens/s over 4 steps" <<<"$line" || fail "generate 5: expected 4 decode steps: $line"
fi

# generate without --session leaves no file anywhere (home or temporary folder).
home="$work/home"
mkdir -p "$home"
HOME="$home" TMPDIR="$home" "$kvlab" generate tiny --prompt hello --max_new_tokens 2 >"$work/gen_nosession.log" 2>&1 ||
  { cat "$work/gen_nosession.log"; fail "generate without --session"; }
grep -q "not recorded" "$work/gen_nosession.log" || { cat "$work/gen_nosession.log"; fail "generate without --session: no note"; }
left=$(find "$home" -mindepth 1)
[ -z "$left" ] || fail "generate without --session left files: $left"

# Refused before the run starts: no file is created.
r="$work/refused.kvlab"
"$kvlab" eval_long tiny --kv_cache.name h2o-default --kv_cache.cache_length 4294967296 --session "$r" >"$work/refused.log" 2>&1
rc=$?
[ "$rc" -eq 1 ] || { cat "$work/refused.log"; fail "refused run: exit $rc, expected 1"; }
grep -q "needs .* of KV" "$work/refused.log" || { cat "$work/refused.log"; fail "refused run: no reason"; }
ls "$work" | grep -q refused.kvlab && { ls -l "$work"; fail "a refused run left a session file"; }
"$kvlab" eval_long smollm2-135M --session "$work/typo.kvlab" >"$work/typo.log" 2>&1
rc=$?
[ "$rc" -ne 0 ] || fail "an unknown model exited 0"
grep -q "model 'smollm2-135M' is not a preset.*did you mean smollm2-135m?" "$work/typo.log" || { cat "$work/typo.log"; fail "no did-you-mean"; }
ls "$work" | grep -q typo.kvlab && { ls -l "$work"; fail "an unknown model left a session file"; }
# A refused run in an existing session keeps that session (and its runs).
"$kvlab" eval_long tiny --kv_cache.name h2o-default --kv_cache.cache_length 4294967296 --session "$s" >/dev/null 2>&1
[ -f "$s" ] || fail "a refused run removed an existing session"
echo "ok"
