#!/bin/sh
# Runs a GUI test binary under a virtual X server (a fresh display per run, so ctest -j is
# safe). Exit 77 = ctest SKIPPED, with the reason, when xvfb-run is not installed.
if ! command -v xvfb-run >/dev/null 2>&1; then
  echo "SKIPPED: xvfb-run not found; install xvfb and xauth (scripts/setup.sh) to run the GUI tests"
  exit 77
fi
exec xvfb-run -a -s "-screen 0 1920x1200x24" "$@"
