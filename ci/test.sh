#!/usr/bin/env bash
# Sets up a fresh machine (ci/setup.sh) and runs memgate's tests: configure, build, unit tests and the CPU memory
# gate, through the `cpu` workflow preset; then a project of its own gated with the installed memgate and with
# FetchContent (ci/downstream.sh, examples/downstream); then memgate installed with pip into a fresh virtual
# environment, gating a Python project's model (ci/pip-install.sh, examples/python). JUnit lands in
# build/cpu/junit.xml, the gate's summary in build/cpu/memgate-summary.md.
set -euo pipefail
cd "$(dirname "$0")/.."
python=$(ci/setup.sh)
export MEMGATE_PYTHON="$python"
rm -f build/cpu/memgate-results.jsonl
status=0
cmake --workflow --preset cpu || status=$?
if [ -s build/cpu/memgate-results.jsonl ]; then
  build/cpu/bin/memgate summary --results build/cpu/memgate-results.jsonl --output build/cpu/memgate-summary.md \
    --html build/cpu/memgate-changed.html >/dev/null || true
fi
if [ "$status" -eq 0 ]; then
  ci/downstream.sh || status=$?
fi
if [ "$status" -eq 0 ]; then
  ci/pip-install.sh || status=$?
fi
exit "$status"
