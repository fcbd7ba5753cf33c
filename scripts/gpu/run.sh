#!/usr/bin/env bash
# The GPU kit's run (docs/GPU.md): unpacks the kit that scripts/gpu/pack.sh made, then runs
# every GPU check, writing one line per check to OUT/summary.txt (PASS, FAIL or SKIPPED, its
# name, what it compared) and every log to OUT/logs.tar.gz.
#   scripts/gpu/run.sh [--dry-run] [--kit DIR] [--out DIR] [--deadline SECONDS] [--only GROUP,...]
# OUT: --out, else $OUT (the device tool's folder), else build/gpu-run (build/gpu-dryrun).
# Relative --kit and --out paths are taken from the repository root. --only picks check groups:
# ops.cuda, eval, finetune, cupti.trace, bench, profile, ops.cuda_memcheck.
# --dry-run: the same script without a GPU: unpacks the kit, checks that its programs load
# with the carried libraries, runs the comparison scripts on CPU-only runs, and reports every
# CUDA check SKIPPED. Exit: 0 no check failed, 1 some check failed, 2 bad arguments, 3 no GPU
# (not a dry run, every CUDA check SKIPPED).
set -uo pipefail  # no -e: a failing check is recorded and the others still run
cd "$(dirname "$0")/../.."
root=$PWD
dry=0
kit_dir=.gpukit
out=${OUT:-}
deadline_s=540  # the device tool stops a command at 600 s
gdev=cuda:0
only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry=1; shift ;;
    --kit) kit_dir=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --deadline) deadline_s=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --gpu-device) gdev=$2; shift 2 ;;  # script testing only: "cpu" runs the GPU half on the CPU
    -h|--help) sed -n 2,12p "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument '$1'; expected --dry-run, --kit DIR, --out DIR, --deadline SECONDS, --only GROUP,..." >&2; exit 2 ;;
  esac
done
if [ -z "$out" ]; then out=$root/build/gpu-run; [ $dry = 1 ] && out=$root/build/gpu-dryrun; fi
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)
rm -f "$out/summary.txt" "$out/logs.tar.gz" "$out/bench.json" "$out/torch_sdpa.json"
work=$(mktemp -d "${TMPDIR:-/tmp}/kvlab-gpu.XXXXXX")
trap 'rm -rf "$work"' EXIT
logs=$work/logs
mkdir -p "$logs"
summary=$out/summary.txt
t_start=$(date +%s)
py=$(command -v python3 || true)
checks=$root/tools/gpu/gpu_checks.py

record() {  # STATUS NAME DETAIL
  printf '%-7s %-34s %s\n' "$1" "$2" "$3" | tee -a "$summary"
}
remaining() { echo $((deadline_s - ($(date +%s) - t_start))); }
budget() {  # seconds a check may take: its own limit or what is left before the deadline
  local r
  r=$(($(remaining) - 15))
  [ "$r" -lt 1 ] && r=1  # never 0: timeout 0 means no limit
  [ "$r" -lt "$1" ] && echo "$r" || echo "$1"
}
# run_logged NAME SECONDS CMD...: stdout+stderr to logs/NAME.log; returns the command's status
# (124 when it ran out of time).
run_logged() {
  local name=$1 secs=$2
  shift 2
  echo "\$ $*" >>"$logs/$name.log"
  timeout -k 10 "$secs" "$@" >>"$logs/$name.log" 2>&1
}
last_line() { grep -v '^\$ ' "$1" 2>/dev/null | grep -E "$2" | tail -1 | cut -c1-300; }

{
  echo "# kvlab GPU kit $([ $dry = 1 ] && echo 'dry run' || echo run): $(date -u '+%Y-%m-%d %H:%M UTC'), host $(uname -n), $(nproc) CPUs"
  echo "# format: STATUS NAME DETAIL, STATUS one of PASS FAIL SKIPPED"
} >"$summary"

# ---- the kit ------------------------------------------------------------------------------
kit=$work/kit
kit_file=$kit_dir/kvlab-gpukit.tar.xz
if [ ! -f "$kit_file" ]; then
  record FAIL kit.unpack "no kit at $kit_file: run scripts/gpu/pack.sh on the build machine and carry .gpukit"
  echo "run.sh: no kit; nothing else can run" >&2
  exit 1
fi
# tar needs the xz program for .tar.xz; Python's tarfile has lzma built in.
if command -v xz >/dev/null; then
  tar -C "$work" -xJf "$kit_file"
else
  "$py" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$kit_file" "$work"
fi
if [ -x "$work/kit/bin/kvlab" ]; then
  record PASS kit.unpack "$(basename "$kit_file") $(($(stat -c %s "$kit_file") >> 20)) MiB: $(sed -n 2p "$kit/MANIFEST")"
else
  record FAIL kit.unpack "$kit_file did not unpack to kit/bin/kvlab"
  exit 1
fi
bin=$kit/bin

# CUDA libraries: the machine's own (CUDA 13). Where the loader does not know them, look in
# the usual toolkit folders and PyTorch's nvidia wheels.
cuda_dirs=""
for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcupti.so.13; do
  ldconfig -p 2>/dev/null | grep -q "$lib " && continue
  f=$(find /usr/local/cuda/lib64 /usr/local/cuda/targets /usr/local/cuda/extras /usr/local/cuda/lib /usr/local/lib /usr/lib/x86_64-linux-gnu /opt \
        -maxdepth 7 -name "$lib" 2>/dev/null | head -1)
  [ -z "$f" ] && [ -n "$py" ] && f=$(find "$("$py" -c 'import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]))' 2>/dev/null || echo /nonexistent)" \
        -maxdepth 6 -name "$lib" 2>/dev/null | head -1)
  [ -n "$f" ] && cuda_dirs="$cuda_dirs:$(dirname "$f")"
done
export LD_LIBRARY_PATH="$kit/lib$cuda_dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# This Debian-built kit needs a libstdc++ at least as new as Debian 12's; if the machine's is
# older, use the carried one.
if ldd "$bin/kvlab" 2>&1 | grep -q "GLIBCXX.*not found\|GCC_.*not found"; then
  export LD_LIBRARY_PATH="$kit/lib:$kit/lib/fallback$cuda_dirs"
  fallback=" (libstdc++ from the kit: the machine's is older)"
fi
missing=""
for f in "$bin"/*; do
  missing="$missing $(ldd "$f" 2>&1 | awk '/not found/ {print $1}' | tr '\n' ' ')"
done
missing=$(echo "$missing" | tr ' ' '\n' | sort -u | tr '\n' ' ' | sed 's/^ *//; s/ *$//')
cuda_note=""
if [ $dry = 1 ]; then  # a dry run's machine may lack CUDA's runtime libraries; the device has them
  cuda_missing=$(echo "$missing" | tr ' ' '\n' | grep -E '^lib(cuda|cudart|cublas|cublasLt|cupti)\.' | tr '\n' ' ')
  missing=$(echo "$missing" | tr ' ' '\n' | grep -vE '^lib(cuda|cudart|cublas|cublasLt|cupti)\.' | tr '\n' ' ' | sed 's/ *$//')
  [ -n "$cuda_missing" ] && cuda_note=" (dry run: CUDA libraries not found here: $cuda_missing)"
fi
if [ -z "$missing" ]; then
  record PASS kit.libraries "every program and plugin resolves its libraries${fallback:-}; CUDA from ${cuda_dirs:-the loader cache}$cuda_note"
else
  record FAIL kit.libraries "unresolved: $missing"
fi
"$bin/kvlab" version >"$logs/kit.version.log" 2>&1
rc=$?
cuda_line=$(grep -m1 "cuda backend" "$logs/kit.version.log")
if [ $rc = 0 ]; then
  record PASS kit.version "kvlab version runs from the kit; ${cuda_line:-no cuda backend line}"
else
  record FAIL kit.version "kvlab version exited $rc: $(tail -1 "$logs/kit.version.log")"
fi

# ---- is there a GPU? ----------------------------------------------------------------------
gpu_skip=""
if [ $dry = 1 ]; then
  gpu_skip="dry run: no CUDA checks"
elif [ "$gdev" = cpu ]; then
  record SKIPPED gpu.device "--gpu-device cpu: the checks' own logic, the GPU side run on the CPU (CUDA-only checks fail)"
elif ! nvidia-smi -L >"$logs/gpu.device.log" 2>&1; then
  gpu_skip="no GPU: nvidia-smi -L failed ($(tail -1 "$logs/gpu.device.log"))"
elif ! echo "$cuda_line" | grep -Eq "built, [1-9][0-9]* devices?"; then
  gpu_skip="the CUDA backend does not load: $cuda_line"
fi
if [ -n "$gpu_skip" ]; then
  record SKIPPED gpu.device "$gpu_skip"
elif [ "$gdev" != cpu ]; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >>"$logs/gpu.device.log" 2>&1
  record PASS gpu.device "$(tail -1 "$logs/gpu.device.log"); $cuda_line"
  sed -i "1a # device: $(tail -1 "$logs/gpu.device.log")" "$summary"
fi

# ---- the eval_long matrix: every registered policy and buffer, CPU and GPU -----------------
# From the registries of the kit's own kvlab (`kvlab list`), so a new policy or buffer joins
# without an edit here: every policy on default and q8 (where its descriptor allows them), and
# every buffer under h2o (attention-weight scores) and lastrec (positions only).
# Fields separated by \037 (unit separator): a tab is IFS white space, so `read` would merge the
# empty "required" fields of most policies with their neighbours.
"$bin/kvlab" list policies --format tsv | tail -n +2 | tr '\t' '\037' >"$work/policies.tsv"
buffers=$("$bin/kvlab" list buffers)
export work
buffer_allowed() {  # ALLOWED BUFFER: the descriptor's list ("all" or a comma list) holds it
  [ "$1" = all ] || [[ ",$1," == *",$2,"* ]]
}
matrix() {
  {
    while IFS=$'\037' read -r name allowed _; do
      for b in default q8; do buffer_allowed "$allowed" "$b" && echo "$name-$b"; done
    done <"$work/policies.tsv"
    for b in $buffers; do for p in h2o lastrec; do echo "$p-$b"; done; done
  } | sort -u
}
# The registry's required options and cache length of the cache's policy (its longest name
# prefix), one argument per line: smart-lastrec's regex, duo's gate pattern, 0 for dense.
policy_args() {
  local cache=$1 best="" req="" len=128 name allowed r text needs_len _rest
  while IFS=$'\037' read -r name allowed r text needs_len _rest; do
    if [[ "$cache" == "$name-"* ]] && [ ${#name} -gt ${#best} ]; then
      best=$name req=$r
      [ "$needs_len" = 0 ] && len=0 || len=128
    fi
  done <"$work/policies.tsv"
  printf -- '--kv_cache.cache_length\n%s\n' "$len"
  local kv
  IFS=';' read -ra kv <<<"$req"
  for x in "${kv[@]}"; do [ -n "$x" ] && printf -- '--%s\n%s\n' "${x%%=*}" "${x#*=}"; done
  return 0
}
# eval_one MODEL DEVICE CACHE DIR THREADS: one eval_long run into DIR/CACHE.kvlab.
eval_one() {  # every chunk's scores are kept (--telemetry.score_interval 1): the tie check reads them
  local model=$1 dev=$2 cache=$3 dir=$4 threads=$5 extra=()
  mapfile -t extra < <(policy_args "$cache")
  case "$cache" in
    smart-lastrec-*) extra+=(--kv_cache.end_initial_regex 'memorize it\.') ;;  # the end of the passkey task's instruction
  esac
  "$bin/kvlab" eval_long "$model" --device "$dev" --threads "$threads" --data passkey --data.seq_length 512 \
    --data.num_samples 1 --kv_cache.name "$cache" --kv_cache.chunk_size 32 \
    --telemetry.cupti false --telemetry.score_interval 1 "${extra[@]}" --session "$dir/$cache.kvlab" >"$dir/$cache.log" 2>&1 || echo "exit $?" >>"$dir/$cache.log"
}
export -f buffer_allowed policy_args
export -f eval_one
export bin
# eval_matrix NAME MODEL DEVICE_B CACHES...: runs every cache on cpu and DEVICE_B, compares each pair.
eval_matrix() {
  local name=$1 model=$2 devb=$3
  shift 3
  local d=$work/$name jobs_cpu=$(( $(nproc) / 2 > 0 ? $(nproc) / 2 : 1 )) secs
  mkdir -p "$d/a" "$d/b"
  secs=$(budget 200)
  if [ "$secs" -lt 20 ]; then record SKIPPED "$name" "out of time ($(remaining) s left of the deadline)"; return; fi
  local t0=$(date +%s)
  # CPU runs in parallel, two threads each; GPU runs four at a time (small models leave it idle).
  printf '%s\n' "$@" | timeout "$secs" xargs -P "$jobs_cpu" -I{} bash -c "eval_one '$model' cpu {} '$d/a' 2"
  secs=$(budget 200)
  printf '%s\n' "$@" | timeout "$secs" xargs -P 4 -I{} bash -c "eval_one '$model' '$devb' {} '$d/b' 2"
  local ok=0 bad=0 first="" refused=0 n=0
  for c in "$@"; do
    echo "== $c" >>"$logs/$name.log"
    # A cache the CPU itself refuses for this model (nf4's 64-value blocks on tiny's 16-wide
    # heads, smart-lastrec without a tokenizer) is not in the CPU matrix: counted, its
    # message logged, not compared.
    if grep -q "^kvlab: error: \|^kvlab: --" "$d/a/$c.log" 2>/dev/null; then
      refused=$((refused + 1))
      grep -h "kvlab: error" "$d/a/$c.log" >>"$logs/$name.log"
      continue
    fi
    n=$((n + 1))
    local expect=()
    [ "$devb" != cpu ] && expect=(--expect-device "$devb")
    if "$py" "$checks" eval "$d/a/$c.kvlab" "$d/b/$c.kvlab" "${expect[@]}" >>"$logs/$name.log" 2>&1; then
      ok=$((ok + 1))
    else
      bad=$((bad + 1))
      [ -z "$first" ] && first="$c: $(grep -h "FAIL\|error" "$logs/$name.log" "$d/b/$c.log" 2>/dev/null | tail -1 | cut -c1-200)"
    fi
  done
  cat "$d"/a/*.log "$d"/b/*.log >"$logs/$name.runs.log" 2>/dev/null
  local what="$ok of $n caches: cpu vs $devb mean loss within 1e-4 relative (1e-3 after tied choices) and identical cache decisions or ties ($refused the CPU refuses for this model; $(($(date +%s) - t0)) s)"
  if [ $bad = 0 ] && [ $ok -gt 0 ]; then record PASS "$name" "$what"; else record FAIL "$name" "$what; first failure $first"; fi
}

# ---- CUDA checks ----------------------------------------------------------------------------
skip_all() { for n in "$@"; do record SKIPPED "$n" "$gpu_skip"; done; }
gtest_counts() {  # LOG -> "P passed, F failed, S skipped"
  local p f s
  p=$(grep -o '\[  PASSED  \] [0-9]*' "$1" | grep -o '[0-9]*$' | tail -1)
  f=$(grep -o '\[  FAILED  \] [0-9]* test' "$1" | grep -o '[0-9]*' | tail -1)
  s=$(grep -o '\[  SKIPPED \] [0-9]* test' "$1" | grep -o '[0-9]*' | tail -1)
  echo "${p:-0} passed, ${f:-0} failed, ${s:-0} skipped"
}
cuda_filter='AllOps/OpConsistency.MatchesReference/cuda_*'

# Each group of checks; --only picks groups by their names (ops.cuda, eval, finetune,
# cupti.trace, bench, ops.cuda_memcheck), e.g. to rerun one that ran out of time.
check_ops() {
  # Op consistency: every cuda_* case (forward, backward, every dtype) against the CPU.
  run_logged ops.cuda "$(budget 120)" "$bin/kvlab_kernel_tests" --gtest_filter="$cuda_filter"
  rc=$?
  counts=$(gtest_counts "$logs/ops.cuda.log")
  if [ $rc = 0 ] && echo "$counts" | grep -q "^[1-9][0-9]* passed, 0 failed, 0 skipped"; then
    record PASS ops.cuda "op-consistency cuda_* cases vs the CPU: $counts"
  else
    record FAIL ops.cuda "op-consistency cuda_* cases vs the CPU: $counts (exit $rc); first: $(last_line "$logs/ops.cuda.log" '^\[  FAILED  \] ' | head -1)"
  fi
}
check_eval() {
  eval_matrix eval.tiny tiny "$gdev" $(matrix)
  smodel=$(ls "$kit_dir"/smollm2-135m-*.gguf 2>/dev/null | head -1)
  if [ -n "$smodel" ]; then
    # The truncated SmolLM2 (one block: a run costs about what a tiny one does), the same matrix.
    eval_matrix eval.smollm2 "$smodel" "$gdev" $(matrix)
  else
    record SKIPPED eval.smollm2 "the kit holds no SmolLM2 ($(grep smollm2 "$kit/MANIFEST"))"
  fi
}
check_finetune() {
  # Fine-tuning: the same few SGD steps on the CPU and the GPU; loss and gradient norm per
  # step, and the saved weights afterwards.
  for mode in lora full; do
    d=$work/finetune.$mode
    mkdir -p "$d"
    for tag in cpu cuda; do
      dev=cpu
      [ $tag = cuda ] && dev=$gdev
      run_logged "finetune.$mode" "$(budget 90)" "$bin/kvlab" "finetune_long_$mode" tiny --device "$dev" --threads 4 \
        --data.seq_length 256 --kv_cache.name h2o-default --kv_cache.cache_length 64 --kv_cache.chunk_size 16 \
        --data.num_samples 8 --data.val_split_fraction 0.25 --train.max_steps 3 --optimizer SGD --train.lr 0.01 \
        --lora.dropout 0 --telemetry.cupti false --session "$d/$tag.kvlab" --out_dir "$d/$tag.out"
    done
    expect=()
    [ "$gdev" != cpu ] && expect=(--expect-device "$gdev")
    if "$py" "$checks" train "$d/cpu.kvlab" "$d/cuda.kvlab" "$d/cpu.out" "$d/cuda.out" "${expect[@]}" >>"$logs/finetune.$mode.log" 2>&1; then
      record PASS "finetune.$mode" "finetune_long_$mode tiny, 3 SGD steps: $(last_line "$logs/finetune.$mode.log" '^saved weights')"
    else
      record FAIL "finetune.$mode" "$(last_line "$logs/finetune.$mode.log" '^FAIL|error')"
    fi
  done
}
check_cupti() {
  # CUPTI: a traced run, its GPU tables, and the three exports.
  d=$work/cupti
  mkdir -p "$d"
  run_logged cupti.trace "$(budget 90)" "$bin/kvlab" eval_long tiny --device "$gdev" --data passkey --data.seq_length 512 \
    --kv_cache.name h2o-default --kv_cache.cache_length 128 --kv_cache.chunk_size 32 --telemetry.cupti true \
    --session "$d/trace.kvlab"
  run_logged cupti.trace 60 "$bin/kvlab" export "$d/trace.kvlab" --run 1 --what all --format chrome-trace -o "$d/trace.json"
  run_logged cupti.trace 60 "$bin/kvlab" export "$d/trace.kvlab" --run 1 --what memory --format csv -o "$d/memory.csv"
  run_logged cupti.trace 60 "$bin/kvlab" export "$d/trace.kvlab" --run 1 --what memory --format torch-snapshot -o "$d/snapshot.pickle"
  if "$py" "$checks" cupti "$d/trace.kvlab" "$d" >>"$logs/cupti.trace.log" 2>&1; then
    record PASS cupti.trace "$(last_line "$logs/cupti.trace.log" '^records:')"
  else
    record FAIL cupti.trace "$(last_line "$logs/cupti.trace.log" '^FAIL|error')"
  fi
}
check_bench() {
  # Benchmarks: ratios to raw cuBLAS, the copy-bandwidth floor and PyTorch, in this run.
  run_logged bench.gpu "$(budget 180)" "$bin/kvlab_gpu_bench" --json "$out/bench.json"
  rc=$?
  if [ $rc = 0 ] && [ -f "$out/bench.json" ]; then
    torch_json=""
    if run_logged bench.torch_sdpa "$(budget 90)" "$py" "$root/tools/gpu/torch_sdpa.py" "$out/bench.json" "$out/torch_sdpa.json"; then
      torch_json=$out/torch_sdpa.json
    else
      record SKIPPED bench.torch_sdpa "$(last_line "$logs/bench.torch_sdpa.log" 'SKIPPED|Error|error')"
    fi
    "$py" "$checks" bench "$out/bench.json" $torch_json >"$logs/bench.summary.log" 2>&1
    grep -E '^(PASS|FAIL) ' "$logs/bench.summary.log" | while read -r s n d; do record "$s" "$n" "$d"; done
  else
    record FAIL bench.gpu "kvlab_gpu_bench exited $rc: $(tail -1 "$logs/bench.gpu.log")"
  fi
}
check_profile() {
  # Where GPU time goes, from our own CUPTI records (no nsys on the device machine): a dense
  # 2048-token prefill of qwen2.5-0.5b in 512-token chunks, and an h2o run in 16-token chunks
  # (attention weights on), and lastrec with a 1024-slot cache fed one token at a time after its
  # prefill (decode). Diagnoses the bench ratios; PASS means the profile was
  # taken, its lines are in logs/profile.*.log.
  d=$work/profile
  mkdir -p "$d"
  local name cache len chunk seq
  for spec in "prefill dense-default 0 512 2048" "chunks h2o-default 512 16 1024" "decode lastrec-default 1024 1 1088"; do
    read -r name cache len chunk seq <<<"$spec"
    run_logged "profile.$name" "$(budget 90)" "$bin/kvlab" eval_long qwen2.5-0.5b --device "$gdev" --data passkey \
      --data.seq_length "$seq" --data.num_samples 1 --kv_cache.name "$cache" --kv_cache.cache_length "$len" \
      --kv_cache.chunk_size "$chunk" --telemetry.cupti true --session "$d/$name.kvlab"
    if "$py" "$checks" profile "$d/$name.kvlab" >>"$logs/profile.$name.log" 2>&1; then
      record PASS "profile.$name" "$cache, $seq tokens in chunks of $chunk: $(last_line "$logs/profile.$name.log" '^kernels:' | sed 's/^kernels: //'); top: $(grep -m1 '^ ' "$logs/profile.$name.log" | tr -s ' ' | cut -c1-120)"
    else
      record FAIL "profile.$name" "$(last_line "$logs/profile.$name.log" '^FAIL|error')"
    fi
  done
}
check_memcheck() {
  # Last, the slowest: the same op cases under compute-sanitizer memcheck.
  secs=$(budget 300)
  if [ "$secs" -lt 30 ]; then
    record SKIPPED ops.cuda_memcheck "out of time ($(remaining) s left of the deadline)"
  elif ! cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer /usr/local/cuda*/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1) || [ -z "$cs" ]; then
    record FAIL ops.cuda_memcheck "compute-sanitizer is neither on the PATH nor under /usr/local/cuda*"
  else
    run_logged ops.cuda_memcheck "$secs" "$cs" --tool memcheck --error-exitcode 86 --print-limit 20 \
      "$bin/kvlab_kernel_tests" --gtest_filter="$cuda_filter"
    rc=$?
    errs=$(last_line "$logs/ops.cuda_memcheck.log" 'ERROR SUMMARY')
    if [ $rc = 0 ] && echo "$errs" | grep -q "ERROR SUMMARY: 0 errors"; then
      record PASS ops.cuda_memcheck "cuda_* cases under memcheck: $(gtest_counts "$logs/ops.cuda_memcheck.log"); $errs"
    else
      record FAIL ops.cuda_memcheck "exit $rc$([ $rc = 124 ] && echo ' (out of time)'): ${errs:-no error summary}; $(gtest_counts "$logs/ops.cuda_memcheck.log")"
    fi
  fi
}
want() { [ -z "$only" ] || [[ ",$only," == *",$1,"* ]]; }
if [ -n "$gpu_skip" ]; then
  skip_all ops.cuda eval.tiny eval.smollm2 finetune.lora finetune.full cupti.trace bench.gpu bench.torch_sdpa profile.prefill profile.chunks profile.decode ops.cuda_memcheck
else
  want ops.cuda && check_ops
  want eval && check_eval
  want finetune && check_finetune
  want cupti.trace && check_cupti
  want bench && check_bench
  want profile && check_profile
  want ops.cuda_memcheck && check_memcheck
fi

# ---- dry run: the comparison scripts on CPU-only runs ----------------------------------------
if [ $dry = 1 ]; then
  # The same cache on the CPU twice must compare equal; two different caches must not: the
  # checker can pass and can fail, without a GPU.
  d=$work/selftest
  mkdir -p "$d/a" "$d/b" "$d/c"
  if [ -z "$py" ]; then
    record FAIL selftest.compare "python3 is missing (the comparisons need it)"
  else
    eval_one tiny cpu h2o-q8 "$d/a" 1
    eval_one tiny cpu h2o-q8 "$d/b" 1
    eval_one tiny cpu lastrec-q8 "$d/c" 1
    mv "$d/c/lastrec-q8.kvlab" "$d/c/h2o-q8.kvlab"
    "$py" "$checks" eval "$d/a/h2o-q8.kvlab" "$d/b/h2o-q8.kvlab" >"$logs/selftest.same.log" 2>&1
    same=$?
    "$py" "$checks" eval "$d/a/h2o-q8.kvlab" "$d/c/h2o-q8.kvlab" >"$logs/selftest.differ.log" 2>&1
    differ=$?
    if [ $same = 0 ] && [ $differ = 1 ]; then
      record PASS selftest.compare "h2o-q8 vs itself on the CPU passes ($(tail -1 "$logs/selftest.same.log" | cut -c1-120)); h2o-q8 vs lastrec-q8 fails"
    else
      record FAIL selftest.compare "same-run compare exit $same (want 0), different-run compare exit $differ (want 1): $(tail -1 "$logs/selftest.same.log") / $(tail -1 "$logs/selftest.differ.log")"
    fi
    # Ties: knorm on the passkey text ties in exact math (RoPE keeps the norm of a repeated
    # token's key); the AVX2 and AVX-512 kernels round differently and break some ties the other
    # way, as the GPU does. The check must pass such runs and say that it saw tied choices.
    eval_one tiny cpu knorm-default "$d/a" 1
    KVLAB_CPU_VARIANT=avx2 eval_one tiny cpu knorm-default "$d/b" 1
    "$py" "$checks" eval "$d/a/knorm-default.kvlab" "$d/b/knorm-default.kvlab" >"$logs/selftest.ties.log" 2>&1
    ties=$?
    if [ $ties = 0 ]; then
      record PASS selftest.ties "knorm, default kernels vs AVX2 kernels on the CPU: $(tail -1 "$logs/selftest.ties.log" | sed 's/.*; //' | cut -c1-150)"
    else
      record FAIL selftest.ties "knorm default vs AVX2 kernels: exit $ties (want 0): $(tail -1 "$logs/selftest.ties.log" | cut -c1-200)"
    fi
    # Fine-tuning: a LoRA run against itself passes (metrics and saved weights read back), a
    # full run against it fails (other gradients from step 1 on).
    for mode in lora full; do
      "$bin/kvlab" "finetune_long_$mode" tiny --device cpu --threads 1 --data.seq_length 256 --kv_cache.name h2o-default \
        --kv_cache.cache_length 64 --kv_cache.chunk_size 16 --data.num_samples 8 --data.val_split_fraction 0.25 \
        --train.max_steps 3 --optimizer SGD --train.lr 0.01 --lora.dropout 0 --telemetry.cupti false \
        --session "$d/$mode.kvlab" --out_dir "$d/$mode.out" >>"$logs/selftest.train.log" 2>&1
    done
    "$py" "$checks" train "$d/lora.kvlab" "$d/lora.kvlab" "$d/lora.out" "$d/lora.out" >"$logs/selftest.train_same.log" 2>&1
    same=$?
    "$py" "$checks" train "$d/lora.kvlab" "$d/full.kvlab" "$d/lora.out" "$d/full.out" >"$logs/selftest.train_differ.log" 2>&1
    differ=$?
    if [ $same = 0 ] && [ $differ = 1 ]; then
      record PASS selftest.train "a LoRA run vs itself passes ($(last_line "$logs/selftest.train_same.log" '^saved weights')); LoRA vs full fails"
    else
      record FAIL selftest.train "same-run compare exit $same (want 0), lora-vs-full exit $differ (want 1): $(tail -1 "$logs/selftest.train_same.log")"
    fi
    # CUPTI: a CPU run and its three exports read back (every reader works), failing only for
    # the GPU records a CPU run cannot have.
    eval_one tiny cpu h2o-default "$d/a" 1
    "$bin/kvlab" export "$d/a/h2o-default.kvlab" --run 1 --what all --format chrome-trace -o "$d/a/trace.json" >"$logs/selftest.cupti.log" 2>&1
    "$bin/kvlab" export "$d/a/h2o-default.kvlab" --run 1 --what memory --format csv -o "$d/a/memory.csv" >>"$logs/selftest.cupti.log" 2>&1
    "$bin/kvlab" export "$d/a/h2o-default.kvlab" --run 1 --what memory --format torch-snapshot -o "$d/a/snapshot.pickle" >>"$logs/selftest.cupti.log" 2>&1
    "$py" "$checks" cupti "$d/a/h2o-default.kvlab" "$d/a" >>"$logs/selftest.cupti.log" 2>&1
    rc=$?
    if [ $rc = 1 ] && ! grep -q "unreadable" "$logs/selftest.cupti.log" && grep -q "no CUPTI_ACTIVITY_KIND_KERNEL records" "$logs/selftest.cupti.log" &&
       grep -q "^torch snapshot devices: \['cpu'\]" "$logs/selftest.cupti.log"; then
      record PASS selftest.cupti "a CPU run's session, Chrome trace, memory CSV and PyTorch snapshot read back; it fails for the missing GPU records"
    else
      record FAIL selftest.cupti "exit $rc (want 1, no unreadable export): $(grep -m1 "unreadable\|Error" "$logs/selftest.cupti.log")"
    fi
    # Benchmark rows become summary lines: one meeting its target, one not, one PyTorch row.
    cat >"$d/bench.json" <<'JSON'
{"device": "none", "rows": [
 {"key": "matmul_f32", "name": "matmul f32 4096^3", "unit": "TFLOP/s", "basis": "raw", "ours": 50, "baseline": 51, "ratio": 0.980, "target": 0.9, "higher_is_better": true, "pass": true},
 {"key": "sdpa_weights_bf16_512x4096", "name": "sdpa bf16 512 queries over 4096: with weights / without", "unit": "ms", "basis": "same call", "ours": 2.0, "baseline": 1.0, "ratio": 2.0, "target": 1.15, "higher_is_better": false, "pass": false}],
 "sdpa_shapes": []}
JSON
    echo '[{"dtype": "bf16", "queries": 512, "keys": 4096, "ours_ms": 1.0, "torch_ms": 0.25, "torch_backend": "none", "target": 0.5}]' >"$d/torch.json"
    "$py" "$checks" bench "$d/bench.json" "$d/torch.json" >"$logs/selftest.bench.log" 2>&1
    got=$(cut -d' ' -f1,2 "$logs/selftest.bench.log" | tr '\n' ' ')
    want="PASS bench.matmul_f32 FAIL bench.sdpa_weights_bf16_512x4096 FAIL bench.sdpa_vs_torch_bf16_512x4096 "
    if [ "$got" = "$want" ]; then
      record PASS selftest.bench_lines "benchmark rows to summary lines: $got"
    else
      record FAIL selftest.bench_lines "got '$got', want '$want'"
    fi
  fi
fi

# ---- what comes back -----------------------------------------------------------------------
pass=$(grep -c '^PASS ' "$summary")
failed=$(grep -c '^FAIL ' "$summary")
skipped=$(grep -c '^SKIPPED ' "$summary")
echo "# totals: $pass PASS, $failed FAIL, $skipped SKIPPED in $(($(date +%s) - t_start)) s" | tee -a "$summary"
cp "$kit/MANIFEST" "$logs/MANIFEST"
tar -C "$work" -czf "$out/logs.tar.gz" logs
echo "run.sh: summary $summary, logs $out/logs.tar.gz"
[ "$failed" = 0 ] || exit 1
# A real run that found no GPU checked nothing on one: say so in the exit status too.
if [ $dry = 0 ] && [ -n "$gpu_skip" ]; then exit 3; fi
exit 0
