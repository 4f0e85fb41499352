#!/usr/bin/env python3
"""The documentation's promises, checked: every link of README.md and docs/*.md stays inside the repository and
reaches a file that is there (and a heading that is there, for #anchors), every Python example runs, and every
MEMGATE_* variable memgate reads is in docs/design.md's table of them.

    python tests/docs/docs_test.py links <source dir>
    python tests/docs/docs_test.py variables <source dir>
    PYTHONPATH=build/cpu/python python tests/docs/docs_test.py python <source dir>

`python` extracts the ```python blocks of README.md and docs/*.md and runs each as a script, those of one document
in order in a fresh folder of their own (the repository is MEMGATE_PROJECT_DIR); a block whose first line is
`# file: <path>` (```python or ```yaml) is written to that path of the folder instead, for the blocks after it. A
block that raises, or whose asserts fail, fails the test, named by file and line. Each script runs as `python
<script>` runs it (as __main__, its folder first on sys.path and as the working folder, its own environment) in a
process of its own forked from this one, which has imported torch: the examples' imports of it cost nothing.

`variables` reads (does not run) memgate's code and installed CMake scripts for the MEMGATE_* environment variables
they read, and fails on one that is not a row of docs/design.md's table under "## Environment variables", or on a row
that nothing reads.
"""
import os
import pathlib
import re
import runpy
import sys
import tempfile
import traceback

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```(\w*)\s*$")


def documents(source):
    return [source / "README.md"] + sorted((source / "docs").glob("*.md"))


def anchors(path):
    """GitHub's anchors of a Markdown file's headings: lower case, punctuation dropped, spaces to dashes."""
    out = set()
    in_code = False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            in_code = not in_code
            continue
        if not in_code and line.startswith("#"):
            text = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", text).replace(" ", "-"))
    return out


def outside_code(text):
    """The text without its fenced and inline code (a link inside code is an example, not a link)."""
    kept, in_code = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            in_code = not in_code
            kept.append("")
            continue
        kept.append("" if in_code else re.sub(r"`[^`]*`", "", line))
    return kept


def check_links(source):
    failures = []
    root = source.resolve()
    for doc in documents(source):
        for number, line in enumerate(outside_code(doc.read_text()), start=1):
            for m in LINK.finditer(line):
                target = m.group(1) or m.group(2)
                where = f"{doc.relative_to(source)}:{number}: link {target}"
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
                    continue
                path, _, anchor = target.partition("#")
                resolved = (doc.parent / path).resolve() if path else doc.resolve()
                if resolved != root and root not in resolved.parents:
                    failures.append(f"{where}: leaves the repository ({resolved}); expected a path inside {root}")
                    continue
                if not resolved.exists():
                    failures.append(f"{where}: {resolved} is not there")
                    continue
                if anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                    failures.append(f"{where}: no heading #{anchor} in {resolved.relative_to(root)}")
    return failures


def python_blocks(source):
    """Per document, its ```python blocks and the blocks that write a file for them, in order: (file, line, language,
    code). A block whose first line is `# file: <path>` (python or yaml) is that file of the example's folder."""
    out = {}
    for doc in documents(source):
        lines = doc.read_text().splitlines()
        i = 0
        while i < len(lines):
            m = FENCE.match(lines[i])
            if not m:
                i += 1
                continue
            j = i + 1
            while j < len(lines) and not FENCE.match(lines[j]):
                j += 1
            code = "\n".join(lines[i + 1:j]) + "\n"
            language = m.group(1)
            if language == "python" or (language == "yaml" and code.startswith("# file: ")):
                out.setdefault(doc.relative_to(source), []).append((i + 2, language, code))
            i = j + 1
    return out


def run_script(script, env):
    """`python <script>` with `env` in the script's folder, forked from this process: (exit code, stdout and stderr).
    The child ends with os._exit: this process's exit functions (its temporary folders' removal) are not the child's."""
    with tempfile.TemporaryFile() as out:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.dup2(out.fileno(), 1)
                os.dup2(out.fileno(), 2)
                os.chdir(script.parent)
                os.environ.clear()
                os.environ.update(env)
                sys.argv = [str(script)]
                sys.path[0] = str(script.parent)
                runpy.run_path(str(script), run_name="__main__")
                code = 0
            except SystemExit as e:  # as Python exits on it: None is 0, a number itself, anything else printed and 1
                code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
                if not isinstance(e.code, int) and e.code is not None:
                    print(e.code, file=sys.stderr)
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        out.seek(0)
        return os.waitstatus_to_exitcode(status), out.read().decode(errors="replace")


def run_python(source):
    """Each document's examples in a folder of their own, in order: `# file:` blocks written there, the other
    ```python blocks run there as scripts."""
    failures = []
    documents_with_examples = python_blocks(source)
    ran = 0
    env = dict(os.environ, MEMGATE_PROJECT_DIR=str(source.resolve()), MEMGATE_PYTHON=sys.executable)
    import torch  # noqa: F401  (once, for every example forked after it)

    for doc, blocks in documents_with_examples.items():
        with tempfile.TemporaryDirectory(prefix="memgate-docs-") as tmp:
            for line, language, code in blocks:
                first = code.splitlines()[0] if code.strip() else ""
                if first.startswith("# file: "):
                    path = pathlib.Path(tmp) / first[len("# file: "):].strip()
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(code)
                    continue
                script = pathlib.Path(tmp) / f"example_{line}.py"
                script.write_text(code)
                returncode, output = run_script(script, env)
                ran += 1
                print(f"{doc}:{line}: exit {returncode}")
                if returncode != 0:
                    failures.append(f"{doc}:{line}: the example exits {returncode}, expected 0:\n{output[-6000:]}")
    if ran == 0:
        failures.append("no ```python example to run in README.md or docs/*.md (expected those of docs/python.md)")
    return failures


VARIABLE = re.compile(r"[\"']((?:MEMGATE)_[A-Z0-9_]+)")  # a string that starts with the name: C++ and Python
CMAKE_VARIABLE = re.compile(r"\$ENV\{(MEMGATE_[A-Z0-9_]+)\}|(?<![\w-])(MEMGATE_[A-Z0-9_]+)=")  # read, or set for a child
TABLE_ROW = re.compile(r"^\| `(MEMGATE_[A-Z0-9_]+)` \|")


def variables_read(source):
    """{name: [where]} of every MEMGATE_* environment variable that memgate's code or its installed CMake scripts
    name: in src/, include/, python/memgate and the test-only memgate-measure-faults, a string that starts with the name (getenv("MEMGATE_X"),
    os.environ.get("MEMGATE_X"), a variable set for a child: "MEMGATE_X=..."; a compile definition such as
    MEMGATE_VERSION is no string); in the CMake scripts that cmake/MemgateInstall.cmake installs, $ENV{MEMGATE_X}
    and MEMGATE_X= (an environment set for a test or a command)."""
    found = {}

    def add(name, path, number):
        found.setdefault(name, []).append(f"{path.relative_to(source)}:{number}")

    code = [p for folder in ("src", "include") for p in sorted((source / folder).rglob("*"))
            if p.suffix in (".cpp", ".h", ".in")]
    code += sorted((source / "python" / "memgate").rglob("*.py"))
    # The test-only program memgate-measure-faults (never installed) reads the fault hooks of memgate's tests.
    code.append(source / "tests" / "launch" / "fault_injection.cpp")
    for path in code:
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            for m in VARIABLE.finditer(line):
                add(m.group(1), path, number)
    install = (source / "cmake" / "MemgateInstall.cmake").read_text()
    scripts = sorted(set(re.findall(r"\$\{PROJECT_SOURCE_DIR\}/cmake/([\w.]+\.(?:cmake|in))", install)))
    for name in scripts:
        path = source / "cmake" / name
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if line.lstrip().startswith("#"):
                continue
            for m in CMAKE_VARIABLE.finditer(line):
                add(m.group(1) or m.group(2), path, number)
    return found, scripts


def variables_documented(source):
    """{name: line} of the rows of docs/design.md's table under "## Environment variables"."""
    rows, inside = {}, False
    for number, line in enumerate((source / "docs" / "design.md").read_text().splitlines(), start=1):
        if line.startswith("## "):
            inside = line.strip() == "## Environment variables"
            continue
        m = TABLE_ROW.match(line) if inside else None
        if m:
            rows[m.group(1)] = number
    return rows


def check_variables(source):
    """Every MEMGATE_* variable that memgate reads is a row of docs/design.md's table, and every row is read."""
    failures = []
    found, scripts = variables_read(source)
    rows = variables_documented(source)
    if not rows:
        return ["docs/design.md: no table of variables under '## Environment variables' (rows | `MEMGATE_X` | ...)"]
    if "memgateConfig.cmake.in" not in scripts or "MemgateFindTorch.cmake" not in scripts:
        failures.append(f"cmake/MemgateInstall.cmake: found the installed scripts {scripts}, expected "
                        "memgateConfig.cmake.in and MemgateFindTorch.cmake among them")
    for name, where in sorted(found.items()):
        if name not in rows:
            failures.append(f"{where[0]}: {name} is read (also {', '.join(where[1:]) or 'nowhere else'}) but is not a "
                            "row of docs/design.md's table under '## Environment variables': add its row (who reads "
                            "it, what it does, who sets it) or stop reading it")
    for name, line in sorted(rows.items()):
        if name not in found:
            failures.append(f"docs/design.md:{line}: {name} is in the table of variables, but nothing in src/, "
                            "include/, python/memgate or the installed CMake scripts reads it: remove its row")
    print(f"{len(found)} MEMGATE_* variables read, {len(rows)} rows in docs/design.md")
    return failures


def main():
    mode, source = sys.argv[1], pathlib.Path(sys.argv[2])
    modes = {"links": check_links, "python": run_python, "variables": check_variables}
    failures = modes[mode](source)
    for f in failures:
        print("FAILED:", f)
    print(f"docs_test {mode}: " + (f"{len(failures)} failure(s)" if failures else "ok"))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
