#!/usr/bin/env bash
# Set up, build and run the whole test suite (ctest). CUDA cases report SKIPPED with the
# reason when no GPU is present. Extra arguments go to ctest (e.g. -R OpConsistency).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
scripts/setup.sh
scripts/build.sh
cd build
ctest --output-on-failure -j "$(nproc 2>/dev/null || echo 2)" "$@"
echo "test.sh: setup + build + tests took $(( $(date +%s) - start )) s"
