#!/usr/bin/env bash
# Sets up, builds and profiles one fixture on whatever device is present (a GPU if LibTorch sees one).
#   ci/profile.sh                                        # fixtures/models/vit_tiny_lora.yaml
#   ci/profile.sh fixtures/models/retfound_large_lora.yaml --batch-sizes 1,8,32 --output out/profile.json
set -euo pipefail
cd "$(dirname "$0")/.."
python=$(ci/setup.sh)
export MEMGATE_PYTHON="$python"
config="fixtures/models/vit_tiny_lora.yaml"
if [ $# -gt 0 ] && [[ "$1" != --* ]]; then config="$1"; shift; fi
cmake --preset cpu >/dev/null
cmake --build --preset cpu --target memgate
exec build/cpu/bin/memgate profile --config "$config" "$@"
