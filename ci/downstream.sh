#!/usr/bin/env bash
# Gates a project of its own with an installed memgate (examples/downstream): installs build/cpu into
# build/install, builds the example against that prefix, runs its gate (it must pass), then builds it again with
# its model grown (-DDOWNSTREAM_GROW_MODEL=ON) and runs the gate again (it must fail, on the grown components).
# Also checks that the installed libraries carry no path of this source tree, that the installed memgate gates a Python
# project's model (examples/python) from that project's folder, and that memgate added by FetchContent keeps the
# example's own settings (C++17 as its default) and compiles as C++20. Run after the cpu workflow.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
prefix="$root/build/install"
rm -rf "$prefix"
cmake --install build/cpu --prefix "$prefix" >/dev/null
if grep -l -a -F "$root/" "$prefix"/lib/*.a "$prefix"/bin/* "$prefix"/libexec/memgate/* "$prefix"/lib/cmake/memgate/*.cmake \
     "$prefix"/lib/memgate/python/memgate/*; then
  echo "downstream: the installed memgate names this source tree ($root): it must not" >&2
  exit 1
fi
# The installed tool finds memgate's GPU fixtures beside itself (<prefix>/share/memgate), from any folder.
(cd /tmp && MEMGATE_PROJECT_DIR= MEMGATE_SOURCE_DIR= "$prefix/bin/memgate" profile \
   --config "$prefix/share/memgate/fixtures/models/vit_tiny_lora.yaml" --batch-sizes 1) >build/install-profile.log 2>&1 ||
  { cat build/install-profile.log >&2; exit 1; }
grep -q "NVIDIA H100 80GB HBM3" build/install-profile.log ||
  { echo "downstream: the installed memgate did not find its GPU fixtures" >&2; cat build/install-profile.log >&2; exit 1; }
# From a Python project's own folder (examples/python copied out of the repository), with nothing set: the installed
# memgate estimates for every GPU fixture, and runs the Python fixture's probes with its installed package
# (<prefix>/lib/memgate/python) in the Python it was built for; the gate records a baseline and passes.
user=$(mktemp -d)
cp examples/python/my_models.py examples/python/my_model.yaml "$user/"
installed=(env -u MEMGATE_PYTHON -u MEMGATE_PYTHONPATH -u PYTHONPATH -u MEMGATE_PROJECT_DIR -u MEMGATE_SOURCE_DIR
           -u MEMGATE_DATA_DIR "$prefix/bin/memgate")
if ! (cd "$user" && "${installed[@]}" estimate --config my_model.yaml --all-gpus &&
      "${installed[@]}" check --config my_model.yaml --device cpu --update-baselines &&
      "${installed[@]}" check --config my_model.yaml --device cpu) >build/install-python.log 2>&1 ||
   ! grep -q "NVIDIA H100 80GB HBM3" build/install-python.log; then
  echo "downstream: the installed memgate, from a Python project's folder:" >&2
  cat build/install-python.log >&2
  rm -rf "$user"
  exit 1
fi
rm -rf "$user"
echo "downstream: the installed memgate gates a Python project's model from its own folder: $(tail -1 build/install-python.log)"

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
for variant in plain grown; do
  grow=OFF
  [[ $variant == grown ]] && grow=ON
  build="$root/build/downstream-$variant"
  cmake -S examples/downstream -B "$build" "${generator[@]}" -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_BUILD_TYPE=Release -DDOWNSTREAM_GROW_MODEL=$grow >"$build.configure.log" 2>&1 ||
    { cat "$build.configure.log" >&2; exit 1; }
  cmake --build "$build" -j"$(nproc)" >"$build.build.log" 2>&1 || { cat "$build.build.log" >&2; exit 1; }
done
echo "downstream: the example's gate, as committed:"
ctest --test-dir build/downstream-plain --output-on-failure -j"$(nproc)" | tail -3
echo "downstream: the example's gate with its model grown (must fail):"
if ctest --test-dir build/downstream-grown -j"$(nproc)" >build/downstream-grown.ctest.log 2>&1; then
  echo "downstream: the gate passed a grown model" >&2
  exit 1
fi
failed=$(grep -c "ComponentTest.StaysWithinBaseline/tiny_mlp_.*(Failed)" build/downstream-grown.ctest.log || true)
others=$(grep "(Failed)" build/downstream-grown.ctest.log | grep -vc "tiny_mlp_" || true)
echo "downstream: $failed tiny_mlp component tests failed, $others other tests failed"
[[ $failed -gt 0 && $others -eq 0 ]] || { cat build/downstream-grown.ctest.log >&2; exit 1; }

echo "downstream: the example with memgate added by FetchContent (the project's own CMAKE_CXX_STANDARD 17):"
# Configuring checks that adding memgate leaves the project's settings as they were (the example's CMakeLists fails
# otherwise). Building all of memgate a second time would compile the sources the cpu workflow just compiled, with
# the same flags (a third of CI's time), so this checks what differs: every memgate file compiles as C++20 in a
# C++17 project, and the example's own files compile against memgate's headers from its source tree.
fetch="$root/build/downstream-fetch"
cmake -S examples/downstream -B "$fetch" -G Ninja -DDOWNSTREAM_FETCH_MEMGATE=ON -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_STANDARD=17 -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >"$fetch.configure.log" 2>&1 ||
  { cat "$fetch.configure.log" >&2; exit 1; }
python3 - "$fetch/compile_commands.json" <<'PY'
import json, re, sys
commands = json.load(open(sys.argv[1]))
def output(c):  # the object file, relative to the build folder: memgate's are under _deps/memgate-build
    match = re.search(r"(?:^| )-o (\S+)", c["command"])
    return c.get("output") or (match.group(1) if match else "")
memgate = [c for c in commands if output(c).startswith("_deps/")]
own = [c for c in commands if not output(c).startswith("_deps/")]
bad = [c["file"] for c in memgate + own if not re.search(r"-std=(c|gnu)\+\+20", c["command"])]
if not memgate or not own or bad:
    sys.exit(f"downstream: {len(memgate)} memgate files, {len(own)} of the example's; not C++20: {bad[:5]}")
print(f"downstream: {len(memgate)} memgate files and {len(own)} of the example's compile as C++20")
PY
objects=$(cd "$fetch" && ninja -t targets all 2>/dev/null | grep -o '^CMakeFiles/downstream_memory_tests\.dir/[^:]*\.o' | sort -u || true)
[ -n "$objects" ] || { echo "downstream: no object of the example's own in the FetchContent build" >&2; exit 1; }
# shellcheck disable=SC2086
cmake --build "$fetch" --target $objects >"$fetch.build.log" 2>&1 || { cat "$fetch.build.log" >&2; exit 1; }
echo "downstream: the example's own files compile against memgate from its source tree"
