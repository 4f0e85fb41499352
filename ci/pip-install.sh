#!/usr/bin/env bash
# memgate as a user installs it (README.md, "Gate your own Python model"): with pip, into a fresh virtual environment,
# then a Python model of a project's own (examples/python) gated from a folder outside this repository. Run by
# ci/test.sh after ci/downstream.sh.
#   1. A fresh virtual environment (build/pip-check/venv) gets the pinned torch, NumPy, PyYAML and scikit-build-core
#      from pip, installed from a folder of wheels kept outside the repository (~/.cache/memgate/wheelhouse, or
#      MEMGATE_WHEELHOUSE): the first run fills it with `pip download`, later runs install from it offline.
#   2. `pip wheel --no-build-isolation` builds memgate's wheel (the one a team caches, docs/python.md), with its build
#      tree outside the source folder; the wheel is checked: the memgate command, memgate-measure, the extension and
#      the GPU fixtures in it, nothing else of this repository, no path of this source tree in its programs, and
#      LibTorch's libraries found relative to where it is installed, not where it was built.
#   3. `pip install` of that wheel into the environment.
#   4. From a folder of the project's own, with the environment neither activated nor named (its memgate command
#      finds the environment's Python): `memgate estimate --all-gpus` finds the GPU fixtures; `memgate check
#      --update-baselines` records the baseline, `memgate check` passes, and with the model grown it fails (exit 1).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
python="${MEMGATE_PYTHON:-$(ci/setup.sh)}"
work="$root/build/pip-check"
wheelhouse="${MEMGATE_WHEELHOUSE:-${XDG_CACHE_HOME:-$HOME/.cache}/memgate/wheelhouse}"
pins=("torch==2.11.0" "numpy==2.4.6" "pyyaml==6.0.4" "scikit-build-core==0.11.6")
log() { printf '[pip-install] %s\n' "$*"; }
fail() { printf '[pip-install] FAILED: %s\n' "$*" >&2; exit 1; }
seconds() { echo $(( $(date +%s) - $1 )); }

rm -rf "$work"
mkdir -p "$work"

# --- 1. a fresh environment, torch from the wheelhouse ---------------------------------------------------------
start=$(date +%s)
base=$("$python" -c 'import sys; print(sys._base_executable)')
"$base" -m venv "$work/venv"
venv_python="$work/venv/bin/python"
pip=("$venv_python" -m pip --disable-pip-version-check --no-cache-dir)
if ! "${pip[@]}" install -q --no-index --find-links "$wheelhouse" "${pins[@]}" 2>"$work/offline.log"; then
  log "filling $wheelhouse (once): ${pins[*]} and what they need"
  "${pip[@]}" download -q -d "$wheelhouse" "${pins[@]}"
  "${pip[@]}" install -q --no-index --find-links "$wheelhouse" "${pins[@]}"
fi
torch_version=$("$venv_python" -c 'import torch; print(torch.__version__)')
log "fresh environment with torch $torch_version: $(seconds "$start") s"

# --- 2. the wheel ------------------------------------------------------------------------------------------------
start=$(date +%s)
touch "$work/stamp"
log "pip wheel --no-build-isolation (its output: build/pip-check/pip-wheel.log)"
if ! "${pip[@]}" wheel --no-build-isolation --no-deps -v -w "$work/wheels" "$root" >"$work/pip-wheel.log" 2>&1; then
  tail -40 "$work/pip-wheel.log" >&2
  fail "pip wheel"
fi
log "built in $(seconds "$start") s: $(cd "$work/wheels" && ls memgate-*.whl)"
# The build tree was not in the source folder (the only CMake build trees there are build/'s presets').
stray=$(find "$root" -path "$root/build" -prune -o -path "$root/.git" -prune -o -newer "$work/stamp" \
          -name CMakeCache.txt -print)
[ -z "$stray" ] || fail "pip's build left a build tree in the source folder: $stray"
"$venv_python" - "$work/wheels" "$root" <<'PY' || fail "the wheel's contents"
import pathlib, subprocess, sys, tempfile, zipfile
wheel = next(pathlib.Path(sys.argv[1]).glob("memgate-*.whl"))
root = sys.argv[2]
names = zipfile.ZipFile(wheel).namelist()
data = "memgate-0.1.0.data/"
expected = ["memgate/__init__.py", "memgate/_build.py", "memgate/pytest_plugin.py", data + "scripts/memgate",
            data + "data/libexec/memgate/memgate-measure", data + "data/share/memgate/fixtures/gpus/h100_80gb.yaml"]
problems = [f"missing {name}" for name in expected if name not in names]
if not any(n.startswith("memgate/_core.") and n.endswith(".so") for n in names):
    problems.append("missing the extension memgate/_core.*.so")
problems += [f"not memgate's: {n}" for n in names if not n.startswith(("memgate/", data, "memgate-0.1.0.dist-info/"))
             or n.startswith(data + "data/share/") and "/fixtures/gpus/" not in n]
with tempfile.TemporaryDirectory() as tmp:
    zipfile.ZipFile(wheel).extractall(tmp)
    for name in names:
        path = pathlib.Path(tmp, name)
        content = path.read_bytes()
        if root.encode() + b"/" in content:
            problems.append(f"{name} names this source tree ({root})")
        if content[:4] == b"\x7fELF":
            dynamic = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True).stdout
            for line in dynamic.splitlines():
                if "RUNPATH" in line or "RPATH" in line:
                    paths = line.split("[", 1)[1].rstrip("]").split(":")
                    problems += [f"{name}: library path {p} is not relative to where it is installed"
                                 for p in paths if not p.startswith("$ORIGIN")]
for problem in problems:
    print(f"[pip-install] {wheel.name}: {problem}", file=sys.stderr)
sys.exit(1 if problems else 0)
PY
log "the wheel holds the command, memgate-measure, the extension and the GPU fixtures; no source path;" \
    "library paths relative to it"

# --- 3. pip install ----------------------------------------------------------------------------------------------
"${pip[@]}" install -q --no-index --find-links "$wheelhouse" "$work"/wheels/memgate-*.whl
"$venv_python" -c 'import memgate; print("[pip-install] import memgate:", memgate.__version__)'

# --- 4. a project's own model, gated from its own folder ------------------------------------------------------------
user=$(mktemp -d)
trap 'rm -rf "$user"' EXIT
cp examples/python/my_models.py examples/python/my_model.yaml "$user/"
memgate=("env" "-u" "MEMGATE_PYTHON" "-u" "MEMGATE_PYTHONPATH" "-u" "PYTHONPATH" "-u" "MEMGATE_PROJECT_DIR"
         "-u" "MEMGATE_SOURCE_DIR" "-u" "MEMGATE_DATA_DIR" "-u" "VIRTUAL_ENV" "$work/venv/bin/memgate")
cd "$user"
"${memgate[@]}" --version
"${memgate[@]}" estimate --config my_model.yaml --all-gpus >"$work/estimate.log" 2>&1 ||
  { cat "$work/estimate.log" >&2; fail "memgate estimate --all-gpus"; }
grep -q "NVIDIA H100 80GB HBM3" "$work/estimate.log" ||
  { cat "$work/estimate.log" >&2; fail "memgate estimate --all-gpus did not find the GPU fixtures"; }
log "memgate estimate --all-gpus, from $user: found the GPU fixtures"
"${memgate[@]}" check --config my_model.yaml --device cpu --update-baselines >"$work/record.log" 2>&1 ||
  { cat "$work/record.log" >&2; fail "memgate check --update-baselines"; }
[ -f baselines/cpu/my_model.json ] || fail "memgate check --update-baselines wrote no baselines/cpu/my_model.json"
"${memgate[@]}" check --config my_model.yaml --device cpu >"$work/check.log" 2>&1 ||
  { cat "$work/check.log" >&2; fail "memgate check failed on the model its baseline was recorded from"; }
log "$(tail -1 "$work/check.log")"
status=0
EXAMPLE_GROW_MODEL=1 "${memgate[@]}" check --config my_model.yaml --device cpu --json "$work/grown.json" \
  >"$work/grown.log" 2>&1 || status=$?
[ "$status" -eq 1 ] || { cat "$work/grown.log" >&2; fail "memgate check on the grown model exited $status, not 1"; }
grep -q "regression" "$work/grown.log" ||
  { cat "$work/grown.log" >&2; fail "the grown model's check named no regression"; }
# The failure names the module that grew (the Sequential's widened layers: "2", its Conv2d, and "3", its ReLU).
"$venv_python" - "$work/grown.json" <<'PY' || { cat "$work/grown.log" >&2; fail "the grown model's check named no module"; }
import json, sys
named = {m["module"] for result in json.load(open(sys.argv[1]))["results"] for m in result.get("modules", [])}
print("[pip-install] the grown model's failures name the modules", ", ".join(sorted(named)))
sys.exit(0 if {"2", "3"} & named else 1)
PY
log "with the model grown: $(tail -1 "$work/grown.log")"
cd "$root"
rm -rf "$work/venv"
