#!/usr/bin/env bash
# Reproduces docs/RESULTS.md: SmolLM2-135M (GGUF, assets/cache) on real English text and on
# passkey retrieval and the repeat task, dense vs every cache policy x buffer x cache length, all
# recorded in one session file by kvlab sweep, which also writes every table (Markdown, under
# results/); kvlab plot draws the figures.
#   scripts/results.sh [SESSION]       (default results/results.kvlab; runs already in it are skipped)
#   RESULTS_BLOCKS="ruler zoo" scripts/results.sh   runs only the named blocks (default: all of
#   ppl qh2o passkey repeat ruler zoo methods fidelity bytes paged leaderboard decoding needles)
# About 2 hours on 2 cores. Needs the build (scripts/setup.sh) and the model (scripts/fetch_assets.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
KVLAB=${KVLAB:-build/bin/kvlab}
SESSION=${1:-results/results.kvlab}
mkdir -p results "$(dirname "$SESSION")"  # the tables go to results/ wherever the session is
TEXT=/usr/share/common-licenses/GPL-3,/usr/share/common-licenses/GFDL-1.3  # GPL-3 is 7640 tokens; GFDL tops it up to 8192
# smart-lastrec is left out: it protects a prompt prefix found by a regex, which plain text has not.
BLOCKS=" ${RESULTS_BLOCKS:-ppl qh2o passkey repeat ruler zoo methods fidelity bytes paged leaderboard decoding needles} "
# One provenance line per block, written when the block starts (results/BLOCK.provenance.md):
# the commit of the tree the tables came from, the date and the CPU they ran on.
COMMIT=${RESULTS_COMMIT:-$(git rev-parse --short HEAD)}
provenance() {
  local isa=AVX2
  grep -qw avx512f /proc/cpuinfo && isa=AVX-512
  printf '*Block `%s` (`RESULTS_BLOCKS=%s scripts/results.sh`), %s, commit %s, %s-vCPU %s (%s).*\n' \
    "$1" "$1" "$(date -u +%F)" "$COMMIT" "$(nproc)" "$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)" "$isa" \
    > "results/$1.provenance.md"
}
want() { [[ "$BLOCKS" == *" $1 "* ]] && provenance "$1"; }
POLICIES="lastrec h2o h2o-orig h2o-vlen streaming tova snapkv knorm"
QPOLICIES="qh2o qh2o-vlen"  # need a quantized buffer

# Perplexity on 8192 tokens of license text, chunk size 128: every policy x buffer x cache length
# in one kvlab sweep (cells the session already holds are skipped, so a stopped run continues),
# its dense-default reference added by the sweep. qh2o and qh2o-vlen score quantization error,
# so they run on the quantized buffers only, in a second sweep sharing the same reference.
ppl=(smollm2-135m --data text --data.files "$TEXT" --data.seq_length 8192 --data.num_samples 1 --kv_cache.chunk_size 128
     --kv_cache.cache_length 512,1024,2048 --telemetry.enabled false --session "$SESSION" --metric perplexity --format md)
want ppl && "$KVLAB" sweep "${ppl[@]}" --kv_cache.name "${POLICIES// /,}" --kv_cache.buffer default,q8,q4 \
  --figure docs/figures/ppl_smollm2.svg > results/ppl.md
want qh2o && "$KVLAB" sweep "${ppl[@]}" --kv_cache.name "${QPOLICIES// /,}" --kv_cache.buffer q8,q4 --figure none > results/ppl.qh2o.md

# Passkey retrieval: 4 samples per length, cache 1024 (dense: the whole sequence); accuracy and
# the loss over the four answer letters (the second call only prints: every cell is done).
passkey=(smollm2-135m --data passkey --data.seq_length 2048,8192 --data.num_samples 4 --kv_cache.name lastrec,h2o,snapkv
         --kv_cache.cache_length 1024 --kv_cache.chunk_size 128 --telemetry.enabled false --session "$SESSION" --format md --figure none)
if want passkey; then
"$KVLAB" sweep "${passkey[@]}" --metric accuracy > results/passkey.accuracy.md
"$KVLAB" sweep "${passkey[@]}" --metric mean_loss > results/passkey.loss.md
echo "results: perplexity in results/ppl.md, results/ppl.qh2o.md (figure docs/figures/ppl_smollm2.svg); passkey in results/passkey.accuracy.md, results/passkey.loss.md"
fi

# Repeat task (docs/RESULTS.md, "Repeat task"): one kvlab sweep into the same session (cells it
# already holds are skipped), its tables as Markdown and the figure.
if want repeat; then
repeat=(smollm2-135m --data repeat --data.seq_length 1024 --data.num_samples 2 --data.repeat_length 64
        --data.repeat_distance 384,896 --kv_cache.name h2o,lastrec,tova,snapkv --kv_cache.cache_length 256,512
        --kv_cache.chunk_size 64 --telemetry.enabled false --session "$SESSION")
"$KVLAB" sweep "${repeat[@]}" --format md --figure none > results/repeat.copy.md
"$KVLAB" sweep "${repeat[@]}" --format md --figure none --metric mean_loss > results/repeat.loss.md
"$KVLAB" sweep smollm2-135m --data repeat --data.seq_length 1024 --data.num_samples 2 --data.repeat_length 64 \
  --data.repeat_distance 384 --data.seed 7,99 --kv_cache.name h2o,lastrec,tova,snapkv --kv_cache.cache_length 256,512 \
  --kv_cache.chunk_size 64 --telemetry.enabled false --session "$SESSION" --format md --figure none > results/repeat.seeds.md
"$KVLAB" sweep smollm2-135m --data repeat --data.seq_length 1024,2048,4096 --data.num_samples 2 --data.repeat_length 64 \
  --data.repeat_distance 384,-1 --kv_cache.name dense --kv_cache.chunk_size 64 --telemetry.enabled false \
  --session "$SESSION" --format md --figure none > results/repeat.dense_lengths.md
"$KVLAB" plot "$SESSION" --y copy_token_accuracy --facet data.repeat_distance --where "data.seed=1234;data.seq_length=1024;data.repeat_distance=384|896" \
  --title "SmolLM2-135M, repeat task (1024 tokens, 64-token passage)" -o docs/figures/repeat_smollm2.svg
echo "results: repeat tables in results/repeat.copy.md, results/repeat.loss.md, results/repeat.seeds.md, results/repeat.dense_lengths.md; figure docs/figures/repeat_smollm2.svg"
fi


# Fidelity against dense (docs/RESULTS.md, "Fidelity against dense"): the repeat task with
# --fidelity true; tables of the kept mass, the attention error and the next-token KL, and the
# figure of the KL against cache length.
# RULER-style tasks (docs/RESULTS.md, "RULER-style tasks"): which tasks the model does with the dense
# cache at 1k/2k/4k tokens (exact match of the greedy answer, 2 samples), then the needle tasks it
# does, swept over policies and cache sizes.
if want ruler; then
ruler=(smollm2-135m --data.num_samples 2 --kv_cache.chunk_size 128 --telemetry.enabled false --session "$SESSION" --figure none)
"$KVLAB" sweep "${ruler[@]}" --data niah_single,niah_multikey,niah_multivalue,vt,cwe --data.seq_length 1024,2048,4096 \
  --kv_cache.name dense --format md --metric accuracy > results/ruler.dense.md
"$KVLAB" sweep "${ruler[@]}" --data niah_single,niah_multikey,niah_multivalue,vt,cwe --data.seq_length 1024,2048,4096 \
  --kv_cache.name dense --format md --metric answer_token_accuracy > results/ruler.dense.tokens.md
"$KVLAB" sweep "${ruler[@]}" --data niah_single,niah_multikey --data.seq_length 2048 --kv_cache.name h2o,lastrec,tova,snapkv \
  --kv_cache.cache_length 512,1024,1536 --format md --metric answer_token_accuracy > results/ruler.policies.tokens.md
"$KVLAB" sweep "${ruler[@]}" --data niah_single,niah_multikey --data.seq_length 2048 --kv_cache.name h2o,lastrec,tova,snapkv \
  --kv_cache.cache_length 512,1024,1536 --format md --metric accuracy > results/ruler.policies.md
"$KVLAB" plot "$SESSION" --x kv_cache.cache_length --y answer_token_accuracy --by kv_cache.policy --facet data \
  --where "data=niah_single|niah_multikey;data.seq_length=2048" \
  --title "SmolLM2-135M, RULER needles at 2048 tokens: answer tokens right" -o docs/figures/ruler_smollm2.svg
echo "results: RULER tables in results/ruler.*.md; figure docs/figures/ruler_smollm2.svg"
fi

# The policies added by issue 19 (default buffer: the per-head policies need full-precision slots)
# on the perplexity text and on the repeat task, next to the recency and score baselines.
if want zoo; then
ZOO="${RESULTS_ZOO:-pyramidkv rkv expected-attention ada-snapkv ada-expected-attention random cake kvzip}"
DUO_GATES=assets/duo/smollm2-135m.duo  # kvlab calibrate duo smollm2-135m -o "$DUO_GATES" --steps 30
"$KVLAB" sweep "${ppl[@]}" --kv_cache.name "${ZOO// /,}" --kv_cache.buffer default --figure none > results/ppl.zoo.md
# duo's gate file is part of its configuration: its own sweep, so the other cells keep theirs
"$KVLAB" sweep "${ppl[@]}" --kv_cache.name duo --kv_cache.buffer default --kv_cache.duo_gates "$DUO_GATES" --figure none > results/ppl.duo.md
zrep=(smollm2-135m --data repeat --data.seq_length 2048 --data.num_samples 2 --data.repeat_length 64 --data.repeat_distance 896
      --kv_cache.cache_length 256,512,1024 --kv_cache.chunk_size 64 --telemetry.enabled false --session "$SESSION" --figure none --format md)
"$KVLAB" sweep "${zrep[@]}" --kv_cache.name "lastrec,h2o,tova,snapkv,streaming,knorm,${ZOO// /,}" > results/repeat.zoo.md
"$KVLAB" sweep "${zrep[@]}" --kv_cache.name duo --kv_cache.duo_gates "$DUO_GATES" > results/repeat.duo.md
"$KVLAB" plot "$SESSION" --x kv_cache.cache_length --y copy_token_accuracy --by kv_cache.policy \
  --where "data=repeat;data.seq_length=2048;data.repeat_distance=896" \
  --title "SmolLM2-135M, repeat task (2048 tokens, passage at the start): every policy" -o docs/figures/repeat_zoo_smollm2.svg
echo "results: results/{ppl,repeat}.{zoo,duo}.md; figure docs/figures/repeat_zoo_smollm2.svg"
fi
# The methods of kvpress's leaderboard added by issue 41, on the same text and repeat task at two
# cache sizes each, next to the baselines (the scorers the wrappers wrap among them). qfilter and
# kvzap read files calibrated here on another text (the Apache licence), so the evaluated text
# is never their calibration data; their sweeps are their own, as duo's above, and their rows are
# in the tables only (in the figure their file options would label every line).
if want methods; then
METHODS="${RESULTS_METHODS:-keydiff chunkkv observed-attention cur non-causal-attn leverage compactor lagkv critical-snapkv critical-expected-attention critical-ada cap simlayerkv finch merging-snapkv merging-knorm cam-h2o cam-knorm key-rerotation-snapkv key-rerotation-streaming key-rerotation-h2o key-rerotation-knorm ada-kvzip global-kvzip}"
# LUKV's per-head budgets need a table: the KV heads of every layer keep 1, 0.75 and 0.5 of L
# (a quarter fewer slots than the others at the same L); rows in the tables only, as qfilter's
LUKV="lukv-knorm,lukv-snapkv,lukv-h2o,lukv-expected-attention" LUKV_RATIOS="pattern:1 0.75 0.5"  # spaces: a comma would make it a sweep list
BASE="lastrec snapkv expected-attention h2o knorm streaming"
CALIB_TEXT=/usr/share/common-licenses/Apache-2.0
QFILTER=results/smollm2-135m.qfilter KVZAP=results/smollm2-135m.kvzap
[ -f "$QFILTER" ] || "$KVLAB" calibrate qfilter smollm2-135m --data "$CALIB_TEXT" --samples 4 -o "$QFILTER"
[ -f "$KVZAP" ] || "$KVLAB" calibrate kvzap smollm2-135m --data "$CALIB_TEXT" --samples 4 -o "$KVZAP"
mppl=(smollm2-135m --data text --data.files "$TEXT" --data.seq_length 8192 --data.num_samples 1 --kv_cache.chunk_size 128
      --kv_cache.cache_length 512,1024 --telemetry.enabled false --session "$SESSION" --metric perplexity --format md
      --kv_cache.buffer default --figure none)
"$KVLAB" sweep "${mppl[@]}" --kv_cache.name "$(echo $BASE $METHODS | tr ' ' ,)" > results/ppl.methods.md
"$KVLAB" sweep "${mppl[@]}" --kv_cache.name qfilter --kv_cache.qfilter "$QFILTER" > results/ppl.qfilter.md
"$KVLAB" sweep "${mppl[@]}" --kv_cache.name kvzap --kv_cache.kvzap "$KVZAP" > results/ppl.kvzap.md
"$KVLAB" sweep "${mppl[@]}" --kv_cache.name "$LUKV" --kv_cache.head_ratios "$LUKV_RATIOS" > results/ppl.lukv.md
mrep=(smollm2-135m --data repeat --data.seq_length 2048 --data.num_samples 2 --data.repeat_length 64 --data.repeat_distance 896
      --kv_cache.cache_length 256,512 --kv_cache.chunk_size 64 --telemetry.enabled false --session "$SESSION" --format md --figure none)
"$KVLAB" sweep "${mrep[@]}" --kv_cache.name "$(echo $BASE $METHODS | tr ' ' ,)" > results/repeat.methods.md
"$KVLAB" sweep "${mrep[@]}" --kv_cache.name qfilter --kv_cache.qfilter "$QFILTER" > results/repeat.qfilter.md
"$KVLAB" sweep "${mrep[@]}" --kv_cache.name kvzap --kv_cache.kvzap "$KVZAP" > results/repeat.kvzap.md
"$KVLAB" sweep "${mrep[@]}" --kv_cache.name "$LUKV" --kv_cache.head_ratios "$LUKV_RATIOS" > results/repeat.lukv.md
"$KVLAB" plot "$SESSION" --x kv_cache.cache_length --y copy_token_accuracy --by kv_cache.policy \
  --where "data=repeat;data.seq_length=2048;data.repeat_distance=896;kv_cache.cache_length=256|512;kv_cache.policy=$(echo $BASE $METHODS | tr ' ' '|')" \
  --title "SmolLM2-135M, repeat task (2048 tokens): the methods of kvpress's leaderboard" -o docs/figures/repeat_methods_smollm2.svg
# KVzip's three allocations side by side (kvzip's cells come from the zoo block: its L = 1024 too)
"$KVLAB" plot "$SESSION" --x kv_cache.cache_length --y copy_token_accuracy --by kv_cache.policy \
  --where "data=repeat;data.seq_length=2048;data.repeat_distance=896;kv_cache.policy=kvzip|ada-kvzip|global-kvzip|dense" \
  --title "SmolLM2-135M, repeat task (2048 tokens): KVzip's scores allocated per head, per layer, over all layers" \
  -o docs/figures/repeat_kvzip_allocations_smollm2.svg
echo "results: results/{ppl,repeat}.{methods,qfilter,kvzap,lukv}.md; figures docs/figures/repeat_{methods,kvzip_allocations}_smollm2.svg"
fi

if want fidelity; then
fid=(smollm2-135m --data repeat --data.seq_length 1024 --data.num_samples 1 --data.repeat_length 64 --data.repeat_distance 384
     --kv_cache.name h2o,lastrec,tova,snapkv --kv_cache.cache_length 256,512 --kv_cache.chunk_size 64 --fidelity true
     --telemetry.enabled false --session "$SESSION" --format md --figure none)
"$KVLAB" sweep "${fid[@]}" --metric fidelity_kept_mass > results/fidelity.mass.md
"$KVLAB" sweep "${fid[@]}" --metric fidelity_attn_rel_error > results/fidelity.error.md
"$KVLAB" sweep "${fid[@]}" --metric fidelity_next_token_kl > results/fidelity.kl.md
"$KVLAB" sweep "${fid[@]}" --metric copy_token_accuracy > results/fidelity.copy.md
"$KVLAB" plot "$SESSION" --y fidelity_next_token_kl --where "data=repeat;data.num_samples=1;fidelity=true" \
  --title "SmolLM2-135M, repeat task: next-token KL vs dense" -o docs/figures/fidelity_kl_smollm2.svg
"$KVLAB" plot "$SESSION" --y fidelity_kept_mass --where "data=repeat;data.num_samples=1;fidelity=true" \
  --title "SmolLM2-135M, repeat task: attention mass kept" -o docs/figures/fidelity_smollm2.svg
echo "results: fidelity tables in results/fidelity.{mass,error,kl,copy}.md; figures docs/figures/fidelity_{kl_,}smollm2.svg"
fi

# KIVI and Quest vs eviction, by bytes (docs/RESULTS.md, "KIVI and Quest vs eviction, by bytes"):
# 4096 tokens of the licence text (8192 did not fit the shared machine's time), chunk 128;
# eviction with f32 slots at 256/384/512/1024, KIVI buffers at cache lengths whose packed bytes match
# (the summary's kv_bytes: codes + scales + residual pool), quest at token budgets of 256/512
# (it saves reads, not memory).
if want bytes; then
bytes=(smollm2-135m --data text --data.files "$TEXT" --data.seq_length 4096 --data.num_samples 1 --kv_cache.chunk_size 128
       --telemetry.enabled false --session "$SESSION" --format md --figure none)
"$KVLAB" sweep "${bytes[@]}" --kv_cache.name lastrec,h2o --kv_cache.buffer kivi2 --kv_cache.cache_length 1024,2048 > results/bytes.kivi2.md
"$KVLAB" sweep "${bytes[@]}" --kv_cache.name quest --kv_cache.quest_token_budget 256,512 --kv_cache.quest_prefill 512 > results/bytes.quest.md
"$KVLAB" sweep "${bytes[@]}" --kv_cache.name lastrec,h2o --kv_cache.buffer kivi4 --kv_cache.cache_length 1024,2048 > results/bytes.kivi4.md
"$KVLAB" sweep "${bytes[@]}" --kv_cache.name lastrec,tova,snapkv,h2o --kv_cache.cache_length 512,256 > results/bytes.evict.md
"$KVLAB" sweep "${bytes[@]}" --kv_cache.name lastrec,h2o --kv_cache.cache_length 384,1024 > results/bytes.evict384.md
# The KV bytes of every cell: the same cells again (all done: only printed) with the kv_bytes metric.
"$KVLAB" sweep "${bytes[@]}" --kv_cache.name lastrec,h2o --kv_cache.buffer kivi2 --kv_cache.cache_length 1024,2048 --metric kv_bytes > results/bytes.kivi2.kv_bytes.md
"$KVLAB" sweep "${bytes[@]}" --kv_cache.name lastrec,h2o --kv_cache.buffer kivi4 --kv_cache.cache_length 1024,2048 --metric kv_bytes > results/bytes.kivi4.kv_bytes.md
"$KVLAB" sweep "${bytes[@]}" --kv_cache.name lastrec,tova,snapkv,h2o --kv_cache.cache_length 512,256 --metric kv_bytes > results/bytes.evict.kv_bytes.md
"$KVLAB" sweep "${bytes[@]}" --kv_cache.name lastrec,h2o --kv_cache.cache_length 384,1024 --metric kv_bytes > results/bytes.evict384.kv_bytes.md
"$KVLAB" plot "$SESSION" --x kv_bytes --y perplexity --by kv_cache.name --where "data=text;data.seq_length=4096" \
  --title "SmolLM2-135M, 4096 tokens of licence text: perplexity vs KV bytes held" -o docs/figures/bytes_smollm2.svg
echo "results: results/bytes.*.md; figure docs/figures/bytes_smollm2.svg"
fi

# Paged storage (docs/RESULTS.md, "Paged storage: slots kept against blocks held"): h2o and
# pyramidkv over a paged buffer (blocks of 128 slots) at L = 1000 on 4096 tokens of the licence
# text, with and without compaction, beside the sweep's dense reference in the same chunks; each
# run records after every chunk the bytes its layers keep (kv_logical_bytes) and hold
# (kv_physical_bytes), so telemetry stays on; the figure draws both per chunk.
if want paged; then
pg=(smollm2-135m --data text --data.files "$TEXT" --data.seq_length 4096 --data.num_samples 1 --kv_cache.chunk_size 128
    --kv_cache.cache_length 1000 --kv_cache.paged_block_size 128 --kv_cache.name h2o,pyramidkv --kv_cache.compact false,true
    --session "$SESSION" --format md --figure none)
"$KVLAB" sweep "${pg[@]}" --metric perplexity > results/paged.ppl.md
"$KVLAB" sweep "${pg[@]}" --metric kv_logical_bytes > results/paged.logical.md
"$KVLAB" sweep "${pg[@]}" --metric kv_physical_bytes > results/paged.physical.md
"$KVLAB" plot "$SESSION" --x step --y kv_logical_bytes,kv_physical_bytes --by kv_cache.name --facet kv_cache.compact \
  --where "data=text;data.seq_length=4096;kv_cache.paged_block_size=128" \
  --title "SmolLM2-135M, 4096 tokens, paged blocks of 128 slots: KV bytes kept (logical) and held (physical) after each chunk" \
  -o docs/figures/paged_smollm2.svg
echo "results: results/paged.{ppl,logical,physical}.md; figure docs/figures/paged_smollm2.svg"
fi

# kvpress's leaderboard under its own protocol (docs/RESULTS.md, "Leaderboard: compress once,
# then ask"): each RULER context compressed once by --kv_cache.compression_ratio, the question
# answered from it; every registered method (--kv_cache.name all: the sweep lists the policies
# that cannot compress once, and why, and leaves them out) x ratio, the mean over the tasks with standard errors, exact answers and answer tokens
# right (the second call only prints: every cell is done). 1024 tokens and 2 samples per cell.
if want leaderboard; then
lb=(smollm2-135m --protocol compress-then-ask --data niah_single,niah_multikey,niah_multivalue --data.seq_length 1024
    --data.num_samples 2 --kv_cache.name all --kv_cache.compression_ratio 0.25,0.5,0.75,0.875
    --kv_cache.chunk_size 128 --telemetry.enabled false --session "$SESSION" --figure none --format leaderboard)
"$KVLAB" sweep "${lb[@]}" --metric accuracy > results/leaderboard.accuracy.md
"$KVLAB" sweep "${lb[@]}" --metric answer_token_accuracy > results/leaderboard.tokens.md
echo "results: results/leaderboard.accuracy.md, results/leaderboard.tokens.md"
fi

# Decoding-time budgets (docs/RESULTS.md, "Decoding-time budgets: generated length next to
# quality"): the same needles at 1536 tokens compressed once by a ratio, then the question and
# the greedy answer decoded with no further eviction (compression_ratio) or keeping that ratio of
# everything seen (decode_ratio); the greedy answers' RULER score and mean length.
if want decoding; then
dec=(smollm2-135m --protocol compress-then-ask --data niah_single,niah_multikey --data.seq_length 1536 --data.num_samples 2
     --kv_cache.name snapkv,knorm --kv_cache.chunk_size 128 --telemetry.enabled false --session "$SESSION" --figure none --format md)
for m in generated_score generated_tokens; do
  "$KVLAB" sweep "${dec[@]}" --kv_cache.compression_ratio 0.5,0.75 --metric $m > results/decoding.compress.$m.md
  "$KVLAB" sweep "${dec[@]}" --kv_cache.decode_ratio 0.5,0.75 --metric $m > results/decoding.decode.$m.md
done
echo "results: results/decoding.{compress,decode}.{generated_score,generated_tokens}.md"
fi

# Needle heat maps and the oracle (docs/RESULTS.md, "Needle heat maps and the oracle"): RULER's
# niah_single with its needle at five set depths (sample i at depth i mod 5) at three context
# lengths, each context compressed once by ratio 0.5 (compress-then-ask, question kept out),
# dense and three methods, one heat map panel per method; then the fidelity oracle on the same
# task streamed in chunks through a quarter of it (the oracle needs the chunked protocol's dense
# reference): kept attention mass per layer of each method and of the best set of the same size.
# About 10 minutes on 2 shared cores.
needles() {
  local methods=snapkv,knorm,streaming
  local cmd=(smollm2-135m --protocol compress-then-ask --data niah_single --data.depths 0,0.25,0.5,0.75,1 --data.num_samples 5
             --data.seq_length 512,1024,2048 --kv_cache.name "$methods" --kv_cache.compression_ratio 0.5 --kv_cache.chunk_size 128
             --session "$SESSION" --figure none --format md)  # telemetry on: the map reads each sample's sample_correct metric
  "$KVLAB" sweep "${cmd[@]}" --metric accuracy > results/needles.accuracy.md
  "$KVLAB" plot "$SESSION" --heatmap needle --by kv_cache.name \
    --where "data=niah_single;protocol=compress-then-ask" \
    --title "SmolLM2-135M, niah_single compressed once to half (ratio 0.5): needles found" -o docs/figures/needles_smollm2.svg
  local fid=(smollm2-135m --data niah_single --data.depths 0,0.25,0.5,0.75,1 --data.num_samples 5 --data.seq_length 1024
             --kv_cache.name "$methods" --kv_cache.cache_length 256 --kv_cache.chunk_size 128 --fidelity true --fidelity_oracle true
             --fidelity_kl_positions 1 --telemetry.enabled false --session "$SESSION" --figure none --format md)
  "$KVLAB" sweep "${fid[@]}" --metric fidelity_kept_mass > results/needles.oracle.kept.md
  "$KVLAB" sweep "${fid[@]}" --metric fidelity_oracle_mass > results/needles.oracle.mass.md
  "$KVLAB" sweep "${fid[@]}" --metric fidelity_efficiency > results/needles.oracle.efficiency.md
  local where="data=niah_single;fidelity_oracle=true;data.seq_length=1024"
  "$KVLAB" plot "$SESSION" --x layer --y fidelity_kept_mass --by kv_cache.name --where "$where" \
    --title "SmolLM2-135M, niah_single 1024 tokens through 256 slots: attention mass kept per layer" -o docs/figures/needles_kept_smollm2.svg
  "$KVLAB" plot "$SESSION" --x layer --y fidelity_oracle_mass --by kv_cache.name --where "$where" \
    --title "The oracle (best 256 slots in hindsight) for the same runs: its kept mass per layer" -o docs/figures/needles_oracle_smollm2.svg
  "$KVLAB" plot "$SESSION" --x layer --y fidelity_efficiency --by kv_cache.name --where "$where" \
    --title "Efficiency per layer: each method's kept mass / the oracle's" -o docs/figures/needles_efficiency_smollm2.svg
  echo "results: results/needles.{accuracy,oracle.kept,oracle.mass,oracle.efficiency,provenance}.md; figures docs/figures/needles{,_kept,_oracle,_efficiency}_smollm2.svg"
}
if want needles; then needles; fi
