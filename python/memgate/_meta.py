"""Meta kernels for an estimate in this Python process: LibTorch's and memgate's own, as in memgate's C++ programs.

`import torch` registers Python Meta kernels (torch._meta_registrations) for some 1,300 ops, over LibTorch's: for ops
that LibTorch runs on the Meta device itself (structured kernels, composites that reach memgate's kernels) they
allocate other tensors than the device would (a reference decomposition of gelu keeps two temporaries; convolution's
stops before memgate's kernel, which allocates what the target's convolution does). An estimate keeps Python's kernels
only for the ops that LibTorch cannot run on the Meta device otherwise."""
import torch


def prefer_libtorch_meta_kernels():
    import torch._meta_registrations as registrations
    from torch._decomp import global_decomposition_table

    library = registrations._meta_lib_dont_use_me_use_register_meta
    registered = list(library._op_impls)  # "aten/<name>[.<overload>]/Meta"
    library._destroy()
    functions = {}
    for kind in ("meta", "post_autograd", "pre_autograd"):  # activate_meta's precedence
        for op, fn in global_decomposition_table[kind].items():
            functions.setdefault(op, fn)
    by_name = {op.name(): (op, fn) for op, fn in functions.items()}
    kept = torch.library.Library("aten", "IMPL", "Meta")
    for key in registered:
        namespace, name, _ = key.split("/")
        qualified = f"{namespace}::{name}" if "." in name else f"{namespace}::{name}"
        if torch._C._dispatch_has_computed_kernel_for_dispatch_key(qualified, "Meta"):
            continue
        entry = by_name.get(qualified)
        if entry is not None:
            kept.impl(entry[0], entry[1])
    kept.impl("_local_scalar_dense", _read_on_meta)
    return kept  # registrations last as long as their library object


def _read_on_meta(tensor):
    """Tensor.item() on the Meta device, which holds no values: a bool reads True. Models branch on such checks of
    their inputs (transformers asks whether a batch is packed, whether a mask is all ones) and memgate's batches are
    unpacked and unmasked, for which they read True. Any other value is an error: a size read from data cannot be
    estimated."""
    if tensor.dtype == torch.bool:
        return True
    raise RuntimeError(f"an estimate cannot read the value of a {tensor.dtype} tensor on the Meta device (Tensor.item(): "
                       f"the model's control flow or sizes depend on its data); measure it instead")
