#!/usr/bin/env bash
# ctest gpu.kit_dry_run (tests/CMakeLists.txt): packs the GPU kit from this build, runs
# scripts/gpu/run.sh --dry-run on it, and checks what a device run relies on: the pack's size
# against the device tool's 64 MiB, its contents, the summary's format and check names, and
# the files that come back ($OUT: at most 8, plain names).
#   scripts/gpu/dry_run_test.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
src=$1
build=$2
t=$build/gpukit-test
rm -rf "$t/out"  # the kit itself is kept: pack.sh repacks only when the build is newer
mkdir -p "$t"
fails=0
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }

for f in "$src"/scripts/gpu/*.sh; do bash -n "$f" || bad "bash -n $f"; done
for f in "$src"/tools/gpu/*.py; do python3 -c 'import ast, sys; ast.parse(open(sys.argv[1]).read(), sys.argv[1])' "$f" || bad "python syntax $f"; done

# --fast: xz -3, not -9 (a minute of one core); the larger tarball only makes the size checks
# below stricter than the real kit needs.
"$src/scripts/gpu/pack.sh" --fast --out "$t" --build "$build" | tee "$t/pack.log"
[ "${PIPESTATUS[0]}" = 0 ] || bad "pack.sh failed"
kit=$t/kvlab-gpukit.tar.xz
[ -f "$kit" ] || { bad "no $kit"; exit 1; }
bytes=$(cat "$t"/kvlab-gpukit.tar.xz "$t"/smollm2-*.gguf 2>/dev/null | wc -c)
tree=$(cd "$src" && git ls-files -z -co --exclude-standard | xargs -0 -r stat -c %s 2>/dev/null | awk '{s+=$1} END {print s+0}')
echo "kit $bytes bytes, tree $tree bytes"
[ "$bytes" -le $((46 << 20)) ] || bad "kit $bytes bytes > 46 MiB"
[ $((bytes + tree)) -le $((60 << 20)) ] || bad "kit + tree $((bytes + tree)) bytes leave less than 4 MiB of the 64 MiB"
list=$(tar -tJf "$kit")
for want in kit/MANIFEST kit/bin/kvlab kit/bin/kvlab_kernel_tests kit/bin/kvlab_gpu_bench kit/bin/libkvlab_cuda.so kit/bin/libkvlab_cupti.so; do
  grep -qx "$want" <<<"$list" || bad "kit lacks $want"
done
grep -q '^kit/lib/libdnnl\.so' <<<"$list" || bad "kit lacks oneDNN (kit/lib/libdnnl.so*)"
# ICU's data library travels as the empty package (scripts/gpu/icu_stub_data.c), not 31 MB.
icu=$(tar -tvJf "$kit" | awk '$6 ~ /^kit\/lib\/libicudata\.so/ {print $3}')
[ -z "$icu" ] || [ "$icu" -lt 65536 ] || bad "kit/lib/libicudata is $icu bytes; expected the empty data package (< 64 KiB)"
grep -q '^icu data: ' "$t/kvlab-gpukit.manifest" || bad "the manifest does not say what became of ICU's data"
echo "$list" | grep -E '/(libcublas|libcudart|libcupti|libc\.so|libm\.so)' && bad "kit carries CUDA or glibc libraries (the machine has its own)"

out=$t/out
"$src/scripts/gpu/run.sh" --dry-run --kit "$t" --out "$out"
rc=$?
[ $rc = 0 ] || bad "run.sh --dry-run exited $rc"
s=$out/summary.txt
[ -f "$s" ] || { bad "no summary"; exit 1; }
grep -v '^#' "$s" | grep -Ev '^(PASS|FAIL|SKIPPED) +[a-z0-9_.x-]+ +[^ ].*$' && bad "summary lines not in the form STATUS NAME DETAIL"
for n in kit.unpack kit.libraries kit.version selftest.compare selftest.ties selftest.train selftest.cupti selftest.bench_lines; do
  grep -Eq "^PASS +$n " "$s" || bad "$n did not PASS"
done
for n in gpu.device ops.cuda ops.cuda_memcheck eval.tiny eval.smollm2 finetune.lora finetune.full cupti.trace bench.gpu bench.torch_sdpa profile.prefill profile.chunks profile.decode; do
  [ "$(grep -Ec "^SKIPPED +$n +dry run" "$s")" = 1 ] || bad "$n is not SKIPPED exactly once in the dry run"
done
lines=$(grep -vc '^#' "$s")
grep -q "^# totals: $(grep -c '^PASS ' "$s") PASS, 0 FAIL, $(grep -c '^SKIPPED ' "$s") SKIPPED" "$s" || bad "totals line does not match the lines"
[ "$lines" = 21 ] || bad "summary has $lines check lines; expected 21"
nfiles=$(find "$out" -type f | wc -l)
[ "$nfiles" -le 8 ] || bad "$nfiles files under OUT; the device tool returns at most 8"
find "$out" -type f | sed "s|^$out/||" | grep -Ev '^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+){0,2}$' && bad "OUT holds names the device tool would not return"
tar -tzf "$out/logs.tar.gz" | grep -q logs/selftest.same.log || bad "logs.tar.gz lacks the selftest log"
[ $fails = 0 ] && echo "gpu kit dry run: OK" || { echo "gpu kit dry run: $fails failures"; exit 1; }
