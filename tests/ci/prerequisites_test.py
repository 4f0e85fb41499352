#!/usr/bin/env python3
"""What memgate needs is said up front: configuring memgate where prerequisites are missing stops with one message that
names each of them and the one line that installs them, before anything is compiled.

    python tests/ci/prerequisites_test.py <source dir> [<cmake>]

Two configures of memgate's source, each into a folder of its own, and pip's build backend without CMake and without
scikit-build-core:
- pip install's (SKBUILD) with yaml-cpp, fmt and CLI11 hidden and a Python without torch: one message listing the four,
  one apt-get line with the three Debian packages, and the torch line for that very Python;
- no C++ compiler (CXX names none): the compiler, and the apt-get line that installs one.
That memgate configures where everything is there, CI's own configure shows. Run by the Python ci/setup.sh makes
(which has scikit-build-core, as the Python that pip installs memgate into has).
"""
import os
import pathlib
import subprocess
import sys
import tempfile
import venv

source = pathlib.Path(sys.argv[1])
cmake = sys.argv[2] if len(sys.argv) > 2 else "cmake"
failures = []


def configure(build, *args, env=None):
    run = subprocess.run([cmake, "-S", str(source), "-B", str(build), "-G", "Ninja", *args], capture_output=True,
                         text=True, env=env)
    return run.returncode, run.stdout + run.stderr


def expect(case, text, *parts):
    for part in parts:
        if part not in text:
            failures.append(f"{case}: expected {part!r} in:\n{text}")


with tempfile.TemporaryDirectory() as tmp:
    tmp = pathlib.Path(tmp)
    no_torch = tmp / "no-torch"
    venv.create(no_torch, with_pip=False)
    python = str(no_torch / "bin" / "python")

    rc, text = configure(tmp / "pip", "-DSKBUILD=ON", f"-DPython_EXECUTABLE={python}", "-DMEMGATE_BUILD_TESTS=OFF",
                         "-DMEMGATE_BUILD_BENCHMARKS=OFF", "-DMEMGATE_INSTALL=OFF", "-DMEMGATE_MEMORY_SUITE=OFF",
                         "-DCMAKE_DISABLE_FIND_PACKAGE_yaml-cpp=ON", "-DCMAKE_DISABLE_FIND_PACKAGE_fmt=ON",
                         "-DCMAKE_DISABLE_FIND_PACKAGE_CLI11=ON")
    if rc == 0:
        failures.append(f"pip's configure passed without yaml-cpp, fmt, CLI11 and torch:\n{text}")
    expect("pip", text, "memgate: missing prerequisites:", "  - yaml-cpp", "  - fmt", "  - CLI11",
           f"  - torch in {python}", "sudo apt-get install libyaml-cpp-dev libfmt-dev libcli11-dev",
           f"{python} -m pip install torch==2.11.0")
    if text.count("memgate: missing prerequisites") != 1 or text.count("CMake Error") != 1:
        failures.append(f"pip: expected one error, the one message:\n{text}")
    if "GoogleTest" in text or "libgtest-dev" in text:
        failures.append(f"pip: GoogleTest asked for where the memory suites are not built:\n{text}")

    rc, text = configure(tmp / "no-compiler", env={**os.environ, "CXX": str(tmp / "no-such-c++")})
    if rc == 0:
        failures.append(f"configure passed without a C++ compiler:\n{text}")
    expect("no compiler", text, "memgate: missing prerequisites:", "a C++20 compiler", "sudo apt-get install g++")

    # Before CMake runs, pip's build backend (python/build_backend/memgate_build.py) says what CMake cannot: no CMake,
    # no scikit-build-core in the Python pip runs in.
    backend = ("import sys; sys.path.insert(0, 'python/build_backend'); import memgate_build; "
               "memgate_build.prepare_metadata_for_build_wheel(sys.argv[1])")
    no_cmake = {**os.environ, "PATH": str(tmp / "no-bin")}
    no_cmake.pop("CMAKE_EXECUTABLE", None)
    for case, python_, env, parts in [
            ("no CMake", sys.executable, no_cmake,
             ["  - CMake >=3.25", "sudo apt-get install cmake", "pip install 'cmake>=3.25'"]),
            ("no scikit-build-core", python, None, [f"  - scikit-build-core in {python}",
                                                    f"{python} -m pip install scikit-build-core==0.11.6"])]:
        run = subprocess.run([python_, "-c", backend, str(tmp / "metadata")], cwd=source, env=env, capture_output=True,
                             text=True)
        if run.returncode == 0:
            failures.append(f"{case}: the build backend went on")
        expect(case, run.stdout + run.stderr, "memgate: missing prerequisites:", *parts)
        if "Traceback" in run.stderr:
            failures.append(f"{case}: a traceback, not the message:\n{run.stderr}")

for failure in failures:
    print(failure, file=sys.stderr)
sys.exit(1 if failures else 0)
