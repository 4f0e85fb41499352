#!/usr/bin/env bash
# Gates a project of its own with an installed memgate (examples/downstream): installs build/cpu into
# build/install, builds the example against that prefix, runs its gate (it must pass), then builds it again with
# its model grown (-DDOWNSTREAM_GROW_MODEL=ON) and runs the gate again (it must fail, on the grown components).
# Also checks that the installed libraries carry no path of this source tree, and that the example builds and passes
# with memgate added by FetchContent under its own settings (C++17 as its default). Run after the cpu workflow.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
prefix="$root/build/install"
rm -rf "$prefix"
cmake --install build/cpu --prefix "$prefix" >/dev/null
if grep -l -a -F "$root/" "$prefix"/lib/*.a "$prefix"/bin/* "$prefix"/lib/cmake/memgate/*.cmake; then
  echo "downstream: the installed memgate names this source tree ($root): it must not" >&2
  exit 1
fi
# The installed tool finds memgate's GPU fixtures beside itself (<prefix>/share/memgate), from any folder.
(cd /tmp && MEMGATE_PROJECT_DIR= MEMGATE_SOURCE_DIR= "$prefix/bin/memgate" profile \
   --config "$prefix/share/memgate/fixtures/models/vit_tiny_lora.yaml" --batch-sizes 1) >build/install-profile.log 2>&1 ||
  { cat build/install-profile.log >&2; exit 1; }
grep -q "NVIDIA H100 80GB HBM3" build/install-profile.log ||
  { echo "downstream: the installed memgate did not find its GPU fixtures" >&2; cat build/install-profile.log >&2; exit 1; }

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
fetch="$root/build/downstream-fetch"
cmake -S examples/downstream -B "$fetch" "${generator[@]}" -DDOWNSTREAM_FETCH_MEMGATE=ON -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_STANDARD=17 >"$fetch.configure.log" 2>&1 || { cat "$fetch.configure.log" >&2; exit 1; }
cmake --build "$fetch" -j"$(nproc)" >"$fetch.build.log" 2>&1 || { cat "$fetch.build.log" >&2; exit 1; }
ctest --test-dir "$fetch" --output-on-failure -j"$(nproc)" | tail -3
