#!/usr/bin/env python3
"""memgate's pytest plugin in a repository of its own: fixtures named in pyproject.toml are collected as a test per
batch size and component beside the repository's own tests; a missing baseline skips (fails under CI), recording on
request makes them pass, a grown component fails with the gate's message, and pytest's JUnit carries it.

    PYTHONPATH=build/cpu/python python tests/python/pytest_plugin_test.py
"""
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
import json

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
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "MEMGATE_STRICT", "GITHUB_STEP_SUMMARY")}
    if ci:
        env["CI"] = "true"
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "memgate.pytest_plugin", "-p", "no:cacheprovider",
                          "-q", "-rA", *args], cwd=project, env=env, capture_output=True, text=True)
    return run.returncode, run.stdout + run.stderr


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

if failures:
    print("FAILED:\n" + "\n".join(failures))
    sys.exit(1)
print("pytest plugin: collection, skip, CI failure, record, pass, regression and JUnit as expected")
