#!/usr/bin/env bash
# kvlab against llama.cpp (llama-cpp-python 0.3.36, built from PyPI's source) on the same GGUF and
# tokens: prefill 512/2048 and decode 128 at 1 and 2 threads, interleaved, ratios with min/median/
# max and the load average (docs/PERFORMANCE.md, "Against llama.cpp"). Outside the product, setup
# and CI path. The first call builds llama.cpp into a scratch venv (10-25 min on 2 cores).
#   tools/reference/llama_cpp_bench.sh [--rounds 3] [--threads 1,2] [--json rows.json] ...
#   LLAMA_VENV=DIR picks the venv (default ~/.cache/kvlab/llama-cpp-venv)
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${LLAMA_VENV:-$HOME/.cache/kvlab/llama-cpp-venv}
if ! "$VENV/bin/python" -c 'import llama_cpp' 2>/dev/null; then
  echo "llama_cpp_bench: building llama-cpp-python 0.3.36 into $VENV (10-25 min)" >&2
  /usr/bin/python3 -m venv "$VENV"
  CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} "$VENV/bin/pip" install --quiet llama-cpp-python==0.3.36
fi
exec "$VENV/bin/python" tools/reference/llama_cpp_bench.py "$@"
