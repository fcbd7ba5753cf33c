#!/usr/bin/env bash
# The main job: set up, build, and run kvlab's demo — a KV-cache policy comparison on the
# built-in tiny model and the passkey task (dense reference, h2o, lastrec, streaming; 8192
# tokens, 1024 slots, chunks of 128), recorded into a new session file.
#   - With a display ($DISPLAY or $WAYLAND_DISPLAY): the desktop app opens on that session and
#     runs the comparison live (kvlab-gui --demo).
#   - Without one: the same runs headless with the CLI (kvlab eval_long ... --session), then
#     `kvlab compare` prints the table; the session path is printed for later inspection.
# KVLAB_HEADLESS=1 forces the headless path; KVLAB_DEMO_DIR chooses where the session goes.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh

dir=${KVLAB_DEMO_DIR:-${HOME:-.}/.local/share/kvlab}
mkdir -p "$dir" 2>/dev/null && [ -w "$dir" ] || dir=build
session="$dir/demo-$(date +%Y%m%d-%H%M%S).kvlab"

if [ -n "${DISPLAY:-}${WAYLAND_DISPLAY:-}" ] && [ -z "${KVLAB_HEADLESS:-}" ]; then
  if [ -x build/bin/kvlab-gui ]; then
    echo "run: opening kvlab-gui on $session (the demo comparison runs live)"
    exec build/bin/kvlab-gui --demo "$session"
  fi
  echo "run: a display is present but kvlab-gui was not built (Qt 6 / Dear ImGui missing?); running headless" >&2
fi

start=$(date +%s)
common=(tiny --data passkey --data.seq_length 8192 --data.num_samples 4 --kv_cache.chunk_size 128 --session "$session")
log=$(mktemp)
trap 'rm -f "$log"' EXIT
run() {  # run NAME CACHE LENGTH
  local t0
  t0=$(date +%s%N)
  if ! ./build/bin/kvlab eval_long "${common[@]}" --name "$1" --kv_cache.name "$2" --kv_cache.cache_length "$3" \
      >"$log" 2>&1; then
    cat "$log" >&2
    exit 1
  fi
  local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  printf "run: %-24s %s  (%d.%d s)\n" "$1" "$(sed -n 's/^result: //p' "$log")" $((ms / 1000)) $((ms % 1000 / 100))
}
echo "run: no display; headless demo comparison into $session"
run "dense (reference)" dense-default 0
run "h2o-default L=1024" h2o-default 1024
run "lastrec-default L=1024" lastrec-default 1024
run "streaming-default L=1024" streaming-default 1024
echo
./build/bin/kvlab compare "$session" --reference 1
echo
echo "session: $session  ($(( $(date +%s) - start )) s)"
echo "inspect: build/bin/kvlab runs $session | build/bin/kvlab-gui $session | build/bin/kvlab export $session --run 2 ..."
