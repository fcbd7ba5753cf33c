#!/usr/bin/env bash
# The main job: set up, build, and run kvlab's demo, recorded into a new session file.
#   - With a display ($DISPLAY or $WAYLAND_DISPLAY): the desktop app opens on that session and
#     runs the same small sweep live (kvlab-gui --demo), opening on the sweep view.
#   - Without one: `kvlab sweep` on SmolLM2-135M (tiny when the asset is missing): dense and
#     h2o / lastrec / tova at 256 and 512 slots on the repeat task and on licence text (1024
#     tokens each, --fidelity true), printing the tables (copy accuracy, perplexity, and the
#     fidelity numbers with their difference to dense) and writing the figures next to the session.
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
# Headless: a small sweep on the real model (dense + 3 policies x 2 cache sizes on the repeat
# task -- a passage, filler, the passage again -- and on licence text, fidelity on), its tables
# and figures. The random `tiny` model
# stands in when the asset is missing; its numbers say nothing about the policies.
model=smollm2-135m
if [ ! -f assets/cache/SmolLM2-135M-Instruct.Q4_1.gguf ]; then
  echo "run: assets/cache/SmolLM2-135M-Instruct.Q4_1.gguf is missing (scripts/fetch_assets.sh fetches it);" \
       "falling back to the random tiny model, whose numbers do not rank the policies" >&2
  model=tiny
fi
figure="${session%.kvlab}.svg"
echo "run: no display; headless demo sweep on $model into $session"
common=(--data.seq_length 1024 --data.num_samples 1 --kv_cache.name h2o,lastrec,tova --kv_cache.cache_length 256,512
        --kv_cache.chunk_size 64 --fidelity true --session "$session")
echo "== repeat task: a 64-token passage, 384 tokens of filler, the passage again (copied tokens of the repeat) =="
./build/bin/kvlab sweep "$model" --data repeat --data.repeat_length 64 --data.repeat_distance 384 "${common[@]}" --figure "$figure"
echo
echo "== licence text (GPL-3): perplexity =="
./build/bin/kvlab sweep "$model" --data text --data.files /usr/share/common-licenses/GPL-3 "${common[@]}" --figure "${session%.kvlab}.text.svg"
echo
echo "== fidelity against the dense cache (mean over layers and chunks; KL: next-token distribution, nats) =="
for m in fidelity_kept_mass fidelity_next_token_kl; do
  ./build/bin/kvlab sweep "$model" --data repeat --data.repeat_length 64 --data.repeat_distance 384 "${common[@]}" --figure none --metric $m
  ./build/bin/kvlab sweep "$model" --data text --data.files /usr/share/common-licenses/GPL-3 "${common[@]}" --figure none --metric $m
done
./build/bin/kvlab plot "$session" --y fidelity_next_token_kl --facet data -o "${session%.kvlab}.kl.svg" >/dev/null
echo
echo "figures: $figure ${session%.kvlab}.text.svg ${session%.kvlab}.kl.svg"
echo "session: $session  ($(( $(date +%s) - start )) s)"
echo "inspect: build/bin/kvlab runs $session | build/bin/kvlab compare $session --reference 1 | build/bin/kvlab-gui $session"
