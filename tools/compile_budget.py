#!/usr/bin/env python3
"""torch.compile's activation_memory_budget against memgate's plan at the same peak, on the CPU (issue 70).

A small GPT (plain PyTorch, as zoo `arch: gpt` builds it: learned positions, tied embeddings, pre-LayerNorm blocks,
GELU MLP, scaled-dot-product attention, next-token cross-entropy, AdamW) is trained one step compiled by
torch.compile (Inductor, the CPU's C++ backend) under each `torch._functorch.config.activation_memory_budget`.
For each budget:

- its real peak: memgate's measurement of that compiled step (`memgate profile --device cpu` of a Python fixture with
  `training.compile: true` whose builder sets the budget in the probe's process before the step is compiled), the
  counting CPU allocator's step_peak;
- its recomputed FLOPs: the FLOPs of the forward and backward graphs that Inductor compiled (the partitioner's output,
  caught by a backend that hands each graph to Inductor's compile_fx_inner), counted by torch.utils.flop_counter on
  fake tensors, less the eager step's (forward and backward under FlopCounterMode);

and memgate's plan for the same model (the zoo twin, `arch: gpt` with the same sizes, trained eagerly) at that peak:
`memgate plan --for cpu --capacity-bytes <the compiled step's peak> --search exhaustive`: its step_peak (the estimate
for the CPU), its fixture measured on the CPU (`memgate profile --device cpu`), and its recomputed FLOPs (memgate's
count: the checkpointed blocks' forward). memgate's count of the eager step and FlopCounterMode's are the same
number here (47,781,511,168 at batch 8), so the two recomputed columns compare directly.

  /root/.cache/memgate/venv/bin/python tools/compile_budget.py [--markdown table.md]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUDGETS = [1.0, 0.5, 0.3, 0.15, 0.05]
# The model and the batch: 4 blocks of width 256 over 256 tokens, batch 8.
CONFIG = dict(vocab_size=512, seq_len=256, n_layer=4, n_embd=256, n_head=4)
BATCH = 8


def gpt(vocab_size, seq_len, n_layer, n_embd, n_head):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(n_embd)
            self.attn = nn.Linear(n_embd, 3 * n_embd)
            self.proj = nn.Linear(n_embd, n_embd)
            self.ln_2 = nn.LayerNorm(n_embd)
            self.fc = nn.Linear(n_embd, 4 * n_embd)
            self.fc_proj = nn.Linear(4 * n_embd, n_embd)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.attn(self.ln_1(x)).split(c, dim=2)
            q, k, v = (z.view(b, t, n_head, c // n_head).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, c))
            return x + self.fc_proj(F.gelu(self.fc(self.ln_2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(vocab_size, n_embd)
            self.wpe = nn.Embedding(seq_len, n_embd)
            self.h = nn.ModuleList(Block() for _ in range(n_layer))
            self.ln_f = nn.LayerNorm(n_embd)

        def forward(self, idx):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
            for block in self.h:
                x = block(x)
            return F.linear(self.ln_f(x), self.wte.weight)

    return GPT()


def budget_gpt(budget, **config):
    """The fixture's entry: the budget set in the probe's process, before memgate compiles the model."""
    import torch._functorch.config

    torch._functorch.config.activation_memory_budget = float(budget)
    return gpt(**config)


def next_token_loss(output, batch):
    import torch.nn.functional as F

    idx = batch.inputs[0]
    return F.cross_entropy(output[:, :-1].reshape(-1, output.shape[-1]), idx[:, 1:].reshape(-1))


def counter():
    """torch.utils.flop_counter's FlopCounterMode, with the CPU's flash attention counted as its CUDA twin is: 2.11
    has no formula for aten._scaled_dot_product_flash_attention_for_cpu and its backward (they would count 0)."""
    import torch
    from torch.utils import flop_counter as fc

    aten = torch.ops.aten

    def as_registered(op):
        def formula(*args, **kwargs):  # the registry's formula, already taking tensors (not wrapped again)
            return fc.flop_registry[op](*args, **kwargs)

        formula._get_raw = True
        return formula

    return fc.FlopCounterMode(display=False, custom_mapping={
        aten._scaled_dot_product_flash_attention_for_cpu: as_registered(aten._scaled_dot_product_flash_attention),
        aten._scaled_dot_product_flash_attention_for_cpu_backward:
            as_registered(aten._scaled_dot_product_flash_attention_backward)})


def flops_of_graph(gm) -> int:
    """FLOPs of an FX graph as torch.utils.flop_counter counts them, run on fake tensors of its inputs' shapes."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        args = []
        for n in placeholders:
            v = n.meta.get("val")
            if isinstance(v, torch.Tensor):
                args.append(torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="cpu"))
            else:
                args.append(v)
        with counter() as c:
            gm(*args)
    return c.get_total_flops()


def compiled_flops(budget: float) -> tuple[int, int, int]:
    """The eager step's FLOPs and the compiled forward's and backward's, at `budget`."""
    import torch
    import torch._functorch.config
    import torch._inductor.config
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    torch.manual_seed(0)
    model = gpt(**CONFIG)
    idx = torch.randint(0, CONFIG["vocab_size"], (BATCH, CONFIG["seq_len"]))

    class B:
        inputs = [idx]

    with counter() as eager:
        next_token_loss(model(idx), B).backward()
    graphs = []

    def backend(gm, example_inputs):
        def inner(g, inputs, **kwargs):
            graphs.append((bool(kwargs.get("is_backward")), flops_of_graph(g)))
            return compile_fx_inner(g, inputs, **kwargs)

        return compile_fx(gm, example_inputs, inner_compile=inner)

    torch._functorch.config.activation_memory_budget = budget
    # Every graph partitioned and compiled here, none taken from the caches (a cached one skips compile_fx_inner).
    torch._functorch.config.enable_autograd_cache = False
    torch._inductor.config.fx_graph_cache = False
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    model.zero_grad(set_to_none=True)
    next_token_loss(compiled(idx), B).backward()
    forward = sum(f for back, f in graphs if not back)
    backward = sum(f for back, f in graphs if back)
    return eager.get_total_flops(), forward, backward


def run(cmd, **kw):
    env = dict(os.environ)
    env.setdefault("MEMGATE_PYTHON", sys.executable)
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, **kw)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--memgate", default=str(ROOT / "build/cpu/bin/memgate"))
    ap.add_argument("--budgets", default=",".join(map(str, BUDGETS)))
    ap.add_argument("--markdown", help="also write the table as Markdown to this file")
    ap.add_argument("--json", help="also write the rows as JSON to this file")
    args = ap.parse_args()
    budgets = [float(b) for b in args.budgets.split(",")]
    here = Path(__file__).resolve()
    rows = []
    with tempfile.TemporaryDirectory(prefix="compile_budget_") as tmp:
        tmp = Path(tmp)
        (tmp / "compile_budget.py").symlink_to(here)
        zoo = {"model": {"arch": "gpt", **CONFIG, "mlp": "gelu", "norm": "layernorm", "position": "learned",
                         "bias": True, "tied_embeddings": True},
               "training": {"optimizer": "adamw", "trainable": "all", "precision": "fp32"},
               "batch_sizes": [BATCH]}
        (tmp / "zoo_gpt.yaml").write_text(json.dumps(zoo))
        for budget in budgets:
            fixture = {"model": {"arch": "python", "entry": "compile_budget.py:budget_gpt",
                                 "args": {"budget": budget, **CONFIG},
                                 "inputs": [{"shape": ["B", CONFIG["seq_len"]], "dtype": "int64",
                                             "high": CONFIG["vocab_size"]}],
                                 "loss": "compile_budget.py:next_token_loss"},
                       "training": {"optimizer": "adamw", "trainable": "all", "precision": "fp32", "compile": True},
                       "batch_sizes": [BATCH]}
            path = tmp / f"compiled_{str(budget).replace('.', '_')}.yaml"
            path.write_text(json.dumps(fixture))
            run([args.memgate, "profile", "--device", "cpu", "--config", path, "--output", tmp / "c.json"])
            compiled = json.loads((tmp / "c.json").read_text())["probes"][0]["components"]
            eager_flops, fw, bw = compiled_flops(budget)
            recompute = fw + bw - eager_flops
            peak = compiled["step_peak"]
            row = {"budget": budget, "compiled_step_peak": peak, "compiled_flops": fw + bw,
                   "eager_flops": eager_flops, "compiled_recompute_flops": recompute}
            try:
                run([args.memgate, "plan", "--config", tmp / "zoo_gpt.yaml", "--for", "cpu", "--capacity-bytes",
                     str(peak), "--search", "exhaustive", "--output", tmp / "p.json"])
                plan = json.loads((tmp / "p.json").read_text())["plans"][0]
                applied = json.loads(json.dumps(zoo))
                for key, value in plan["change"].get("training", {}).items():
                    applied["training"][key] = value
                (tmp / "zoo_gpt_plan.yaml").write_text(json.dumps(applied))
                run([args.memgate, "profile", "--device", "cpu", "--config", tmp / "zoo_gpt_plan.yaml", "--output",
                     tmp / "pm.json"])
                row["plan_measured_step_peak"] = json.loads((tmp / "pm.json").read_text())["probes"][0][
                    "components"]["step_peak"]
                row.update(plan_step_peak=plan["step_peak"], plan_recompute_flops=plan["recompute_flops"],
                           plan_step_flops=plan["step_flops"], plan_levers=", ".join(plan["levers"]) or "none",
                           plan_change=plan["change"])
            except RuntimeError as e:
                row.update(plan_error=str(e).splitlines()[-1])
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.markdown:
        lines = ["| budget | compiled: step_peak measured | compiled: recomputed FLOPs | memgate plan at that peak "
                 "| plan: step_peak estimated for the CPU | plan: measured | plan: recomputed FLOPs |",
                 "|---|---|---|---|---|---|---|"]
        for r in rows:
            frac = r["compiled_recompute_flops"] / r["eager_flops"]
            left = (f"| {r['budget']} | {r['compiled_step_peak']:,} B | {r['compiled_recompute_flops']:,} "
                    f"({100 * frac:.1f}%) |")
            if "plan_error" in r:
                lines.append(left + f" no plan fits: {r['plan_error']} | | | |")
            else:
                pf = r["plan_recompute_flops"] / max(r["plan_step_flops"], 1)
                lines.append(left + f" {r['plan_levers']} | {r['plan_step_peak']:,} B | "
                             f"{r['plan_measured_step_peak']:,} B | "
                             f"{r['plan_recompute_flops']:,} ({100 * pf:.1f}%) |")
        Path(args.markdown).write_text("\n".join(lines) + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
