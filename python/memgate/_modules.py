"""Which module's forward runs: the names a probe's per-module breakdown gives its bytes (memgate's C++ attribution,
backend/module_attribution.h, tags each allocation with the innermost module entered when it was made)."""

import torch

from memgate import _core


class Tracking:
    """Forward hooks on every module (torch's global ones) that tell memgate which of `root`'s modules runs, by its
    dotted name in `root.named_modules()` ("(root)" for `root` itself); modules outside `root` (an EMA copy, a loss
    module) are not named. remove() takes the hooks away. The hooks allocate no tensor and change no output."""

    def __init__(self, root: torch.nn.Module):
        names = {id(module): name or "(root)" for name, module in root.named_modules()}
        enter, leave = _core.enter_module, _core.exit_module

        def before(module, args):
            name = names.get(id(module))
            if name is not None:
                enter(name)

        def after(module, args, output):
            if id(module) in names:
                leave()

        self._handles = [
            torch.nn.modules.module.register_module_forward_pre_hook(before),
            torch.nn.modules.module.register_module_forward_hook(after, always_call=True),
        ]

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


def track(root: torch.nn.Module) -> Tracking:
    return Tracking(root)
