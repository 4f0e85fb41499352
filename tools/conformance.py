#!/usr/bin/env python3
"""memgate's conformance suite from PyTorch's own op samples (issue 68): each op's bytes on the CPU against its estimate.

PyTorch's wheel carries sample inputs for several hundred ops, the OpInfo database its own tests run (`op_db` in
torch.testing._internal.common_methods_invocations). For each op and each of its CPU samples (float32 and bf16; also
non-contiguous and channels-last copies of the sample where it has such tensors) this tool runs the op

  1. on the CPU under memgate's counting allocator with its portable kernels (oneDNN and NNPACK off, one thread, as a
     CPU probe runs them): forward, then backward where the op supports autograd (the sum of its outputs as the loss),
     recording each allocation and free in order, what autograd saves (shape, stride, dtype of each saved tensor) and
     the peak above what was allocated before;
  2. on the Meta device as memgate's estimate for the CPU runs it (memgate._meta's kernels, memgate's C++ Meta
     kernels for the CPU's portable kernels, every request counted as it is), recording the same;

and compares them: the same allocations in the same order, the same saved tensors and the same peak is `exact`;
a peak and total bytes each within 1% of the CPU's is `within 1%`; else `differs` (by how many bytes, and the first
allocation where the two part, with the ATen op that made it on each side); an op the Meta device cannot run is
`refused`, with the reason (an op without a Meta kernel, a value read on Meta). A sample whose CPU run fails is
`skipped` (PyTorch's error samples, a dtype the CPU kernel lacks).

  python tools/conformance.py                                   # every op, float32 and bf16, every variant
  python tools/conformance.py --ops nn.functional.gelu,matmul   # some ops (their OpInfo names)
  python tools/conformance.py --sample 100 --seed 1             # 100 ops drawn with seed 1 (CI: ConformanceTest)
  python tools/conformance.py --json out.json --markdown out.md # every sample's record; the table of docs/accuracy.md
  python tools/conformance.py --check tools/conformance_known.json --sample 100 --seed 1  # CI's gate

`--check FILE` reads the known differences and refusals (per op, dtype and variant: its status and why) and exits 1
when a run op is worse than the file says (an op not in it must be exact); an entry that got better is printed, to
be taken out of the file. `--write-known FILE` writes the run's differences and refusals as such a file.

The ops run in a worker process (memgate's extension from MEMGATE_BUILD/python, default build/cpu/python), several
ops per worker; an op that crashes it or runs past --timeout seconds is `refused` with that reason and the next
worker goes on. Needs expecttest (which torch's test utilities import; ci/setup.sh installs it).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import selectors
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DTYPES = ("float32", "bfloat16")
VARIANTS = ("contiguous", "noncontiguous", "channels_last")
ORDER = {"exact": 0, "within 1%": 1, "differs": 2}


# ---------------------------------------------------------------------------------------------------------------------
# The worker: one process that imports torch, memgate's extension and the OpInfo database, and runs ops on request.


class Worker:
    def __init__(self, build: Path):
        sys.path.insert(0, str(build))
        import torch

        from memgate import _core
        from memgate._meta import prefer_libtorch_meta_kernels

        self.torch = torch
        self.core = _core
        _core.count_cpu_allocations()  # before any tensor of the samples: every CPU tensor is counted from here
        self.kept = prefer_libtorch_meta_kernels()  # as an estimate's Python process does (src/python/module.cpp)
        _core.estimate_for_cpu()
        # A CPU probe's portable kernels (src/measure/probe.cpp, configure_cpu_kernels; the baselines' one thread).
        torch.backends.mkldnn.set_flags(False)
        torch.backends.nnpack.set_flags(False)
        torch.set_num_threads(1)
        from torch.testing._internal.common_methods_invocations import op_db

        self.ops = {}
        for op in op_db:
            self.ops.setdefault(op_key(op), op)
        self.recorder = _core.AllocationRecorder()
        import gc

        gc.freeze()  # torch and op_db out of the collector's walks: each run collects what the one before left

    # -- one sample on one device --

    def fresh(self, value, device, channels_last):
        """The sample's tensors as leaves of their own on `device`: the same shape, strides, storage offset and storage
        size (a non-contiguous sample keeps its gaps), the CPU's with the same values; requires_grad as given."""
        torch = self.torch
        if isinstance(value, torch.Tensor):
            t = value.detach()
            if channels_last and t.dim() == 4:
                t = t.contiguous(memory_format=torch.channels_last)
            with torch.no_grad():
                raw = torch.empty(t.untyped_storage().nbytes(), dtype=torch.uint8, device=device)
                if device == "cpu":
                    raw.copy_(torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage()))
                out = torch.empty(0, dtype=t.dtype, device=device).set_(raw.untyped_storage(), t.storage_offset(),
                                                                         t.shape, t.stride())
            return out.requires_grad_(value.requires_grad)
        if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
            return type(value)(self.fresh(v, device, channels_last) for v in value)
        if isinstance(value, dict):
            return {k: self.fresh(v, device, channels_last) for k, v in value.items()}
        return value

    def run_once(self, op, sample, device, channels_last, backward, tag_ops=False):
        """Runs the op on `device`; returns (events, saved, ops) or raises what the op raised. events: (device, bytes,
        block), bytes negative for a free; saved: (shape, stride, dtype) of each tensor autograd saved; ops: with
        tag_ops, (first event, last event, op name) of each ATen op that reached the device."""
        import gc

        torch = self.torch
        inp = self.fresh(sample.input, device, channels_last)
        args = self.fresh(list(sample.args), device, channels_last)
        kwargs = self.fresh(dict(sample.kwargs), device, channels_last)
        saved = []

        def pack(t):
            saved.append((list(t.shape), list(t.stride()), str(t.dtype).replace("torch.", "")))
            return t.detach()  # the same storage, without the output's grad_fn (no reference cycle)

        tagged = []
        mode = _op_tagger(torch, self.recorder, tagged) if tag_ops else None
        gc.collect()
        gc.freeze()  # what is alive now out of later collections' walks, as torch and op_db are
        self.recorder.start()
        try:
            if mode is not None:
                mode.__enter__()
            try:
                with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                    out = op(inp, *args, **kwargs)
                if backward:
                    outs = [o for o in _tensors(out) if o.requires_grad and o.dtype.is_floating_point]
                    if outs:
                        loss = outs[0].sum()
                        for o in outs[1:]:
                            loss = loss + o.sum()
                        loss.backward()
                del out
            finally:
                if mode is not None:
                    mode.__exit__(None, None, None)
        finally:
            self.recorder.stop()
        return self.recorder.events(), saved, tagged

    def run_sample(self, op, sample, variant):
        torch = self.torch
        channels_last = variant == "channels_last"
        backward = op.supports_autograd and any(
            t.requires_grad for t in _tensors([sample.input, list(sample.args), dict(sample.kwargs)]))
        try:
            cpu = self.run_once(op, sample, "cpu", channels_last, backward)
        except Exception as e:  # noqa: BLE001 (PyTorch's error samples, a dtype the CPU kernel lacks)
            return {"status": "skipped", "reason": f"the CPU run fails: {_first_line(e)}"}
        try:
            meta = self.run_once(op, sample, "meta", channels_last, backward)
        except Exception as e:  # noqa: BLE001
            return {"status": "refused", "reason": refusal_reason(e)}
        # The CPU run's own events (the input's copies are made before it starts); the estimate counts the CPU's
        # allocations beside the Meta device's (src/launch/estimate.cpp, CpuBesideMeta), so both are the Meta run's.
        cpu_events = [e for e in cpu[0] if e[0] == "cpu"]
        meta_events = meta[0]
        result = compare(cpu_events, meta_events, cpu[1], meta[1])
        result["backward"] = backward
        if result["status"] != "exact":
            # Which op made the first allocation where they part (a second run of each, its ops named).
            try:
                c = self.run_once(op, sample, "cpu", channels_last, backward, tag_ops=True)
                m = self.run_once(op, sample, "meta", channels_last, backward, tag_ops=True)
                result["why"] = explain([e for e in c[0] if e[0] == "cpu"], m[0], c[2], m[2], c[1], m[1])
            except Exception as e:  # noqa: BLE001
                result["why"] = f"(not explained: {_first_line(e)})"
        del torch
        return result

    def run_op(self, key, dtypes, variants, max_samples):
        torch = self.torch
        op = self.ops.get(key)
        if op is None:
            return {"op": key, "error": "no such op in op_db"}
        records = []
        for dtype_name in dtypes:
            dtype = getattr(torch, dtype_name)
            if dtype not in op.supported_dtypes("cpu"):
                continue
            torch.manual_seed(0)
            try:
                grad = op.supports_autograd and dtype in op.supported_backward_dtypes("cpu")
                samples = list(op.sample_inputs("cpu", dtype, requires_grad=grad))
            except Exception as e:  # noqa: BLE001
                records.append({"dtype": dtype_name, "variant": "contiguous", "index": -1, "status": "skipped",
                                "reason": f"no samples: {_first_line(e)}"})
                continue
            if max_samples:
                samples = samples[:max_samples]
            for index, sample in enumerate(samples):
                if any(t.layout != torch.strided or t.is_complex()
                       for t in _tensors([sample.input, list(sample.args), dict(sample.kwargs)])):
                    continue  # sparse or complex tensors: neither is what memgate estimates
                for variant in variants:
                    s = sample
                    if variant == "noncontiguous":
                        s = sample.noncontiguous()
                    elif variant == "channels_last" and not any(
                            t.dim() == 4 for t in _tensors([sample.input, list(sample.args), dict(sample.kwargs)])):
                        continue
                    r = self.run_sample(op, s, variant)
                    r.update({"dtype": dtype_name, "variant": variant, "index": index})
                    records.append(r)
        return {"op": key, "samples": records}


def op_key(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def _tensors(value):
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


def _op_tagger(torch, recorder, tagged):
    from torch.utils._python_dispatch import TorchDispatchMode

    class Tagger(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            first = recorder.count()
            out = func(*args, **(kwargs or {}))
            tagged.append((first, recorder.count(), str(func)))
            return out

    return Tagger()


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200] if text else ''}"


def refusal_reason(e: BaseException) -> str:
    """Why the Meta device cannot run it, in a few words that group alike refusals."""
    text = str(e)
    m = (re.search(r"Could not run '([\w:.]+)' with arguments from the 'Meta' backend", text)
         or re.search(r"([\w:.]+): attempted to run this operator with Meta tensors", text)
         or re.search(r"There was no fake impl registered for <CustomOpDef\(([\w:.]+)\)>", text))
    if m:
        return f"no Meta kernel: {m.group(1)}"
    if ("cannot read the value" in text or "Tensor.item() cannot be called on meta tensors" in text
            or "_local_scalar_dense" in text or "data-dependent" in text.lower()
            or "data-independent implementation does not exist" in text):
        return "reads a tensor's value (a size or a branch from its data)"
    if "is not implemented for" in text and "meta" in text.lower():
        return _first_line(e)
    return _first_line(e)


# ---------------------------------------------------------------------------------------------------------------------
# The comparison


def _peak(events):
    now = peak = 0
    for _, b, _ in events:
        now += b
        peak = max(peak, now)
    return peak


def compare(cpu_events, meta_events, cpu_saved, meta_saved):
    cpu_allocs = [b for _, b, _ in cpu_events if b > 0]
    meta_allocs = [b for _, b, _ in meta_events if b > 0]
    cpu_peak, meta_peak = _peak(cpu_events), _peak(meta_events)
    cpu_total, meta_total = sum(cpu_allocs), sum(meta_allocs)
    result = {"cpu_peak": cpu_peak, "meta_peak": meta_peak, "cpu_allocated": cpu_total, "meta_allocated": meta_total,
              "allocations": [len(cpu_allocs), len(meta_allocs)]}
    same_saved = cpu_saved == meta_saved
    if cpu_allocs == meta_allocs and cpu_peak == meta_peak and same_saved:
        result["status"] = "exact"
        return result

    def within(a, b):
        return abs(a - b) <= 0.01 * max(a, 1)

    saved_bytes = [_saved_bytes(cpu_saved), _saved_bytes(meta_saved)]
    result["saved_bytes"] = saved_bytes
    result["same_saved"] = same_saved
    close = within(cpu_peak, meta_peak) and within(cpu_total, meta_total) and within(*saved_bytes)
    result["status"] = "within 1%" if close else "differs"
    return result


def _saved_bytes(saved):
    size = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8, "int64": 8, "int32": 4, "bool": 1, "uint8": 1,
            "int8": 1, "int16": 2}
    total = 0
    for shape, _, dtype in saved:
        n = 1
        for d in shape:
            n *= d
        total += n * size.get(dtype, 4)
    return total


def explain(cpu_events, meta_events, cpu_ops, meta_ops, cpu_saved, meta_saved) -> str:
    """The first allocation where the two runs part, with the op that made it on each side; else the first free
    out of order; and the saved tensors that differ."""

    def op_at(ops, index):
        for first, last, name in ops:
            if first <= index < last:
                return name
        return "outside any op (autograd)"

    def allocs(events):
        return [(i, b) for i, (_, b, _) in enumerate(events) if b > 0]

    a, b = allocs(cpu_events), allocs(meta_events)
    parts = []
    for k in range(max(len(a), len(b))):
        x = a[k] if k < len(a) else None
        y = b[k] if k < len(b) else None
        if x is None or y is None or x[1] != y[1]:
            left = f"{x[1]} B by {op_at(cpu_ops, x[0])}" if x else "none"
            right = f"{y[1]} B by {op_at(meta_ops, y[0])}" if y else "none"
            parts.append(f"allocation #{k + 1}: the CPU {left}, the estimate {right}")
            break
    if not parts:
        # Same allocations: a free comes at another moment.
        for k, (x, y) in enumerate(zip(cpu_events, meta_events)):
            if x[1] != y[1]:
                parts.append(f"event #{k + 1}: the CPU {'allocates' if x[1] > 0 else 'frees'} {abs(x[1])} B "
                             f"({op_at(cpu_ops, k)}), the estimate {'allocates' if y[1] > 0 else 'frees'} {abs(y[1])} B "
                             f"({op_at(meta_ops, k)})")
                break
    if cpu_saved != meta_saved:
        extra = [s for s in meta_saved if s not in cpu_saved]
        missing = [s for s in cpu_saved if s not in meta_saved]
        parts.append(f"saved: the CPU {len(cpu_saved)} tensors, the estimate {len(meta_saved)}"
                     + (f"; only the CPU's {missing[:2]}" if missing else "")
                     + (f"; only the estimate's {extra[:2]}" if extra else ""))
    if not parts:
        parts.append("the second runs, each op named by a dispatch mode, agree: the difference is on a path such a "
                     "mode changes")
    return "; ".join(parts)


def worker_main(build: Path, dtypes, variants, max_samples) -> int:
    import warnings

    warnings.filterwarnings("ignore")
    w = Worker(build)
    print(json.dumps({"ready": sorted(w.ops)}), flush=True)
    for line in sys.stdin:
        key = line.strip()
        if not key:
            continue
        start = time.monotonic()
        try:
            result = w.run_op(key, dtypes, variants, max_samples)
        except Exception as e:  # noqa: BLE001
            result = {"op": key, "error": _first_line(e)}
        result["seconds"] = round(time.monotonic() - start, 3)
        print(json.dumps(result), flush=True)
    return 0


# ---------------------------------------------------------------------------------------------------------------------
# The driver: workers, the report, the known list


class WorkerProcess:
    def __init__(self, args):
        env = dict(os.environ)
        command = [sys.executable, __file__, "--worker", "--build", str(args.build), "--dtypes", ",".join(args.dtypes),
                   "--variants", ",".join(args.variants), "--max-samples", str(args.max_samples)]
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, env=env, bufsize=1)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.proc.stdout, selectors.EVENT_READ)

    def read(self, timeout):
        """The worker's next answer (a JSON line; anything else an op printed is passed over), {} when it died,
        None after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sel.select(left):
                return None
            line = self.proc.stdout.readline()
            if not line:
                return {}
            if line.startswith("{"):
                try:
                    return json.loads(line)
                except json.JSONDecodeError:
                    pass

    def ask(self, key, timeout):
        self.proc.stdin.write(key + "\n")
        self.proc.stdin.flush()
        return self.read(timeout)

    def close(self):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def start_worker(args):
    """A worker that has imported torch, memgate's extension and op_db, and the op_db keys it can run."""
    worker = WorkerProcess(args)
    ready = worker.read(300)
    if not ready or "ready" not in ready:
        worker.close()
        raise SystemExit("conformance: the worker did not start (is memgate's extension built? --build)")
    return worker, ready["ready"]


def run_all(args, keys, worker=None):
    """Each op of `keys` in `worker` (started here when None), a fresh worker after one that crashed or hung."""
    results = []
    all_keys = None
    for n, key in enumerate(keys):
        if worker is None:
            worker, all_keys = start_worker(args)
        start = time.monotonic()
        answer = worker.ask(key, args.timeout)
        if not answer or "op" not in answer:
            why = f"ran past {args.timeout} s" if answer is None else "crashed the process"
            code = worker.proc.poll()
            if answer is not None and code is not None:
                why += f" (exit {code})"
            answer = {"op": key, "samples": [{"status": "refused", "reason": f"the op {why}", "dtype": "*",
                                              "variant": "*", "index": -1}],
                      "seconds": round(time.monotonic() - start, 3)}
            worker.close()
            worker = None
        results.append(answer)
        if not args.quiet:
            print(f"[{n + 1}/{len(keys)}] {report_line(answer)}", flush=True)
    if worker is not None:
        worker.close()
    return results, all_keys




def summarize(samples):
    """Per (dtype, variant): the counts of each status, the op's status (its worst sample; refused if any sample
    was), and its worst difference and first reason."""
    groups = {}
    for s in samples:
        g = groups.setdefault((s["dtype"], s["variant"]), {"counts": {}, "status": None, "reason": ""})
        g["counts"][s["status"]] = g["counts"].get(s["status"], 0) + 1
    for (dtype, variant), g in groups.items():
        mine = [s for s in samples if (s["dtype"], s["variant"]) == (dtype, variant)]
        refused = [s for s in mine if s["status"] == "refused"]
        ran = [s for s in mine if s["status"] in ORDER]
        if refused:
            g["status"] = "refused"
            g["reason"] = refused[0]["reason"]
        elif ran:
            worst = max(ran, key=lambda s: (ORDER[s["status"]], abs(s["meta_peak"] - s["cpu_peak"])))
            g["status"] = worst["status"]
            if worst["status"] != "exact":
                g["reason"] = (f"sample {worst['index']}: peak {worst['meta_peak'] - worst['cpu_peak']:+d} B of "
                               f"{worst['cpu_peak']}, allocated {worst['meta_allocated'] - worst['cpu_allocated']:+d} B"
                               f"; {worst.get('why', '')}")
        else:
            g["status"] = "skipped"
            g["reason"] = mine[0].get("reason", "") if mine else ""
    return groups


def report_line(answer):
    if "error" in answer:
        return f"{answer['op']}: error: {answer['error']}"
    parts = []
    for (dtype, variant), g in sorted(summarize(answer["samples"]).items()):
        counts = ", ".join(f"{k} {v}" for k, v in sorted(g["counts"].items()))
        parts.append(f"{dtype}/{variant}: {g['status']} ({counts})" + (f": {g['reason']}" if g["reason"] else ""))
    return f"{answer['op']} ({answer.get('seconds', 0):.1f} s): " + (" | ".join(parts) if parts else "no samples")


def table(results):
    """The table of docs/accuracy.md: per dtype and variant, ops and samples run, exact, within 1%, differing,
    refused (an op's status is its worst sample's)."""
    rows = {}
    reasons = {}
    for answer in results:
        for (dtype, variant), g in summarize(answer.get("samples", [])).items():
            r = rows.setdefault((dtype, variant), {"ops": 0, "samples": 0, "exact_ops": 0, "within_ops": 0,
                                                  "differs_ops": 0, "refused_ops": 0, "exact": 0, "within 1%": 0,
                                                  "differs": 0, "refused": 0, "skipped": 0})
            if g["status"] == "skipped":
                r["skipped"] += sum(g["counts"].values())
                continue
            r["ops"] += 1
            r["samples"] += sum(v for k, v in g["counts"].items() if k != "skipped")
            for k, v in g["counts"].items():
                r[k] += v
            r[{"exact": "exact_ops", "within 1%": "within_ops", "differs": "differs_ops",
               "refused": "refused_ops"}[g["status"]]] += 1
            if g["status"] == "refused":
                reason = re.sub(r"\(exit -?\d+\)", "", g["reason"])
                reasons.setdefault(reason, []).append(answer["op"])
    lines = ["| dtype | variant | ops | samples | exact (ops / samples) | within 1% | differ | refused |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for (dtype, variant), r in sorted(rows.items()):
        lines.append(f"| {dtype} | {variant} | {r['ops']} | {r['samples']} | {r['exact_ops']} / {r['exact']} | "
                     f"{r['within_ops']} / {r['within 1%']} | {r['differs_ops']} / {r['differs']} | "
                     f"{r['refused_ops']} / {r['refused']} |")
    lines += ["", "| refused because | ops |", "|---|---|"]
    for reason, ops in sorted(reasons.items(), key=lambda kv: -len(set(kv[1]))):
        names = sorted(set(ops))
        lines.append(f"| {reason.replace('|', '/')} | {len(names)}: {', '.join(names[:12])}"
                     f"{', ...' if len(names) > 12 else ''} |")
    return "\n".join(lines)


def known_from(results):
    known = {}
    for answer in results:
        for (dtype, variant), g in sorted(summarize(answer.get("samples", [])).items()):
            if g["status"] in ("exact", "skipped"):
                continue
            known[f"{answer['op']} {dtype} {variant}"] = {"status": g["status"], "why": g["reason"][:300]}
    return known


def check(results, known):
    """What got worse than the known list says (an op not in it is exact), and what got better."""
    worse, better = [], []
    for answer in results:
        if "error" in answer:
            worse.append(f"{answer['op']}: {answer['error']}")
            continue
        for (dtype, variant), g in sorted(summarize(answer["samples"]).items()):
            if g["status"] == "skipped":
                continue
            key = f"{answer['op']} {dtype} {variant}"
            expected = known.get(key, {}).get("status", "exact")
            got = g["status"]
            if got == expected:
                continue
            if expected == "refused" and got == "refused":
                continue
            if got == "refused" or (expected != "refused" and ORDER[got] > ORDER[expected]):
                worse.append(f"{key}: {got}, known {expected}: {g['reason']}")
            else:
                better.append(f"{key}: {got}, known {expected}: take it out of the known list or lower it")
    return worse, better


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ops", help="comma-separated OpInfo names (name or name.variant_test_name); default: all")
    p.add_argument("--sample", type=int, default=0, help="run N ops drawn with --seed")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--dtypes", default=",".join(DTYPES))
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--max-samples", type=int, default=0, help="at most this many samples per op and dtype (0: all)")
    p.add_argument("--timeout", type=float, default=300, help="seconds per op before it is refused as a hang")
    p.add_argument("--json", type=Path, help="write every sample's record here")
    p.add_argument("--markdown", type=Path, help="write the summary table here")
    p.add_argument("--check", type=Path, help="the known list: exit 1 when an op is worse than it says")
    p.add_argument("--write-known", type=Path, help="write the run's differences and refusals as a known list")
    p.add_argument("--build", type=Path, default=Path(os.environ.get("MEMGATE_BUILD", ROOT / "build" / "cpu"))
                   / "python", help="the folder with the memgate package and its extension")
    p.add_argument("--quiet", action="store_true", help="no line per op")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    args.variants = [v for v in args.variants.split(",") if v]
    for v in args.variants:
        if v not in VARIANTS:
            p.error(f"--variants: expected some of {', '.join(VARIANTS)}, got '{v}'")
    if args.worker:
        return worker_main(args.build, args.dtypes, args.variants, args.max_samples)

    # The op_db keys come from a worker (the database is imported there), which then runs the ops: the import, the
    # most of a sample run's start, is paid once.
    worker = None
    if args.ops:
        keys = [k for k in args.ops.split(",") if k]
    else:
        worker, keys = start_worker(args)
    if args.sample:
        keys = sorted(random.Random(args.seed).sample(sorted(keys), min(args.sample, len(keys))))
    start = time.monotonic()
    results, _ = run_all(args, keys, worker)
    summary = table(results)
    print(f"\n{len(keys)} ops in {time.monotonic() - start:.0f} s\n\n{summary}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    if args.markdown:
        args.markdown.write_text(summary + "\n")
    if args.write_known:
        args.write_known.write_text(json.dumps(known_from(results), indent=1, sort_keys=True) + "\n")
    if args.check:
        known = json.loads(args.check.read_text())
        worse, better = check(results, known)
        compared = sum(1 for a in results for s in a.get("samples", []) if s["status"] in ORDER)
        if compared == 0:
            worse.append("no sample was compared (every one skipped or refused): the run checked nothing")
        for line in better:
            print(f"better: {line}")
        for line in worse:
            print(f"WORSE: {line}")
        if worse:
            print(f"\n{len(worse)} op(s) worse than {args.check} says", file=sys.stderr)
            return 1
        print(f"\nno op worse than {args.check} says ({len(better)} better)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
