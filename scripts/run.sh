#!/usr/bin/env bash
# The main job: set up, build, and run kvlab. Until the desktop app lands this prints the
# CLI help and runs the op benchmark (ratios to this machine's own ceilings).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
./build/bin/kvlab --help
./build/bin/kvlab version
./build/bin/kvlab bench ops
