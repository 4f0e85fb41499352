#!/usr/bin/env python3
"""PyTorch's own activation checkpointing of chosen blocks (issue 70): a Python fixture's step, as
tools/step_reference.py runs and measures it (the plain-PyTorch loop, torch.profiler's CPU allocation events), with
each named block's forward wrapped in torch.utils.checkpoint.checkpoint, as a user writes it:

  block.forward = lambda *a, **k: torch.utils.checkpoint.checkpoint(original_forward, *a, use_reentrant=..., **k)

A block is named as memgate names it ("blocks.3"): the module whose name is that or ends with "." and that (PEFT's
"base_model.model.blocks.3"). The fixture itself carries no gradient_checkpointing key; this script applies it, so the
same twin measures a zoo fixture's `training.gradient_checkpointing: {blocks: [...]}` and the Python fixture's own.

`--blocks` may be given several times: each selection is measured in turn in the one launch (its JSON's
"selections", in that order; "probes" is the first's, as before).

`--selective NAMES@POLICY` (again for another) measures, after the --blocks selections, PyTorch's selective activation
checkpointing of the named blocks, as memgate's `training.gradient_checkpointing: {save: [...]}` (or `{policy: ...}`)
asks it of a Python fixture and as a user writes it:

  torch.utils.checkpoint.checkpoint(original_forward, *a, use_reentrant=False, preserve_rng_state=False,
      context_fn=functools.partial(torch.utils.checkpoint.create_selective_checkpoint_contexts, policy), **k)

POLICY is comma-separated op names as torch.ops spells them (aten.mm: every overload of torch.ops.aten.mm, as its
overloads() lists them; aten.mm.default: that one), or file.py:callable, a policy function (ctx, op, *args, **kwargs)
-> CheckpointPolicy. Its selection is {"blocks": [...], "policy": POLICY, "probes": [...]}.

`--save-on-cpu PIN` (0 or 1, again for another) measures, after the --blocks selections (if any), the fixture with
its training forwards (forward and loss, warm-up and measured step) inside
torch.autograd.graph.save_on_cpu(pin_memory=PIN), as memgate's `training.activation_offload` (cpu: 0, cpu_pinned: 1)
applies it, without checkpointing. Such a selection ({"save_on_cpu": {"pin_memory": PIN}, "probes": [...]}) also
reports host_activations: the most bytes that the copies save_on_cpu's pack hook allocated held at once in the
measured step (each allocation inside the hook, by its address, until its free). On a machine without CUDA,
pin_memory=True makes plain CPU copies (torch.cuda.is_available() is false), and pin_memory=False on CPU tensors
keeps the tensor itself (tensor.cpu()): no copy.

Several fixtures in one launch (torch and the fixtures' libraries imported once): each fixture's options, --config
first, separated by `--then`; the output is then {"runs": [one fixture's object, ...]}, in that order. One fixture
prints its object alone, as before.

Run: ~/.cache/memgate/venv/bin/python tools/checkpoint_reference.py \\
       --config fixtures/models/py_vit_tiny_lora_timm.yaml --blocks blocks.1,blocks.2 --blocks blocks.1 \\
       --batch-sizes 1,4
     ~/.cache/memgate/venv/bin/python tools/checkpoint_reference.py \\
       --config fixtures/models/py_vit_tiny_lora_timm.yaml --save-on-cpu 1 --save-on-cpu 0 --batch-sizes 1,4
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys

import torch
import torch.utils.checkpoint

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import step_reference  # noqa: E402
from timm_reference import exit_fast  # noqa: E402


def wrap_blocks(model: torch.nn.Module, names: list, flag: str, **checkpoint_options) -> None:
    """Wraps each named block's forward in torch.utils.checkpoint.checkpoint(**checkpoint_options); a name that
    matches no module, or several, exits naming `flag`."""
    modules = dict(model.named_modules())
    for name in names:
        found = [m for n, m in modules.items() if n == name or n.endswith("." + name)]
        if len(found) != 1:
            raise SystemExit(f"{flag}: {name!r} matches {len(found)} modules, expected one")
        block = found[0]
        original = block.forward

        def forward(*args, _original=original, **kwargs):
            return torch.utils.checkpoint.checkpoint(_original, *args, **checkpoint_options, **kwargs)

        block.forward = forward


def checkpoint_blocks(model: torch.nn.Module, names: list, use_reentrant: bool, preserve_rng_state: bool) -> None:
    """Wraps each named block's forward in torch.utils.checkpoint.checkpoint."""
    wrap_blocks(model, names, "--blocks", use_reentrant=use_reentrant, preserve_rng_state=preserve_rng_state)


def selective_policy(text: str):
    """The policy create_selective_checkpoint_contexts takes: the OpOverloads of comma-separated op names, or the
    callable of file.py:callable."""
    if ":" in text:
        import importlib.util
        path, name = text.rsplit(":", 1)
        spec = importlib.util.spec_from_file_location("checkpoint_reference_policy", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return getattr(module, name)
    ops = []
    for name in (n for n in text.split(",") if n):
        namespace, op, *overload = name.removeprefix("torch.ops.").split(".")
        packet = getattr(getattr(torch.ops, namespace), op)
        ops += [getattr(packet, overload[0])] if overload else [getattr(packet, o) for o in packet.overloads()]
    return ops


def checkpoint_selectively(model: torch.nn.Module, names: list, policy) -> None:
    """Wraps each named block's forward in PyTorch's selective checkpointing with `policy`."""
    import functools
    context_fn = functools.partial(torch.utils.checkpoint.create_selective_checkpoint_contexts, policy)
    wrap_blocks(model, names, "--selective", use_reentrant=False, preserve_rng_state=False, context_fn=context_fn)


PACK = "memgate_save_on_cpu_pack"


def offloaded_peak(prof) -> int:
    """The most bytes the copies save_on_cpu's pack hook (record_function PACK) made held at once in the measured step:
    each allocation inside a call of the hook that outlives the call (not copy_'s temporary block of a transposed
    source, freed inside it), counted from its allocation to the free of its address."""
    from torch._C._profiler import _EventType

    events = []  # (time, order, address, bytes, the hook's call or None, phase)
    calls = 0

    def visit(node, call, phase: str):
        nonlocal calls
        kind = node.typed[0]
        if kind == _EventType.Allocation:
            f = node.typed[1]
            if f.device.type == "cpu" and f.alloc_size != 0:
                events.append((node.start_time_ns, len(events), f.ptr, f.alloc_size, call, phase))
            return
        if kind == _EventType.TorchOp:
            if node.name.startswith("memgate::"):
                phase = node.name[len("memgate::"):]
            if node.name == PACK and call is None:
                calls += 1
                call = calls
        for child in node.children:
            visit(child, call, phase)

    for root in prof.profiler.kineto_results.experimental_event_tree():
        visit(root, None, "")
    events.sort(key=lambda e: (e[0], e[1]))
    temporary, open_in_call = set(), {}
    for i, (_, _, ptr, size, call, _) in enumerate(events):
        if size > 0 and call is not None:
            open_in_call[ptr] = (i, call)
        elif size < 0 and ptr in open_in_call:
            first, first_call = open_in_call.pop(ptr)
            if call == first_call:
                temporary.add(first)
    live, held, peak = {}, 0, 0
    for i, (_, _, ptr, size, call, phase) in enumerate(events):
        if size > 0 and call is not None and i not in temporary:
            live[ptr] = size
            held += size
        elif size < 0 and ptr in live:
            held -= live.pop(ptr)
        if phase.startswith("measured:"):
            peak = max(peak, held)
    return peak


def save_on_cpu_probe(fx, batch_size: int, pin_memory: bool) -> dict:
    """step_reference's probe with every training forward (fx.loss) inside save_on_cpu(pin_memory), its pack hook
    marked so that its allocations are found, and host_activations beside the components."""
    loss = fx.loss
    profiles = []

    def offloaded_loss(model, batch):
        hooks = torch.autograd.graph.save_on_cpu(pin_memory=pin_memory)
        pack = hooks.pack_hook

        def marked_pack(tensor):
            with torch.profiler.record_function(PACK):
                return pack(tensor)

        hooks.pack_hook = marked_pack
        with hooks:
            return loss(model, batch)

    # The probe's profile itself, for the addresses of the pack hook's allocations: reference_loop's run_protocol
    # makes it with its module's `profile`, which this keeps.
    loop = step_reference.reference_loop
    real_profile = loop.profile

    def kept_profile(*args, **kwargs):
        prof = real_profile(*args, **kwargs)
        profiles.append(prof)
        return prof

    fx.loss, loop.profile = offloaded_loss, kept_profile
    try:
        out = step_reference.run_probe(fx, batch_size)
    finally:
        fx.loss, loop.profile = loss, real_profile
    out["host_activations"] = offloaded_peak(profiles[-1])
    return out


def main(argv=None) -> int:
    """One fixture's object, or with `--then` between fixtures' options, {"runs": [...]} (one launch)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    groups = [[]]
    for arg in argv:
        if arg == "--then":
            groups.append([])
        else:
            groups[-1].append(arg)
    runs = [reference(group) for group in groups]
    json.dump(runs[0] if len(runs) == 1 else {"runs": runs}, sys.stdout, indent=2)
    print()
    return 0


def reference(argv: list) -> dict:
    """The selections of one fixture's options (--config and what follows it), measured in this process."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="a Python fixture (arch: python) without gradient_checkpointing")
    p.add_argument("--blocks", action="append", default=[],
                   help="comma-separated block names, e.g. blocks.1,blocks.2; again for another selection")
    p.add_argument("--save-on-cpu", type=int, choices=(0, 1), action="append", default=[], metavar="PIN",
                   help="a selection with the training forwards inside save_on_cpu(pin_memory=PIN); again for another")
    p.add_argument("--selective", action="append", default=[], metavar="NAMES@POLICY",
                   help="blocks (comma-separated) in selective checkpointing with POLICY (op names, comma-separated, "
                        "or file.py:callable); again for another")
    p.add_argument("--batch-sizes", default="2")
    p.add_argument("--use-reentrant", type=int, default=1, help="1: the reentrant variant (memgate's); 0: the other")
    p.add_argument("--preserve-rng-state", type=int, default=0,
                   help="1: stash the CPU generator's state per block (5,056 bytes each on the CPU), as the default")
    a = p.parse_args(argv)
    if not a.blocks and not a.save_on_cpu and not a.selective:
        p.error("expected --blocks, --selective or --save-on-cpu")
    torch.set_num_threads(1)
    torch.backends.mkldnn.enabled = False
    torch._C._set_nnpack_enabled(False)
    selections = [[n for n in blocks.split(",") if n] for blocks in a.blocks]
    with contextlib.redirect_stdout(sys.stderr):
        fx = step_reference.Fixture(a.config)
    step_reference.freeze_what_is_alive()  # its packages and modules imported: out of the probes' collections
    build = fx.build_fn
    def probes_of(probe):
        """Each batch size's probe, the first after one unmeasured call (what a first call imports or caches lazily:
        once per selection, its first batch size's; the next batch sizes' find it done)."""
        probes = []
        for i, bs in enumerate(int(s) for s in a.batch_sizes.split(",")):
            if i == 0:
                with contextlib.redirect_stdout(sys.stderr):
                    probe(bs)
            # A wrapped block's forward refers to the block (a cycle): its model is freed here, not in the next build.
            gc.collect()
            probes.append(probe(bs))
        return probes

    measured = []
    for names in selections:

        def build_checkpointed(_names=names, **kwargs):
            model = build(**kwargs)
            checkpoint_blocks(model, _names, bool(a.use_reentrant), bool(a.preserve_rng_state))
            return model

        fx.build_fn = build_checkpointed
        measured.append({"blocks": names, "probes": probes_of(lambda bs: step_reference.run_probe(fx, bs))})
    for selective in a.selective:
        names, _, text = selective.partition("@")
        policy = selective_policy(text)

        def build_selective(_names=[n for n in names.split(",") if n], **kwargs):
            model = build(**kwargs)
            checkpoint_selectively(model, _names, policy)
            return model

        fx.build_fn = build_selective
        measured.append({"blocks": names.split(","), "policy": text,
                         "probes": probes_of(lambda bs: step_reference.run_probe(fx, bs))})
    fx.build_fn = build
    for pin in a.save_on_cpu:
        measured.append({"save_on_cpu": {"pin_memory": bool(pin)},
                         "probes": probes_of(lambda bs, _pin=bool(pin): save_on_cpu_probe(fx, bs, _pin))})
    return {"reference": "torch.utils.checkpoint on chosen blocks", "fixture": a.config,
            "blocks": measured[0].get("blocks", []), "use_reentrant": bool(a.use_reentrant),
            "preserve_rng_state": bool(a.preserve_rng_state), "probes": measured[0]["probes"], "selections": measured}


if __name__ == "__main__":
    exit_fast(main())
