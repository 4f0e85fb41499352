#!/usr/bin/env python3
"""Plain-PyTorch reference for a Python fixture's own training step (issue 57): the fixture's callables run in the loop
a user writes, measured as tools/timm_reference.py measures (tools/reference_loop.py: torch.profiler's CPU allocation
events, each with the allocator's running total), by memgate's protocol (docs/fixtures.md, "Your own training step"):

  build (seeded 0, under torch.device("cpu")); freeze what `trainable` does not select; the batch, seeded 1 (the
  fixture's `batch:` callable with a torch.Generator seeded 1, or its `inputs` and `target` drawn as memgate draws
  them); the optimizer (memgate's adamw / sgd as torch.optim runs them on the CPU, foreach=False; or the fixture's
  torch.optim class or callable); model.eval() and two passes under no_grad (compute_loss, or forward); model.train()
  and warm-up step(s); the measured step: loss = compute_loss(model, batch) (or forward and the loss / task),
  loss.backward(), clip_grad_norm_(model.parameters(), max_grad_norm), optimizer.step(), ema.update(model),
  optimizer.zero_grad(). An EMA (`training.ema`) is timm's own ModelEmaV3, made after the optimizer.

Components, in bytes above what was allocated before the build: params, gradients, optimizer_state, activations,
forward_peak, eval_peak (absolute), step_peak (absolute), and ema where the fixture keeps one.

Run: ~/.cache/memgate/venv/bin/python tools/step_reference.py --config fixtures/models/py_step_vic.yaml --batch-sizes 2,4

Several fixtures in one run (torch and the fixtures' packages imported once): --config A.yaml --batch-sizes 2,4
--config B.yaml --batch-sizes 1,2 prints a JSON list, one document per --config in its order (one --batch-sizes:
the same for each). Each fixture is run as in a run of its own: its model built anew and its first probe unmeasured.
"""
from __future__ import annotations

import argparse
import contextlib
import fnmatch
import gc
import importlib
import importlib.util
import json
import os
import sys
import types

import torch
import torch.nn.functional as F
from torch.profiler import record_function

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_loop  # noqa: E402
from reference_loop import exit_fast, freeze_what_is_alive, phase_window, protocol_components  # noqa: E402

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "int64": torch.int64,
          "int32": torch.int32, "bool": torch.bool}


def load_callable(fixture_dir: str, text: str):
    """`file.py:callable` relative to the fixture (its folder first on sys.path), or `dotted.module:callable`."""
    where, name = text.rsplit(":", 1)
    if where.endswith(".py") or "/" in where:
        path = where if os.path.isabs(where) else os.path.join(fixture_dir, where)
        folder = os.path.dirname(os.path.abspath(path))
        if folder not in sys.path:
            sys.path.insert(0, folder)
        module_name = "memgate_fixture_" + os.path.splitext(os.path.basename(path))[0]
        if module_name not in sys.modules:
            spec = importlib.util.spec_from_file_location(module_name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            spec.loader.exec_module(module)
        module = sys.modules[module_name]
    else:
        module = importlib.import_module(where)
    return getattr(module, name)


def make_input(spec: dict, batch_size: int) -> torch.Tensor:
    """One of `inputs` (or the `target`) as memgate makes it (src/models/task.cpp, make_input)."""
    shape = [batch_size if d == "B" else int(d) for d in spec["shape"]]
    dtype = DTYPES[spec.get("dtype", "float32")]
    values = spec.get("values")
    if values == "ones":
        return torch.ones(shape, dtype=dtype)
    if values == "zeros":
        return torch.zeros(shape, dtype=dtype)
    if isinstance(values, list):
        return torch.empty(shape, dtype=dtype).uniform_(float(values[0]), float(values[1]))
    if dtype.is_floating_point:
        return torch.randn(shape, dtype=dtype)
    if dtype == torch.bool:
        return torch.randint(2, shape).to(torch.bool)
    return torch.randint(int(spec.get("high", 2)), shape, dtype=dtype)


class Fixture(reference_loop.Loop):
    """A Python fixture's model and training, its own callables (entry, batch, compute_loss, loss, optimizer) run
    as the loop a user writes runs them."""

    def __init__(self, path: str):
        import yaml

        with open(path) as f:
            raw = yaml.safe_load(f)
        self.dir = os.path.dirname(os.path.abspath(path))
        self.model = raw["model"]
        self.training = raw.get("training", {}) or {}
        if self.model.get("arch") != "python":
            raise SystemExit(f"{path}: arch {self.model.get('arch')!r}, expected python")
        if (self.training.get("precision", "fp32") != "fp32" or self.training.get("accumulation_steps", 1) != 1
                or "distributed" in self.training or self.training.get("gradient_checkpointing")):
            raise SystemExit(f"{path}: the reference runs fp32, one micro-batch, one process, no checkpointing")
        m = self.model
        self.build_fn = load_callable(self.dir, m["entry"])
        self.args = m.get("args", {}) or {}
        self.batch_fn = load_callable(self.dir, m["batch"]) if "batch" in m else None
        self.compute_loss = load_callable(self.dir, m["compute_loss"]) if "compute_loss" in m else None
        self.loss_fn = load_callable(self.dir, m["loss"]) if "loss" in m else None
        self.task = m.get("task", "sum")
        self.max_grad_norm = self.training.get("max_grad_norm")
        self.ema_decay = (self.training.get("ema") or {}).get("decay")

    def build(self) -> torch.nn.Module:
        with torch.device("cpu"):
            model = self.build_fn(**self.args)
        model = model.to("cpu")
        gc.collect()
        return model

    def trainable(self, model: torch.nn.Module) -> list:
        trainable = self.training.get("trainable", "all")
        out = []
        for name, p in model.named_parameters():
            if trainable == "all":
                train = True
            elif isinstance(trainable, dict):
                train = any(fnmatch.fnmatchcase(name, pat) for pat in trainable["train"])
            else:
                raise SystemExit(f"trainable {trainable!r}: the reference takes all or {{train: [...]}}")
            p.requires_grad_(train)
            if train:
                out.append(p)
        return out

    def batch(self, batch_size: int):
        """The `batch:` callable's value, else the namespace a loss callable gets (inputs, kwargs, target)."""
        if self.batch_fn is not None:
            return self.batch_fn(batch_size, torch.device("cpu"), torch.Generator(device="cpu").manual_seed(1))
        inputs = self.model["inputs"]
        args, kwargs = [], {}
        for spec in inputs:
            t = make_input(spec, batch_size)
            if spec.get("kwarg"):
                kwargs[spec["kwarg"]] = t
            else:
                args.append(t)
        target = None
        if self.task == "classify" and self.loss_fn is None and self.compute_loss is None:
            target = torch.randint(int(self.model["num_classes"]), (batch_size,))
        if "target" in self.model:
            target = make_input(self.model["target"], batch_size)
        return types.SimpleNamespace(inputs=args, kwargs=kwargs, target=target)

    def forward(self, model, batch):
        if self.batch_fn is not None:
            if isinstance(batch, dict):
                return model(**batch)
            if isinstance(batch, (tuple, list)):
                return model(*batch)
            return model(batch)
        return model(*batch.inputs, **batch.kwargs)

    def loss(self, model, batch):
        if self.compute_loss is not None:
            return self.compute_loss(model, batch)
        output = self.forward(model, batch)
        if self.loss_fn is not None:
            return self.loss_fn(output, batch)
        if self.task == "classify":
            first = output[0] if isinstance(output, (tuple, list)) else output
            return F.cross_entropy(first, batch.target)
        if self.task == "sum":
            tensors = [output] if isinstance(output, torch.Tensor) else list(output)
            total = None
            for t in tensors:
                if t.is_floating_point():
                    s = t.sum()
                    total = s if total is None else total + s
            return total
        raise SystemExit(f"task {self.task!r}: the reference takes classify or sum")

    def eval_pass(self, model, batch):
        if self.compute_loss is not None:
            self.compute_loss(model, batch)
        else:
            self.forward(model, batch)

    def optimizer(self, model, trainable):
        o = self.training.get("optimizer", "adamw")
        if isinstance(o, dict):
            module, name = o["class"].rsplit(".", 1)
            cls = getattr(importlib.import_module(module), name)
            return cls(trainable, **{k: v for k, v in o.items() if k != "class"})
        if ":" in o:
            return load_callable(self.dir, o)(model)
        lr = self.training.get("lr", 1e-4)
        if o == "adamw":
            return torch.optim.AdamW(trainable, lr=lr, weight_decay=self.training.get("weight_decay", 0.01),
                                     foreach=False)
        if o == "sgd":
            return torch.optim.SGD(trainable, lr=lr, momentum=self.training.get("momentum", 0.0),
                                   weight_decay=self.training.get("weight_decay", 0.0), foreach=False)
        raise SystemExit(f"optimizer {o!r}")

    def make_ema(self, model):
        if not self.ema_decay:
            return None
        # timm's own EMA, made after the optimizer as timm's train.py makes it
        from timm.utils import ModelEmaV3
        with record_function("memgate::ema"):
            return ModelEmaV3(model, decay=self.ema_decay)

    def step(self, optimizer, model, ema) -> None:
        if self.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), self.max_grad_norm)
        optimizer.step()
        if ema is not None:
            ema.update(model)


def run_probe(fx: Fixture, batch_size: int, warmup_steps: int = 1, timeline_out=None) -> dict:
    _, events = reference_loop.run_protocol(fx, batch_size, warmup_steps, timeline_out=timeline_out)
    out = {"batch_size": batch_size, **protocol_components(events)}
    if fx.ema_decay:
        before_ema, after_ema, _ = phase_window(events, "ema")
        out["ema"] = after_ema - before_ema
    return out


def reference(config: str, batch_sizes: str, warmup_steps: int, timeline) -> dict:
    """The document of one fixture: its probes at each of `batch_sizes` (comma-separated)."""
    with contextlib.redirect_stdout(sys.stderr):  # what importing the user's libraries prints
        fx = Fixture(config)
    freeze_what_is_alive()  # its packages and modules imported: out of the probes' collections
    probes = []
    for i, bs in enumerate(int(s) for s in batch_sizes.split(",")):
        # One probe first, unmeasured, so that what a first call imports or caches lazily is not in the numbers (once
        # per fixture, at its first batch size: the next batch sizes find it done).
        if i == 0:
            with contextlib.redirect_stdout(sys.stderr):
                run_probe(fx, bs)
        if timeline:
            print(f"# {config} batch {bs}" if timeline.multi else f"# batch {bs}", file=timeline.file)
        probes.append(run_probe(fx, bs, warmup_steps, timeline.file if timeline else None))
    return {"reference": "plain PyTorch loop", "fixture": config, "probes": probes}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, action="append",
                   help="a Python fixture (arch: python); several: one document each, as a JSON list")
    p.add_argument("--batch-sizes", action="append",
                   help="comma-separated (default 2): once for every --config, or once per --config in its order")
    p.add_argument("--warmup-steps", type=int, default=1)
    p.add_argument("--timeline", help="write every allocation/free (phase, bytes, running total, op) here")
    a = p.parse_args(argv)
    sizes = a.batch_sizes or ["2"]
    if len(sizes) == 1:
        sizes = sizes * len(a.config)
    if len(sizes) != len(a.config):
        p.error(f"--batch-sizes: given {len(sizes)} times for {len(a.config)} --config, expected once or once each")
    torch.set_num_threads(1)
    torch.backends.mkldnn.enabled = False
    torch._C._set_nnpack_enabled(False)
    timeline = types.SimpleNamespace(file=open(a.timeline, "w"), multi=len(a.config) > 1) if a.timeline else None
    docs = [reference(config, bs, a.warmup_steps, timeline) for config, bs in zip(a.config, sizes)]
    if timeline:
        timeline.file.close()
    json.dump(docs[0] if len(docs) == 1 else docs, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    exit_fast(main())
