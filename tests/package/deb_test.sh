#!/usr/bin/env bash
# The Debian package end to end: scripts/package.sh --no-build packs the build folder, dpkg -x
# unpacks it into a scratch root, and the installed files run: `kvlab version` (kernel
# variants loaded from usr/lib/kvlab), a short `kvlab eval_long tiny` into a session, the
# missing-model message, and `kvlab-gui --version` without a display.
# Usage: deb_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src="$1"
build="$2"
fail() { echo "deb_test: FAIL: $*" >&2; exit 1; }

KVLAB_BUILD_DIR="$build" "$src/scripts/package.sh" --no-build
deb="$(ls "$build"/package/kvlab_*_amd64.deb | head -n 1)"
[ -f "$deb" ] || fail "no .deb in $build/package"
case "$(basename "$deb")" in kvlab_[0-9]*.[0-9]*_amd64.deb) ;; *) fail "unexpected file name $(basename "$deb")" ;; esac

depends="$(dpkg-deb -f "$deb" Depends)"
echo "Depends: $depends"
for lib in libc6 libstdc++6 libgomp1 libdnnl libsqlite3; do
  echo "$depends" | grep -q "$lib" || fail "Depends lacks $lib (dpkg-shlibdeps should have found it): $depends"
done
if echo "$depends" | grep -qi 'cuda\|cublas\|cupti'; then fail "Depends names a CUDA library; the CUDA plugins are optional: $depends"; fi

contents="$(dpkg-deb -c "$deb")"
for f in ./usr/bin/kvlab ./usr/bin/kvlab-bench ./usr/share/kvlab/fetch_assets.sh ./usr/share/man/man1/kvlab.1.gz; do
  grep -q " $f\$" <<<"$contents" || fail "$f is not in the package"
done
if grep -q '^KVLAB_HAVE_GUI' "$build/CMakeCache.txt" 2>/dev/null || [ -x "$build/bin/kvlab-gui" ]; then
  for f in ./usr/bin/kvlab-gui ./usr/share/applications/kvlab.desktop ./usr/share/icons/hicolor/scalable/apps/kvlab.svg \
           ./usr/share/man/man1/kvlab-gui.1.gz; do
    grep -q " $f\$" <<<"$contents" || fail "$f is not in the package"
  done
fi
for so in "$build"/bin/libkvlab_cpu_*.so; do
  [ -e "$so" ] || continue
  grep -q " ./usr/lib/kvlab/$(basename "$so")\$" <<<"$contents" || fail "$(basename "$so") is not in the package"
done
if grep -q '\.gguf' <<<"$contents"; then fail "the package holds a model file; assets are fetched, never packed"; fi

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
dpkg -x "$deb" "$scratch/root"
kvlab="$scratch/root/usr/bin/kvlab"
export HOME="$scratch/home"
unset KVLAB_ASSETS XDG_DATA_HOME DISPLAY WAYLAND_DISPLAY KVLAB_CPU_VARIANT
mkdir -p "$HOME"

out="$("$kvlab" version)" || fail "installed kvlab version failed: $out"
echo "$out"
echo "$out" | grep -q '^kvlab [0-9]' || fail "version line missing"
echo "$out" | grep -q '^cpu kernels: ' || fail "no cpu kernels line"
# Only the CPU lines: a build configured without CUDA says so on its cuda lines (KVLAB_CUDA=OFF).
if echo "$out" | grep -E '^cpu (kernels|variants):' | grep -q 'not built'; then
  fail "a kernel variant this CPU runs did not load from usr/lib/kvlab"
fi

out="$("$kvlab" eval_long tiny --data.seq_length 256 --kv_cache.name h2o-default --kv_cache.cache_length 64 \
        --kv_cache.chunk_size 16 --threads 1 --session "$scratch/s.kvlab" 2>&1)" || fail "installed eval_long failed: $out"
echo "$out" | tail -n 3
echo "$out" | grep -q "run 1 done" || fail "eval_long did not finish its run"
out="$(KVLAB_CPU_VARIANT=base "$kvlab" eval_long tiny --data.seq_length 256 --kv_cache.name h2o-default --kv_cache.cache_length 64 \
        --kv_cache.chunk_size 16 --threads 1 --session "$scratch/s.kvlab" 2>&1)" || fail "installed eval_long (base variant) failed: $out"
echo "$out" | grep -q "run 2 done" || fail "eval_long with the base variant did not finish"

# `kvlab bench` runs the installed kvlab-bench beside it (an unknown benchmark reaches its parser).
out="$("$kvlab" bench frob 2>&1)" && fail "installed kvlab bench frob exited 0: $out"
echo "$out" | grep -q "bench: unknown benchmark 'frob'" || fail "installed kvlab bench did not reach kvlab-bench: $out"

set +e
out="$("$kvlab" eval_long smollm2-135m --data.seq_length 64 --kv_cache.name h2o-default --kv_cache.cache_length 32 --kv_cache.chunk_size 16 2>&1)"
rc=$?
set -e
echo "$out"
[ $rc -ne 0 ] || fail "eval_long smollm2-135m without the model asset succeeded"
echo "$out" | grep -q "usr/bin/../share/kvlab/fetch_assets.sh" || fail "the missing-model message does not name the installed fetch script"
echo "$out" | grep -q "$HOME/.local/share/kvlab/assets" || fail "the missing-model message does not name where the model goes"

if [ -x "$scratch/root/usr/bin/kvlab-gui" ]; then
  out="$("$scratch/root/usr/bin/kvlab-gui" --version 2>&1)" || fail "kvlab-gui --version without a display failed: $out"
  echo "$out" | grep -q "kvlab-gui [0-9]" || fail "kvlab-gui --version printed: $out"
fi
echo "deb_test: ok ($(basename "$deb"))"
