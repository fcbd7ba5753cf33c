#!/usr/bin/env bash
# Builds the Debian package build/package/kvlab_<version>_amd64.deb with CPack from the
# portable build (x86-64-v2 base + AVX2/AVX-512 kernel variants chosen at run time), so the
# package runs on any x86-64 CPU from x86-64-v2 up. Depends: is computed by dpkg-shlibdeps.
#   scripts/package.sh              set up, build, package
#   scripts/package.sh --no-build   package what the build folder holds (the test suite does this)
# KVLAB_BUILD_DIR picks the build folder (default: build).
set -euo pipefail
cd "$(dirname "$0")/.."
build="${KVLAB_BUILD_DIR:-build}"
if [ "${1:-}" != "--no-build" ]; then
  scripts/setup.sh
  scripts/build.sh
fi
if [ ! -f "$build/CMakeCache.txt" ]; then
  echo "package: $build is not a configured build folder; run scripts/build.sh first" >&2
  exit 1
fi
if grep -q '^KVLAB_NATIVE:BOOL=ON' "$build/CMakeCache.txt"; then
  echo "package: $build was configured with KVLAB_NATIVE=ON, whose binaries run only on CPUs like this one;" \
       "reconfigure with -DKVLAB_NATIVE=OFF (the default)" >&2
  exit 1
fi
for tool in cpack dpkg-shlibdeps file; do
  command -v "$tool" >/dev/null || { echo "package: $tool is missing; run scripts/setup.sh" >&2; exit 1; }
done
rm -rf "$build/package"
log="$build/cpack.log"
if ! (cd "$build" && cpack -G DEB >"$(basename "$log")" 2>&1); then
  echo "package: cpack failed; its log:" >&2
  cat "$log" >&2
  exit 1
fi
deb="$(ls "$build"/package/kvlab_*_amd64.deb 2>/dev/null | head -n 1 || true)"
if [ -z "$deb" ]; then
  echo "package: cpack wrote no kvlab_*_amd64.deb into $build/package; its log: $log" >&2
  exit 1
fi
echo "package: $deb ($(du -h "$deb" | cut -f1))"
dpkg-deb -f "$deb" Package Version Architecture Depends
