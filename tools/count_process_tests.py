#!/usr/bin/env python3
"""Counts the tests that start a process: each CTest test of a build run once under strace.

A test starts a process when it, or anything it started, creates a process: fork, vfork, or clone without
CLONE_THREAD (posix_spawn's too); a child that execs is named by its program, one that does not (a fork server's
probe, a forked rank) by its parent's. The test programs (tests/common/test_main.cpp) mark each GoogleTest test's
start and end under MEMGATE_TEST_MARKERS, so a process is counted against the test that ran when it was created
(or against its suite's set-up, before the first test), and one that a test's process had started earlier (a fork
server) is counted against the test that asked it for a child.

    tools/count_process_tests.py [--build build/cpu] [--label cpu] [-R REGEX] [--jobs 2] [--json OUT]

Runs the tests as `CI=true ctest --preset cpu` does (CI=true, MEMGATE_RESULTS in a temporary folder), prints one
line per test that started a process and the counts: CTest tests and GoogleTest tests (one per parameter) that
started one, of how many. A test that fails under strace is counted all the same and named.
"""
import argparse
import collections
import concurrent.futures
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile

TRACED = "execve,execveat,fork,vfork,clone,clone3,access,faccessat,faccessat2"
LINE = re.compile(r"^(\d+)\s+(.*)$")
MARK = re.compile(r'"/memgate-test-(start|end)/([^"]+)"')
EXEC = re.compile(r'^execve(?:at)?\((?:\d+, )?"([^"]*)"')
RESUMED = re.compile(r"^<\.\.\. (\w+) resumed>")


def tests_of(build, label, regex):
    command = ["ctest", "--test-dir", str(build), "--show-only=json-v1", "-L", f"^{label}$"]
    if regex:
        command += ["-R", regex]
    listing = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
    for test in listing["tests"]:
        props = {p["name"]: p["value"] for p in test.get("properties", [])}
        env = dict(item.split("=", 1) for item in props.get("ENVIRONMENT", []))
        yield {"name": test["name"], "command": test["command"], "env": env,
               "cwd": props.get("WORKING_DIRECTORY", str(build)), "timeout": float(props.get("TIMEOUT", 1500))}


def creates_process(call):
    """The syscall text (name and arguments) creates a process, not a thread."""
    name = call.split("(", 1)[0]
    if name in ("fork", "vfork"):
        return True
    if name in ("clone", "clone3"):
        return "CLONE_THREAD" not in call
    return False


def analyse(log):
    """(programs started, per GoogleTest test {name: [programs]}, tests seen) from an strace -f log."""
    root = None
    exe = {}               # pid -> the program it runs
    pending = {}           # pid -> the unfinished call's text (clone's flags come before <unfinished ...>)
    current = "(set-up)"
    seen = []
    per_test = collections.defaultdict(list)
    started = []
    unnamed = {}           # pid -> (index in started, index in per_test[test], test) until it execs
    for raw in log.splitlines():
        match = LINE.match(raw)
        if not match:
            continue
        pid, text = int(match.group(1)), match.group(2)
        if root is None:
            root = pid
        resumed = RESUMED.match(text)
        if resumed:
            call = pending.pop(pid, "") + text[resumed.end():]
        elif text.endswith("<unfinished ...>"):
            pending[pid] = text[: -len("<unfinished ...>")]
            continue
        else:
            call = text
        mark = MARK.search(call)
        if mark and pid == root:
            if mark.group(1) == "start":
                current = mark.group(2)
                seen.append(current)
            else:
                current = "(between tests)"
            continue
        ex = EXEC.match(call)
        if ex and call.rstrip().endswith("= 0"):
            program = os.path.basename(ex.group(1))
            if pid in unnamed:  # a child's first exec names it
                i, j, test = unnamed.pop(pid)
                started[i] = (pid, program, test)
                per_test[test][j] = program
            exe[pid] = program
            continue
        if creates_process(call):
            result = call.rsplit("=", 1)[-1].strip().split(" ")[0]
            if not result.lstrip("-").isdigit() or int(result) <= 0:
                continue
            child = int(result)
            exe[child] = exe.get(pid, "?")
            program = "fork of " + exe.get(pid, "?")
            unnamed[child] = (len(started), len(per_test[current]), current)
            started.append((child, program, current))
            per_test[current].append(program)
    return [p for _, p, _ in started], dict(per_test), seen


def run_one(test, scratch, markers):
    log = scratch / (re.sub(r"[^A-Za-z0-9_.-]", "_", test["name"]) + ".strace")
    env = dict(os.environ)
    env.update(test["env"])
    env["CI"] = "true"
    env.setdefault("MEMGATE_RESULTS", str(scratch / "memgate-results.jsonl"))
    if markers:
        env["MEMGATE_TEST_MARKERS"] = "1"
    command = ["strace", "-f", "--seccomp-bpf", "-qqq", "-s", "256", "-e", f"trace={TRACED}", "-e", "signal=none",
               "-o", str(log)] + test["command"]
    try:
        rc = subprocess.run(command, cwd=test["cwd"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            timeout=test["timeout"]).returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    programs, per_test, seen = analyse(log.read_text(errors="replace") if log.exists() else "")
    log.unlink(missing_ok=True)
    return {"name": test["name"], "rc": rc, "programs": programs, "per_test": per_test, "tests": seen}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", default="build/cpu")
    parser.add_argument("--label", default="cpu")
    parser.add_argument("-R", dest="regex")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--json", help="write every test's processes here")
    parser.add_argument("--no-markers", action="store_true", help="count CTest tests only")
    args = parser.parse_args()
    build = pathlib.Path(args.build).resolve()
    tests = list(tests_of(build, args.label, args.regex))
    results = []
    with tempfile.TemporaryDirectory(prefix="count-process-tests-") as tmp:
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            futures = [pool.submit(run_one, t, pathlib.Path(tmp), not args.no_markers) for t in tests]
            for future in concurrent.futures.as_completed(futures):
                r = future.result()
                results.append(r)
                if r["programs"]:
                    names = collections.Counter(r["programs"])
                    print(f"{r['name']}: {len(r['programs'])} processes ("
                          + ", ".join(f"{n} {p}" for p, n in names.most_common()) + ")", flush=True)
    results.sort(key=lambda r: r["name"])
    ctest_starting = [r for r in results if r["programs"]]
    gtest_total = sum(len(r["tests"]) for r in results)
    gtest_starting = sum(1 for r in results for t in r["tests"] if r["per_test"].get(t))
    setups = sum(1 for r in results if r["per_test"].get("(set-up)") and r["tests"])
    failed = [r["name"] for r in results if r["rc"] != 0]
    print(f"CTest tests that start a process: {len(ctest_starting)} of {len(results)}")
    print(f"GoogleTest tests that start a process: {gtest_starting} of {gtest_total} "
          f"(and {setups} CTest tests of GoogleTest programs whose suite set-up starts one)")
    print(f"processes started: {sum(len(r['programs']) for r in results)}")
    if failed:
        print(f"failed or timed out under strace ({len(failed)}): " + ", ".join(failed))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
