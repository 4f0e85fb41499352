#!/usr/bin/env python3
"""No module of memgate's Python package imports one that imports it back, directly or through others: every `import`
and `from ... import` of the package's files, those inside functions included (a cycle there fails only once the
function runs, as __main__.py and _forkserver.py did), read with the ast, not run. An import of the package itself
(`from memgate import check_torch`) is not an edge: Python imports a package before any of its modules.

    python tests/python/import_cycle_test.py <source dir>

It first checks that it finds a cycle where one is (a package of three modules written to a temporary folder, the
cycle through a function's import), then memgate's package (python/memgate); exit 1 naming the cycle.
"""
import ast
import pathlib
import sys
import tempfile


def imports_of(path: pathlib.Path, package: str, modules: set) -> set:
    """The package's modules that `path` imports anywhere in it: `memgate.x`, `from memgate.x import ...`,
    `from memgate import x` (x a module of the package), `from . import x`, `from .x import ...`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package if node.level > 0 else node.module or ""
            if node.level > 0 and node.module:
                base = f"{package}.{node.module}"
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == package and len(parts) > 1 and parts[1] in modules:
                found.add(parts[1])
    found.discard(path.stem)
    return found


def cycle_in(folder: pathlib.Path) -> list:
    """A cycle of the package in `folder` as its modules' names (the first back at the end), or [] where none is."""
    package = folder.name
    files = {p.stem: p for p in sorted(folder.glob("*.py")) if p.stem != "__init__"}
    graph = {name: sorted(imports_of(path, package, set(files))) for name, path in files.items()}
    state = {}  # name -> 1 while on the path, 2 once done

    def visit(name, path):
        path = path + [name]
        state[name] = 1
        for other in graph[name]:
            if state.get(other) == 1:
                return path[path.index(other):] + [other]
            if other not in state:
                found = visit(other, path)
                if found:
                    return found
        state[name] = 2
        return []

    for name in graph:
        if name not in state:
            found = visit(name, [])
            if found:
                return found
    return []


def main() -> int:
    source = pathlib.Path(sys.argv[1])
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        planted = pathlib.Path(tmp) / "pkg"
        planted.mkdir()
        (planted / "__init__.py").write_text("from pkg.a import run\n")
        (planted / "a.py").write_text("import os\n\n\ndef run():\n    from pkg import b\n    return b.go()\n")
        (planted / "b.py").write_text("from pkg.c import helper\n\n\ndef go():\n    return helper()\n")
        (planted / "c.py").write_text("def helper():\n    import pkg.a\n    return pkg.a\n")
        (planted / "d.py").write_text("from pkg import a, b\n")
        found = cycle_in(planted)
        if sorted(set(found)) != ["a", "b", "c"]:
            failures.append(f"the checker finds {found or 'no cycle'} in a package whose a imports b, b imports c and "
                            f"c imports a (inside functions); expected the cycle a -> b -> c -> a")
    package = source / "python" / "memgate"
    found = cycle_in(package)
    if not (package / "__init__.py").is_file() or not (package / "_probe.py").is_file():
        failures.append(f"{package}: expected memgate's package (its __init__.py and _probe.py)")
    elif found:
        failures.append("python/memgate: " + " -> ".join(f"{name}.py" for name in found) +
                        " import one another: move what both need into a module of its own (as memgate._probe holds "
                        "the probe that __main__.py and _forkserver.py both run)")
    for f in failures:
        print("FAILED:", f)
    print("import_cycle_test: " + (f"{len(failures)} failure(s)" if failures else "ok"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
