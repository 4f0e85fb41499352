#!/usr/bin/env python3
"""PyTorch's own numbers beside memgate's, on a GPU: the same models, batches, optimizer and protocol.

For each Python fixture in tools/gpu_compare (timm's vit_large_patch16_224 fully fine-tuned and head-only,
vit_small_patch16_224, torchvision's resnet50 and resnet18; each at two batch sizes), this runs:

- PyTorch, plain: the model built by the fixture's own callable under `torch.device("cuda")`, trained with
  `torch.optim.AdamW(foreach=True)` (what memgate's `optimizer_impl: auto` is on CUDA) through memgate's protocol
  (docs/design.md and docs/protocol.md: cuBLAS's handles and workspaces made before anything is counted, params after the build, two eval
  no-grad forwards, one warm-up step, one measured step) and read with `torch.cuda.memory_allocated`,
  `max_memory_allocated` and `max_memory_reserved`, the peaks reset where memgate resets them;
- memgate on the same Python fixture (the same module, measured through memgate's C++ core), and
- memgate on its zoo's twin of the architecture (`zoo_*.yaml`: memgate's own C++ model),

and prints one table of all three with the differences in percent (`--markdown`), and writes them as JSON.

  python3 tools/gpu_reference.py compare --memgate build/gpu/bin/memgate --out build/gpu/gpu-reference
  python3 tools/gpu_reference.py reference --config tools/gpu_compare/py_resnet18_full.yaml   # PyTorch's side only
"""
from __future__ import annotations

import argparse
import concurrent.futures
import fnmatch
import importlib.util
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
COMPARE_DIR = os.path.join(HERE, "gpu_compare")
COMPONENTS = ("params", "gradients", "optimizer_state", "activations", "forward_peak", "eval_peak", "step_peak",
              "step_peak_reserved")


def load_fixture(path: str) -> dict:
    import yaml

    with open(path) as f:
        return yaml.safe_load(f)


def build_module(fixture: dict, fixture_path: str):
    file, func = fixture["model"]["entry"].rsplit(":", 1)
    spec = importlib.util.spec_from_file_location("gpu_compare_models", os.path.join(os.path.dirname(fixture_path), file))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, func)(**fixture["model"].get("args", {}))


def trainable_names(model, trainable) -> list[str]:
    names = [n for n, _ in model.named_parameters()]
    if trainable == "all":
        return names
    patterns = trainable["train"]
    return [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]


def reference_probe(fixture: dict, fixture_path: str, batch_size: int, device: str = "cuda") -> dict:
    """memgate's protocol, in plain PyTorch, read off the CUDA caching allocator."""
    import torch
    import torch.nn.functional as F

    cuda = torch.cuda
    torch.backends.cudnn.benchmark = False

    def sync():
        cuda.synchronize()

    # cuBLAS's and cuBLASLt's handles and workspaces exist before the base is read, as memgate makes them first:
    # this thread's, and those of autograd's thread for the device, which runs backward.
    for dtype in (torch.float32, torch.bfloat16):
        ones = lambda *s: torch.ones(*s, dtype=dtype, device=device)  # noqa: E731
        torch.addmm(ones(8), ones(8, 8), ones(8, 8).requires_grad_()).sum().backward()
    sync()
    cuda.empty_cache()
    base, base_reserved = cuda.memory_allocated(), cuda.memory_reserved()

    torch.manual_seed(0)
    with torch.device(device):
        model = build_module(fixture, fixture_path)
    model.to(device)
    sync()
    params = cuda.memory_allocated() - base
    train = set(trainable_names(model, fixture["training"]["trainable"]))
    for name, p in model.named_parameters():
        p.requires_grad_(name in train)
    counts = {"total": sum(p.numel() for p in model.parameters()),
              "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad)}

    num_classes = fixture["model"]["num_classes"]
    shape = [batch_size if d == "B" else d for d in fixture["model"]["inputs"][0]["shape"]]
    images = torch.randn(*shape, device=device)
    target = torch.randint(num_classes, (batch_size,), device=device)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3, foreach=True)

    model.eval()
    eval_peak = 0
    for _ in range(2):
        sync()
        cuda.reset_peak_memory_stats()
        with torch.no_grad():
            model(images)
        sync()
        eval_peak = cuda.max_memory_allocated() - base
    model.train()

    out = {}
    for step in ("warmup", "measured"):
        sync()
        cuda.reset_peak_memory_stats()
        before_step = cuda.memory_allocated()
        output = model(images)
        loss = F.cross_entropy(output.float(), target)
        del output
        sync()
        if step == "measured":
            out["activations"] = cuda.memory_allocated() - before_step
            out["forward_peak"] = cuda.max_memory_allocated() - before_step
        loss.backward()
        del loss
        sync()
        if step == "measured":
            out["gradients"] = cuda.memory_allocated() - before_step
        before_optimizer = cuda.memory_allocated()
        optimizer.step()
        sync()
        if step == "warmup":
            out["optimizer_state"] = cuda.memory_allocated() - before_optimizer
        optimizer.zero_grad(set_to_none=True)
        sync()
        if step == "measured":
            out["step_peak"] = cuda.max_memory_allocated() - base
            out["step_peak_reserved"] = cuda.max_memory_reserved() - base_reserved
    free, total = cuda.mem_get_info()
    result = {"batch_size": batch_size, "components": {"params": params, "eval_peak": eval_peak, **out},
              "parameter_counts": counts, "outside_allocator_bytes": (total - free) - cuda.memory_reserved()}
    del model, optimizer, images, target
    cuda.empty_cache()
    return result


def cmd_reference(a) -> int:
    import torch

    fixture = load_fixture(a.config)
    sizes = [int(s) for s in a.batch_sizes.split(",")] if a.batch_sizes else fixture["batch_sizes"]
    start = time.monotonic()
    probes = [reference_probe(fixture, a.config, b) for b in sizes]
    doc = {"fixture": os.path.basename(a.config), "torch": torch.__version__,
           "gpu": torch.cuda.get_device_name(), "seconds": round(time.monotonic() - start, 2), "probes": probes}
    text = json.dumps(doc, indent=1)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    return 0


def run(cmd: list[str], log: str) -> int:
    with open(log, "w") as f:
        code = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
        if code != 0:
            print(f"{' '.join(cmd)}: exit status {code}", file=f)
        return code


def probes_by_batch(path: str) -> dict:
    with open(path) as f:
        doc = json.load(f)
    return {p["batch_size"]: p for p in doc["probes"]}


def pct(ours, theirs) -> str:
    if ours is None or theirs is None:
        return "n/a"
    if theirs == 0:
        return "0.00%" if ours == 0 else "inf"
    return f"{100.0 * (ours - theirs) / theirs:+.2f}%"


def cmd_compare(a) -> int:
    os.makedirs(a.out, exist_ok=True)
    pairs = sorted(f[3:-5] for f in os.listdir(COMPARE_DIR) if f.startswith("py_") and f.endswith(".yaml"))
    if a.only:
        pairs = [p for p in pairs if p in a.only.split(",")]
    jobs = []
    for name in pairs:
        py, zoo = (os.path.join(COMPARE_DIR, f"{k}_{name}.yaml") for k in ("py", "zoo"))
        jobs.append((f"torch_{name}", [sys.executable, os.path.abspath(__file__), "reference", "--config", py,
                                       "--out", os.path.join(a.out, f"torch_{name}.json")]))
        if a.memgate:
            for kind, cfg in (("py", py), ("zoo", zoo)):
                jobs.append((f"{kind}_{name}", [a.memgate, "profile", "--config", cfg, "--device", a.device,
                                                "--output", os.path.join(a.out, f"{kind}_{name}.json")]))
    if not a.fresh:  # what an earlier run of the same --out measured is kept (PyTorch's side, run while memgate builds)
        jobs = [(tag, cmd) for tag, cmd in jobs if not os.path.exists(os.path.join(a.out, f"{tag}.json"))]
    failed = []
    with concurrent.futures.ThreadPoolExecutor(a.jobs) as pool:
        futures = {pool.submit(run, cmd, os.path.join(a.out, f"{tag}.log")): tag for tag, cmd in jobs}
        for future in concurrent.futures.as_completed(futures):
            if future.result() != 0:
                failed.append(futures[future])
    rows, table = [], []
    for name in pairs:
        sides = {}
        for kind in ("torch", "py", "zoo"):
            path = os.path.join(a.out, f"{kind}_{name}.json")
            sides[kind] = probes_by_batch(path) if os.path.exists(path) else {}
        for batch in sorted(sides["torch"]):
            for c in COMPONENTS:
                get = lambda k: sides[k].get(batch, {}).get("components", {}).get(c)  # noqa: E731
                row = {"model": name, "batch_size": batch, "component": c, "torch": get("torch"),
                       "memgate_python": get("py"), "memgate_zoo": get("zoo")}
                rows.append(row)
                table.append(f"| {name} | {batch} | {c} | {row['torch']} | {row['memgate_python']} | "
                             f"{pct(row['memgate_python'], row['torch'])} | {row['memgate_zoo']} | "
                             f"{pct(row['memgate_zoo'], row['torch'])} |")
    with open(os.path.join(a.out, "comparison.json"), "w") as f:
        json.dump({"rows": rows, "failed": sorted(failed)}, f, indent=1)
    print("| model | batch | component | PyTorch (bytes) | memgate, Python fixture | diff | memgate, zoo twin | diff |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(table))
    if failed:
        print(f"failed: {', '.join(sorted(failed))} (logs in {a.out})", file=sys.stderr)
    return 1 if failed else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("reference", help="PyTorch's side for one Python fixture of tools/gpu_compare")
    r.add_argument("--config", required=True)
    r.add_argument("--batch-sizes")
    r.add_argument("--out")
    c = sub.add_parser("compare", help="PyTorch, memgate on the Python fixture and on its zoo twin, in one table")
    c.add_argument("--memgate", help="memgate's CLI (build/gpu/bin/memgate); without it, PyTorch's side alone")
    c.add_argument("--device", default="cuda")
    c.add_argument("--out", required=True)
    c.add_argument("--only", help="comma-separated names (vit_large_full, resnet18_full, ...)")
    c.add_argument("--jobs", type=int, default=5)
    c.add_argument("--fresh", action="store_true", help="measure again what --out already holds")
    a = p.parse_args(argv)
    return cmd_reference(a) if a.command == "reference" else cmd_compare(a)


if __name__ == "__main__":
    sys.exit(main())
