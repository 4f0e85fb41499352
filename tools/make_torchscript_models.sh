#!/usr/bin/env bash
# Regenerates fixtures/models/torchscript/*.pt (see make_torchscript_models.py). Installs the pinned timm and
# torchvision (without touching the project's torch) into ~/.cache/memgate/torchscript-tools and runs the script
# with the Python of ci/setup.sh's virtual environment.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${MEMGATE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/memgate/venv}"
tools="${XDG_CACHE_HOME:-$HOME/.cache}/memgate/torchscript-tools"
python="$venv/bin/python"
[[ -x "$python" ]] || { echo "make_torchscript_models: no Python at $python; run ci/setup.sh first" >&2; exit 2; }
if [[ ! -f "$tools/.installed" ]]; then
  "$python" -m pip install --quiet --no-deps --target "$tools" timm==1.0.31 torchvision==0.26.0
  "$python" -m pip install --quiet --target "$tools" numpy pyyaml safetensors huggingface_hub pillow
  touch "$tools/.installed"
fi
PYTHONPATH="$tools" "$python" "$root/tools/make_torchscript_models.py" "$@"
