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

Run: ~/.cache/memgate/venv/bin/python tools/checkpoint_reference.py \\
       --config fixtures/models/py_vit_tiny_lora_timm.yaml --blocks blocks.1,blocks.2 --blocks blocks.1 \\
       --batch-sizes 1,4
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


def checkpoint_blocks(model: torch.nn.Module, names: list, use_reentrant: bool, preserve_rng_state: bool) -> None:
    """Wraps each named block's forward in torch.utils.checkpoint.checkpoint; a name that matches no module exits."""
    modules = dict(model.named_modules())
    for name in names:
        found = [m for n, m in modules.items() if n == name or n.endswith("." + name)]
        if len(found) != 1:
            raise SystemExit(f"--blocks: {name!r} matches {len(found)} modules, expected one")
        block = found[0]
        original = block.forward

        def forward(*args, _original=original, **kwargs):
            return torch.utils.checkpoint.checkpoint(_original, *args, use_reentrant=use_reentrant,
                                                     preserve_rng_state=preserve_rng_state, **kwargs)

        block.forward = forward


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="a Python fixture (arch: python) without gradient_checkpointing")
    p.add_argument("--blocks", required=True, action="append",
                   help="comma-separated block names, e.g. blocks.1,blocks.2; again for another selection")
    p.add_argument("--batch-sizes", default="2")
    p.add_argument("--use-reentrant", type=int, default=1, help="1: the reentrant variant (memgate's); 0: the other")
    p.add_argument("--preserve-rng-state", type=int, default=0,
                   help="1: stash the CPU generator's state per block (5,056 bytes each on the CPU), as the default")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    torch.backends.mkldnn.enabled = False
    torch._C._set_nnpack_enabled(False)
    selections = [[n for n in blocks.split(",") if n] for blocks in a.blocks]
    with contextlib.redirect_stdout(sys.stderr):
        fx = step_reference.Fixture(a.config)
    build = fx.build_fn
    measured = []
    for names in selections:

        def build_checkpointed(_names=names, **kwargs):
            model = build(**kwargs)
            checkpoint_blocks(model, _names, bool(a.use_reentrant), bool(a.preserve_rng_state))
            return model

        fx.build_fn = build_checkpointed
        probes = []
        for bs in (int(s) for s in a.batch_sizes.split(",")):
            with contextlib.redirect_stdout(sys.stderr):
                step_reference.run_probe(fx, bs)  # unmeasured: what a first call imports or caches lazily
            # A wrapped block's forward refers to the block (a cycle): its model is freed here, not in the next build.
            gc.collect()
            probes.append(step_reference.run_probe(fx, bs))
        measured.append({"blocks": names, "probes": probes})
    json.dump({"reference": "torch.utils.checkpoint on chosen blocks", "fixture": a.config,
               "blocks": measured[0]["blocks"], "use_reentrant": bool(a.use_reentrant),
               "preserve_rng_state": bool(a.preserve_rng_state), "probes": measured[0]["probes"],
               "selections": measured}, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    exit_fast(main())
