#!/usr/bin/env bash
# Installs everything memgate needs on a fresh Debian machine (and is cheap to rerun when all is there):
# the Debian -dev packages (GoogleTest, Google Benchmark, yaml-cpp, nlohmann/json, fmt, CLI11, gloo's headers, ninja,
# Python's headers for memgate's extension) and LibTorch from the pinned torch wheel, in a virtual environment kept
# outside the repository, with the pinned libraries the Python fixtures build their models from (torchvision, timm,
# peft, transformers).
#
#   ci/setup.sh            # install what is missing
#   MEMGATE_VENV=/opt/memgate-venv ci/setup.sh
#
# Prints, on its last line, the Python whose torch the build uses: python=$(ci/setup.sh) captures it.
set -euo pipefail

torch_version="${MEMGATE_TORCH_VERSION:-2.11.0}"
venv="${MEMGATE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/memgate/venv}"
debs=(cmake ninja-build g++ python3-venv python3-dev libgtest-dev libgmock-dev libbenchmark-dev libyaml-cpp-dev nlohmann-json3-dev libgloo-dev
      libfmt-dev libcli11-dev chromium-headless-shell)

log() { printf '[memgate setup] %s\n' "$*" >&2; }

# --- Debian packages -----------------------------------------------------------------------------------------
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
# python3-venv is only needed when the Python in use is Debian's own.
if ((${#missing[@]})); then
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  log "installing Debian packages: ${missing[*]}"
  if ! $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1; then
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
else
  log "Debian packages: all present"
fi

# --- LibTorch from the torch wheel, in a venv outside the repository -------------------------------------------
python="${MEMGATE_PYTHON_BASE:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  log "creating virtual environment $venv"
  mkdir -p "$(dirname "$venv")"
  "$python" -m venv "$venv"
fi
have=$("$venv/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null || true)
if [[ "$have" == "$torch_version"* ]]; then
  log "torch $have already in $venv: nothing to download"
else
  log "installing torch==$torch_version into $venv (a CUDA build: several GB on the first run)"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "torch==$torch_version"
fi
# The libraries the Python fixtures' models come from (tests and the CPU suite), pinned beside torch so that pip keeps
# torch as it is; PyYAML for tools/corpus.py, the references and the pytest plugin, which read fixtures; pytest for the
# plugin's own test (tests/python/pytest_plugin_test.py); check-jsonschema lints ci/github/'s workflows
# (tests/ci/workflow_lint_test.py); scikit-build-core is pip's build backend for memgate (tests/ci/prerequisites_test.py
# runs it); segmentation_models_pytorch, MONAI (with einops, which its SwinUNETR imports) and diffusers build the real
# libraries' models the estimate is checked on (tests/python/libraries_test.cpp); expecttest is imported by torch's
# test utilities, whose OpInfo samples tools/conformance.py runs (ConformanceTest).
py_deps=("torchvision==0.26.0" "timm==1.0.31" "peft==0.21.2" "transformers==5.24.0" "pyyaml==6.0.4" "pytest==9.2.0"
         "check-jsonschema==0.39.0" "scikit-build-core==0.11.6"
         "segmentation-models-pytorch==0.6.0" "monai==1.6.1" "diffusers==0.42.1" "einops==0.8.2" "expecttest==0.3.0")
if "$venv/bin/python" - "${py_deps[@]}" <<'PY' 2>/dev/null; then
import importlib.metadata as m, sys
sys.exit(0 if all(m.version(d.split("==")[0]) == d.split("==")[1] for d in sys.argv[1:]) else 1)
PY
  log "Python fixtures' libraries: all present"
else
  log "installing ${py_deps[*]} into $venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "torch==$torch_version" "${py_deps[@]}"
fi
"$venv/bin/python" - <<'PY' >&2
import torch
print(f"[memgate setup] torch {torch.__version__}, CUDA {torch.version.cuda}, cmake prefix {torch.utils.cmake_prefix_path}")
PY
echo "$venv/bin/python"
