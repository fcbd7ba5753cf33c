# Sourced by the CLI test scripts that take KVLAB WORKDIR: unset variables are errors, $kvlab and
# $work from the arguments, a fresh $work, and fail MESSAGE (prints FAIL: MESSAGE, exits 1).
set -u
kvlab="$1"
work="$2"
rm -rf "$work"
mkdir -p "$work"
fail() {
  echo "FAIL: $*"
  exit 1
}
