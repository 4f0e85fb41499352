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
    """The memgate command: MEMGATE_CLI, else a build tree's bin/memgate beside this package (or an install's: the
    package in <prefix>/lib/memgate/python), else the one pip installed into this environment's scripts, else memgate
    on PATH."""
    if os.environ.get("MEMGATE_CLI"):
        return os.environ["MEMGATE_CLI"]
    here = pathlib.Path(__file__).resolve().parent
    scripts = pathlib.Path(sysconfig.get_path("scripts"))
    installed = here.parents[3] if len(here.parents) > 3 else here
    for candidate in (here.parent.parent / "bin" / "memgate", installed / "bin" / "memgate", scripts / "memgate"):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("memgate")
    if found:
        return found
    raise FileNotFoundError("the memgate command is not beside this package nor on PATH: set MEMGATE_CLI")


def _reference(fn, key):
    """`<file.py>:<name>` of a callable, as a fixture names one; a callable without a file (a notebook cell, a lambda)
    cannot be imported by memgate's probe process, so it is refused naming the key."""
    source = inspect.getsourcefile(fn) if callable(fn) else None
    name = getattr(fn, "__name__", "")
    if source is None or not name.isidentifier():
        raise ValueError(f"profile({key}={fn!r}): memgate imports the callable from its file in a process of its own, "
                         "and this one has none: expected a function defined at the top of a .py file (not in a "
                         "notebook cell, not a lambda)")
    return f"{os.path.abspath(source)}:{name}"


def _fixture_for(build, inputs, task, num_classes, training, args, blocks, loss, target, batch, compute_loss):
    """The fixture (as a dict) that measures `build`: the keys profile() was given, and no others, so that what
    the fixture reader says of a bad one is what the user wrote."""
    model = {"arch": "python", "entry": _reference(build, "config"), "args": args or {}}
    if batch is not None:
        model["batch"] = _reference(batch, "batch")
    if inputs:
        model["inputs"] = inputs
    if compute_loss is not None:
        model["compute_loss"] = _reference(compute_loss, "compute_loss")
    if loss is not None:
        model["loss"] = _reference(loss, "loss")
    if target is not None:
        model["target"] = target
    # The task: what was given, else `sum` where nothing else makes the loss (a loss or compute_loss replaces it).
    if task is not None:
        model["task"] = task
    elif loss is None and compute_loss is None:
        model["task"] = "sum"
    if num_classes is not None:
        model["num_classes"] = num_classes
    if blocks:
        model["blocks"] = blocks
    return {"name": build.__name__, "model": model, "training": training or {}, "batch_sizes": [1]}


def profile(config, batch_sizes=None, device="cpu", *, inputs=None, task=None, num_classes=None, training=None,
            args=None, blocks=None, loss=None, target=None, batch=None, compute_loss=None, quiet=False):
    """Measures a fixture (a YAML file) or a callable that builds an nn.Module, as `memgate profile` does: prints its
    report (unless quiet) and returns its JSON as a dict.

    For a callable, the other arguments are the fixture's keys (docs/fixtures.md): `inputs` lists forward()'s
    arguments ({"shape": ["B", 3, 224, 224], "dtype": "float32"}: B is the batch size), or `batch` is a callable
    (batch_size, device, generator) -> the batch; the loss is the `task`'s ("classify" with `num_classes`,
    "regress", "sum"), or `loss`, a callable (output, batch) -> scalar loss that gets batch.target made from
    `target` (an entry like an input's), or `compute_loss`, a callable (model, batch) -> scalar loss. Without any
    of them the task is "sum". `training`, `args` (keyword arguments of the callable) and `blocks` are the fixture's
    keys. The callables must be defined in a .py file (memgate imports them in a process of its own).

    A batch size that fails (the model raises at that size) is in the result as {"batch_size": N, "failed": True,
    "error": "..."}, the others measured, and its error is printed on stderr. Raises ValueError for arguments that
    cannot make a fixture, and RuntimeError with memgate's message when the profile fails as a whole."""
    with tempfile.TemporaryDirectory(prefix="memgate-profile-") as tmp:
        written = None
        if callable(config):
            if not inputs and batch is None:
                raise ValueError("profile(callable): give `inputs`, one entry per forward() argument, or `batch`, a "
                                 "callable that makes the batch")
            if task is not None and (loss is not None or compute_loss is not None):
                raise ValueError(f"profile(callable): task={task!r} and a {'loss' if loss is not None else 'compute_loss'}"
                                 " callable both say how the loss is made: give one")
            fixture = _fixture_for(config, inputs, task, num_classes, training, args, blocks, loss, target, batch,
                                   compute_loss)
            path = pathlib.Path(tmp) / f"{config.__name__}.json"
            # YAML is a superset of JSON: the fixture reader takes this file as it is.
            written = json.dumps(fixture)
            path.write_text(written)
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
            message = run.stderr.strip() or run.stdout
            if written is not None:
                # The fixture was a temporary file, gone when this returns: say what it held instead of where it was.
                message = message.replace(config, "<the fixture profile() wrote>")
                message += f"\n(the fixture profile() wrote for {fixture['name']}: {written})"
            raise RuntimeError(f"memgate profile failed (exit {run.returncode}): {message}")
        if not quiet:
            # The JSON went to a temporary file that is deleted on return: its "wrote <path>" line is not the user's.
            print(_without_wrote(run.stdout, output), end="")
        return json.loads(output.read_text())


def _without_wrote(text, output):
    """`memgate profile`'s report without the line that names the temporary JSON (and the blank line before it)."""
    lines = text.splitlines(keepends=True)
    kept = [line for line in lines if line.rstrip("\n") != f"wrote {output}"]
    if len(kept) < len(lines) and kept and kept[-1].strip() == "":
        kept.pop()
    return "".join(kept)
