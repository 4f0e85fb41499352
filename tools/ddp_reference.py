#!/usr/bin/env python3
"""PyTorch's own DistributedDataParallel on CPU ranks (Gloo), measured per rank with memgate's probe protocol.

The reference for memgate's DDP probes (src/distributed/data_parallel.cpp): timm's VisionTransformer (what memgate's ViT
equals byte for byte, tools/timm_reference.py) wrapped in torch.nn.parallel.DistributedDataParallel over N
processes that meet through a FileStore, each measured as tools/timm_reference.py measures one device (one thread,
oneDNN off, torch.profiler's allocation events), with two warm-up steps (DDP rebuilds its buckets at the second
iteration's forward: the measured step is the third, as in memgate). Prints one JSON object per rank and batch
size, with DDP's bucket bytes and count.

Run (timm installed beside the venv's torch, as tools/make_torchscript_models.sh installs it):
  PYTHONPATH=~/.cache/memgate/torchscript-tools ~/.cache/memgate/venv/bin/python tools/ddp_reference.py \\
      --config fixtures/models/vit_tiny_ddp.yaml --world-size 2 --batch-sizes 1,2
(--config more than once and --world-size 2,4 run each fixture at each world size in one launch, as
tools/fsdp_reference.py's do: {"runs": [...]}; so does --case CONFIG WORLD_SIZES BATCH_SIZES, several; and
tools/fsdp_reference.py --case runs a DDP fixture as this script does, beside FSDP ones, in its launch.)
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


def rank_main(rank: int, world: int, store_path: str, a: argparse.Namespace, ddp: dict, out_dir: str) -> None:
    torch.set_num_threads(1)
    torch.backends.mkldnn.enabled = False
    timm_reference.import_timm()
    import fsdp_reference  # its Gloo group of one worker thread, and its fence

    dist.Backend.register_backend("gloo_one_worker", fsdp_reference.gloo_one_worker, devices=["cpu"])
    store = dist.FileStore(store_path, world)
    dist.init_process_group("gloo_one_worker", store=store, rank=rank, world_size=world)
    fsdp_reference.FENCE = torch.zeros(1)

    def fenced_allreduce_hook(_state, bucket):
        """DDP's default allreduce_hook (the bucket divided by N in place, then all-reduced), run to the end on this
        thread with fsdp_reference's fence: what the all-reduce's Work holds is freed here, where torch.profiler sees
        it, and not at random on Gloo's worker thread (step_peak +4% on one rank of one probe in a few)."""
        buffer = bucket.buffer()
        buffer.div_(world)
        fsdp_reference.fenced(lambda: dist.all_reduce(buffer, async_op=True), None)
        done = torch.futures.Future()
        done.set_result(buffer)
        return done

    def fenced_broadcast_coalesced(tensors, buffer_size, authoritative_rank=0):
        """c10d's broadcast_coalesced (comm.cpp), which DDP syncs its buffers with before each forward, as it
        allocates and frees: the tensors in buckets of buffer_size (compute_bucket_assignment_by_size), each bucket
        flattened (flatten_dense_tensors: a cat, a view for one tensor) and broadcast, at most two in flight, the
        oldest copied back and let go before the next is flattened; each broadcast run to the end here with the
        fence. PyTorch's own lets Gloo's worker thread free the flat buffer when it drops the broadcast last, a free
        torch.profiler does not see: the rank kept its bytes (1 KiB for the TorchScript LM's buffers, on one or two
        ranks of four in some runs) in eval_peak and step_peak."""
        from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

        buckets, _ = dist._compute_bucket_assignment_by_size(list(tensors), [buffer_size])
        in_flight = []

        def finish(flat, bucket):
            for t, synced in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
                if synced.numel() != 0:
                    t.copy_(synced)

        for indices in buckets:
            if len(in_flight) >= 2:
                finish(*in_flight.pop(0))
            bucket = [tensors[i] for i in indices]
            flat = _flatten_dense_tensors(bucket)
            fsdp_reference.fenced(lambda: dist.broadcast(flat, authoritative_rank, async_op=True), None)
            in_flight.append((flat, bucket))
            del flat
        while in_flight:
            finish(*in_flight.pop(0))

    def wrap(model):
        # DDP's own initial sync broadcasts the module's state coalesced, into flat buffers that Gloo's worker thread
        # frees when it lets go of the broadcast; torch.profiler does not see a free on that thread, so one rank in a
        # few kept those bytes in its running total (eval_peak +49% on one of four ranks in the corpus, rank and probe
        # at random). The same sync, one tensor at a time, waited for on this thread (as memgate syncs: every byte
        # is the same from run to run), then DDP without its own.
        for t in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(t.data, 0)
        wrapped = torch.nn.parallel.DistributedDataParallel(model, init_sync=False, **ddp)
        wrapped.register_comm_hook(None, fenced_allreduce_hook)
        wrapped._distributed_broadcast_coalesced = fenced_broadcast_coalesced
        return wrapped

    def extra(model):
        buckets = model.reducer._get_zeros_like_grad_buckets()
        return {"rank": rank, "comm_buffers": len(buckets),
                "comm_buffer_bytes": sum(b.buffer().numel() * b.buffer().element_size() for b in buckets)}

    results = [timm_reference.run_probe(a, bs, wrap=wrap, extra=extra) for bs in a.batch_size_list]
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()


def main(argv=None) -> int:
    import fsdp_reference

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", action="append",
                   help="a memgate fixture with training.distributed (strategy ddp); several: each is run")
    fsdp_reference.add_case_argument(p)
    p.add_argument("--world-size", type=fsdp_reference.world_sizes_arg,
                   help="ranks, or a list of them (0,2,4) each run (default: the fixture's world_size; 0: the "
                   "same model and training without ranks)")
    p.add_argument("--batch-sizes", default="1,2")
    p.add_argument("--warmup-steps", type=int, default=WARMUP_STEPS)
    a = p.parse_args(argv)
    return fsdp_reference.run_many(p, a, "ddp", rank_main, options_for)


WARMUP_STEPS = 2  # DDP rebuilds its buckets at the second iteration's forward: the measured step is the third


def options_for(_config: str, d: dict) -> dict:
    """DistributedDataParallel's options from the fixture's training.distributed block `d`, with "reference"."""
    ddp = {"gradient_as_bucket_view": bool(d.get("gradient_as_bucket_view", False))}
    if "bucket_cap_mb" in d:
        ddp["bucket_cap_mb"] = d["bucket_cap_mb"]
    return {"reference": "torch DistributedDataParallel (Gloo), timm eager", **ddp}


if __name__ == "__main__":
    timm_reference.exit_fast(main())
