#!/usr/bin/env bash
# Sets up, builds and profiles one fixture on whatever device is present (a GPU if LibTorch sees one).
#   ci/profile.sh                                        # fixtures/models/vit_tiny_lora.yaml
#   ci/profile.sh fixtures/models/retfound_large_lora.yaml --batch-sizes 1,8,32 --output out/profile.json
# Set-up, configure and build print one line each (to stderr) and keep their output in build/setup.log,
# build/configure.log and build/build.log; a stage that fails prints the end of its log and stops the script.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p build

say() { printf '[memgate] %s\n' "$*" >&2; }

# stage <what> <log> <command...>: runs the command with its output in the log; on failure shows the log's end.
stage() {
  local what=$1 log=$2
  shift 2
  say "$what (log: $log)"
  local status=0
  "$@" >"$log" 2>&1 || status=$?
  if [ "$status" -ne 0 ]; then
    say "$what failed (exit $status); the end of $log:"
    tail -n 30 "$log" >&2
    exit "$status"
  fi
}

stage "setting up: Debian packages and LibTorch" build/setup.log ci/setup.sh
# ci/setup.sh prints the Python whose torch the build uses on its last line.
python=$(tail -n 1 build/setup.log)
if [ ! -x "$python" ]; then
  say "ci/setup.sh did not end with a Python interpreter (got '$python'); see build/setup.log"
  exit 1
fi
export MEMGATE_PYTHON="$python"

config="fixtures/models/vit_tiny_lora.yaml"
if [ $# -gt 0 ] && [[ "$1" != --* ]]; then config="$1"; shift; fi
stage "configuring: cmake --preset cpu" build/configure.log cmake --preset cpu
stage "building build/cpu/bin/memgate, a few minutes the first time" build/build.log \
  cmake --build --preset cpu --target memgate
exec build/cpu/bin/memgate profile --config "$config" "$@"
