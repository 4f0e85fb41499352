#!/usr/bin/env python3
"""The GitHub Actions workflows memgate ships (ci/github/*.yml) are valid workflows: each is checked against GitHub's
workflow schema (SchemaStore's, vendored by check-jsonschema) with the linter the project pins, and a workflow with a
misspelled key is refused by the same check (so that a pass means something).

    python tests/ci/workflow_lint_test.py <source dir>
"""
import pathlib
import subprocess
import sys
import tempfile

source = pathlib.Path(sys.argv[1])
linter = [str(pathlib.Path(sys.executable).parent / "check-jsonschema"), "--builtin-schema", "vendor.github-workflows"]
failures = []
workflows = sorted((source / "ci" / "github").glob("*.yml"))
if len(workflows) < 2:
    failures.append(f"expected the GPU runner's and the Python repository's workflows, found {workflows}")
for workflow in workflows:
    run = subprocess.run(linter + [str(workflow)], capture_output=True, text=True)
    if run.returncode != 0:
        failures.append(f"{workflow}: {run.stdout}{run.stderr}")

python_workflow = source / "ci" / "github" / "memgate-python.yml"
with tempfile.TemporaryDirectory() as tmp:
    broken = pathlib.Path(tmp) / "broken.yml"
    broken.write_text(python_workflow.read_text().replace("runs-on: ubuntu-24.04", "run-on: ubuntu-24.04", 1))
    run = subprocess.run(linter + [str(broken)], capture_output=True, text=True)
    if run.returncode == 0:
        failures.append("a workflow whose job says run-on (not runs-on) passed the linter")

if failures:
    print("FAILED:\n" + "\n".join(failures))
    sys.exit(1)
print(f"{len(workflows)} workflows valid; a misspelled key is refused")
