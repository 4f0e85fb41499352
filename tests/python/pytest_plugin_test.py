#!/usr/bin/env python3
"""memgate's pytest plugin in a repository of its own: fixtures named in pyproject.toml are collected as a test per
batch size and component beside the repository's own tests; a missing baseline skips (fails under CI), recording on
request makes them pass, a grown component fails with the gate's message, and pytest's JUnit carries it.

    PYTHONPATH=build/cpu/python python tests/python/pytest_plugin_test.py
"""
import json
import os
import pathlib
import re
import sys
import tempfile
import traceback
import xml.etree.ElementTree as ET

import pytest as _pytest

failures = []


def expect(ok, what):
    if not ok:
        failures.append(what)


FIXTURE = """model:
  arch: vit
  img_size: 32
  patch_size: 8
  embed_dim: 64
  depth: 2
  num_heads: 4
  num_classes: 5
training:
  optimizer: adamw
  trainable: head
batch_sizes: [1, 2]
"""


def pytest(project, *args, ci=False):
    """`python -m pytest -p memgate.pytest_plugin ... <args>` in `project`: (exit code, stdout + stderr). It runs as
    pytest.main() in a process forked from this one, which has imported pytest (not the plugin, which pytest imports
    itself to rewrite its asserts): a run pays no start of Python and pytest, and is otherwise the command's: its own
    process, environment and working folder, the folder first on sys.path as `python -m` puts it."""
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "MEMGATE_STRICT", "GITHUB_STEP_SUMMARY")}
    if ci:
        env["CI"] = ci if isinstance(ci, str) else "true"
    argv = ["-p", "memgate.pytest_plugin", "-p", "no:cacheprovider", "-q", "-rA", *args]
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.dup2(stdout.fileno(), 1)
                os.dup2(stderr.fileno(), 2)
                os.chdir(project)
                os.environ.clear()
                os.environ.update(env)
                sys.argv = [_pytest.__file__]
                sys.path[0] = os.getcwd()
                code = int(_pytest.main(argv))
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)  # not this process's exit functions (its temporary folders' removal)
        _, status = os.waitpid(pid, 0)
        stdout.seek(0)
        stderr.seek(0)
        return os.waitstatus_to_exitcode(status), (stdout.read() + stderr.read()).decode(errors="replace")


def counts(output):
    """pytest's last line, e.g. '1 failed, 16 passed in 3.2s' -> {'failed': 1, 'passed': 16}."""
    return {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?)", output.splitlines()[-1])}


with tempfile.TemporaryDirectory() as tmp:
    project = pathlib.Path(tmp)
    (project / "memgate").mkdir()
    (project / "memgate" / "tiny_vit.yaml").write_text(FIXTURE)
    (project / "pyproject.toml").write_text('[tool.pytest.ini_options]\nmemgate_fixtures = ["memgate/*.yaml"]\n'
                                            'memgate_baselines = "memgate/baselines"\n')
    (project / "test_own.py").write_text("def test_the_teams_own_test():\n    assert 1 + 1 == 2\n")

    # Collected: the team's test and 2 batch sizes x 8 components, named as memgate's tests are.
    rc, out = pytest(project, "--collect-only")
    expect(rc == 0, f"--collect-only exit {rc}:\n{out}")
    expect("tiny_vit_bs2_activations" in out and "test_the_teams_own_test" in out, f"collection:\n{out}")
    gates = [line for line in out.splitlines() if line.startswith("memgate/tiny_vit.yaml::tiny_vit_bs")]
    expect(len(gates) == 16, f"16 gate tests, got {len(gates)}:\n{out}")

    # No baseline: skipped, saying how to record; under CI they fail (a gate that compared nothing is not a pass).
    rc, out = pytest(project)
    expect(rc == 0 and counts(out) == {"passed": 1, "skipped": 16}, f"no baselines: exit {rc}, {counts(out)}:\n{out}")
    expect("memgate check --update-baselines" in out, f"the skip says how to record:\n{out}")
    rc, out = pytest(project, ci=True)
    expect(rc == 1 and counts(out).get("failed") == 16, f"no baselines under CI: exit {rc}, {counts(out)}:\n{out}")

    # Recorded on request, then the gate passes on them.
    rc, out = pytest(project, "--memgate-update-baselines")
    baseline = project / "memgate" / "baselines" / "cpu" / "tiny_vit.json"
    expect(rc == 0 and baseline.is_file(), f"--memgate-update-baselines: exit {rc}, {baseline} written:\n{out}")
    rc, out = pytest(project, ci=True)
    expect(rc == 0 and counts(out) == {"passed": 17}, f"recorded: exit {rc}, {counts(out)}:\n{out}")

    # A grown component (its baseline made 10% smaller): that one test fails with the gate's message; pytest's JUnit
    # has the failure.
    doc = json.loads(baseline.read_text())
    for probe in doc["probes"]:
        if probe["batch_size"] == 2:
            probe["components"]["activations"] = probe["components"]["activations"] * 9 // 10
    baseline.write_text(json.dumps(doc, indent=2))
    junit = project / "junit.xml"
    rc, out = pytest(project, f"--junitxml={junit}", ci=True)
    expect(rc == 1 and counts(out) == {"failed": 1, "passed": 16}, f"grown: exit {rc}, {counts(out)}:\n{out}")
    expect("tiny_vit_bs2_activations" in out and "activations grew beyond its baseline" in out,
           f"the failure names the component and says what grew:\n{out}")
    expect("memgate check --update-baselines --config" in out, f"and how to record it if intended:\n{out}")
    failed = [c.get("name") for c in ET.parse(junit).getroot().iter("testcase") if c.find("failure") is not None]
    expect(failed == ["tiny_vit_bs2_activations"], f"JUnit failures {failed}")

    # A fixture memgate refuses: its tests fail with memgate's error naming the key.
    (project / "memgate" / "broken.yaml").write_text(FIXTURE.replace("  num_classes: 5\n", "  num_classes: 5\n  colour: blue\n"))
    rc, out = pytest(project, "-k", "broken")
    expect(rc == 1 and "colour" in out, f"a broken fixture: exit {rc}:\n{out}")

# A fixture that offloads its activations to the host has one more component, host_activations: collected, recorded
# and gated as memgate names it (a test the plugin did not collect would leave that component ungated).
with tempfile.TemporaryDirectory() as tmp:
    project = pathlib.Path(tmp)
    (project / "memgate").mkdir()
    (project / "memgate" / "offload.yaml").write_text(
        FIXTURE.replace("  trainable: head\n", "  trainable: all\n  activation_offload: cpu_pinned\n")
        .replace("batch_sizes: [1, 2]", "batch_sizes: [2]"))
    (project / "pyproject.toml").write_text('[tool.pytest.ini_options]\nmemgate_fixtures = ["memgate/*.yaml"]\n')
    rc, out = pytest(project, "--memgate-update-baselines")
    expect(rc == 0 and counts(out) == {"passed": 9}, f"offload, recorded: exit {rc}, {counts(out)}:\n{out}")
    recorded = json.loads((project / "baselines" / "cpu" / "offload.json").read_text())
    expect(recorded["probes"][0]["components"].get("host_activations", 0) > 0,
           f"the baseline holds host_activations: {recorded['probes'][0]['components']}")
    rc, out = pytest(project, ci=True)
    expect(rc == 0 and counts(out) == {"passed": 9} and "PASSED memgate/offload.yaml::offload_bs2_host_activations" in out,
           f"offload, gated: exit {rc}, {counts(out)}:\n{out}")

# Fixtures whose batch sizes or world size are not what memgate reads: each is one failing test with memgate's
# message, and the session's other tests run (collection is not interrupted). Globs of memgate_fixtures that match no
# file warn; under CI (its truthy words read as memgate reads them, case-insensitive) each is a failing test.
with tempfile.TemporaryDirectory() as tmp:
    project = pathlib.Path(tmp)
    (project / "memgate").mkdir()
    (project / "memgate" / "bad_batch.yaml").write_text(FIXTURE.replace("batch_sizes: [1, 2]", "batch_sizes: 8"))
    (project / "memgate" / "bad_world.yaml").write_text(
        FIXTURE.replace("  trainable: head\n", "  trainable: head\n  distributed: {strategy: ddp, world_size: two}\n"))
    (project / "pyproject.toml").write_text('[tool.pytest.ini_options]\nmemgate_fixtures = ["memgate/*.yaml", '
                                            '"memgate/missing.yaml", "nothing/*.yml"]\n')
    (project / "test_own.py").write_text("def test_the_teams_own_test():\n    assert 1 + 1 == 2\n")
    fixtures = {p.name: p.read_bytes() for p in (project / "memgate").iterdir()}

    rc, out = pytest(project)
    expect("Interrupted" not in out and "error during collection" not in out, f"collection interrupted:\n{out}")
    expect(rc == 1 and counts(out) == {"failed": 2, "passed": 1}, f"broken fixtures: exit {rc}, {counts(out)}:\n{out}")
    expect(re.search(r"bad_batch\.yaml.*batch_sizes", out) is not None, f"memgate names batch_sizes:\n{out}")
    expect(re.search(r"bad_world\.yaml.*world_size", out) is not None, f"memgate names world_size:\n{out}")
    for glob in ("memgate/missing.yaml", "nothing/*.yml"):
        expect(f"'{glob}' matches no fixture file" in out and "PytestConfigWarning" in out,
               f"outside CI, {glob} warns:\n{out}")
    for ci in ("true", "YES", "1"):
        rc, out = pytest(project, ci=ci)
        expect(rc == 1 and counts(out) == {"failed": 4, "passed": 1}, f"CI={ci}: exit {rc}, {counts(out)}:\n{out}")
        expect("memgate_fixtures[nothing/*.yml]" in out and "memgate_fixtures[memgate/missing.yaml]" in out and
               "CI is set: this fails" in out, f"CI={ci}: the globs fail:\n{out}")
    rc, out = pytest(project, ci="false")
    expect(rc == 1 and counts(out) == {"failed": 2, "passed": 1}, f"CI=false: exit {rc}, {counts(out)}:\n{out}")
    expect({p.name: p.read_bytes() for p in (project / "memgate").iterdir()} == fixtures, "the fixtures changed")

if failures:
    print("FAILED:\n" + "\n".join(failures))
    sys.exit(1)
print("pytest plugin: collection, skip, CI failure, record, pass, regression, JUnit, broken fixtures and unmatched "
      "globs as expected")
