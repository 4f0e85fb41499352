#!/usr/bin/env python3
"""Checks that memgate's layers depend downwards only, and that no header includes itself back.

Each folder of src/ is a layer, its public headers under include/memgate/<layer>/. A file of a layer may include
memgate headers of its own layer and of the layers below it (LAYERS, bottom first), never of one above; the
layers that link no LibTorch include no torch, c10 or ATen header. Headers of the whole tree form no include cycle.

    tools/check_layers.py [SOURCE_DIR]      # exit 0 when all holds, 1 with one line per violation
"""
import pathlib
import re
import sys

# Bottom first. Each layer may use those before it in this list (not all of them: this is the order only).
LAYERS = ["base", "bench", "allocator", "report", "spec", "models", "backend", "estimate", "distributed", "measure",
          "launch", "gate", "advise", "plan", "child", "python", "suite", "cli"]
NO_TORCH = {"base", "bench", "allocator", "report", "spec"}
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^">]+)[">]', re.M)


def layer_files(root: pathlib.Path, layer: str):
    for folder in (root / "src" / layer, root / "include" / "memgate" / layer):
        if folder.is_dir():
            yield from sorted(p for p in folder.rglob("*") if p.suffix in {".h", ".cpp"})


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent)
    rank = {name: i for i, name in enumerate(LAYERS)}
    problems = []
    for folder in sorted((root / "src").iterdir()):
        if folder.is_dir() and folder.name not in rank:
            problems.append(f"src/{folder.name}: a folder that is not a layer of tools/check_layers.py (add it)")
    graph = {}
    for layer in LAYERS:
        for path in layer_files(root, layer):
            rel = path.relative_to(root).as_posix()
            includes = INCLUDE.findall(path.read_text(encoding="utf-8"))
            for inc in includes:
                if inc.startswith("memgate/"):
                    used = inc.split("/")[1]
                    if used not in rank:
                        problems.append(f"{rel}: includes {inc}, of no layer")
                    elif rank[used] > rank[layer]:
                        problems.append(f"{rel}: {layer} includes {inc}, of the layer {used} above it")
                    if path.suffix == ".h":
                        graph.setdefault(rel, []).append("include/" + inc)
                elif layer in NO_TORCH and re.match(r"(torch|c10|ATen)/", inc):
                    problems.append(f"{rel}: {layer} links no LibTorch, but includes {inc}")
    # Include cycles among the public headers (depth-first search, colouring).
    state = {}

    def visit(node, stack):
        state[node] = 1
        for nxt in graph.get(node, []):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                problems.append("include cycle: " + " -> ".join(cycle))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    for p in problems:
        print(p)
    print(f"{len(LAYERS)} layers checked: {'ok' if not problems else f'{len(problems)} problem(s)'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
