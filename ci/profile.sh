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

# build_stage <what> <log> <command...>: as stage, and while the build runs, its latest step ("[41/97] Building CXX
# object ..." from Ninja, "[ 45%] ..." from Make) every 30 s, so that a first build of many minutes is seen to move.
build_stage() {
  local what=$1 log=$2
  shift 2
  say "$what (log: $log)"
  "$@" >"$log" 2>&1 &
  local pid=$! status=0 waited=0 step
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    waited=$((waited + 1))
    if [ $((waited % 30)) -eq 0 ]; then
      step=$(grep '^\[' "$log" | tail -n 1 | cut -c1-100 || true)
      say "  still building after ${waited} s: step ${step:-(none yet)}"
    fi
  done
  wait "$pid" || status=$?
  if [ "$status" -ne 0 ]; then
    say "$what failed (exit $status); the end of $log:"
    tail -n 30 "$log" >&2
    exit "$status"
  fi
  say "  built in ${waited} s"
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
# The first build compiles memgate's command and its measuring program (LibTorch's headers, some 50 C++ files): 13
# minutes on 2 cores when issue 58 timed it (pip's build of the same and the Python extension: 14 min 38 s); more
# cores divide it. ccache (CMAKE_CXX_COMPILER_LAUNCHER=ccache) makes a rebuild of an unchanged file free.
build_stage "building build/cpu/bin/memgate: about 13 minutes on 2 cores the first time, seconds after" build/build.log \
  cmake --build --preset cpu --target memgate
exec build/cpu/bin/memgate profile --config "$config" "$@"
