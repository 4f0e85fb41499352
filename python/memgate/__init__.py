"""memgate in Python: the memory of a training step of your own nn.Module, measured by memgate's C++ protocol.

    import memgate
    result = memgate.profile("fixtures/models/my_model.yaml", batch_sizes=[1, 8])   # prints what `memgate profile` prints
    result["probes"][0]["components"]["step_peak"]

A fixture with `model: {arch: python, entry: my_models.py:build, ...}` names the callable that builds the module;
`memgate.profile(build, inputs=..., loss=...)` writes one for a callable (docs/python.md). memgate runs each probe in a Python process of
its own (this Python, or MEMGATE_PYTHON), where its extension memgate._core drives the module's forward.
"""
import sys

from memgate._build import TORCH_VERSION as _BUILT_FOR_TORCH
from memgate._build import VERSION as __version__


def check_torch():
    """Raises ImportError, saying what to do, unless this Python's torch is the one memgate's extension was built for
    (its ABI must match to the letter). `python -m memgate` calls it before it loads the extension."""
    try:
        import torch
    except ImportError as e:
        raise ImportError(f"memgate needs torch {_BUILT_FOR_TORCH} in this Python ({sys.executable}), which has none "
                          f"({e})") from None
    if torch.__version__ != _BUILT_FOR_TORCH:
        raise ImportError(f"memgate's extension was built for torch {_BUILT_FOR_TORCH}, and this Python "
                          f"({sys.executable}) has torch {torch.__version__}: install torch=={_BUILT_FOR_TORCH} here, "
                          f"or build memgate against this torch (pip install memgate's folder again)")


from memgate.api import profile  # noqa: E402

__all__ = ["check_torch", "profile", "__version__"]
