#!/usr/bin/env bash
# The GPU kit, packed here for a bare H100 machine (docs/GPU.md):
#   scripts/gpu/pack.sh [--out DIR] [--build DIR] [--smollm2-layers N] [--fast]
# Takes the binaries of an existing build (scripts/build.sh with nvcc present: the CUDA and
# CUPTI plugins built), strips them, adds every shared library they link that is neither glibc
# nor CUDA (the device machine has its own CUDA 13 and none of our Debian packages), plus
# libstdc++/libgcc_s as a fallback, into DIR/kvlab-gpukit.tar.xz (xz -9: 1 MB smaller than
# xz -6 once kvlab links Open MPI and its libraries, ~60-80 s on 2 cores; run.sh unpacks with tar or Python's lzma), and beside it SmolLM2-135M
# cut to its first N blocks (default 1) with its Q8_0 embedding re-quantized to Q4_0
# (incompressible, so not in the tarball). DIR (default .gpukit) is ignored by git: name it in
# the device tool's `carry`. Fails when the kit would not leave room under the 64 MiB.
# --fast packs with xz -3 (~8 s instead of ~60 s, 4 MiB larger): the kit's dry-run test
# (scripts/gpu/dry_run_test.sh), which checks the contents and a size bound the real kit is under.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=.gpukit
build=build
layers=1
xz_level=-9
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --smollm2-layers) layers=$2; shift 2 ;;
    --fast) xz_level=-3; shift ;;
    -h|--help) sed -n 2,10p "$0"; exit 0 ;;
    *) echo "pack.sh: unknown argument '$1'; expected --out DIR, --build DIR, --smollm2-layers N, --fast" >&2; exit 2 ;;
  esac
done
# The kit alone; the tree that travels with it (tracked files) comes on top (checked below, and
# that total is the device tool's real limit). 46 MiB: the tarball is ~26 MiB, the one-block
# SmolLM2 19 MiB (its re-quantized embedding is 16 of them).
kit_limit_mib=${KVLAB_GPU_KIT_LIMIT_MIB:-46}
travel_limit_mib=64
# Room left under the device tool's 64 MiB for the tree to grow after packing (results, figures):
# 4 MiB. libicudata (7 MiB of the tarball) is replaced by an empty data package below; libdnnl
# (40 MB unpacked) is the largest library left.
travel_margin_mib=4

bin=$build/bin
need=(kvlab kvlab_kernel_tests kvlab_gpu_bench libkvlab_cuda.so libkvlab_cupti.so)
for f in "${need[@]}"; do
  if [ ! -f "$bin/$f" ]; then
    echo "pack.sh: $bin/$f is missing; build first with nvcc on the PATH (scripts/build.sh; KVLAB_CUDA=AUTO finds it)" >&2
    exit 1
  fi
done
# The device is an H100 (sm_90): the plugin must hold sm_90 code. The build's own nvcc flags
# say which (cuobjdump, where installed, would read the library; this machine has none).
archs=$(grep -hoE "code=\[[^]]*\]" "$build"/kernels/CMakeFiles/kvlab_cuda.dir/flags.make "$build"/build.ninja 2>/dev/null | grep -oE "sm_[0-9a-z]+" | sort -u | tr "\n" " " || true)
if ! echo "$archs" | grep -q "sm_90"; then
  echo "pack.sh: $bin/libkvlab_cuda.so is not built for sm_90 (nvcc code targets: ${archs:-none found in $build/kernels/CMakeFiles/kvlab_cuda.dir/flags.make}); configure with -DCMAKE_CUDA_ARCHITECTURES='80;90'" >&2
  exit 1
fi

# Up to date: a kit newer than every program, plugin, this script and the model asset is kept
# (ctest packs on every run; the libraries under /lib change only with the system).
asset=${KVLAB_ASSETS:-assets/cache}/SmolLM2-135M-Instruct.Q4_1.gguf
if [ -f "$out/kvlab-gpukit.tar.xz" ] && [ -f "$out/kvlab-gpukit.manifest" ] && [ -f "$out/kvlab-gpukit.layers" ] && [ "$(cat "$out/kvlab-gpukit.layers")" = "$layers xz$xz_level" ] &&
   [ -z "$(find "$bin"/kvlab "$bin"/kvlab_kernel_tests "$bin"/kvlab_gpu_bench "$bin"/kvlab_gguf_truncate "$bin"/libkvlab_*.so "$0" scripts/gpu/icu_stub_data.c "$asset" -newer "$out/kvlab-gpukit.tar.xz" 2>/dev/null)" ]; then
  echo "pack.sh: $out/kvlab-gpukit.tar.xz is up to date (newer than the build, pack.sh and the model)"
  up_to_date=1
fi

stage=$(mktemp -d "${TMPDIR:-/tmp}/kvlab-gpukit.XXXXXX")
trap 'rm -rf "$stage"' EXIT
kit=$stage/kit
if [ -z "${up_to_date:-}" ]; then
mkdir -p "$kit/bin" "$kit/lib/fallback"
mkdir -p "$out"
rm -f "$out"/kvlab-gpukit.* "$out"/smollm2-135m-*.gguf

# Programs and plugins (the engine loads the plugins from next to the executable).
for f in "${need[@]}" $(cd "$bin" && ls libkvlab_cpu_*.so 2>/dev/null); do
  cp "$bin/$f" "$kit/bin/"
done
strip --strip-unneeded "$kit"/bin/* 2>/dev/null || true

# Shared libraries: whatever ldd resolves, except glibc (the machine's own), CUDA (the
# machine's CUDA 13: cuBLAS alone is ~600 MB) and libstdc++/libgcc_s (the machine's, newer on
# its Ubuntu; carried in lib/fallback for run.sh to use only if a GLIBCXX version is missing).
is_glibc() { case "$1" in linux-vdso.so*|ld-linux*|libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libutil.so*|libresolv.so*|libmvec.so*) return 0 ;; esac; return 1; }
is_cuda() { case "$1" in libcuda.so*|libcudart.so*|libcublas.so*|libcublasLt.so*|libcupti.so*|libnvrtc*|libnvJitLink*|libnvperf*) return 0 ;; esac; return 1; }
missing=""
for f in "$kit"/bin/*; do
  while read -r name _ path _; do
    [ -n "$name" ] || continue
    is_glibc "$name" && continue
    is_cuda "$name" && continue
    if [ "$path" = "not" ]; then missing="$missing $name"; continue; fi
    case "$name" in
      libstdc++.so*|libgcc_s.so*) dest=$kit/lib/fallback ;;
      *) dest=$kit/lib ;;
    esac
    [ -f "$dest/$name" ] || cp -L "$path" "$dest/$name"
  done < <(ldd "$f" | awk '/=>/ {print $1, $2, $3, $4}')  # vdso and the loader have no '=>'
done
if [ -n "$missing" ]; then
  echo "pack.sh: these libraries do not resolve here:$missing" >&2
  exit 1
fi
# ICU's data library (31 MB, 7 MB of the tarball) becomes an empty data package: on the device
# kvlab tokenizes byte vocabularies and SmolLM2's GGUF BPE, whose properties, NFC and case
# mapping libicuuc holds itself (scripts/gpu/icu_stub_data.c says what fails without it).
icu_stub=none
for f in "$kit"/lib/libicudata.so.*; do
  [ -f "$f" ] || continue
  sym=$(nm -D --defined-only "$f" | awk '$3 ~ /^icudt[0-9]+[a-z]?_dat$/ {print $3; exit}')
  if [ -z "$sym" ]; then
    echo "pack.sh: $f exports no icudtNN_dat symbol; expected ICU's data library" >&2
    exit 1
  fi
  cc -O2 -shared -fPIC -DICU_DATA_SYMBOL="$sym" -Wl,-soname,"$(basename "$f")" -o "$f" scripts/gpu/icu_stub_data.c
  icu_stub="$(basename "$f") is an empty ICU data package ($sym): NFKC/NFKD normalizers fail on the device"
done
strip --strip-unneeded "$kit"/lib/*.so* "$kit"/lib/fallback/*.so* 2>/dev/null || true

# SmolLM2-135M, first $layers blocks, embedding Q8_0 -> Q4_0 (the whole GGUF, 94 MiB, exceeds
# the 64 MiB the tree may take; its embedding alone is 30 MB): its vocabulary, tokenizer, GQA
# heads and Q4_1 blocks, fewer layers (docs/GPU.md).
if [ -f "$asset" ] && [ -x "$bin/kvlab_gguf_truncate" ] && [ "$layers" -gt 0 ]; then
  "$bin/kvlab_gguf_truncate" "$asset" "$out/smollm2-135m-${layers}l.gguf" "$layers" --q4_0-embedding >/dev/null
  smollm2="smollm2-135m-${layers}l.gguf (first $layers of 30 blocks, embedding re-quantized Q8_0 -> Q4_0)"
else
  smollm2="not packed ($asset or $bin/kvlab_gguf_truncate missing, or --smollm2-layers 0)"
fi

{
  echo "kvlab GPU kit"
  echo "packed: $(date -u '+%Y-%m-%d %H:%M UTC') on $(uname -m), from $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' (+ uncommitted changes)')"
  echo "cuda archs: $archs"
  echo "nvcc: $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' || echo '?')"
  echo "smollm2: $smollm2"
  echo "icu data: $icu_stub"
  echo "files:"
  (cd "$kit" && find . -type f ! -name MANIFEST -printf '%P %s\n' | sort)
} >"$kit/MANIFEST"

XZ_OPT="$xz_level -T2" tar -C "$stage" -cJf "$out/kvlab-gpukit.tar.xz.tmp" kit
mv "$out/kvlab-gpukit.tar.xz.tmp" "$out/kvlab-gpukit.tar.xz"
echo "$layers xz$xz_level" >"$out/kvlab-gpukit.layers"  # what the up-to-date check above compares
cp "$kit/MANIFEST" "$out/kvlab-gpukit.manifest"
else
  smollm2=$(sed -n 's/^smollm2: //p' "$out/kvlab-gpukit.manifest")
fi
# The kit's files: the archive, and the model only when it was packed (an unmatched glob must
# not reach cat, whose failure would end the script silently under pipefail).
kit_files=("$out/kvlab-gpukit.tar.xz")
for f in "$out"/smollm2-135m-*.gguf; do if [ -f "$f" ]; then kit_files+=("$f"); fi; done
kit_bytes=$(stat -c %s "${kit_files[@]}" | awk '{s += $1} END {print s + 0}')
unpacked=$(xz -l --robot "$out/kvlab-gpukit.tar.xz" 2>/dev/null | awk '$1 == "totals" {print $5}')
# What travels besides the kit: tracked and untracked-not-ignored files.
tree_bytes=$(git ls-files -z -co --exclude-standard 2>/dev/null | xargs -0 -r stat -c %s 2>/dev/null | awk '{s+=$1} END {print s+0}')
mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
echo "pack.sh: $out: $(mib "$kit_bytes") MiB (kvlab-gpukit.tar.xz $(mib "$(stat -c %s "$out/kvlab-gpukit.tar.xz")") MiB, $(mib "$unpacked") MiB unpacked; the model beside it); the tree besides it $(mib "$tree_bytes") MiB; together $(mib $((kit_bytes + tree_bytes))) of the device tool's $travel_limit_mib MiB"
echo "pack.sh: smollm2: $smollm2"
if [ "$kit_bytes" -gt $((kit_limit_mib << 20)) ] || [ $((kit_bytes + tree_bytes)) -gt $(((travel_limit_mib - travel_margin_mib) << 20)) ]; then
  echo "pack.sh: too large: the kit must stay under $kit_limit_mib MiB and, with the tree, leave $travel_margin_mib MiB of the $travel_limit_mib MiB (--smollm2-layers 1, or 0 for no SmolLM2)" >&2
  exit 1
fi
