#!/usr/bin/env python3
"""Where the CPU test run's time goes: `ctest --preset cpu` and the CPU memory suite, timed as issue 43 measures them.

    benchmarks/test_times.py                      # runs ctest --preset cpu once, then the memory suite 3 times
    benchmarks/test_times.py --log ctest.log      # reads a ctest --preset cpu output instead of running it
    benchmarks/test_times.py --memory-runs 0      # the whole run only

Prints a Markdown report: the run's wall time, its cost in core-seconds (each test's seconds times the cores it
claims: what a 2-core runner must fit) and the CPU it really used, the longest tests and the cost per test program;
then the memory suite's wall time (`ctest --preset cpu -L memory`, the median of the runs). Run it from the source
tree after `cmake --workflow --preset cpu` (or configure and build), on an otherwise idle machine.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULT = re.compile(r"Test +#\d+: (.+?) \.{3,}\s*(Passed|Failed|Not Run|\*\*\*\w+)\s+([\d.]+) sec")
LABEL = re.compile(r"^cpu +=\s+([\d.]+) sec\*proc", re.M)
TOTAL = re.compile(r"Total Test time \(real\) = +([\d.]+) sec")


def machine_cpu() -> tuple[float, float] | None:
    """The machine's busy and idle CPU so far, in core-seconds (/proc/stat's first line); None off Linux."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]  # idle, iowait
    busy = sum(fields[:8]) - idle  # user nice system idle iowait irq softirq steal
    return busy / ticks, idle / ticks


def ctest(args: list[str]) -> tuple[str, float, float, tuple[float, float] | None]:
    """ctest's output, its wall time, the CPU time (user + system) of ctest and of every process it waited for, and
    the machine's busy and idle core-seconds meanwhile (every process: the Python fork servers, which end without
    being waited for, count there)."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    machine_before = machine_cpu()
    start = time.monotonic()
    p = subprocess.run(["ctest", *args], cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - start
    machine_after = machine_cpu()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    machine = None
    if machine_before and machine_after:
        machine = (machine_after[0] - machine_before[0], machine_after[1] - machine_before[1])
    return p.stdout + p.stderr, wall, cpu, machine


def tests_of(build: Path) -> dict:
    """Each CTest test's program and the cores it claims (PROCESSORS)."""
    text = subprocess.run(["ctest", "--test-dir", str(build), "-L", "^cpu$", "--show-only=json-v1"],
                          capture_output=True, text=True, check=True).stdout
    out = {}
    for t in json.loads(text)["tests"]:
        cores = next((p["value"] for p in t.get("properties", []) if p["name"] == "PROCESSORS"), 1)
        command = t.get("command") or ["?"]
        program = Path(command[0]).name
        if program.startswith("python") and len(command) > 1:
            program = Path(command[1]).name
        out[t["name"]] = (program, int(cores))
    return out


def report(log: str, wall: float | None, build: Path, memory: list[float], cpu: float | None = None,
           machine: tuple[float, float] | None = None) -> str:
    results = [(m.group(1), m.group(2), float(m.group(3))) for m in RESULT.finditer(log)]
    if not results:
        sys.exit("no test results in the ctest output")
    total = TOTAL.search(log)
    label = LABEL.search(log)
    info = tests_of(build)
    cost = {name: seconds * info.get(name, ("?", 1))[1] for name, _, seconds in results}
    failed = [name for name, status, _ in results if status != "Passed"]
    lines = ["| Figure | Value |", "|---|---|",
             f"| tests | {len(results)} ({len(failed)} not passed) |",
             f"| `ctest --preset cpu`, wall (CTest's total) | {float(total.group(1)) if total else wall:.1f} s |",
             f"| cost: each test's seconds x the cores it claims (CTest's sec*proc of label cpu) | "
             f"{float(label.group(1)) if label else sum(cost.values()):.0f} core-s |"]
    if cpu is not None:
        # What the claims leave idle: a test that waits (a timeout, a peer) holds its cores without using them.
        lines.append(f"| CPU used (user + system of ctest and the processes it waited for) | {cpu:.0f} core-s |")
    if machine is not None:
        lines.append(f"| the machine meanwhile: busy / idle (every process, on an otherwise idle machine) | "
                     f"{machine[0]:.0f} / {machine[1]:.0f} core-s |")
    if memory:
        lines.append(f"| CPU memory suite (`ctest --preset cpu -L memory`), median of {len(memory)} | "
                     f"{statistics.median(memory):.1f} s (runs: {', '.join(f'{m:.1f}' for m in memory)}) |")
    # The tables take each test's cores from the build tree as it is now.
    lines += ["", "The longest tests (core-s):", "", "| core-s | s | cores | test |", "|---|---|---|---|"]
    for name, seconds in sorted(((n, s) for n, _, s in results), key=lambda x: -cost[x[0]])[:15]:
        lines.append(f"| {cost[name]:.1f} | {seconds:.1f} | {info.get(name, ('?', 1))[1]} | {name} |")
    per_program = collections.Counter()
    for name, c in cost.items():
        per_program[info.get(name, ("?", 1))[0]] += c
    lines += ["", "Per program (core-s):", "", "| core-s | program |", "|---|---|"]
    lines += [f"| {c:.0f} | {p} |" for p, c in per_program.most_common(12)]
    if failed:
        lines += ["", "Not passed: " + ", ".join(failed)]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--log", help="a ctest --preset cpu output to read instead of running it")
    p.add_argument("--build", default=str(ROOT / "build" / "cpu"), help="the build tree (default build/cpu)")
    p.add_argument("--memory-runs", type=int, default=3, help="runs of the memory suite (default 3; 0: none)")
    a = p.parse_args(argv)
    if a.log:
        log, wall, cpu, machine = Path(a.log).read_text(), None, None, None
    else:
        log, wall, cpu, machine = ctest(["--preset", "cpu"])
    memory = [ctest(["--preset", "cpu", "-L", "memory"])[1] for _ in range(a.memory_runs)]
    print(report(log, wall, Path(a.build), memory, cpu, machine))
    return 0


if __name__ == "__main__":
    sys.exit(main())
