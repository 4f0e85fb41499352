#!/usr/bin/env python3
"""Eager PyTorch reference for memgate's ViT: timm's VisionTransformer measured with memgate's probe protocol.

Builds timm 1.0.31's VisionTransformer (class token, no dropout, SDPA attention) with the given sizes, runs the
protocol of src/measure/train_step.cpp and probe.cpp on the CPU (one thread, oneDNN off, as memgate's probes run
LibTorch's own kernels): build, batch, two eval no-grad forwards, warm-up step(s), one measured step (forward,
backward, torch.optim.AdamW with foreach=False, i.e. memgate's CPU `optimizer_impl: auto`, zero_grad), and reads
every CPU allocation and free from torch.profiler's allocation events (each carries the allocator's running
total): the loop of tools/reference_loop.py, which tools/step_reference.py runs too. Components mean what docs/design.md's "The numbers" says, in bytes above the allocations that
existed before the model was built: params, gradients, optimizer_state, activations, forward_peak, eval_peak
(absolute: parameters and the batch included), step_peak (absolute).

A fixture of a TorchScript module (`arch: torchscript` with one input and `task: sum`) loads it with torch.jit.load,
which keeps the module's source-range debug records that memgate's loader skips (load_debug_files=false): params and
every level read from before the build are that many bytes higher (20,813 B for token_lm_traced.pt).

A fixture of the zoo's GPT (`--config` with `arch: gpt`) builds fixtures/models/python/models.py's gpt_twin instead
(the zoo's GPT in plain PyTorch, equal to it to the byte), with tokens and next-token targets for a batch and the
logits' fp32 cross-entropy for a loss; its head (`trainable: head`) is ln_f and lm_head. tools/ddp_reference.py and
tools/fsdp_reference.py take it too (FSDP's units: the blocks `h.N`, then the root).

Optional LoRA (`--lora-rank`, `--lora-targets qkv,...`, `--trainable lora`) wraps timm's Linear layers as memgate's
nn::Linear computes them: y = linear(x, W, b) + linear(linear(x, A), B) * alpha / rank.

Run (timm installed beside the venv's torch, as tools/make_torchscript_models.sh installs it):
  PYTHONPATH=~/.cache/memgate/torchscript-tools ~/.cache/memgate/venv/bin/python tools/timm_reference.py \
      --img-size 32 --patch-size 8 --embed-dim 64 --depth 4 --num-heads 4 --num-classes 5 \
      --trainable head --batch-sizes 2,3
  (or --config fixtures/models/vit_tiny_full.yaml to take the sizes and training from a fixture;
   --timeline out.txt writes every allocation and free with the op that made it, to diff against a
   `memgate profile --snapshot` pickle).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_loop  # noqa: E402
from reference_loop import allocation_events, exit_fast, phase_window, protocol_components  # noqa: E402,F401


class LoraLinear(nn.Linear):
    """nn.Linear plus memgate's LoRA adapter (parameters weight, bias, lora_a, lora_b, as memgate names them)."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float):
        super().__init__(base.in_features, base.out_features, bias=base.bias is not None)
        with torch.no_grad():
            self.weight.copy_(base.weight)
            if base.bias is not None:
                self.bias.copy_(base.bias)
        self.lora_a = nn.Parameter(torch.empty(rank, base.in_features))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank))
        nn.init.normal_(self.lora_a, 0.0, base.in_features ** -0.5)
        self.scale = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        y = y + F.linear(F.linear(x, self.lora_a), self.lora_b) * self.scale
        return y


def import_timm():
    """timm's VisionTransformer; what importing timm prints (huggingface_hub's warnings) goes to stderr."""
    import contextlib

    with contextlib.redirect_stdout(sys.stderr):
        from timm.models.vision_transformer import VisionTransformer
    return VisionTransformer


GPT_KEYS = ("vocab_size", "seq_len", "n_layer", "n_embd", "n_head", "mlp_hidden", "mlp", "norm", "position", "bias",
            "tied_embeddings")


def gpt_twin():
    """fixtures/models/python/models.py's gpt_twin: the zoo's GPT in plain PyTorch (equal to it to the byte)."""
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "models", "python", "models.py")
    spec = importlib.util.spec_from_file_location("memgate_fixture_models", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.gpt_twin


def build_model(a: argparse.Namespace) -> nn.Module:
    if a.arch == "torchscript":  # a TorchScript module as memgate loads it (torch::jit::load), in training mode
        return torch.jit.load(a.ts["path"]).train()
    if a.arch == "gpt":
        args = dict(a.gpt)
        if a.lora_rank > 0:
            args.update(lora_rank=a.lora_rank, lora_alpha=a.lora_alpha, lora_targets=a.lora_targets)
        return gpt_twin()(**args)
    model = import_timm()(img_size=a.img_size, patch_size=a.patch_size, embed_dim=a.embed_dim, depth=a.depth,
                          num_heads=a.num_heads, mlp_ratio=a.mlp_ratio, num_classes=a.num_classes,
                          qkv_bias=True, class_token=True, global_pool="token")
    if a.lora_rank > 0:
        for block in model.blocks:
            for target in a.lora_targets:
                owner, name = {"qkv": (block.attn, "qkv"), "proj": (block.attn, "proj"),
                               "fc1": (block.mlp, "fc1"), "fc2": (block.mlp, "fc2")}[target]
                setattr(owner, name, LoraLinear(getattr(owner, name), a.lora_rank, a.lora_alpha))
    return model


def select_trainable(model: nn.Module, trainable: str) -> list[nn.Parameter]:
    out = []
    heads = ("ln_f.", "lm_head.") if hasattr(model, "ln_f") else ("head.",)  # gpt_twin's head, or timm's
    for name, p in model.named_parameters():
        head = name.startswith(heads)
        train = {"all": True, "head": head, "lora": head or "lora_" in name}[trainable]
        p.requires_grad_(train)
        if train:
            out.append(p)
    return out


class _Loop(reference_loop.Loop):
    """The model and training of the command line (parse_args): timm's ViT, the zoo's GPT twin or a TorchScript
    module, AdamW (foreach=False), the task's loss."""

    def __init__(self, a: argparse.Namespace):
        self.a = a

    def build(self) -> nn.Module:
        return build_model(self.a)

    def trainable(self, model: nn.Module) -> list:
        return select_trainable(model, self.a.trainable)

    def batch(self, batch_size: int):
        a = self.a
        if a.arch == "torchscript":  # the fixture's one input ([B, ...]: an integer's high, else randn)
            spec = a.ts["input"]
            shape = [batch_size if d == "B" else int(d) for d in spec["shape"]]
            images = torch.randint(int(spec["high"]), shape) if spec.get("dtype") == "int64" else torch.randn(shape)
            return images, None
        if a.arch == "gpt":  # the zoo GPT's batch: tokens and next-token targets
            images = torch.randint(a.gpt["vocab_size"], (batch_size, a.gpt["seq_len"]))
            return images, torch.randint(a.gpt["vocab_size"], (batch_size, a.gpt["seq_len"]))
        images = torch.randn(batch_size, 3, a.img_size, a.img_size)
        return images, torch.randint(a.num_classes, (batch_size,))

    def optimizer(self, model: nn.Module, trainable: list):
        return torch.optim.AdamW(trainable, lr=self.a.lr, weight_decay=self.a.weight_decay, foreach=False)

    def eval_pass(self, model: nn.Module, batch) -> None:
        model(batch[0])

    def loss(self, model: nn.Module, batch) -> torch.Tensor:
        images, target = batch
        # The output lives through the loss, as a training loop's `logits = model(x)` (Hugging Face's and
        # torchtitan's: their loss casts bf16 logits to fp32 while the caller holds them) and memgate's protocol keep
        # it; it is gone before backward.
        output = model(images)
        if self.a.arch == "torchscript":  # task: sum, as memgate's task_loss
            return output.sum()
        if self.a.arch == "gpt":  # the logits cast to fp32 for the loss, as the zoo's (and gpt_twin_loss)
            return F.cross_entropy(output.float().flatten(0, 1), target.flatten())
        return F.cross_entropy(output.float(), target)


def run_probe(a: argparse.Namespace, batch_size: int, timeline_out=None, wrap=None, extra=None,
              params_after_wrap: bool = False) -> dict:
    """The probe (reference_loop.run_protocol); `wrap(model)` (e.g. DistributedDataParallel, fully_shard) is applied
    after the trainable parameters are chosen, outside the build's window, as memgate's TrainingStep does;
    `extra(model)` adds entries to the result after the measurement. With `params_after_wrap`, params is the level
    after the wrap (FSDP's shards, the full parameters freed) instead of after the build."""
    model, events = reference_loop.run_protocol(_Loop(a), batch_size, a.warmup_steps, wrap=wrap, record_shapes=True,
                                                timeline_out=timeline_out)
    result = extra(model) if extra is not None else {}
    return {**result, "batch_size": batch_size,
            **protocol_components(events, "wrap" if params_after_wrap else "build")}


def parse_args(argv=None) -> argparse.Namespace:
    """The command line, with the model's sizes and training taken from --config where flags do not give them."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", help="a memgate fixture YAML (model: {arch: vit, ...}); flags given override it")
    p.add_argument("--img-size", type=int)
    p.add_argument("--patch-size", type=int)
    p.add_argument("--embed-dim", type=int)
    p.add_argument("--depth", type=int)
    p.add_argument("--num-heads", type=int)
    p.add_argument("--num-classes", type=int)
    p.add_argument("--mlp-ratio", type=float)
    p.add_argument("--trainable", choices=("all", "head", "lora"))
    p.add_argument("--lora-rank", type=int)
    p.add_argument("--lora-alpha", type=float)
    p.add_argument("--lora-targets", type=lambda s: s.split(","))
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--warmup-steps", type=int, default=1)
    p.add_argument("--batch-sizes", default="2")
    p.add_argument("--timeline", help="write every allocation/free (phase, bytes, running total, op) here")
    a = p.parse_args(argv)
    a.arch, a.gpt = "vit", {}

    defaults = {"img_size": 224, "patch_size": 16, "embed_dim": 768, "depth": 12, "num_heads": 12,
                "num_classes": 1000, "mlp_ratio": 4.0, "trainable": "all", "lora_rank": 0, "lora_alpha": 1.0,
                "lora_targets": ["qkv"]}
    if a.config:
        import yaml

        with open(a.config) as f:
            fixture = yaml.safe_load(f)
        m, t = fixture.get("model", {}), fixture.get("training", {})
        if m.get("arch") not in ("vit", "gpt", "torchscript"):
            p.error(f"{a.config}: arch {m.get('arch')!r}, expected vit, gpt or torchscript")
        if m["arch"] == "torchscript":
            import os

            if m.get("task") != "sum" or len(m.get("inputs", [])) != 1:
                p.error(f"{a.config}: a torchscript model with one input and task sum is mirrored, no other")
            path = m["path"] if os.path.isabs(m["path"]) else os.path.join(os.path.dirname(a.config), m["path"])
            a.arch, a.ts = "torchscript", {"path": path, "input": m["inputs"][0]}
        if m["arch"] == "gpt":
            a.arch = "gpt"
            a.gpt = {k: m[k] for k in GPT_KEYS if k in m}
        for key in ("img_size", "patch_size", "embed_dim", "depth", "num_heads", "num_classes", "mlp_ratio"):
            if key in m:
                defaults[key] = m[key]
        if "lora" in m:
            defaults.update(lora_rank=m["lora"]["rank"], lora_alpha=m["lora"].get("alpha", m["lora"]["rank"]),
                            lora_targets=m["lora"].get("targets", ["qkv"]))
        if isinstance(t.get("trainable"), str):
            defaults["trainable"] = t["trainable"]
        if t.get("optimizer", "adamw") != "adamw":
            p.error("only optimizer adamw is mirrored")
        a.lr = t.get("lr", a.lr)
        a.weight_decay = t.get("weight_decay", a.weight_decay)
    for key, value in defaults.items():
        if getattr(a, key) is None:
            setattr(a, key, value)
    if a.warmup_steps < 1:
        p.error("--warmup-steps: at least 1 (optimizer_state is read over the first warm-up step)")
    a.model_keys = list(defaults)
    return a


def parse_args_from_config(config: str, warmup_steps: int = 1) -> argparse.Namespace:
    """The arguments for a fixture's model and training, as --config reads them."""
    return parse_args(["--config", config, "--warmup-steps", str(warmup_steps)])


def training_block(config: str) -> dict:
    """The fixture's training block."""
    import yaml

    with open(config) as f:
        return yaml.safe_load(f).get("training", {})


def distributed_block(config: str, strategy: str, error) -> dict:
    """The fixture's training.distributed block; error(message) (argparse's) unless its strategy is `strategy`."""
    d = training_block(config).get("distributed", {})
    if d.get("strategy") != strategy:
        error(f"{config}: training.distributed.strategy must be {strategy}")
    return d


def run_ranks(rank_main, world: int, config: str, warmup_steps: int, batch_sizes: str, options: dict) -> list:
    """Starts `world` processes (torch.multiprocessing) of rank_main(rank, world, store_path, ref, options, out_dir),
    which meet through a FileStore and each write rank<R>.json; returns each rank's list of probes. `ref` is the
    fixture's model and training as parse_args_from_config reads them, with the batch sizes to probe."""
    import os
    import tempfile

    import torch.multiprocessing as mp

    ref = parse_args_from_config(config, warmup_steps)
    ref.batch_size_list = [int(s) for s in batch_sizes.split(",")]
    # The ranks are forked from this process once what they import is imported here (torch, timm, FSDP2): each spawned
    # rank imported them again (about 2.7 s of CPU a rank). Nothing here has run an operator, so no intra-op thread
    # pool is forked, as with a DataLoader's workers.
    import_timm()
    import torch.distributed.fsdp  # noqa: F401
    reference_loop.freeze_what_is_alive()  # out of the ranks' collections too: they are forked with it frozen
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(rank_main, args=(world, os.path.join(tmp, "store"), ref, options, tmp), nprocs=world,
                           join=True, start_method="fork")
        ranks = []
        for r in range(world):
            with open(os.path.join(tmp, f"rank{r}.json")) as f:
                ranks.append(json.load(f))
    return ranks


def main(argv=None) -> int:
    a = parse_args(argv)

    torch.set_num_threads(1)
    torch.backends.mkldnn.enabled = False
    import_timm()  # imported before any probe: nothing of the import lands in a timeline
    reference_loop.freeze_what_is_alive()
    timeline = open(a.timeline, "w") if a.timeline else None
    probes = []
    for bs in (int(s) for s in a.batch_sizes.split(",")):
        if timeline:
            print(f"# batch {bs}", file=timeline)
        probes.append(run_probe(a, bs, timeline))
    if timeline:
        timeline.close()
    json.dump({"reference": "timm eager", "model": {k: getattr(a, k) for k in a.model_keys}, "probes": probes},
              sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    exit_fast(main())
