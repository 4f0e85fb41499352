"""The training loop of memgate's probe protocol in plain PyTorch, measured by torch.profiler's CPU allocation events
(each carries the allocator's running total): what tools/timm_reference.py (timm's ViT, the zoo's GPT twin, a
TorchScript module; under DDP or FSDP2 through tools/ddp_reference.py and tools/fsdp_reference.py) and
tools/step_reference.py (a Python fixture's own callables) both run, each with a Loop of its own.

The protocol (src/measure/probe.cpp, train_step.cpp), each phase a `memgate::<phase>` record_function that the
components are read over (protocol_components):

  a marker allocation (the level before the build) -> build, seeded 0 -> the trainable parameters chosen -> wrap
  (DDP, fully_shard) -> the batch, seeded 1 -> model.train(), the optimizer (and an EMA) -> model.eval() and two
  passes under no_grad (eval0, eval1) -> model.train() and warm-up step(s) -> the measured step: forward (the loss),
  backward, optimizer, zero_grad.
"""
from __future__ import annotations

import gc

import torch
from torch.profiler import ProfilerActivity, profile, record_function


def freeze_what_is_alive() -> None:
    """What is alive once the imports are made (torch, timm, PEFT, transformers, the fixture's own modules), garbage
    collected first, out of every later collection's walk (gc.freeze), as memgate's fork server freezes what it imported
    (python/memgate/_forkserver.py): each collection of a probe, the protocol's own and those Python makes as objects
    pile up, walked all of torch's and the packages' objects again (a third of a step reference's CPU). A frozen
    object is alive and stays so; what a probe allocates is collected as before, so its bytes are the same."""
    gc.collect()
    gc.freeze()


class Loop:
    """One reference's model and training. build, trainable, batch, optimizer and loss are the reference's own; the
    rest are what a plain loop does."""

    def build(self) -> torch.nn.Module:
        raise NotImplementedError

    def trainable(self, model: torch.nn.Module) -> list:
        """Freezes what does not train; the parameters that do."""
        raise NotImplementedError

    def batch(self, batch_size: int):
        raise NotImplementedError

    def optimizer(self, model: torch.nn.Module, trainable: list):
        raise NotImplementedError

    def loss(self, model: torch.nn.Module, batch) -> torch.Tensor:
        """forward and the loss: the output goes before this returns (inside the forward phase), the loss lives on."""
        raise NotImplementedError

    def eval_pass(self, model: torch.nn.Module, batch) -> None:
        """One of the two passes under no_grad."""
        raise NotImplementedError

    def make_ema(self, model: torch.nn.Module):
        """What the loop keeps beside the model after its optimizer is made (timm's EMA), else None."""
        return None

    def step(self, optimizer, model: torch.nn.Module, ema) -> None:
        """The optimizer phase."""
        optimizer.step()


def allocation_events(prof) -> list[tuple[int, int, int, str, str]]:
    """(time_ns, size, running total, op, phase) of every CPU allocation (+) and free (-), in order."""
    from torch._C._profiler import _EventType

    events = []
    order = 0

    def visit(node, op: str, phase: str):
        nonlocal order
        kind = node.typed[0]
        if kind == _EventType.Allocation:
            f = node.typed[1]
            if f.device.type == "cpu" and f.alloc_size != 0:
                events.append((node.start_time_ns, order, f.alloc_size, f.total_allocated, op, phase))
                order += 1
            return
        if kind == _EventType.TorchOp:
            if node.name.startswith("memgate::"):
                phase = node.name[len("memgate::"):]
            else:
                op = node.name  # the innermost op names the allocation
        for child in node.children:
            visit(child, op, phase)

    for root in prof.profiler.kineto_results.experimental_event_tree():
        visit(root, "", "")
    events.sort(key=lambda e: (e[0], e[1]))
    # The running totals must chain: then the order is the allocator's.
    for prev, cur in zip(events, events[1:]):
        if cur[3] != prev[3] + cur[2]:
            raise RuntimeError(f"allocation events out of order near t={cur[0]}: {prev} then {cur}")
    return [(t, size, total, op, phase) for t, _, size, total, op, phase in events]


def run_protocol(loop: Loop, batch_size: int, warmup_steps: int = 1, wrap=None, record_shapes: bool = False,
                 timeline_out=None):
    """The probe of `loop` at `batch_size`, profiled: (the model as the loop left it, its allocation events).
    `wrap(model)` (DistributedDataParallel, fully_shard) is applied after the trainable parameters are chosen, in a
    phase of its own, as memgate's TrainingStep does, and the optimizer takes the wrapped model's trainable
    parameters (fully_shard replaces them with sharded DTensors). `timeline_out` gets every allocation and free
    (phase, bytes, running total, op), one a line."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=record_shapes,
                 with_stack=False) as prof:
        # A marker allocation first, so that the running total before the build is known.
        marker = torch.empty(1)
        del marker
        with record_function("memgate::build"):
            torch.manual_seed(0)
            model = loop.build()
        trainable = loop.trainable(model)
        if wrap is not None:
            with record_function("memgate::wrap"):
                model = wrap(model)
                # The same parameters under DDP; fully_shard's shards, the full ones freed here as this list drops them
                trainable = [p for p in model.parameters() if p.requires_grad]
        torch.manual_seed(1)
        with record_function("memgate::batch"):
            batch = loop.batch(batch_size)
        model.train()
        optimizer = loop.optimizer(model, trainable)
        ema = loop.make_ema(model)
        model.eval()
        for p in range(2):
            with torch.no_grad(), record_function(f"memgate::eval{p}"):
                loop.eval_pass(model, batch)
        model.train()
        for step in range(warmup_steps + 1):
            tag = "measured" if step == warmup_steps else f"warmup{step}"
            with record_function(f"memgate::{tag}:forward"):
                loss = loop.loss(model, batch)
            with record_function(f"memgate::{tag}:backward"):
                loss.backward()
                del loss  # memgate's loss dies with its loop iteration, before the optimizer
            with record_function(f"memgate::{tag}:optimizer"):
                loop.step(optimizer, model, ema)
            with record_function(f"memgate::{tag}:zero_grad"):
                optimizer.zero_grad(set_to_none=True)

    events = allocation_events(prof)
    if timeline_out is not None:
        for t, size, total, op, phase in events:
            print(f"{phase}\t{size}\t{total}\t{op}", file=timeline_out)
    return model, events


def phase_window(events, prefix: str):
    """(level before, level after, peak) over the phases whose name starts with prefix."""
    idx = [i for i, e in enumerate(events) if e[4].startswith(prefix)]
    if not idx:
        raise RuntimeError(f"no allocation in phase {prefix}")
    first, last = idx[0], idx[-1]
    before = events[first][2] - events[first][1]
    peak = max([before] + [events[i][2] for i in range(first, last + 1)])
    return before, events[last][2], peak


def protocol_components(events, build_phase: str = "build") -> dict:
    """memgate's components from a probe's allocation events, read where its protocol reads them: params after
    `build_phase`, eval_peak over the second eval pass, optimizer_state over the first warm-up optimizer step,
    activations, forward_peak and gradients in the measured step, step_peak over it (absolute ones above the base)."""
    def window(prefix: str):
        return phase_window(events, prefix)

    base = events[0][2] - events[0][1]
    _, built, _ = window(build_phase)
    _, _, eval_peak = window("eval1")
    _, before_opt0, _ = window("warmup0:backward")
    _, after_opt0, _ = window("warmup0:optimizer")
    before_step, after_fwd, fwd_peak = window("measured:forward")
    _, after_bwd, _ = window("measured:backward")
    # (zero_grad frees nothing where the gradients are views into DDP's buckets)
    phases = [p for p in ("forward", "backward", "optimizer", "zero_grad")
              if any(e[4] == f"measured:{p}" for e in events)]
    step_peak = max(window(f"measured:{p}")[2] for p in phases)
    return {
        "params": built - base,
        "gradients": after_bwd - before_step,
        "optimizer_state": after_opt0 - before_opt0,
        "activations": after_fwd - before_step,
        "forward_peak": fwd_peak - before_step,
        "eval_peak": eval_peak - base,
        "step_peak": step_peak - base,
    }


def exit_fast(code: int):
    """Ends this script with `code`, what it printed flushed, without Python's teardown: with torch imported that is
    0.4 s of a reference's run here, paid once per fixture a corpus sweep checks. Nothing of the script's own is
    open."""
    import os
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
