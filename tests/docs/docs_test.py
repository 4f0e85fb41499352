#!/usr/bin/env python3
"""The documentation's promises, checked: every link of README.md and docs/*.md stays inside the repository and
reaches a file that is there (and a heading that is there, for #anchors), and every Python example runs.

    python tests/docs/docs_test.py links <source dir>
    PYTHONPATH=build/cpu/python python tests/docs/docs_test.py python <source dir>

`python` extracts the ```python blocks of README.md and docs/*.md and runs each as a script, those of one document
in order in a fresh folder of their own (the repository is MEMGATE_PROJECT_DIR); a block whose first line is
`# file: <path>` (```python or ```yaml) is written to that path of the folder instead, for the blocks after it. A
block that raises, or whose asserts fail, fails the test, named by file and line.
"""
import os
import pathlib
import re
import subprocess
import sys
import tempfile

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


def run_python(source):
    """Each document's examples in a folder of their own, in order: `# file:` blocks written there, the other
    ```python blocks run there as scripts."""
    failures = []
    documents_with_examples = python_blocks(source)
    ran = 0
    env = dict(os.environ, MEMGATE_PROJECT_DIR=str(source.resolve()), MEMGATE_PYTHON=sys.executable)
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
                run = subprocess.run([sys.executable, str(script)], cwd=tmp, env=env, capture_output=True, text=True)
                ran += 1
                print(f"{doc}:{line}: exit {run.returncode}")
                if run.returncode != 0:
                    failures.append(f"{doc}:{line}: the example exits {run.returncode}, expected 0:\n"
                                    f"{run.stdout[-3000:]}{run.stderr[-3000:]}")
    if ran == 0:
        failures.append("no ```python example to run in README.md or docs/*.md (expected those of docs/python.md)")
    return failures


def main():
    mode, source = sys.argv[1], pathlib.Path(sys.argv[2])
    failures = check_links(source) if mode == "links" else run_python(source)
    for f in failures:
        print("FAILED:", f)
    print(f"docs_test {mode}: " + (f"{len(failures)} failure(s)" if failures else "ok"))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
