"""memgate.profile(): `memgate profile` from a script or a notebook, on a fixture file or on a callable."""
import inspect
import json
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import tempfile


def _cli():
    """The memgate command: MEMGATE_CLI, else a build tree's bin/memgate beside this package, else the one pip installed
    into this environment's scripts, else memgate on PATH."""
    if os.environ.get("MEMGATE_CLI"):
        return os.environ["MEMGATE_CLI"]
    here = pathlib.Path(__file__).resolve().parent
    scripts = pathlib.Path(sysconfig.get_path("scripts"))
    for candidate in (here.parent.parent / "bin" / "memgate", scripts / "memgate"):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("memgate")
    if found:
        return found
    raise FileNotFoundError("the memgate command is not beside this package nor on PATH: set MEMGATE_CLI")


def _fixture_for(build, inputs, task, num_classes, training, args, blocks, loss):
    source = inspect.getsourcefile(build)
    if source is None:
        raise ValueError(f"{build!r}: memgate imports the callable from its file, and it has none (define it in a .py "
                         "file, not in a notebook cell)")
    model = {"arch": "python", "entry": f"{os.path.abspath(source)}:{build.__name__}", "args": args or {},
             "inputs": inputs, "task": task}
    if task == "classify":
        model["num_classes"] = num_classes
    if blocks:
        model["blocks"] = blocks
    if loss is not None:
        model["loss"] = f"{os.path.abspath(inspect.getsourcefile(loss))}:{loss.__name__}"
    return {"name": build.__name__, "model": model, "training": training or {}, "batch_sizes": [1]}


def profile(config, batch_sizes=None, device="cpu", *, inputs=None, task="sum", num_classes=None, training=None,
            args=None, blocks=None, loss=None, quiet=False):
    """Measures a fixture (a YAML file) or a callable that builds an nn.Module, as `memgate profile` does: prints its
    report (unless quiet) and returns its JSON as a dict. For a callable, `inputs` lists forward()'s arguments
    ({"shape": ["B", 3, 224, 224], "dtype": "float32"}: B is the batch size) and `task`, `training`, `args` (keyword
    arguments of the callable), `blocks` and `loss` are the fixture's keys. A batch size that fails (the model raises
    at that size) is in the result as {"batch_size": N, "failed": True, "error": "..."}, the others measured, and its
    error is printed on stderr; raises RuntimeError with memgate's message when the profile fails as a whole."""
    with tempfile.TemporaryDirectory(prefix="memgate-profile-") as tmp:
        if callable(config):
            if not inputs:
                raise ValueError("profile(callable): give `inputs`, one entry per forward() argument")
            path = pathlib.Path(tmp) / f"{config.__name__}.json"
            # YAML is a superset of JSON: the fixture reader takes this file as it is.
            path.write_text(json.dumps(_fixture_for(config, inputs, task, num_classes, training, args, blocks, loss)))
            config = str(path)
        output = pathlib.Path(tmp) / "profile.json"
        command = [_cli(), "profile", "--config", str(config), "--device", device, "--output", str(output)]
        if batch_sizes:
            command += ["--batch-sizes", ",".join(str(b) for b in batch_sizes)]
        env = dict(os.environ)
        env.setdefault("MEMGATE_PYTHON", sys.executable)
        run = subprocess.run(command, capture_output=True, text=True, env=env)
        if run.returncode != 0 and output.exists():
            written = json.loads(output.read_text())
            if any(p.get("failed") for p in written.get("probes", [])):
                # Some batch sizes failed, the others were measured: memgate's stderr names each failure.
                print(run.stderr, end="", file=sys.stderr)
                if not quiet:
                    print(run.stdout, end="")
                return written
        if run.returncode != 0:
            raise RuntimeError(f"memgate profile failed (exit {run.returncode}): {run.stderr.strip() or run.stdout}")
        if not quiet:
            print(run.stdout, end="")
        return json.loads(output.read_text())
