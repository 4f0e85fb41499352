#!/usr/bin/env python3
"""memgate.profile() on a callable with the fixture's ways of making the loss (issue 58): a `loss` callable with a
`target` gives the bytes of the same fixture written by hand; `task` beside a loss is refused before anything runs;
the report printed names no temporary file, and an error names the fixture profile() wrote, not its deleted path.

    PYTHONPATH=build/cpu/python python tests/python/api_loss_test.py
"""
import contextlib
import io
import pathlib
import sys
import tempfile

import memgate

failures = []


def expect(ok, what):
    if not ok:
        failures.append(what)


memgate.check_torch()
with tempfile.TemporaryDirectory() as tmp:
    folder = pathlib.Path(tmp)
    (folder / "loss_models.py").write_text(
        "import torch\n\n"
        "def net():\n"
        "    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))\n\n"
        "def xent(output, batch):\n"
        "    return torch.nn.functional.cross_entropy(output, batch.target)\n")
    sys.path.insert(0, tmp)
    import loss_models

    inputs = [{"shape": ["B", 8], "dtype": "float32"}]
    target = {"shape": ["B"], "dtype": "int64", "high": 3}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        by_callable = memgate.profile(loss_models.net, inputs=inputs, loss=loss_models.xent, target=target,
                                      batch_sizes=[2, 4])
    # The same fixture, written as a user would.
    (folder / "net.yaml").write_text(
        "model:\n  arch: python\n  entry: loss_models.py:net\n  inputs: [{shape: [B, 8], dtype: float32}]\n"
        "  loss: loss_models.py:xent\n  target: {shape: [B], dtype: int64, high: 3}\n"
        "training: {}\nbatch_sizes: [2, 4]\n")
    by_file = memgate.profile(str(folder / "net.yaml"), quiet=True)
    expect([p["batch_size"] for p in by_callable["probes"]] == [2, 4], f"batches {by_callable['probes']}")
    for a, b in zip(by_callable["probes"], by_file["probes"]):
        expect(a["components"] == b["components"], f"batch {a['batch_size']}: callable {a['components']} != "
                                                   f"fixture file {b['components']}")
        expect(a["components"]["activations"] > 0, f"batch {a['batch_size']}: no activations {a['components']}")
    expect(by_callable["model"]["total_params"] == 8 * 16 + 16 + 16 * 3 + 3, f"params {by_callable['model']}")
    report = printed.getvalue()
    expect("memgate profile: net" in report, f"the report was not printed: {report!r}")
    expect("memgate-profile-" not in report and "wrote" not in report,
           f"the printed report names the temporary JSON profile() deletes: {report!r}")

    # A task beside a loss: refused here, naming both, before memgate runs.
    try:
        memgate.profile(loss_models.net, inputs=inputs, loss=loss_models.xent, task="classify", num_classes=3)
        expect(False, "task and loss together raised nothing")
    except ValueError as e:
        expect("task='classify'" in str(e) and "loss" in str(e), f"message: {e}")

    # A bad fixture: memgate's message, with the fixture profile() wrote, not the path it deleted.
    try:
        memgate.profile(loss_models.net, inputs=inputs, task="classify", quiet=True)
        expect(False, "classify without num_classes raised nothing")
    except RuntimeError as e:
        message = str(e)
        expect("num_classes" in message, f"the message does not name the key: {message}")
        expect("memgate-profile-" not in message, f"the message names a deleted temporary file: {message}")
        expect('"task": "classify"' in message, f"the message does not show the fixture written: {message}")

for f in failures:
    print("FAILED:", f)
print("api_loss_test: " + (f"{len(failures)} failure(s)" if failures else "ok"))
sys.exit(1 if failures else 0)
