#!/usr/bin/env python3
"""tools/check_layers.py: memgate's own tree passes; a tree with an upward include, an include cycle or LibTorch in
a layer that links none fails, naming each."""
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(sys.argv[1])
CHECK = ROOT / "tools" / "check_layers.py"


def run(root):
    r = subprocess.run([sys.executable, str(CHECK), str(root)], capture_output=True, text=True)
    return r.returncode, r.stdout


def write(root, rel, text):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


failures = []
code, out = run(ROOT)
if code != 0:
    failures.append(f"memgate's own tree: expected exit 0, got {code}:\n{out}")

with tempfile.TemporaryDirectory() as tmp:
    t = pathlib.Path(tmp)
    write(t, "src/measure/probe.cpp", '#include "memgate/launch/run.h"\n')
    write(t, "include/memgate/gate/a.h", '#include "memgate/gate/b.h"\n')
    write(t, "include/memgate/gate/b.h", '#include "memgate/gate/a.h"\n')
    write(t, "src/report/chart.cpp", "#include <torch/torch.h>\n")
    write(t, "src/misc/x.cpp", "\n")
    code, out = run(t)
    expected = ["src/measure/probe.cpp: measure includes memgate/launch/run.h, of the layer launch above it",
                "include cycle: include/memgate/gate/a.h -> include/memgate/gate/b.h -> include/memgate/gate/a.h",
                "src/report/chart.cpp: report links no LibTorch, but includes torch/torch.h",
                "src/misc: a folder that is not a layer"]
    if code != 1:
        failures.append(f"a tree with violations: expected exit 1, got {code}")
    for e in expected:
        if e not in out:
            failures.append(f"a tree with violations: expected a line with '{e}' in:\n{out}")

for f in failures:
    print(f)
print("check_layers_test: " + (f"{len(failures)} failure(s)" if failures else "ok"))
sys.exit(1 if failures else 0)
