#!/usr/bin/env python3
"""Compares two runs of the CLI tests recorded with MEMGATE_TEST_CLI_RECORD (tests/common/cli_fork.h): one with the
cases forked from the test program, one with MEMGATE_TEST_FORK_CLI=0 (each the real program). Each case's exit code
and output must be the same, once what differs from run to run anyway is written alike: the case's and a probe's
temporary folders, durations and times, process ids, which rank of a probe failed first, the step times advise
measures, a probe's progress lines (each phase that lasts a second).

    compare_cli_runs.py FORKED_FOLDER REAL_FOLDER
"""
import pathlib
import re
import sys

NORMAL = [
    (re.compile(r"/tmp/memgate-test-\d+"), "{dir}"),
    (re.compile(r"/tmp/memgate-probe-\w+"), "{probe}"),
    (re.compile(r"\b\d+(\.\d+)? s\b"), "<seconds> s"),
    (re.compile(r"\bpid \d+"), "pid <pid>"),
    (re.compile(r"\brank \d+ of \d+"), "rank <r> of <n>"),
    (re.compile(r"\brank\d+\."), "rank<r>."),
    # LibTorch's warnings carry the time they were written.
    (re.compile(r"^\[([WIE])\d{4} [\d:.]+ ", re.M), r"[\1<time> "),
    # advise's variants measured when a batch does not fit: their step time against the fixture's, measured.
    (re.compile(r"^( {4}\S.*\s{2,}\d+\s+)[+-]\d+%(  )", re.M), r"\1<step time>\2"),
]
# A probe's progress while it runs (MEMGATE_PROGRESS=1): the phase it is in when a second passes, as long as it takes.
HEARTBEAT = re.compile(r"^\[memgate\] .*: measured step: [a-z ]+ \(<seconds> s\)\n", re.M)


def normal(text):
    for pattern, to in NORMAL:
        text = pattern.sub(to, text)
    return HEARTBEAT.sub("", text)


def main():
    forked_dir, real_dir = (pathlib.Path(a) for a in sys.argv[1:3])
    forked = {p.name: p.read_text(errors="replace") for p in forked_dir.glob("*.txt")}
    real = {p.name: p.read_text(errors="replace") for p in real_dir.glob("*.txt")}
    differ = 0
    for name in sorted(set(forked) | set(real)):
        if name not in forked or name not in real:
            print(f"{name}: only in {'the forked' if name in forked else 'the real'} run")
            differ += 1
            continue
        (f_head, _, f_out), (r_head, _, r_out) = forked[name].partition("\n"), real[name].partition("\n")
        if f_head.split()[0] != r_head.split()[0] or normal(f_out) != normal(r_out):
            print(f"{name}: exit {f_head} against {r_head}")
            for a, b in zip(normal(f_out).splitlines(), normal(r_out).splitlines()):
                if a != b:
                    print(f"  forked: {a}\n  real:   {b}")
            differ += 1
    ran = sum(1 for t in forked.values() if t.partition("\n")[0].endswith(" forked"))
    print(f"{len(forked)} cases, {ran} forked, {len(forked) - ran} the real program; {differ} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
