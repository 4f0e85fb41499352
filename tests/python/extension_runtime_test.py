#!/usr/bin/env python3
"""memgate's extension (memgate/_core*.so) shares the C++ runtime of the Python process it is imported into: it
needs libstdc++.so.6 and defines none of that library's functions itself. A toolchain that links libstdc++
statically by default would put a second copy into the extension, part of which the process resolves to the first:
its probes then crash at the first stream they write to (src/python/CMakeLists.txt links the process's libstdc++).

    python tests/python/extension_runtime_test.py <build dir>/python
"""
import pathlib
import subprocess
import sys

import torch  # noqa: F401 (the process's C++ runtime is the one torch brought)

package = pathlib.Path(sys.argv[1]) / "memgate"
extensions = sorted(package.glob("_core*.so"))
if not extensions:
    sys.exit(f"no memgate/_core*.so in {sys.argv[1]}: build memgate_python_core first")
extension = extensions[0]
runtime = next((line.split()[-1] for line in open("/proc/self/maps") if "/libstdc++.so" in line), None)
if runtime is None:
    sys.exit("torch's process has no libstdc++.so loaded: nothing to compare with")


def defined_functions(path):
    """The functions a shared object defines in its dynamic symbol table (strong ones: T)."""
    out = subprocess.run(["nm", "-D", "--defined-only", str(path)], check=True, capture_output=True, text=True).stdout
    return {fields[2] for fields in (line.split() for line in out.splitlines()) if len(fields) == 3 and fields[1] == "T"}


failures = []
needed = subprocess.run(["readelf", "-d", str(extension)], check=True, capture_output=True, text=True).stdout
if "[libstdc++.so.6]" not in needed:
    failures.append(f"{extension.name} does not need libstdc++.so.6 (it carries its own C++ runtime)")
both = sorted(defined_functions(extension) & defined_functions(runtime))
if both:
    failures.append(f"{extension.name} defines {len(both)} functions of {runtime}, e.g. {', '.join(both[:5])}")
for f in failures:
    print("FAILED:", f)
if failures:
    sys.exit(1)
print(f"ok: {extension.name} needs libstdc++.so.6 and defines none of the functions of {runtime}")
