#!/usr/bin/env python3
"""memgate.profile() in Python: on a fixture file (a Python fixture and its zoo twin give the same bytes), on a
callable (a fixture written for it), one that fails at one batch size (reported as failed, the others measured), and
a bad one (a RuntimeError with memgate's message).

    PYTHONPATH=build/cpu/python python tests/python/api_test.py <source dir>
"""
import pathlib
import sys
import tempfile

import memgate

source = pathlib.Path(sys.argv[1])
failures = []


def expect(ok, what):
    if not ok:
        failures.append(what)


memgate.check_torch()
models = source / "fixtures" / "models"
python = memgate.profile(str(models / "py_resnet_tiny_torchvision.yaml"), batch_sizes=[1, 2], quiet=True)
zoo = memgate.profile(str(models / "resnet_tiny_classify.yaml"), batch_sizes=[1, 2], quiet=True)
expect([p["batch_size"] for p in python["probes"]] == [1, 2], f"batch sizes {[p['batch_size'] for p in python['probes']]}")
for p, z in zip(python["probes"], zoo["probes"]):
    expect(p["components"] == z["components"], f"batch {p['batch_size']}: {p['components']} != {z['components']}")
expect(python["model"]["total_params"] == zoo["model"]["total_params"] > 0, f"params {python['model']} vs {zoo['model']}")

with tempfile.TemporaryDirectory() as tmp:
    module = pathlib.Path(tmp) / "tiny_models.py"
    module.write_text("import torch\n\ndef tiny():\n    return torch.nn.Linear(4, 2)\n")
    sys.path.insert(0, tmp)
    import tiny_models

    result = memgate.profile(tiny_models.tiny, inputs=[{"shape": ["B", 4], "dtype": "float32"}], task="sum",
                             batch_sizes=[2], quiet=True)
    expect(result["model"]["name"] == "tiny", f"name {result['model']['name']}")
    expect(result["model"]["total_params"] == 10, f"a Linear(4, 2) has 10 parameters, got {result['model']}")
    expect(result["probes"][0]["components"]["params"] == 40, f"params bytes {result['probes'][0]['components']}")

    # A model that fails at one batch size: that one is reported as failed, the others measured.
    module = pathlib.Path(tmp) / "picky_models.py"
    module.write_text("import torch\n\nclass Picky(torch.nn.Linear):\n    def forward(self, x):\n"
                      "        if x.shape[0] == 3:\n            raise ValueError('not three')\n"
                      "        return super().forward(x)\n\ndef picky():\n    return Picky(4, 2)\n")
    import picky_models

    result = memgate.profile(picky_models.picky, inputs=[{"shape": ["B", 4], "dtype": "float32"}], task="sum",
                             batch_sizes=[2, 3, 4], quiet=True)
    probes = result["probes"]
    expect([p["batch_size"] for p in probes] == [2, 3, 4], f"batch sizes {[p['batch_size'] for p in probes]}")
    expect(probes[1].get("failed") is True and "ValueError: not three" in probes[1].get("error", ""),
           f"batch 3: {probes[1]}")
    expect(probes[0]["components"]["params"] == probes[2]["components"]["params"] == 40, f"batches 2 and 4: {probes}")

try:
    memgate.profile(str(models / "no_such_fixture.yaml"), quiet=True)
    expect(False, "a fixture that is not there raised nothing")
except RuntimeError as e:
    expect("no_such_fixture.yaml" in str(e) and "exit 3" in str(e), f"message: {e}")

for f in failures:
    print("FAILED:", f)
print("api_test: " + (f"{len(failures)} failure(s)" if failures else "ok"))
sys.exit(1 if failures else 0)
