#!/usr/bin/env bash
# scripts/performance.sh assembles docs/PERFORMANCE.md from the benchmarks' --md sections.
# Here it runs with --quick (tiny sizes) and the result, and the committed docs/PERFORMANCE.md,
# must be reference, not a notebook: at most 400 lines, every table followed by its caption
# (CPU, kernels, date, commit) before the next heading, no run diary words.
#   performance_doc.sh KVLAB SOURCE_DIR WORK_DIR
set -euo pipefail
KVLAB=$1 SRC=$2 WORK=$3
rm -rf "$WORK" && mkdir -p "$WORK"
KVLAB=$KVLAB "$SRC/scripts/performance.sh" --quick --out "$WORK/PERFORMANCE.md" 2> "$WORK/log.txt" ||
  { cat "$WORK/log.txt"; echo "FAIL: scripts/performance.sh --quick exited non-zero"; exit 1; }

check() {
  local f=$1 lines tables
  lines=$(wc -l < "$f")
  [ "$lines" -le 400 ] || { echo "FAIL: $f has $lines lines; expected at most 400"; exit 1; }
  if grep -n -i -E 'this session|UTC|load average' "$f"; then
    echo "FAIL: $f reads like a run diary (lines above); expected tables and what they measure"; exit 1
  fi
  # Each table (its |---| separator line) needs a caption line before the next heading or the end.
  awk -v f="$f" '
    /^\|[-:|]+\|$/ { if (open) { print "FAIL: " f ": a table without caption before line " NR; bad = 1 } open = 1; tables++ }
    /^\*Measured on .*, kernels [a-z0-9]+, [0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9], commit [^ ]+\*$/ { open = 0; captions++ }
    /^## / { if (open) { print "FAIL: " f ": a table without caption before line " NR; bad = 1 } open = 0 }
    END { if (open) { print "FAIL: " f ": the last table has no caption"; bad = 1 }
          if (tables == 0) { print "FAIL: " f ": no table"; bad = 1 }
          if (!bad) print f ": " tables " tables, " captions " captions, " NR " lines"; exit bad }' "$f"
}
check "$WORK/PERFORMANCE.md"
# Every benchmark has its section: a table or one "not measured here" line.
for b in ops model families cache policies kivi quest telemetry grad fidelity sweep dist; do
  grep -q "^## .*kvlab bench $b\`\|^## .*\`kvlab bench $b\`" "$WORK/PERFORMANCE.md" ||
    grep -q "not measured here: .*bench $b" "$WORK/PERFORMANCE.md" ||
    { echo "FAIL: no section for kvlab bench $b in $WORK/PERFORMANCE.md"; exit 1; }
done
# The trace view: rendered by the app's OpenGL host under Xvfb where both exist (CI installs
# xvfb), else kvlab bench trace's CPU-side table, or why not here.
if [ -x "$(dirname "$KVLAB")/kvlab-gui" ] && command -v xvfb-run > /dev/null; then
  grep -q '^## Trace view, rendered (`kvlab-gui --bench-frames --bench-only trace`)' "$WORK/PERFORMANCE.md" ||
    { echo "FAIL: no section for kvlab-gui --bench-frames --bench-only trace in $WORK/PERFORMANCE.md"; exit 1; }
else
  grep -q '^## Trace view' "$WORK/PERFORMANCE.md" || { echo "FAIL: no trace view section in $WORK/PERFORMANCE.md"; exit 1; }
fi
check "$SRC/docs/PERFORMANCE.md"
echo PASS
