#!/usr/bin/env python3
"""memgate's generated corpus: seeded fixtures across every axis memgate supports, each checked three ways.

A fixture nobody tuned memgate to is the test of its numbers. `generate` writes N valid fixtures from a seed (the same
seed, the same files); `sweep` measures each on the CPU and checks it

  1. estimate: `memgate estimate --for cpu` against the measurement: params, gradients and optimizer_state exact, every
     other component within 1%;
  2. reference: the measurement against PyTorch's own run of the same model: a Python twin (timm's ViT with PEFT's
     LoRA, torchvision's ResNet, a plain-PyTorch GPT: fixtures/models/python/models.py) measured by memgate's protocol
     through its Python extension, or, for a ViT or a GPT over ranks, PyTorch's own DistributedDataParallel or
     fully_shard on Gloo ranks over timm's ViT or the plain GPT (tools/ddp_reference.py, tools/fsdp_reference.py),
     measured with torch.profiler; the model states exact, the rest within 1%;
  3. repeat: the same probe twice, every component equal to the byte;

per rank where the fixture trains over ranks. It writes `results.json` (every probe's numbers) and `report.md` (each
fixture's worst error, and the distribution of the errors per check and component), and exits 1 when any fixture is
beyond its bounds. `--sample` keeps a fixed subset of the corpus that covers every axis value at least once (what CI
runs: tests/corpus).

  tools/corpus.py generate --seed 1 --count 300 --out build/corpus
  tools/corpus.py sweep --seed 1 --count 300 --out build/corpus --jobs 2       # the full sweep
  tools/corpus.py sweep --seed 1 --sample --out build/corpus-sample            # CI's sample
  tools/corpus.py sweep --seed 1 --sample --shard 1/2 --out build/corpus-1of2  # half of it (CI runs both halves)

`--memgate` names the memgate command (build/cpu/bin/memgate); the Python that runs twins and references is
MEMGATE_PYTHON (or the venv ci/setup.sh makes); it needs PyYAML, timm, torchvision, peft.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS_PY = ROOT / "fixtures" / "models" / "python" / "models.py"

STATES = ("params", "gradients", "optimizer_state")
OTHERS = ("activations", "forward_peak", "eval_peak", "step_peak")
COMPONENTS = STATES + OTHERS
BOUND_PCT = 1.0  # every component that is not a model state


# ---------------------------------------------------------------------------------------------------------------------
# Generation


def pick(rng: random.Random, weighted):
    """One value of [(value, weight), ...] or of a plain list."""
    if isinstance(weighted[0], tuple):
        values, weights = zip(*weighted)
        return rng.choices(values, weights)[0]
    return rng.choice(weighted)


def training_axes(rng: random.Random, depth: int, lora: dict | None) -> tuple[dict, list[str]]:
    """The training block of a single-device fixture, and its axis values (what the sample covers)."""
    t: dict = {}
    opt = pick(rng, [("adamw", 3), ("sgd", 2)])
    t["optimizer"] = opt
    if opt == "sgd":
        t["lr"] = 0.01
        t["momentum"] = pick(rng, [0.0, 0.9])
    impl = pick(rng, ["for_loop", "foreach", "fused"])
    t["optimizer_impl"] = impl
    trainable = ["all", "head", f"last_blocks:{rng.randint(1, depth)}"] + (["lora", "lora"] if lora else [])
    t["trainable"] = pick(rng, trainable)
    t["precision"] = pick(rng, [("fp32", 3), ("bf16", 2), ("fp16", 1)])
    t["gradient_checkpointing"] = rng.random() < 0.3
    t["accumulation_steps"] = pick(rng, [(1, 3), (2, 1), (3, 1)])
    feats = [f"opt={opt}" + (f"/m{t['momentum']}" if opt == "sgd" else ""), f"impl={impl}",
             f"trainable={t['trainable'].split(':')[0]}", f"precision={t['precision']}",
             f"ckpt={t['gradient_checkpointing']}", f"accum={min(t['accumulation_steps'], 2)}"]
    return t, feats


def lora_axes(rng: random.Random, width: int, targets) -> dict | None:
    if rng.random() < 0.5:
        return None
    chosen = sorted(rng.sample(targets, rng.randint(1, len(targets))), key=targets.index)
    rank = pick(rng, [1, 2, 4, 8, 16])
    return {"rank": min(rank, width), "alpha": pick(rng, [rank, 2 * rank, 16]), "targets": chosen}


def lora_features(lora: dict | None) -> list[str]:
    return [f"lora={t}" for t in lora["targets"]] if lora else ["lora=none"]


def head_dim_and_heads(rng: random.Random) -> tuple[int, int]:
    head_dim = pick(rng, [(8, 3), (12, 1), (16, 3), (24, 1), (32, 2), (64, 2), (128, 1)])
    heads = pick(rng, [1, 2, 3, 4, 6]) if head_dim <= 32 else pick(rng, [1, 2])
    return head_dim, heads


def gen_vit(rng: random.Random, distributed: str | None) -> tuple[dict, dict, list[str]]:
    patch = pick(rng, [4, 8, 16])
    img = patch * rng.randint(1, 5)
    head_dim, heads = head_dim_and_heads(rng)
    embed = head_dim * heads
    depth = rng.randint(1, 4)
    mlp_ratio = pick(rng, [1.0, 2.0, 2.5, 4.0])
    model = {"arch": "vit", "img_size": img, "patch_size": patch, "embed_dim": embed, "depth": depth,
             "num_heads": heads, "mlp_ratio": mlp_ratio, "num_classes": rng.randint(2, 37)}
    lora = lora_axes(rng, embed, ["qkv", "proj", "fc1", "fc2"])
    if lora:
        model["lora"] = lora
    feats = [f"head_dim={head_dim}", *lora_features(lora)]
    if distributed is None:
        training, tf = training_axes(rng, depth, lora)
    else:
        training, tf = distributed_axes(rng, distributed, lora)
    return model, training, feats + tf


def distributed_axes(rng: random.Random, distributed: str, lora: dict | None) -> tuple[dict, list[str]]:
    """A training block over ranks: what PyTorch's own DDP and fully_shard references mirror (AdamW, the device's
    default implementation, no checkpointing or accumulation), and its axis values."""
    training = {"optimizer": "adamw", "trainable": pick(rng, ["all", "head"] + (["lora", "lora"] if lora else []))}
    feats = []
    world = pick(rng, [2, 4])
    d: dict = {"strategy": distributed, "world_size": world}
    feats += [f"trainable={training['trainable']}", f"{distributed}_world={world}"]
    if distributed == "ddp":
        d["bucket_cap_mb"] = pick(rng, [0.01, 0.05, 0.25, 25])
        d["gradient_as_bucket_view"] = rng.random() < 0.5
        feats += [f"ddp_view={d['gradient_as_bucket_view']}", f"ddp_buckets={'one' if d['bucket_cap_mb'] == 25 else 'many'}"]
    else:
        d["units"] = pick(rng, [("blocks", 3), ("root", 1)])
        reshard = pick(rng, ["unset", True, False] + ([2] if world == 4 else []))
        if reshard != "unset":
            d["reshard_after_forward"] = reshard
        d["backward_prefetch"] = pick(rng, [(1, 3), (2, 1)])
        precision = pick(rng, ["fp32", "bf16"])
        training["precision"] = precision
        if precision == "bf16" and rng.random() < 0.5:
            d["reduce_dtype"] = "fp32"
        feats += [f"fsdp_units={d['units']}", f"fsdp_reshard={reshard}", f"fsdp_prefetch={d['backward_prefetch']}",
                  f"fsdp_precision={precision}/{d.get('reduce_dtype', 'none')}"]
    training["distributed"] = d
    return training, feats


def gen_gpt(rng: random.Random, distributed: str | None = None) -> tuple[dict, dict, list[str]]:
    head_dim, heads = head_dim_and_heads(rng)
    embed = head_dim * heads
    depth = rng.randint(1, 3)
    model = {"arch": "gpt", "vocab_size": rng.randint(37, 301), "seq_len": rng.randint(5, 48), "n_layer": depth,
             "n_embd": embed, "n_head": heads, "mlp": pick(rng, ["gelu", "swiglu"]),
             "norm": pick(rng, ["layernorm", "rmsnorm"]), "position": pick(rng, ["learned", "none"]),
             "bias": rng.random() < 0.6, "tied_embeddings": rng.random() < 0.5}
    if rng.random() < 0.4:
        model["mlp_hidden"] = rng.randint(embed // 2 + 1, 4 * embed + 7)
    lora = lora_axes(rng, embed, ["qkv", "proj", "fc1", "fc2"])
    if lora:
        model["lora"] = lora
    if distributed is None:
        training, tf = training_axes(rng, depth, lora)
    else:
        training, tf = distributed_axes(rng, distributed, lora)
        tf.append(f"vocab_divides_world={model['vocab_size'] % training['distributed']['world_size'] == 0}")
    feats = [f"head_dim={head_dim}", f"mlp={model['mlp']}", f"norm={model['norm']}", f"position={model['position']}",
             f"bias={model['bias']}", f"tied={model['tied_embeddings']}", *lora_features(lora)]
    return model, training, feats + tf


def gen_resnet(rng: random.Random) -> tuple[dict, dict, list[str]]:
    depth = pick(rng, [(18, 3), (34, 1)])
    # At least 40 px: at 32 the last stage is 1x1, and PyTorch refuses to train its BatchNorm on one sample per channel
    # ("Expected more than 1 value per channel when training") where LibTorch's C++ batch_norm runs.
    model = {"arch": "resnet", "depth": depth, "img_size": pick(rng, [48, 40, 56, 64]), "width": pick(rng, [4, 6, 8]),
             "task": "classify", "num_classes": rng.randint(2, 20)}
    training, tf = training_axes(rng, {18: 8, 34: 16}[depth], None)
    return model, training, [f"resnet={depth}"] + tf


FAMILIES = [("vit", 4), ("gpt", 4), ("resnet", 1), ("vit_ddp", 1), ("vit_fsdp", 1), ("gpt_ddp", 1), ("gpt_fsdp", 1)]


def generate(seed: int, count: int) -> list[dict]:
    """`count` cases from `seed`: each {name, family, fixture (a dict for YAML), features}."""
    rng = random.Random(seed)
    cases = []
    for i in range(count):
        family = pick(rng, FAMILIES)
        if family == "vit":
            model, training, feats = gen_vit(rng, None)
        elif family == "gpt":
            model, training, feats = gen_gpt(rng)
        elif family.startswith("gpt_"):
            model, training, feats = gen_gpt(rng, family.split("_")[1])
        elif family == "resnet":
            model, training, feats = gen_resnet(rng)
        else:
            model, training, feats = gen_vit(rng, family.split("_")[1])
        first = rng.randint(1, 3)
        batch_sizes = [first, first + rng.randint(1, 4)]
        name = f"s{seed}_{i:04d}_{family}"
        cases.append({"name": name, "family": family, "features": [f"family={family}"] + feats,
                      "fixture": {"name": name, "model": model, "training": training, "batch_sizes": batch_sizes}})
    return cases


def sample(cases: list[dict]) -> list[dict]:
    """The fewest cases, taken greedily in corpus order, that cover every axis value of the corpus at least once."""
    uncovered = {f for c in cases for f in c["features"]}
    chosen = []
    while uncovered:
        best = max(cases, key=lambda c: len(uncovered.intersection(c["features"])))
        chosen.append(best)
        uncovered -= set(best["features"])
    return sorted(chosen, key=lambda c: c["name"])


# ---------------------------------------------------------------------------------------------------------------------
# Twins and references


def python_twin(fixture: dict) -> dict | None:
    """The fixture's model built by PyTorch's own modules in Python (arch: python), with the same training; None where
    the corpus has no twin."""
    m, t = fixture["model"], dict(fixture["training"])
    if "distributed" in t:
        return None
    entry = f"{MODELS_PY}:"
    lora = m.get("lora")
    if m["arch"] == "vit":
        args = {k: m[k] for k in ("img_size", "patch_size", "embed_dim", "depth", "num_heads", "mlp_ratio", "num_classes")}
        if lora:
            # PEFT matches a target by the end of a module's name: a bare "proj" would also take timm's
            # patch_embed.proj (a convolution the zoo's LoRA does not adapt).
            qualified = {"qkv": "attn.qkv", "proj": "attn.proj", "fc1": "mlp.fc1", "fc2": "mlp.fc2"}
            args.update(lora_rank=lora["rank"], lora_alpha=lora["alpha"],
                        lora_targets=[qualified[t] for t in lora["targets"]])
        model = {"arch": "python", "entry": entry + "timm_vit_lora", "args": args,
                 "inputs": [{"shape": ["B", 3, m["img_size"], m["img_size"]], "dtype": "float32"}],
                 "task": "classify", "num_classes": m["num_classes"], "blocks": "*blocks.*"}
        head, blocks = ["*head.*"], [f"*blocks.{i}.*" for i in range(m["depth"])]
    elif m["arch"] == "gpt":
        args = {k: m[k] for k in ("vocab_size", "seq_len", "n_layer", "n_embd", "n_head", "mlp", "norm", "position",
                                  "bias", "tied_embeddings")}
        args["mlp_hidden"] = m.get("mlp_hidden", 0)
        if lora:
            args.update(lora_rank=lora["rank"], lora_alpha=lora["alpha"], lora_targets=lora["targets"])
        model = {"arch": "python", "entry": entry + "gpt_twin", "args": args,
                 "inputs": [{"shape": ["B", m["seq_len"]], "dtype": "int64", "high": m["vocab_size"]},
                            {"shape": ["B", m["seq_len"]], "dtype": "int64", "high": m["vocab_size"]}],
                 "loss": entry + "gpt_twin_loss", "blocks": "*h.*"}
        head = ["*ln_f.*"] + ([] if m["tied_embeddings"] else ["*lm_head.*"])
        blocks = [f"*h.{i}.*" for i in range(m["n_layer"])]
    elif m["arch"] == "resnet":
        layers = {18: [2, 2, 2, 2], 34: [3, 4, 6, 3]}[m["depth"]]
        model = {"arch": "python", "entry": entry + "torchvision_resnet",
                 "args": {"layers": layers, "width": m["width"], "num_classes": m["num_classes"]},
                 "inputs": [{"shape": ["B", 3, m["img_size"], m["img_size"]], "dtype": "float32"}],
                 "task": "classify", "num_classes": m["num_classes"], "blocks": "layer*.*"}
        head = ["fc.*"]
        blocks = [f"layer{s + 1}.{i}.*" for s, n in enumerate(layers) for i in range(n)]
    else:
        return None
    trainable = t["trainable"]
    if trainable == "lora":
        t["trainable"] = {"train": ["*lora_*"] + head}
    elif trainable == "head":
        t["trainable"] = {"train": head}
    elif trainable.startswith("last_blocks:"):
        n = int(trainable.split(":")[1])
        t["trainable"] = {"train": blocks[len(blocks) - n:] + head}
    return {"name": fixture["name"] + "_twin", "model": model, "training": t, "batch_sizes": fixture["batch_sizes"]}


# ---------------------------------------------------------------------------------------------------------------------
# Running


def run_reference(script: str, argv: list[str], out: str, err: str) -> None:
    """tools/<strategy>_reference.py with `argv`, in this process (forked from the forkserver that imported torch and
    timm), its output into `out` and `err`; it ends the process (exit_fast)."""
    import runpy

    for fd, path in ((1, out), (2, err)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    sys.argv = [script, *argv]
    runpy.run_path(script, run_name="__main__")


class Tools:
    def __init__(self, memgate: str, python: str):
        self.memgate = memgate
        self.python = python
        self.env = dict(os.environ, MEMGATE_PYTHON=python)
        pkg = Path(memgate).resolve().parent.parent / "python"
        if pkg.is_dir():
            self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pkg), os.environ.get("PYTHONPATH")]))
        # The references run in processes forked from one Python that has imported torch and timm (multiprocessing's
        # forkserver), where `python` is this one: each was a Python of its own that imported them (2.7 s here, of a
        # reference's 4.6 s). Each is still a process of its own, started fresh from that server. timm's ViT module is
        # among what the server imports (timm_reference imports it only when called): each reference imported it
        # again, 1.0 s of CPU of its 1.2-1.4 before it forks its ranks.
        self.forkserver = None
        import importlib.util
        import multiprocessing

        if Path(python).resolve() == Path(sys.executable).resolve() and importlib.util.find_spec("torch"):
            self.forkserver = multiprocessing.get_context("forkserver")
            self.forkserver.set_forkserver_preload(["torch", "torch.distributed.fsdp", "timm_reference",
                                                    "timm.models.vision_transformer"])

    def reference(self, script: Path, argv: list[str], what: str) -> str:
        """What tools/<strategy>_reference.py with `argv` prints (JSON)."""
        if self.forkserver is None:
            return self.run([self.python, str(script), *argv], what)
        with tempfile.TemporaryDirectory() as tmp:
            out, err = os.path.join(tmp, "out"), os.path.join(tmp, "err")
            p = self.forkserver.Process(target=run_reference, args=(str(script), argv, out, err))
            p.start()
            p.join()
            if p.exitcode != 0:
                tail = "\n".join(Path(err).read_text(errors="replace").strip().splitlines()[-6:])
                raise RuntimeError(f"{what} exited {p.exitcode}: {tail}")
            return Path(out).read_text()

    def run(self, argv: list[str], what: str) -> str:
        p = subprocess.run(argv, env=self.env, capture_output=True, text=True)
        if p.returncode != 0:
            tail = "\n".join((p.stderr or p.stdout).strip().splitlines()[-6:])
            raise RuntimeError(f"{what} exited {p.returncode}: {tail}")
        return p.stdout

    def memgate_json(self, sub: list[str], config: Path, batch_sizes: list[int], out: Path, what: str) -> dict:
        self.run([self.memgate, *sub, "--config", str(config), "--batch-sizes", ",".join(map(str, batch_sizes)),
                  "--output", str(out)], what)
        return json.loads(out.read_text())


def per_rank(doc: dict) -> dict:
    """{(batch, rank): components} of a memgate profile or estimate (rank 0 on one device)."""
    out = {}
    for p in doc["probes"]:
        if p.get("ranks"):
            for r in p["ranks"]:
                out[(p["batch_size"], r["rank"])] = r["components"]
        else:
            out[(p["batch_size"], 0)] = p["components"]
    return out


def reference_per_rank(doc: dict) -> dict:
    return {(e["batch_size"], e["rank"]): {c: e[c] for c in COMPONENTS} for rank in doc["ranks"] for e in rank}


def compare(measured: dict, other: dict, check: str, exact_all: bool = False) -> list[dict]:
    """One record per (batch, rank, component): the other's error relative to the measurement, and whether it is in
    bounds."""
    rows = []
    for key in sorted(measured):
        if key not in other:
            rows.append({"check": check, "batch": key[0], "rank": key[1], "component": "*", "measured": None,
                         "other": None, "error_pct": None, "ok": False, "why": "missing"})
            continue
        for c in COMPONENTS:
            m, o = measured[key][c], other[key][c]
            pct = 0.0 if m == o else (100.0 * (o - m) / m if m else float("inf"))
            ok = m == o if (exact_all or c in STATES) else abs(pct) <= BOUND_PCT
            rows.append({"check": check, "batch": key[0], "rank": key[1], "component": c, "measured": m, "other": o,
                         "error_pct": pct, "ok": ok})
    return rows


class Probes:
    """A sweep's probes on one device, measured in batches: one `memgate check --update-baselines` for several
    fixtures, its recorded baselines read back as their profiles (every component, to the byte what `memgate profile`
    writes). Round "first" measures every such fixture and, for the reference, every Python twin (each twin's probe a
    process of its own forked from one fork server: torch, timm, PEFT and torchvision imported once for the batch, not
    once per twin); round "again", the repeat, measures every such fixture a second time in another memgate process,
    in the reverse order. A batch is measured when a fixture first asks for one of its probes; `batches` per round, so
    that --jobs workers share the work."""

    def __init__(self, cases: list[dict], out: Path, tools: Tools, batches: int, checks):
        import yaml

        self.tools = tools
        self.folder = out / "work" / "probes"
        self.fixtures = out / "fixtures"
        # Not a fixture over ranks: check starts its ranks for each batch size where profile starts them once for all
        # (5.8 s of CPU against 3.5 for a DDP fixture of the sample); it keeps `memgate profile`.
        fixtures = [c["name"] for c in cases if "distributed" not in c["fixture"]["training"]]
        self.batched = set(fixtures)
        twins = []
        for case in cases if "reference" in checks else []:
            twin = python_twin(case["fixture"])
            if twin is not None:
                (self.fixtures / f"{twin['name']}.yaml").write_text(yaml.safe_dump(twin, sort_keys=False))
                twins.append(twin["name"])
        rounds = {"first": fixtures + twins}
        if "repeat" in checks:
            rounds["again"] = fixtures[::-1]
        self.batches = []  # (round, names)
        for round_, names in rounds.items():
            size = max(1, -(-len(names) // max(1, batches)))
            self.batches += [(round_, names[i:i + size]) for i in range(0, len(names), size)]
        self.done: dict[int, concurrent.futures.Future] = {}
        self.lock = threading.Lock()

    def measure(self, name: str, round_: str = "first") -> dict:
        """The profile of fixture `name` in `round_` (its baseline's JSON: {"probes": [{"batch_size", "components"},
        ...]})."""
        index = next(i for i, (r, names) in enumerate(self.batches) if r == round_ and name in names)
        with self.lock:
            future = self.done.get(index)
            mine = future is None
            if mine:
                future = self.done[index] = concurrent.futures.Future()
        if mine:
            try:
                future.set_result(self.run(index))
            except Exception as e:  # noqa: BLE001: each fixture of the batch reports it
                future.set_exception(e)
        said = future.result().get(name)
        found = list((self.folder / str(index)).glob(f"*/{name}.json"))
        if len(found) != 1:
            what = "the Python twin" if round_ == "first" and name.endswith("_twin") else \
                "memgate check" + (" (again)" if round_ == "again" else "")
            raise RuntimeError(f"{what}: {name} was not measured: {said or 'no baseline recorded'}")
        return json.loads(found[0].read_text())

    def run(self, index: int) -> dict:
        """Measures batch `index`; {fixture: the lines of check's output that name it} (its errors, where it failed)."""
        baselines = self.folder / str(index)
        shutil.rmtree(baselines, ignore_errors=True)  # an earlier sweep's, into the same --out
        names = self.batches[index][1]
        argv = [self.tools.memgate, "check", "--update-baselines", "--baselines", str(baselines)]
        for name in names:
            argv += ["--config", str(self.fixtures / f"{name}.yaml")]
        p = subprocess.run(argv, env=self.tools.env, capture_output=True, text=True)
        lines = (p.stderr + p.stdout).strip().splitlines()
        return {name: "\n".join([line for line in lines if f"{name}.yaml" in line][-6:] or lines[-6:])
                for name in names}


CHECKS = ("estimate", "reference", "repeat")


def reference(fixture: dict, path: Path, tools: Tools, probes: Probes) -> tuple[str, dict] | None:
    """PyTorch's own run of the fixture at `path`: its Python twin measured by memgate's protocol (`probes`), or, over
    ranks, tools/<strategy>_reference.py. Returns what it is and its components per (batch, rank); None where the
    corpus has no reference for the fixture."""
    bs = ",".join(map(str, fixture["batch_sizes"]))
    twin = python_twin(fixture)
    if twin is not None:
        return "python twin: " + twin["model"]["entry"].rsplit(":", 1)[1], per_rank(probes.measure(twin["name"]))
    if "distributed" not in fixture["training"]:
        return None
    strategy = fixture["training"]["distributed"]["strategy"]
    script = ROOT / "tools" / f"{strategy}_reference.py"
    text = tools.reference(script, ["--config", str(path), "--batch-sizes", bs], f"tools/{strategy}_reference.py")
    return f"torch {strategy} ({script.name})", reference_per_rank(json.loads(text))


def sweep_one(case: dict, out: Path, tools: Tools, probes: Probes, checks=CHECKS) -> dict:
    start = time.monotonic()
    name, fixture = case["name"], case["fixture"]
    path = out / "fixtures" / f"{name}.yaml"
    bs = fixture["batch_sizes"]
    result = {"name": name, "family": case["family"], "features": case["features"], "rows": [], "errors": []}
    work = out / "work" / name
    work.mkdir(parents=True, exist_ok=True)
    try:
        if name in probes.batched:
            measured = per_rank(probes.measure(name))
            again = probes.measure(name, "again") if "repeat" in checks else None
        else:
            # Over ranks: the repeat is the same batch sizes again in the same `memgate profile` (each probe's ranks
            # started afresh from its rank server), not a memgate of its own.
            twice = bs + bs if "repeat" in checks else bs
            doc = tools.memgate_json(["profile"], path, twice, work / "profile.json", "memgate profile")
            if [p["batch_size"] for p in doc["probes"]] != twice:
                raise RuntimeError(f"memgate profile: probes at {[p['batch_size'] for p in doc['probes']]}, "
                                   f"expected {twice}")
            measured = per_rank({"probes": doc["probes"][:len(bs)]})
            again = {"probes": doc["probes"][len(bs):]} if "repeat" in checks else None
        if again is not None:
            result["rows"] += compare(measured, per_rank(again), "repeat", exact_all=True)
        if "estimate" in checks:
            estimate = tools.memgate_json(["estimate", "--for", "cpu"], path, bs, work / "estimate.json",
                                          "memgate estimate")
            result["rows"] += compare(measured, per_rank(estimate), "estimate")
        found = reference(fixture, path, tools, probes) if "reference" in checks else None
        if found is not None:
            result["reference"] = found[0]
            result["rows"] += compare(measured, found[1], "reference")
    except Exception as e:  # noqa: BLE001: a probe that fails is a result of the sweep, named with its fixture
        result["errors"].append(str(e))
    result["seconds"] = round(time.monotonic() - start, 2)
    result["ok"] = not result["errors"] and all(r["ok"] for r in result["rows"])
    return result


def worst(rows: list[dict]) -> dict | None:
    bad = [r for r in rows if r["error_pct"] is not None]
    return max(bad, key=lambda r: abs(r["error_pct"]), default=None)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    v = sorted(values)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))]


def report(results: list[dict], args) -> str:
    lines = [f"# memgate corpus sweep: seed {args.seed}, {len(results)} fixtures"
             f"{' (the CI sample)' if args.sample else ''}", ""]
    bad = [r for r in results if not r["ok"]]
    lines.append(f"{len(results) - len(bad)} of {len(results)} fixtures within bounds (model states exact, every other "
                 f"component within {BOUND_PCT:g}%, the same probe twice equal to the byte).")
    lines.append("")
    lines.append("## Errors per check and component (|error| in %, over every batch size and rank)")
    lines.append("")
    lines.append("| check | component | probes | exact | p50 | p95 | max | worst fixture |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for check in ("estimate", "reference", "repeat"):
        for c in COMPONENTS:
            rows = [(r["name"], row) for r in results for row in r["rows"]
                    if row["check"] == check and row["component"] == c and row["error_pct"] is not None]
            if not rows:
                continue
            errs = [abs(row["error_pct"]) for _, row in rows]
            exact = sum(1 for _, row in rows if row["measured"] == row["other"])
            wname, wrow = max(rows, key=lambda x: abs(x[1]["error_pct"]))
            where = f"{wname} bs {wrow['batch']} rank {wrow['rank']}" if max(errs) > 0 else ""
            lines.append(f"| {check} | {c} | {len(rows)} | {exact} | {percentile(errs, 0.5):.3f} | "
                         f"{percentile(errs, 0.95):.3f} | {max(errs):.3f} | {where} |")
    lines.append("")
    lines.append("## Each fixture's worst error")
    lines.append("")
    lines.append("| fixture | reference | worst estimate | worst reference | repeat | s | verdict |")
    lines.append("|---|---|---|---|---|---|---|")

    def cell(rows, check):
        w = worst([row for row in rows if row["check"] == check])
        if w is None:
            return "—"
        return f"{w['error_pct']:+.3f}% {w['component']}" if w["error_pct"] else "0"

    for r in sorted(results, key=lambda r: r["name"]):
        verdict = "ok" if r["ok"] else ("error: " + r["errors"][0].replace("|", "/").replace("\n", " ")[:160]
                                        if r["errors"] else "beyond bounds")
        lines.append(f"| {r['name']} | {r.get('reference', 'none')} | {cell(r['rows'], 'estimate')} | "
                     f"{cell(r['rows'], 'reference')} | {cell(r['rows'], 'repeat')} | {r['seconds']} | {verdict} |")
    if bad:
        lines.append("")
        lines.append("## Beyond bounds")
        lines.append("")
        for r in bad:
            for e in r["errors"]:
                lines.append(f"- {r['name']}: {e}")
            for row in r["rows"]:
                if not row["ok"]:
                    lines.append(f"- {r['name']}: {row['check']} {row['component']} at batch {row['batch']} rank "
                                 f"{row['rank']}: measured {row['measured']}, {row['check']} {row['other']} "
                                 f"({row['error_pct']:+.3f}%)")
    return "\n".join(lines) + "\n"


def write_fixtures(cases: list[dict], out: Path) -> None:
    import yaml

    folder = out / "fixtures"
    folder.mkdir(parents=True, exist_ok=True)
    for c in cases:
        header = f"# generated by tools/corpus.py; axes: {', '.join(c['features'])}\n"
        (folder / f"{c['name']}.yaml").write_text(header + yaml.safe_dump(c["fixture"], sort_keys=False))


def default_python() -> str:
    return os.environ.get("MEMGATE_PYTHON") or str(Path.home() / ".cache" / "memgate" / "venv" / "bin" / "python")


def parse_shard(text: str, parser: argparse.ArgumentParser) -> tuple[int, int]:
    """`K/N` as (K, N), 1 <= K <= N; a usage error naming --shard otherwise."""
    k, slash, n = text.partition("/")
    if slash and k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n):
        return int(k), int(n)
    parser.error(f"--shard: {text!r}, expected K/N with 1 <= K <= N (for example 1/2)")
    raise AssertionError("unreachable")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    merge = sub.add_parser("report", help="one report of several sweeps' results.json (a later one's fixture wins)")
    merge.add_argument("--seed", type=int, default=1)
    merge.add_argument("--sample", action="store_true")
    merge.add_argument("--out", required=True, type=Path)
    merge.add_argument("results", nargs="+", type=Path, help="folders of earlier sweeps")
    for name in ("generate", "sweep"):
        s = sub.add_parser(name)
        s.add_argument("--seed", type=int, default=1)
        s.add_argument("--count", type=int, default=300, help="fixtures in the corpus (default 300)")
        s.add_argument("--sample", action="store_true", help="only the fixed subset that covers every axis value")
        s.add_argument("--out", required=True, type=Path)
        if name == "sweep":
            s.add_argument("--memgate", default=str(ROOT / "build" / "cpu" / "bin" / "memgate"))
            s.add_argument("--python", default=default_python())
            s.add_argument("--jobs", type=int, default=1)
            s.add_argument("--only", help="a comma-separated list of fixture names")
            s.add_argument("--shard", metavar="K/N",
                           help="only the K-th of N interleaved parts of the fixtures (1 <= K <= N): a sweep split over "
                                "N jobs or runners, each with its own --out; `report` merges them")
            s.add_argument("--checks", default=",".join(CHECKS),
                           help=f"a comma-separated subset of {','.join(CHECKS)} (default: all three)")
    a = p.parse_args(argv)
    if a.command == "report":
        merged = {}
        for folder in a.results:
            for r in json.loads((folder / "results.json").read_text()):
                # A later sweep's checks replace the earlier's, fixture by fixture and check by check (a rerun with
                # --checks estimate keeps the earlier reference and repeat rows).
                earlier = merged.get(r["name"])
                if earlier is not None and not r["errors"]:
                    redone = {row["check"] for row in r["rows"]}
                    kept = [row for row in earlier["rows"] if row["check"] not in redone]
                    r = {**earlier, **r, "rows": kept + r["rows"],
                         "errors": [] if redone >= set(CHECKS) else earlier["errors"],
                         "reference": r.get("reference", earlier.get("reference"))}
                    r["ok"] = not r["errors"] and all(row["ok"] for row in r["rows"])
                merged[r["name"]] = r
        results = sorted(merged.values(), key=lambda r: r["name"])
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "results.json").write_text(json.dumps(results, indent=1))
        (a.out / "report.md").write_text(report(results, a))
        print(f"wrote {a.out / 'report.md'}: {sum(r['ok'] for r in results)} of {len(results)} within bounds")
        return 0 if all(r["ok"] for r in results) else 1
    if a.count < 1:
        p.error(f"--count: {a.count}, expected at least 1")
    checks = a.checks.split(",") if a.command == "sweep" else []
    if a.command == "sweep" and any(c not in CHECKS for c in checks):
        p.error(f"--checks: {a.checks!r}, expected a comma-separated subset of {','.join(CHECKS)}")
    cases = generate(a.seed, a.count)
    if a.sample:
        cases = sample(cases)
    if getattr(a, "only", None):
        names = set(a.only.split(","))
        cases = [c for c in cases if c["name"] in names]
    if getattr(a, "shard", None):
        k, n = parse_shard(a.shard, p)
        cases = cases[k - 1::n]
    write_fixtures(cases, a.out)
    if a.command == "generate":
        print(f"{len(cases)} fixtures in {a.out / 'fixtures'}")
        return 0
    if not Path(a.memgate).is_file():
        p.error(f"--memgate: {a.memgate} is not there (build memgate first: cmake --workflow --preset cpu)")
    tools = Tools(a.memgate, a.python)
    probes = Probes(cases, a.out, tools, a.jobs, checks)
    results = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        futures = {pool.submit(sweep_one, c, a.out, tools, probes, checks): c for c in cases}
        for f in concurrent.futures.as_completed(futures):
            r = f.result()
            results.append(r)
            w = worst([row for row in r["rows"] if row["check"] != "repeat"])
            detail = f" (worst {w['check']} {w['component']} {w['error_pct']:+.3f}%)" if w and w["error_pct"] else ""
            failure = "; " + r["errors"][0] if r["errors"] else ""
            print(f"[{len(results)}/{len(cases)}] {r['name']}: {'ok' if r['ok'] else 'BEYOND BOUNDS'}{detail}{failure}"
                  f" ({r['seconds']} s)", flush=True)
    results.sort(key=lambda r: r["name"])
    (a.out / "results.json").write_text(json.dumps(results, indent=1))
    text = report(results, a)
    (a.out / "report.md").write_text(text)
    print(f"wrote {a.out / 'report.md'} and {a.out / 'results.json'}")
    if all(r["ok"] for r in results):
        return 0
    print(text[text.index("## Beyond bounds"):], end="")
    return 1


if __name__ == "__main__":
    sys.exit(main())
