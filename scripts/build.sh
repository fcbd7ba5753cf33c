#!/usr/bin/env bash
# Configures and builds kvlab into ./build (Release). Extra arguments go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j "$jobs" 2>&1 | grep -E "error|warning|Linking|Built target kvlab$" || true
test -x build/bin/kvlab || { echo "build: kvlab was not built" >&2; exit 1; }
