#!/usr/bin/env python3
"""PyTorch's own FSDP2 (fully_shard) on CPU ranks (Gloo), measured per rank with memgate's probe protocol.

The reference for memgate's FSDP probes: timm's VisionTransformer (what memgate's ViT equals byte for byte,
tools/timm_reference.py) sharded with torch.distributed.fsdp.fully_shard over N processes that meet through a FileStore,
each measured as tools/timm_reference.py measures one device (one thread, oneDNN off, torch.profiler's allocation
events), with one warm-up step. Each block is a unit, then the root (patch embedding, tokens, final norm, head; with
`units: root` the root alone is the one unit), all with the fixture's reshard_after_forward and, where
training.precision is bf16, FSDP2's MixedPrecisionPolicy(param_dtype=bfloat16,
reduce_dtype=<training.distributed.reduce_dtype, else None>) in place of autocast (as memgate and torchtitan train under
FSDP; --precision and --reduce-dtype override); AdamW steps the sharded parameters (DTensors). params is the level after
fully_shard (each rank's padded dim-0 shards, the full parameters freed). Prints one JSON object per rank and batch
size, with the rank's padded shard bytes. A fixture without reshard_after_forward leaves fully_shard's default (None:
the blocks reshard after forward, the root keeps its parameters gathered from forward to backward); with true, false or
an integer (the size of the group of ranks to reshard to: FSDP2 builds the post-forward DeviceMesh) every unit gets it,
the root too. training.distributed.offload_policy (or --offload-policy) cpu gives every unit
offload_policy=CPUOffloadPolicy(pin_memory=False) (cpu_pinned: pin_memory=True, which needs CUDA); none or unset, none.

Gloo on the CPU has every collective FSDP2 uses, with temporaries of its own: all_gather_into_tensor allocates a
flat output of the unit's size on Gloo's worker thread, reduce_scatter_tensor clones the whole input and all-reduces
the clone (ReduceOp.AVG divides there), then copies this rank's chunk out. What a collective's Work holds is freed
by whichever thread lets go of it last; freed on Gloo's worker thread, after the collective ran, it is a free that
torch.profiler does not see (the CPU allocator counts a free only on a thread that profiles), so the running total
keeps the bytes, at random, on some ranks. Hence one Gloo worker thread per rank and a fence after every all-gather
and reduce-scatter (fenced()): the Work dies on the rank's own thread, and the numbers are the same from run to run.

--backward-prefetch K (the fixture's training.distributed.backward_prefetch, else 1: FSDP2's implicit prefetch of
the next unit) with K > 1 sets each block to prefetch the K blocks before it in backward order, and the root the
last K blocks (set_modules_to_backward_prefetch).

Several runs in one launch: --config given more than once and --world-size a list (2,4) run every fixture at every
world size, each run's ranks forked afresh from this process once torch, timm and FSDP2 are imported (the import is
most of a launch's time here); the output is then {"runs": [one run's object, ...]}, fixture by fixture, world size by
world size. --case CONFIG WORLD_SIZES BATCH_SIZES (several) runs each fixture at world sizes and batch sizes of its own
in one launch, a DDP fixture as tools/ddp_reference.py runs it (tests/python/python_test.cpp's FsdpReferenceTest and
DdpReferenceTest ask for all their runs so). One fixture at one world size prints that run's object alone, as before.
World size 0 runs the fixture's model and training without ranks (no process group, no fully_shard:
tools/timm_reference.py's probe, in a forked process of its own), to tell what of a gap is the model's own.

Run (timm installed beside the venv's torch, as tools/make_torchscript_models.sh installs it):
  PYTHONPATH=~/.cache/memgate/torchscript-tools ~/.cache/memgate/venv/bin/python tools/fsdp_reference.py \\
      --config fixtures/models/vit_tiny_fsdp.yaml --world-size 2 --batch-sizes 1,2
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import timm_reference  # noqa: E402


FENCE = None  # a rank's one-element tensor for fenced()
WARMUP_STEPS = 1


def gloo_one_worker(store, rank: int, size: int, timeout):
    """ProcessGroupGloo with one worker thread (init_process_group gives it two and takes no options for gloo)."""
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = timeout
    opts._threads = 1
    opts._devices = [dist.ProcessGroupGloo.create_default_device()]
    return dist.ProcessGroupGloo(store, rank, size, opts)


def fenced(start, group) -> None:
    """Runs a collective to the end on this thread: waits for it, then for a one-element all-reduce (the fence), which
    the one worker takes only after it has let go of the collective before; so what the collective's Work holds (for
    Gloo's reduce-scatter, a copy of the whole input) is freed here, where torch.profiler sees it."""
    work = start()
    work.wait()
    dist.all_reduce(FENCE, group=group)
    del work


def rank_main(rank: int, world: int, store_path: str, a: argparse.Namespace, fsdp: dict, out_dir: str) -> None:
    global FENCE
    torch.set_num_threads(1)
    torch.backends.mkldnn.enabled = False
    timm_reference.import_timm()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter
    from torch.distributed.fsdp._fully_shard._fsdp_state import _get_module_fsdp_state

    class FencedAllGather(DefaultAllGather):
        def __call__(self, output_tensor, input_tensor, group, async_op=False):
            assert not async_op, "FSDP2 all-gathers synchronously on the CPU"
            fenced(lambda: dist.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=True),
                   group)

    class FencedReduceScatter(DefaultReduceScatter):
        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
            assert not async_op, "FSDP2 reduce-scatters synchronously"
            fenced(lambda: dist.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group, async_op=True),
                   group)

    dist.Backend.register_backend("gloo_one_worker", gloo_one_worker, devices=["cpu"])
    store = dist.FileStore(store_path, world)
    dist.init_process_group("gloo_one_worker", store=store, rank=rank, world_size=world)
    # Before the probes: nothing of these lands in their windows.
    mesh = init_device_mesh("cpu", (world,))
    FENCE = torch.zeros(1)
    reshard, prefetch = fsdp["reshard_after_forward"], fsdp["backward_prefetch"]
    dtypes = {None: None, "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    mp_policy = MixedPrecisionPolicy(param_dtype=None if fsdp["param_dtype"] == "fp32" else dtypes[fsdp["param_dtype"]],
                                     reduce_dtype=dtypes[fsdp["reduce_dtype"]])
    offload = fsdp.get("offload_policy", "none")
    offload_policy = OffloadPolicy() if offload == "none" else CPUOffloadPolicy(pin_memory=offload == "cpu_pinned")

    def wrap(model):
        blocks = list(model.h if a.arch == "gpt" else model.blocks) if fsdp["units"] == "blocks" else []
        for unit in blocks + [model]:
            fully_shard(unit, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp_policy,
                        offload_policy=offload_policy)
            unit.set_custom_all_gather(FencedAllGather())
            unit.set_custom_reduce_scatter(FencedReduceScatter())
        if prefetch > 1 and blocks:
            for i, block in enumerate(blocks):
                block.set_modules_to_backward_prefetch(blocks[max(i - prefetch, 0):i][::-1])
            model.set_modules_to_backward_prefetch(blocks[-prefetch:][::-1])
        return model

    def extra(model):
        groups = [s._fsdp_param_group for s in map(_get_module_fsdp_state, model.modules())
                  if s is not None and s._fsdp_param_group is not None]
        return {"rank": rank, "units": len(groups),
                "sharded_param_bytes": sum(p._sharded_param_data.numel() * p._sharded_param_data.element_size()
                                           for g in groups for p in g.fsdp_params)}

    results = [timm_reference.run_probe(a, bs, wrap=wrap, extra=extra, params_after_wrap=True)
               for bs in a.batch_size_list]
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()


def reshard_arg(value) -> bool | int:
    """true, false or an int (the group size to reshard to after forward), as fully_shard takes it."""
    if isinstance(value, (bool, int)):
        return value
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    return int(value)


def world_sizes_arg(value: str) -> list[int]:
    """A world size, or several (2,4); 0: without ranks."""
    sizes = [int(s) for s in value.split(",")]
    if any(n < 0 for n in sizes):
        raise ValueError(value)
    return sizes


def without_ranks_main(rank: int, world: int, store_path: str, a: argparse.Namespace, options: dict,
                       out_dir: str) -> None:
    """The same model and training in one process without a process group or a wrap (tools/timm_reference.py's probe,
    forked as a rank is): world size 0."""
    torch.set_num_threads(1)
    torch.backends.mkldnn.enabled = False
    timm_reference.import_timm()
    results = [{"rank": 0, **timm_reference.run_probe(a, bs)} for bs in a.batch_size_list]
    with open(os.path.join(out_dir, "rank0.json"), "w") as f:
        json.dump(results, f)


def add_case_argument(p: argparse.ArgumentParser) -> None:
    """--case CONFIG WORLD_SIZES BATCH_SIZES, in place of --config: runs of several fixtures in one launch, each at
    world sizes and batch sizes of its own."""
    p.add_argument("--case", nargs=3, action="append", metavar=("CONFIG", "WORLD_SIZES", "BATCH_SIZES"),
                   help="a fixture run at its own world sizes (2,4; 0: without ranks; fixture: its world_size) and "
                   "batch sizes (1,4), in place of --config, --world-size and --batch-sizes; several: each is run, "
                   "in order (tools/fsdp_reference.py: a DDP fixture too, as tools/ddp_reference.py runs it)")


def run_many(p: argparse.ArgumentParser, a: argparse.Namespace, strategy: str, rank_main, options_for) -> int:
    """Runs every --config at every --world-size (default: each fixture's world_size; 0: the same model and training
    without ranks, one process, no wrap), or each --case at its own world sizes and batch sizes, each run's ranks
    forked by timm_reference.run_ranks; prints the one run's object, or {"runs": [...]} for several.
    `options_for(config, d)`: the run's options from the fixture's training.distributed block `d` (p.error on a bad
    one), with "reference" (what the run is) among them, taken out for the output."""
    if bool(a.config) == bool(a.case):
        p.error("--config or --case: one of them, at least once")
    if a.case:
        cases = [(config, None if worlds == "fixture" else world_sizes_arg(worlds), sizes)
                 for config, worlds, sizes in a.case]
    else:
        cases = [(config, a.world_size, a.batch_sizes) for config in a.config]
    runs = []
    for config, world_sizes, batch_sizes in cases:
        # A DDP fixture's --case in this script's launch runs as tools/ddp_reference.py runs it (its warm-up steps)
        case_strategy, case_main, case_options, warmup = strategy, rank_main, options_for, a.warmup_steps
        if a.case and strategy == "fsdp" and \
                timm_reference.training_block(config).get("distributed", {}).get("strategy") == "ddp":
            import ddp_reference

            case_strategy, case_main, case_options = "ddp", ddp_reference.rank_main, ddp_reference.options_for
            warmup = ddp_reference.WARMUP_STEPS if a.warmup_steps is None else a.warmup_steps
        elif warmup is None:
            warmup = WARMUP_STEPS
        d = timm_reference.distributed_block(config, case_strategy, p.error)
        options = case_options(config, d)
        reference = options.pop("reference")
        for world in world_sizes or [d["world_size"]]:
            if world == 0:
                if timm_reference.training_block(config).get("precision", "fp32") != "fp32":
                    p.error(f"{config}: world size 0 runs without autocast: an fp32 fixture only")
                ranks = timm_reference.run_ranks(without_ranks_main, 1, config, warmup, batch_sizes, {})
                runs.append({"reference": "timm eager, no ranks", "config": config, "world_size": 0, "ranks": ranks})
                continue
            ranks = timm_reference.run_ranks(case_main, world, config, warmup, batch_sizes, options)
            runs.append({"reference": reference, "config": config, "world_size": world, case_strategy: options,
                         "ranks": ranks})
    json.dump(runs[0] if len(runs) == 1 else {"runs": runs}, sys.stdout, indent=1)
    print()
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", action="append",
                   help="a memgate ViT or GPT fixture with training.distributed (strategy fsdp); several: each is run")
    add_case_argument(p)
    p.add_argument("--world-size", type=world_sizes_arg,
                   help="ranks, or a list of them (0,2,4) each run (default: the fixture's world_size; 0: the "
                   "same model and training without ranks)")
    p.add_argument("--batch-sizes", default="1,2")
    p.add_argument("--warmup-steps", type=int,
                   help=f"default {WARMUP_STEPS} (a DDP fixture's --case: tools/ddp_reference.py's, 2)")
    p.add_argument("--reshard-after-forward", type=reshard_arg,
                   help="true|false|int (default: the fixture's reshard_after_forward, else fully_shard's None)")
    p.add_argument("--backward-prefetch", type=int,
                   help="blocks each unit prefetches in backward (default: the fixture's backward_prefetch, else 1)")
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"),
                   help="MixedPrecisionPolicy.param_dtype (default: the fixture's training.precision; fp32: none)")
    p.add_argument("--reduce-dtype", choices=("fp32", "bf16", "fp16"),
                   help="MixedPrecisionPolicy.reduce_dtype (default: the fixture's reduce_dtype, else None)")
    p.add_argument("--offload-policy", choices=("none", "cpu", "cpu_pinned"),
                   help="FSDP2's offload_policy: CPUOffloadPolicy(pin_memory=False | True) (default: the fixture's "
                   "offload_policy, else none)")
    a = p.parse_args(argv)

    def options_for(config: str, d: dict) -> dict:
        if d.get("units", "blocks") not in ("blocks", "root"):
            p.error(f"{config}: training.distributed.units: {d['units']!r}, expected blocks or root")
        fsdp = {"units": d.get("units", "blocks"),
                "reshard_after_forward": (a.reshard_after_forward if a.reshard_after_forward is not None
                                          else reshard_arg(d["reshard_after_forward"]) if "reshard_after_forward" in d
                                          else None),
                "backward_prefetch": a.backward_prefetch if a.backward_prefetch is not None
                else int(d.get("backward_prefetch", 1)),
                "param_dtype": a.precision or timm_reference.training_block(config).get("precision", "fp32"),
                "reduce_dtype": a.reduce_dtype or d.get("reduce_dtype"),
                "offload_policy": a.offload_policy or d.get("offload_policy", "none")}
        if fsdp["offload_policy"] not in ("none", "cpu", "cpu_pinned"):
            p.error(f"{config}: training.distributed.offload_policy: {fsdp['offload_policy']!r}, expected none, cpu "
                    "or cpu_pinned")
        if fsdp["param_dtype"] == "fp16":
            p.error("fp16 trains with a gradient scaler, which this reference does not mirror: use bf16")
        if fsdp["backward_prefetch"] < 1:
            p.error("--backward-prefetch: at least 1")
        return {"reference": "torch fully_shard (FSDP2, Gloo), timm eager", **fsdp}

    return run_many(p, a, "fsdp", rank_main, options_for)


if __name__ == "__main__":
    timm_reference.exit_fast(main())
