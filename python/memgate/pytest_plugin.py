"""memgate's pytest plugin: a Python repository's memory gate as pytest tests, one per fixture, batch size and component.

Installed with memgate (the `pytest11` entry point `memgate`), it does nothing until fixtures are named, in pytest's
configuration or on its command line:

    [tool.pytest.ini_options]                 # pyproject.toml (or pytest.ini's [pytest])
    memgate_fixtures = ["memgate/*.yaml"]     # globs from the rootdir: the fixtures to gate
    memgate_baselines = "memgate/baselines"   # <folder>/<device>/<fixture>.json (default: baselines)
    memgate_device = "cpu"                    # cpu, cuda, cuda:N or auto (default: cpu)

    pytest                                    # the gate: `<fixture>.yaml::<fixture>_bs8_activations` ... as tests
    pytest --memgate-update-baselines         # records the baselines instead, from this run's measurement

Each fixture file is one `memgate check --config F --json ...` (its probes measured once, every component judged by
memgate's own rules), and each test reads its verdict: a regression, a changed model, an out-of-memory or a component
that is not repeatable fails with the gate's message (and the command that records a new baseline); a missing baseline
is skipped (it fails under CI, as `memgate check` says, where a gate that compared nothing would pass); stale and ok
pass. A fixture that cannot be judged fails each of its tests with memgate's error; one whose batch sizes or world size
cannot even be read (`batch_sizes: 8`, `world_size: two`) is a single test that fails with memgate's error, and the
session's other tests still run. A glob of memgate_fixtures that matches no fixture file (a .yaml or .yml under the
rootdir) is a warning, and under CI (CI set to true, 1, yes or on, as memgate reads it) a failing test: a gate that
judges nothing does not pass. `--memgate-fixtures GLOB` and `--memgate-device` override the configuration;
`--memgate-strict` fails stale and missing baselines too.
"""
from __future__ import annotations

import fnmatch
import glob
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import warnings

import pytest

# The components every probe has, in memgate's report order; `ema` where the fixture keeps an EMA copy, then
# `host_activations` where it offloads its activations to the host (training.activation_offload: cpu | cpu_pinned).
COMPONENTS = ("params", "gradients", "optimizer_state", "activations", "forward_peak", "eval_peak", "step_peak",
              "step_peak_reserved")


def pytest_addoption(parser):
    group = parser.getgroup("memgate", "memgate: GPU-memory regression gate")
    group.addoption("--memgate-fixtures", action="append", default=[], metavar="GLOB",
                    help="fixture files to gate (globs from the rootdir; repeatable); default: ini memgate_fixtures")
    group.addoption("--memgate-baselines", metavar="DIR", help="the baselines folder (default: ini memgate_baselines)")
    group.addoption("--memgate-device", metavar="DEVICE", help="cpu, cuda, cuda:N or auto (default: ini memgate_device)")
    group.addoption("--memgate-update-baselines", action="store_true",
                    help="record the fixtures' baselines from this run instead of judging them")
    group.addoption("--memgate-strict", action="store_true", help="stale and missing baselines fail too")
    parser.addini("memgate_fixtures", type="args", default=[], help="globs of memgate fixture files to gate")
    parser.addini("memgate_baselines", default="baselines", help="memgate's baselines folder")
    parser.addini("memgate_device", default="cpu", help="the device memgate measures on")


def _globs(config):
    return config.getoption("memgate_fixtures") or config.getini("memgate_fixtures")


def _in_ci() -> bool:
    """CI set to a truthy word, as memgate's ci_environment reads it (src/base/status.cpp)."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes", "on")


def _matches_a_fixture(root: pathlib.Path, pattern: str) -> bool:
    """Whether `pattern` (from the rootdir, or absolute) names at least one fixture file: a .yaml or .yml file."""
    where = pattern if os.path.isabs(pattern) else str(root / pattern)
    return any(os.path.isfile(path) and path.endswith((".yaml", ".yml")) for path in glob.iglob(where, recursive=True))


class MemgateFailure(Exception):
    pass


class _MemgateItem(pytest.Item):
    """A test of memgate's: marked `memgate`, and a MemgateFailure reported as memgate's message alone."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_marker("memgate")

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, MemgateFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, None, f"memgate: {self.name}"


class UnmatchedGlob(_MemgateItem):
    """Under CI, a glob of memgate_fixtures that names no file: a failing test (a gate that judged nothing)."""

    def __init__(self, *, message, **kwargs):
        super().__init__(**kwargs)
        self.message = message

    def runtest(self):
        raise MemgateFailure(self.message)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    root = pathlib.Path(str(config.rootpath))
    option = bool(config.getoption("memgate_fixtures"))
    source = "--memgate-fixtures" if option else f"memgate_fixtures ({config.inipath or 'the ini file'})"
    for pattern in _globs(config):
        if _matches_a_fixture(root, pattern):
            continue
        message = (f"{source}: '{pattern}' matches no fixture file under {root}: expected a glob of .yaml or .yml "
                   f"files from the rootdir (a missing file, or a glob that matches nothing, gates nothing)")
        if _in_ci():
            items.append(UnmatchedGlob.from_parent(session, name=f"memgate_fixtures[{pattern}]",
                                                   message=message + "; CI is set: this fails"))
        else:
            warnings.warn(pytest.PytestConfigWarning(message))


def pytest_collect_file(file_path: pathlib.Path, parent):
    if file_path.suffix not in (".yaml", ".yml"):
        return None
    root = pathlib.Path(str(parent.config.rootpath))
    try:
        relative = file_path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        relative = file_path.as_posix()
    for pattern in _globs(parent.config):
        if fnmatch.fnmatch(relative, pattern) or fnmatch.fnmatch(str(file_path), pattern):
            return FixtureFile.from_parent(parent, path=file_path)
    return None


def pytest_configure(config):
    config._memgate_runs = {}  # fixture file -> its `memgate check`, run once per session
    config.addinivalue_line("markers", "memgate: a component of a memgate fixture, judged against its baseline")


def _read_fixture(path: pathlib.Path):
    try:
        import yaml
    except ImportError as e:  # pragma: no cover: PyYAML comes with memgate
        raise pytest.UsageError(f"memgate's pytest plugin reads fixtures with PyYAML: {e}") from None
    with open(path) as f:
        doc = yaml.safe_load(f)
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: expected a fixture (a map with model, training and batch_sizes)")
    return doc


class FixtureFile(pytest.File):
    """A memgate fixture: a test per batch size and component."""

    def collect(self):
        try:
            doc = _read_fixture(self.path)
        except Exception as e:  # a file memgate would refuse: one test that says why
            yield GateItem.from_parent(self, name=self.path.stem, batch_size=None, component=None,
                                       load_error=str(e))
            return
        tests = _tests_of(doc)
        if not tests:
            # memgate names what is wrong with it (no batch_sizes, a value that is not a number): one test carries
            # its error, and the session's other tests still run.
            yield GateItem.from_parent(self, name=self.path.stem, batch_size=None, component=None)
            return
        for b, c in tests:
            yield GateItem.from_parent(self, name=f"{self.path.stem}_bs{b}_{c}", batch_size=b, component=c)


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _tests_of(doc: dict) -> list:
    """(batch size, component) of each test of a fixture, as memgate names its rows; empty where its batch sizes or
    world size are not what memgate reads (memgate's own run then says what is wrong)."""
    sizes = doc.get("batch_sizes")
    if not isinstance(sizes, list) or not sizes or not all(_positive_int(b) for b in sizes):
        return []
    training = doc.get("training")
    if training is None:
        training = {}
    if not isinstance(training, dict):
        return []
    distributed = training.get("distributed")
    world = distributed.get("world_size") if isinstance(distributed, dict) else None
    if world is not None and not _positive_int(world):
        return []
    components = list(COMPONENTS) + (["ema"] if training.get("ema") else [])
    if training.get("activation_offload") in ("cpu", "cpu_pinned"):
        components.append("host_activations")
    if world:
        components = [f"rank{r}_{c}" for r in range(world) for c in components]
    return [(b, c) for b in sizes for c in components]


def _cli():
    from memgate.api import _cli as find

    return find()


def _run_check(config, path: pathlib.Path):
    """One `memgate check` of a fixture file for the session (every test of the file reads its result)."""
    runs = config._memgate_runs
    key = str(path)
    if key in runs:
        return runs[key]
    baselines = config.getoption("memgate_baselines") or config.getini("memgate_baselines")
    baselines = str((pathlib.Path(str(config.rootpath)) / baselines).resolve())
    device = config.getoption("memgate_device") or config.getini("memgate_device")
    env = dict(os.environ)
    env.setdefault("MEMGATE_PYTHON", sys.executable)
    command = [_cli(), "check", "--config", str(path), "--device", device, "--baselines", baselines]
    if config.getoption("memgate_update_baselines"):
        command.append("--update-baselines")
        run = subprocess.run(command, capture_output=True, text=True, env=env)
        result = {"recorded": run.returncode == 0, "output": (run.stdout + run.stderr).strip(), "rows": {}}
    else:
        if config.getoption("memgate_strict"):
            command.append("--strict")
        with tempfile.TemporaryDirectory(prefix="memgate-pytest-") as tmp:
            out = pathlib.Path(tmp) / "verdicts.json"
            run = subprocess.run(command + ["--json", str(out)], capture_output=True, text=True, env=env)
            doc = json.loads(out.read_text()) if out.exists() else None
        result = {"output": (run.stdout + run.stderr).strip(), "returncode": run.returncode, "rows": {}, "doc": doc}
        if doc is not None:
            result["rows"] = {row["test"]: row for row in doc["results"]}
    runs[key] = result
    return result


class GateItem(_MemgateItem):
    def __init__(self, *, batch_size, component, load_error=None, **kwargs):
        super().__init__(**kwargs)
        self.batch_size = batch_size
        self.component = component
        self.load_error = load_error

    def runtest(self):
        if self.load_error:
            raise MemgateFailure(self.load_error)
        result = _run_check(self.config, self.path)
        if self.config.getoption("memgate_update_baselines"):
            if not result["recorded"]:
                raise MemgateFailure(f"not recorded:\n{result['output']}")
            return
        doc = result.get("doc")
        if doc is None:
            raise MemgateFailure(f"memgate check gave no verdicts (exit {result['returncode']}):\n{result['output']}")
        if self.component is None or self.name not in result["rows"]:
            errors = "\n".join(e["error"] for e in doc.get("not_judged", []))
            raise MemgateFailure(errors or f"memgate judged no {self.name}:\n{result['output']}")
        row = result["rows"][self.name]
        if row.get("fails"):
            raise MemgateFailure(f"{row['status']}: {row.get('message', '')}")
        if row["status"] == "missing":
            pytest.skip(row.get("message", "no baseline"))
        self.user_properties.extend((k, row[k]) for k in ("status", "baseline", "measured") if k in row)

