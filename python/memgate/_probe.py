"""One probe (or one rank) of a fixture in this Python process: what `python -m memgate --memgate-rank ...` runs
(__main__.py), and what a probe forked from the fork server runs (_forkserver.py). Neither of those imports the other:
both import this."""
import os
import sys


class _ImportsAsProgress:
    """A finder first on sys.meta_path that finds nothing: each module the probe imports (the model's code importing
    timm, transformers: seconds, module by module) tells memgate's supervisor that the probe moves. A call that sleeps,
    spins or waits imports nothing, and is ended after the probe's timeout."""

    def __init__(self, note):
        self.note = note

    def find_spec(self, name, path=None, target=None):
        self.note()
        return None


def _note_imports_as_progress(note) -> None:
    if not any(isinstance(finder, _ImportsAsProgress) for finder in sys.meta_path):
        sys.meta_path.insert(0, _ImportsAsProgress(note))


def _count_cpu_storage_copies() -> None:
    """A storage copied in Python (copy.deepcopy of any tensor that is not a Parameter: a module's buffers, a teacher
    or an EMA copy made with deepcopy) is made by torch.UntypedStorage(nbytes, device), which on the CPU takes
    LibTorch's default CPU allocator directly, not the one memgate counts with: bytes a CPU probe would not see (on CUDA
    and on the Meta device the same call takes the allocator memgate reads). In memgate's probe, a CPU storage's copy is
    allocated as a tensor's is, the same bytes, counted."""
    import torch
    from torch.storage import _StorageBase

    original = _StorageBase.clone
    if getattr(original, "_memgate_counted", False):
        return

    def clone(self):
        if type(self) is not torch.UntypedStorage or self.device.type != "cpu":
            return original(self)
        return torch.empty(self.nbytes(), dtype=torch.uint8).untyped_storage().copy_(self)

    clone._memgate_counted = True
    clone.__doc__ = original.__doc__
    _StorageBase.clone = clone


def freeze_what_is_alive() -> None:
    """What this process holds now, garbage collected first, out of every later collection's walk (gc.freeze): the
    probes forked from it collect their own objects only. An object frozen here is alive (the collection before it
    freed what was not), and one that a probe's reference cycle holds is kept alive by the cycle's reference as
    before; what the probe allocates is collected as it was."""
    import gc

    if os.environ.get("MEMGATE_GC_FREEZE") == "0":  # memgate's tests: the probes as they were, every object walked
        gc.unfreeze()  # in a probe forked from the fork server: what the server froze is walked again
        return
    gc.collect()
    gc.freeze()


def main() -> int:
    """The probe that sys.argv asks for (`--memgate-rank --request FILE [--parent-pid PID]`: the request that memgate
    wrote, launch/request.h): exit 0 when it measured, 2 for bad arguments, 3 otherwise. An estimate's request has
    memgate._core.rank_main set memgate._meta up first."""
    if len(sys.argv) < 2 or sys.argv[1] != "--memgate-rank":
        print("usage: python -m memgate --memgate-rank --request FILE [--parent-pid PID] (memgate starts it; "
              "run the gate with the memgate command)", file=sys.stderr)
        return 2
    try:
        from memgate import check_torch

        check_torch()
        from memgate import _core
    except ImportError as e:
        print(f"memgate rank: {e}", file=sys.stderr)
        return 3
    # What is imported by now (torch, memgate; in a probe forked from the fork server, everything the server imported)
    # is out of the collector's walks: the protocol collects several times per probe, and each full collection walked
    # every object of torch and of the model's packages (2 s of a ViT-B estimate's 2.5 s).
    freeze_what_is_alive()
    _note_imports_as_progress(_core.note_progress)
    _count_cpu_storage_copies()
    return _core.rank_main(sys.argv)
