#!/usr/bin/env python3
"""The Python fork server's reading of a model's imports (memgate/_forkserver.py, Server.imports_of): the installed
packages it imports before it forks a probe, so that the probe finds them imported.

- a file's imports outside any function count (in try blocks and class bodies too), and those in the named callable
  (its nested blocks and functions too);
- those in the file's other functions and in methods do not (a models.py of many models imports only what the one
  built needs);
- a name with a module of the user's own beside the file, or in the probe's working folder, is left to the probe;
- the standard library, the user's own modules, relative imports and memgate do not count, nor what the server has
  imported already;
- a file that is not there or does not parse gives nothing (the probe reports it);
- a package of the team's own on PYTHONPATH counts as installed (not the working folder there).

    python tests/python/forkserver_scan_test.py <build dir>/python
"""
import importlib
import os
import pathlib
import socket
import sys
import tempfile

sys.path.insert(0, sys.argv[1])
from memgate._forkserver import Server  # noqa: E402

failures = []


def expect(got, want, what):
    if got != want:
        failures.append(f"{what}: got {got}, expected {want}")


with tempfile.TemporaryDirectory() as tmp:
    root = pathlib.Path(tmp)
    # Installed packages: a site-packages of this test's own.
    site = root / "site"
    for name in ("inst_top", "inst_try", "inst_class", "inst_entry", "inst_nested", "inst_inner", "inst_other",
                 "inst_method", "inst_loss", "inst_beside", "inst_cwd"):
        (site / name).mkdir(parents=True)
        (site / name / "__init__.py").write_text("")
    (site / "inst_entry" / "sub.py").write_text("")
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    a, b = socket.socketpair()
    server = Server(b)
    server.installed = (os.path.realpath(site) + os.sep,)
    code = root / "code"
    code.mkdir()
    models = code / "models.py"
    models.write_text(
        "import os\n"
        "import inst_top\n"
        "from . import sibling\n"
        "import memgate\n"
        "import helpers\n"
        "import inst_beside\n"
        "import inst_cwd\n"
        "try:\n"
        "    import inst_try\n"
        "except ImportError:\n"
        "    pass\n"
        "\n"
        "\n"
        "class Wrapper:\n"
        "    import inst_class\n"
        "\n"
        "    def method(self):\n"
        "        import inst_method\n"
        "\n"
        "\n"
        "def build(depth=2):\n"
        "    import inst_entry.sub\n"
        "    if depth:\n"
        "        from inst_nested import x\n"
        "\n"
        "    def inner():\n"
        "        import inst_inner\n"
        "    return inner\n"
        "\n"
        "\n"
        "def other():\n"
        "    import inst_other\n"
        "\n"
        "\n"
        "def loss(output, batch):\n"
        "    import inst_loss\n")
    (code / "helpers.py").write_text("")
    (code / "inst_beside.py").write_text("")  # the user's own, beside the file: it shadows the installed one
    work = root / "work"
    (work / "inst_cwd").mkdir(parents=True)  # the user's own, in the probe's working folder
    expect(server.imports_of([f"{models}:build"], str(work)),
           ["inst_class", "inst_entry", "inst_inner", "inst_nested", "inst_top", "inst_try"], "the entry's")
    expect(server.imports_of([f"{models}:build", f"{models}:loss"], str(work)),
           ["inst_class", "inst_entry", "inst_inner", "inst_loss", "inst_nested", "inst_top", "inst_try"],
           "the entry's and the loss's")
    expect(server.imports_of([f"{models}:nothing"], str(root)),
           ["inst_class", "inst_cwd", "inst_top", "inst_try"], "a callable that is not there: the file's own")
    expect(server.imports_of([f"{code / 'nothere.py'}:build"], str(work)), [], "a file that is not there")
    (code / "broken.py").write_text("def build(:\n")
    expect(server.imports_of([f"{code / 'broken.py'}:build"], str(work)), [], "a file that does not parse")
    server.preloaded.update({"inst_top", "inst_entry"})
    expect(server.imports_of([f"{models}:build"], str(work)), ["inst_class", "inst_inner", "inst_nested", "inst_try"],
           "what the server imported already")

    # A team's own package on PYTHONPATH counts as an installed one (imported by the server, outside any probe's
    # Meta build); the server's working folder on PYTHONPATH does not.
    own = root / "own"
    (own / "own_pkg").mkdir(parents=True)
    (own / "own_pkg" / "__init__.py").write_text("")
    (code / "uses_own.py").write_text("def build():\n    import own_pkg\n")
    sys.path.insert(0, str(own))
    importlib.invalidate_caches()
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(own), os.getcwd()])
    try:
        with_path = Server(socket.socketpair()[1])
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before
    expect(with_path.imports_of([f"{code / 'uses_own.py'}:build"], str(work)), ["own_pkg"], "a package on PYTHONPATH")
    expect(os.path.realpath(os.getcwd()) + os.sep in with_path.installed, False, "the working folder on PYTHONPATH")

if failures:
    print("\n".join(failures))
    sys.exit(1)
print("ok")
