#!/usr/bin/env python3
"""Every plan of `memgate plan`, its fixture measured on the CPU against its estimate for the CPU (issue 70).

For each case (a fixture, a batch, targets: GPU fixtures or capacities), runs `memgate plan --json` with
--allow-changes, writes each listed plan's fixture (the plan's `change` merged into the fixture's YAML, as
`apply_change` in src/plan/plan.cpp merges it), then measures that fixture on the CPU (`memgate profile --device cpu`)
and estimates it for the CPU (`memgate estimate --for cpu`) at the plan's micro-batch, and compares every component.
A plan's fixture that several targets share is measured once. Prints a table (fixture x target x plan: step_peak
estimated and measured, the difference in %, the worst other component) and the largest difference; exits 1 when a
difference passes --tolerance (1% by default).

The plan's own bytes are an estimate for CUDA on the target's GPU (no GPU is used); what is checked here is that the
same fixture's estimate is what the CPU measures, under the CPU's kernels (portable, the fixture's default).

  tools/plan_check.py                      # the full table (docs/plan.md), about 10 minutes on 2 loaded cores
  tools/plan_check.py --quick              # the small cases only
  tools/plan_check.py --case vit_tiny_full:batch=64:t4_16gb,mib=30 --markdown table.md

The tool needs PyYAML (the project's venv has it): /root/.cache/memgate/venv/bin/python tools/plan_check.py
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
COMPONENTS = ["params", "gradients", "optimizer_state", "activations", "forward_peak", "eval_peak", "step_peak",
              "step_peak_reserved"]
GPUS = ["t4_16gb", "rtx_4090_24gb", "h100_80gb"]

# The 1024 px UNet at width 8 in fp32: vessel_unet_1024_fp16 itself (width 64, fp16 autocast) needs 5.3 GiB on the
# CPU at batch 1 and LibTorch's portable fp16 convolutions ran over 25 minutes for its one step on 2 loaded cores.
UNET_1024_W8 = {"model": {"base_channels": 8}, "training": {"precision": "fp32"}}
# fixture, the batch option (batch=B or effective=N), the targets: three GPU fixtures, and capacities (mib=N) that the
# fixture as it is does not fit, so that the levers are exercised (a tiny twin fits any GPU as it is); and keys that
# change the fixture before it is planned (None: as it is).
FULL = [
    ("vit_tiny_full", "batch=64", GPUS + ["mib=30", "mib=40"], None),
    ("vit_tiny_full", "effective=64", GPUS + ["mib=24"], None),
    ("gpt_tiny", "effective=64", GPUS + ["mib=28"], None),
    ("gpt_tiny", "batch=128", GPUS + ["mib=30"], None),
    ("unet_tiny", "batch=8", GPUS + ["mib=40"], None),
    ("multimodal_tiny", "effective=256", GPUS + ["mib=4", "mib=8"], None),
    ("py_vit_tiny_lora_timm", "effective=32", GPUS + ["mib=6"], None),
    ("vessel_unet_1024_fp16", "batch=1", GPUS + ["mib=800"], UNET_1024_W8),
]
QUICK = [
    ("vit_tiny_full", "batch=64", ["t4_16gb", "mib=30"], None),
    ("gpt_tiny", "effective=64", ["h100_80gb", "mib=28"], None),
]


def merge(node: dict, change: dict) -> None:
    """`change` into `node`, as plan.cpp's apply_change merges it (a JSON merge patch): an object into a map key by
    key, a null removes the key, anything else replaces."""
    for k, v in change.items():
        if v is None:
            node.pop(k, None)
        elif isinstance(v, dict) and isinstance(node.get(k), dict):
            merge(node[k], v)
        else:
            node[k] = copy.deepcopy(v)


def run_json(cmd: list[str], out: Path, timeout: float | None = None) -> dict:
    env = dict(os.environ)
    env.setdefault("MEMGATE_PYTHON", "/root/.cache/memgate/venv/bin/python")
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return json.loads(out.read_text())


def parse_case(text: str):
    name, batch, targets = text.split(":")
    return name, batch, targets.split(","), None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--memgate", default=str(ROOT / "build/cpu/bin/memgate"))
    ap.add_argument("--case", action="append", default=[], help="fixture:batch=B|effective=N:target,target,...")
    ap.add_argument("--quick", action="store_true", help="the small cases only")
    ap.add_argument("--tolerance", type=float, default=1.0, help="percent (default 1)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds for one measurement (default 300)")
    ap.add_argument("--markdown", help="also write the table as Markdown to this file")
    ap.add_argument("--json", help="also write every row as JSON to this file")
    args = ap.parse_args()
    cases = [parse_case(c) for c in args.case] or (QUICK if args.quick else FULL)
    rows, measured = [], {}
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="plan_check_") as tmp:
        tmp = Path(tmp)
        # Python fixtures name their code relative to their folder.
        (tmp / "python").symlink_to(ROOT / "fixtures/models/python")
        for name, batch, targets, override in cases:
            src = ROOT / "fixtures/models" / f"{name}.yaml"
            base = yaml.safe_load(src.read_text())
            if override:
                merge(base, override)
                name = f"{name} (" + ", ".join(f"{k}: {v}" for part in override.values() for k, v in part.items()) + ")"
                src = tmp / f"{Path(src).stem}_twin.yaml"
                src.write_text(yaml.safe_dump(base, sort_keys=False))
            kind, n = batch.split("=")
            for target in targets:
                out = tmp / "plan.json"
                cmd = [args.memgate, "plan", "--config", str(src), "--allow-changes", "--output", str(out),
                       "--batch" if kind == "batch" else "--effective-batch", n]
                cmd += ["--capacity-mib", target[4:]] if target.startswith("mib=") else ["--gpu", target]
                try:
                    plans = run_json(cmd, out)
                except RuntimeError as e:
                    rows.append({"fixture": name, "batch": batch, "target": target,
                                 "error": str(e).strip().splitlines()[-1]})
                    print(f"{name} {batch} {target}: no plan: {str(e).splitlines()[-1]}", file=sys.stderr)
                    continue
                for i, plan in enumerate(plans["plans"]):
                    fixture = copy.deepcopy(base)
                    merge(fixture, plan["change"])
                    text = yaml.safe_dump(fixture, sort_keys=False)
                    micro = plan["micro_batch"]
                    key = (text, micro)
                    if key not in measured:
                        path = tmp / f"{src.stem}_plan{len(measured)}.yaml"
                        path.write_text(f"# {name} with the plan {json.dumps(plan['change'])}\n" + text)
                        t0 = time.monotonic()
                        est = run_json([args.memgate, "estimate", "--config", str(path), "--for", "cpu",
                                        "--batch-sizes", str(micro), "--output", str(tmp / "e.json")], tmp / "e.json")
                        try:
                            meas = run_json([args.memgate, "profile", "--device", "cpu", "--config", str(path),
                                             "--batch-sizes", str(micro), "--output", str(tmp / "m.json")],
                                            tmp / "m.json", timeout=args.timeout)["probes"][0]
                        except subprocess.TimeoutExpired:
                            meas = None
                        measured[key] = (est["probes"][0], meas, time.monotonic() - t0)
                    est, meas, seconds = measured[key]
                    if meas is None:
                        rows.append({"fixture": name, "batch": batch, "target": target, "plan": i + 1,
                                     "levers": ", ".join(plan["levers"]) or "none: fits as it is",
                                     "error": f"not measured: over {args.timeout:.0f} s on the CPU"})
                        print(f"{name} {batch} {target} #{i + 1} {rows[-1]['levers']}: {rows[-1]['error']}",
                              flush=True)
                        continue
                    diffs = {}
                    # Every component either side has (host_activations where the plan offloads, ema where the
                    # fixture keeps one): one that only one side has is a difference of 100%.
                    for c in COMPONENTS + sorted((set(est["components"]) | set(meas["components"])) -
                                                 set(COMPONENTS)):
                        e, m = est["components"].get(c), meas["components"].get(c)
                        if e is None or m is None:
                            diffs[c] = 100.0
                            continue
                        diffs[c] = 0.0 if e == m else 100.0 * (e - m) / max(abs(m), 1)
                    row = {"fixture": name, "batch": batch, "target": target, "plan": i + 1,
                           "levers": ", ".join(plan["levers"]) or "none: fits as it is", "micro_batch": micro,
                           "accumulation_steps": plan["accumulation_steps"],
                           "recompute_flops_fraction": plan["recompute_flops_fraction"],
                           "cuda_step_peak": plan["step_peak"], "cpu_estimated": est["components"],
                           "cpu_measured": meas["components"], "diff_percent": diffs, "seconds": seconds,
                           "step_peak_diff": diffs.get("step_peak", float("nan")),
                           "worst": max(diffs.items(), key=lambda kv: abs(kv[1]))}
                    rows.append(row)
                    print(f"{name:24} {batch:13} {target:14} #{i + 1} {row['levers'][:60]:60} step_peak "
                          f"{est['components']['step_peak']:>13,} est {meas['components']['step_peak']:>13,} meas "
                          f"{row['step_peak_diff']:+.3f}%  worst {row['worst'][0]} {row['worst'][1]:+.3f}%",
                          flush=True)
    elapsed = time.monotonic() - start
    checked = [r for r in rows if "error" not in r]
    worst_step = max((abs(r["step_peak_diff"]) for r in checked), default=0.0)
    worst_any = max((abs(r["worst"][1]) for r in checked), default=0.0)
    summary = (f"{len(checked)} plans measured, {len(rows) - len(checked)} not, of {len(cases)} cases ({len(measured)} distinct plan fixtures measured on the "
               f"CPU) in {elapsed:.0f} s; largest step_peak difference {worst_step:.3f}%, largest of any component "
               f"{worst_any:.3f}%")
    print(summary)
    if args.markdown:
        lines = ["| fixture | batch | target | plan | levers | micro x steps | step_peak estimated (CPU) | measured "
                 "(CPU) | diff | worst component |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            if "error" in r:
                lines.append(f"| {r['fixture']} | {r['batch']} | {r['target']} | {r.get('plan', '')} | "
                             f"{r.get('levers', '')} | | | | {r['error']} | |")
                continue
            w = r["worst"]
            lines.append(f"| {r['fixture']} | {r['batch']} | {r['target']} | {r['plan']} | {r['levers']} | "
                         f"{r['micro_batch']} x {r['accumulation_steps']} | {r['cpu_estimated']['step_peak']:,} | "
                         f"{r['cpu_measured']['step_peak']:,} | {r['step_peak_diff']:+.3f}% | {w[0]} {w[1]:+.3f}% |")
        lines.append("")
        lines.append(summary)
        Path(args.markdown).write_text("\n".join(lines) + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    failed = [r for r in rows if "error" in r and "no plan fits" not in r["error"]]
    for r in failed:
        print(f"FAILED: {r['fixture']} {r['batch']} {r['target']}: {r['error']}", file=sys.stderr)
    return 1 if worst_any > args.tolerance or failed else 0


if __name__ == "__main__":
    sys.exit(main())
