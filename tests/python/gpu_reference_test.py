#!/usr/bin/env python3
"""tools/gpu_reference.py without a GPU, so that a GPU machine's few minutes are not spent on its mistakes:

- every Python fixture of tools/gpu_compare has its zoo twin, with the same batch sizes, and the same training;
- PyTorch's side runs memgate's protocol through to every component (on the CPU, torch.cuda's statistics stubbed
  with a counter that moves at each reading, so that each component is a difference of two distinct readings);
- the comparison reads the three sides' JSON and gives each row's difference to PyTorch.

    python tests/python/gpu_reference_test.py <source dir>
"""
import json
import pathlib
import sys
import tempfile
import types

source = pathlib.Path(sys.argv[1])
sys.path.insert(0, str(source / "tools"))
import gpu_reference as g  # noqa: E402
import torch  # noqa: E402

failures = []


def expect(ok, what):
    if not ok:
        failures.append(what)


# The pairs.
compare_dir = source / "tools" / "gpu_compare"
pairs = sorted(p.name[3:-5] for p in compare_dir.glob("py_*.yaml"))
expect(len(pairs) == 5, f"pairs {pairs}")
for name in pairs:
    py, zoo = g.load_fixture(compare_dir / f"py_{name}.yaml"), g.load_fixture(compare_dir / f"zoo_{name}.yaml")
    expect(py["batch_sizes"] == zoo["batch_sizes"], f"{name}: batch sizes {py['batch_sizes']} vs {zoo['batch_sizes']}")
    expect(py["training"]["optimizer"] == zoo["training"]["optimizer"] == "adamw", f"{name}: optimizers")
    expect(py["model"]["num_classes"] == zoo["model"]["num_classes"], f"{name}: classes")

# PyTorch's side, on a small module of a fixture of its own.
readings = iter(range(0, 1 << 40, 512))
fake = dict(synchronize=lambda: None, empty_cache=lambda: None, reset_peak_memory_stats=lambda: None,
            memory_allocated=lambda: next(readings), max_memory_allocated=lambda: next(readings),
            memory_reserved=lambda: next(readings), max_memory_reserved=lambda: next(readings),
            mem_get_info=lambda: (0, 1 << 30))
for key, value in fake.items():
    setattr(torch.cuda, key, value)
with tempfile.TemporaryDirectory() as tmp:
    tmp = pathlib.Path(tmp)
    (tmp / "models.py").write_text(
        "import torch\n"
        "def small(num_classes=3):\n"
        "    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 8), torch.nn.ReLU(),\n"
        "                               torch.nn.Linear(8, num_classes))\n")
    fixture = {"model": {"arch": "python", "entry": "models.py:small", "args": {"num_classes": 3},
                         "inputs": [{"shape": ["B", 3, 2, 2], "dtype": "float32"}], "task": "classify",
                         "num_classes": 3},
               "training": {"optimizer": "adamw", "trainable": {"train": ["3.*"]}}, "batch_sizes": [2]}
    r = g.reference_probe(fixture, str(tmp / "small.yaml"), 2, device="cpu")
    expect(sorted(r["components"]) == sorted(g.COMPONENTS), f"components {sorted(r['components'])}")
    expect(all(v > 0 for v in r["components"].values()), f"a component read no difference: {r['components']}")
    expect(r["parameter_counts"] == {"total": 12 * 8 + 8 + 8 * 3 + 3, "trainable": 8 * 3 + 3},
           f"parameter counts {r['parameter_counts']} (the head alone trains)")

    # The comparison of three sides' files.
    out = tmp / "out"
    out.mkdir()
    comps = {c: 1000 for c in g.COMPONENTS}
    for kind, bump in (("torch", 0), ("py", 0), ("zoo", 20)):
        doc = {"probes": [{"batch_size": 8, "components": {**comps, "step_peak": 1000 + bump}}]}
        (out / f"{kind}_{pairs[0]}.json").write_text(json.dumps(doc))
    # Without --memgate and with PyTorch's side already there, compare measures nothing and reads the files.
    code = g.main(["compare", "--out", str(out), "--only", pairs[0]])
    rows = json.loads((out / "comparison.json").read_text())["rows"]
    expect(code == 0, f"compare exited {code}")
    expect(len(rows) == len(g.COMPONENTS), f"{len(rows)} rows")
    step = [row for row in rows if row["component"] == "step_peak"][0]
    expect(step["torch"] == step["memgate_python"] == 1000 and step["memgate_zoo"] == 1020, f"row {step}")
    expect(g.pct(1020, 1000) == "+2.00%" and g.pct(1000, 1000) == "+0.00%", "differences in percent")

if failures:
    print("\n".join(failures))
    sys.exit(1)
print(f"gpu_reference: {len(pairs)} pairs, PyTorch's protocol and the comparison checked")
