#!/usr/bin/env bash
# One full check of memgate on a GPU machine, in one go (an offline or borrowed GPU machine keeps nothing between
# runs): build with the gpu preset, record the GPU baselines with the update workflow, run the GPU suite again (its
# measuring tests, component verdicts, budgets under the caching allocator's cap and the CUDA tests) as many times
# as time allows, and put PyTorch's own numbers beside memgate's (tools/gpu_reference.py). Each phase writes what it
# made into $OUT as it ends, so a run cut short still returns what it finished:
#   log.txt (everything), env.txt, baselines.tar.gz (baselines/<gpu>/), compare.tar.gz, suite1.tar.gz, ...
#
#   ci/gpu-check.sh [seconds]      # default 540: phases that would start too late are skipped
#
# OUT (default build/gpu/check) receives everything; PUBLISH, if set, a folder that receives only the files above, as
# they are made (a device tool's $OUT that takes few files).
#
# Needs: nvidia-smi, nvcc, CMake, ninja, a python3 with torch 2.11 (+ timm, torchvision for the comparison), and the
# Debian packages staged into .device-deps by ci/stage-device-deps.sh where the machine lacks them.
set -uo pipefail
cd "$(dirname "$0")/.."
case "${1:-540}" in
  -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *[!0-9]*|'') echo "ci/gpu-check.sh: '$1': expected a number of seconds (ci/gpu-check.sh --help)" >&2; exit 2 ;;
esac
budget=${1:-540}
command -v nvidia-smi > /dev/null || { echo "ci/gpu-check.sh: nvidia-smi not found: this checks a GPU machine" >&2; exit 3; }
OUT=${OUT:-$PWD/build/gpu/check}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
t0=$(date +%s)
elapsed() { echo $(( $(date +%s) - t0 )); }
left() { echo $(( budget - $(elapsed) )); }
phase() { echo; echo "=== [$(elapsed) s] $*"; publish log.txt; }
publish() { if [ -n "${PUBLISH:-}" ]; then for f in "$@"; do cp "$OUT/$f" "$PUBLISH/" 2>/dev/null; done; fi; }

phase "environment"
{
  nvidia-smi
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), torch.cuda.get_device_name(), torch.cuda.get_device_properties(0).total_memory)'
  python3 -c 'import timm, torchvision; print("timm", timm.__version__, "torchvision", torchvision.__version__)'
  nvcc --version | tail -2
  cmake --version | head -1; g++ --version | head -1; nproc
} 2>&1 | tee "$OUT/env.txt"
publish env.txt

export MEMGATE_PYTHON=$(command -v python3)
ext=ON
python3 -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
  || { ext=OFF; echo "no Python.h for $MEMGATE_PYTHON: memgate's Python extension is not built (Python fixtures skip)"; }

# PyTorch's side of the comparison needs no build: it runs on the GPU while the CPUs build.
phase "PyTorch's reference runs (in the background)"
python3 tools/gpu_reference.py compare --out "$OUT/compare" > "$OUT/reference.log" 2>&1 &
reference_pid=$!

phase "configure and build (gpu preset)"
cmake --preset gpu -DMEMGATE_PYTHON_EXTENSION=$ext -DMEMGATE_BUILD_BENCHMARKS=OFF > "$OUT/configure.log" 2>&1 \
  || { tail -40 "$OUT/configure.log"; exit 1; }
targets=(memgate memgate_measure_cli memgate_verdicts memgate_memory_tests memgate_cuda_tests)
[ "$ext" = ON ] && targets+=(memgate_python_core)
cmake --build --preset gpu --target "${targets[@]}" > "$OUT/build.log" 2>&1 || { tail -60 "$OUT/build.log"; exit 1; }
echo "built in $(elapsed) s"
# The extension must share the Python process's libstdc++ (a GCC whose -lstdc++ finds only libstdc++.a gave it a copy
# of its own once, and every Python probe crashed): said here, before any probe runs.
[ "$ext" = ON ] && python3 tests/python/extension_runtime_test.py build/gpu/python
wait "$reference_pid"; echo "PyTorch's reference runs: exit $?"

phase "record the GPU baselines (ctest --preset update-baselines-gpu)"
start=$(date +%s)
timeout -k 10 "$(left)" ctest --preset update-baselines-gpu --output-on-failure > "$OUT/record.log" 2>&1
echo "recorded: exit $? in $(( $(date +%s) - start )) s"; tail -5 "$OUT/record.log"
tar czf "$OUT/baselines.tar.gz" --exclude=baselines/cpu baselines -C "$OUT" record.log
publish baselines.tar.gz
# After the recording, not beside it: allocated bytes are per process, but what a probe reads outside the caching
# allocator (cudaMemGetInfo) is the whole GPU's, so other processes on it would count there.
phase "PyTorch beside memgate (tools/gpu_reference.py compare)"
timeout -k 10 "$(left)" python3 tools/gpu_reference.py compare --memgate build/gpu/bin/memgate --out "$OUT/compare" \
  --jobs 3 > "$OUT/compare.log" 2>&1
echo "comparison: exit $?"; cat "$OUT/compare.log"
tar czf "$OUT/compare.tar.gz" -C "$OUT" compare compare.log reference.log configure.log build.log
publish compare.tar.gz

# The suite again, as many times as there is time for (a run takes about what the recording took).
for run in 1 2 3; do
  [ "$(left)" -gt $(( $(date +%s) - start + 30 )) ] || { echo "no time for suite run $run"; break; }
  phase "GPU suite, run $run (ctest --preset gpu)"
  start=$(date +%s)
  timeout -k 10 "$(left)" ctest --preset gpu --output-on-failure > "$OUT/suite$run.log" 2>&1
  echo "suite run $run: exit $? in $(( $(date +%s) - start )) s"; tail -4 "$OUT/suite$run.log"
  cp build/gpu/memgate-results.jsonl "$OUT/results$run.jsonl" 2>/dev/null
  cp build/gpu/junit.xml "$OUT/junit$run.xml" 2>/dev/null
  tar czf "$OUT/suite$run.tar.gz" -C "$OUT" "suite$run.log" "results$run.jsonl" "junit$run.xml" 2>/dev/null
  publish "suite$run.tar.gz"
  rm -f build/gpu/memgate-results.jsonl
done
# The CUDA context and libraries outside the caching allocator, as one probe alone on the GPU reads them: the
# figure for the GPU's fixture (fixtures/gpus/<gpu>.yaml).
phase "outside the caching allocator"
timeout -k 10 60 ctest --preset gpu -R '^CudaProbeTest.MeasuresOnCudaRepeatably$' -V 2>&1 | grep "outside the allocator"
phase "done"
