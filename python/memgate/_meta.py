"""Meta kernels for an estimate in this Python process: LibTorch's and memgate's own, as in memgate's C++ programs,
and torch's Python ones where LibTorch has nothing that runs on the Meta device.

`import torch` registers Python Meta kernels (torch._meta_registrations) for some 1,300 ops, over LibTorch's: for ops
that LibTorch runs on the Meta device itself (structured kernels, composites that reach memgate's kernels) they
allocate other tensors than the device would (a reference decomposition of gelu keeps two temporaries; convolution's
stops before memgate's kernel, which allocates what the target's convolution does). An estimate keeps Python's kernel
for an op where LibTorch (memgate's kernels included) has no Meta kernel of its own and the CPU does not run a
composite of LibTorch's either (`needs_python_meta_kernel`): 2-D cross-entropy (nll_loss2d), PReLU, GroupNorm,
hardtanh's backward (ReLU6), roll, abs.out under integer abs."""
import sys
import weakref

import torch
from torch.utils._device import DeviceContext as _DeviceContext  # torch's own `with torch.device(...)`


def needs_python_meta_kernel(op: str) -> bool:
    """Whether the estimate takes torch's Python Meta kernel for `op` ("aten::name[.overload]"), asked once torch's
    Python registrations are gone and memgate's own are made:
    - LibTorch's or memgate's Meta kernel (structured ops, memgate's convolution, norms, attention): not Python's.
    - a CompositeImplicitAutograd op decomposes above the Meta device: its parts' kernels run (torch registers no
      Python Meta kernel for these).
    - a kernel of the CPU's own (nll_loss2d_forward, _prelu_kernel, native_group_norm, roll, abs.out): the device
      runs that kernel, which allocates its outputs, as Python's Meta kernel does; a composite beside it
      (native_group_norm's math_group_norm, a batch norm over a view) is not what the CPU runs.
    - else a composite of LibTorch's (CompositeExplicitAutograd: convolution, abs, _foreach_norm) is what the CPU runs,
      down to kernels that run on Meta (memgate's convolution_overrideable, abs.out): it stays.
    - an op with none of these (a CUDA-only kernel: _scaled_mm) has only Python's."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    if has(op, "Meta") or has(op, "CompositeImplicitAutograd"):
        return False
    if has(op, "CPU"):
        return True
    return not (has(op, "CompositeExplicitAutograd") or has(op, "CompositeExplicitAutogradNonFunctional"))


def prefer_libtorch_meta_kernels():
    import torch._meta_registrations as registrations
    from torch._decomp import global_decomposition_table

    from memgate import _core

    # memgate's kernels first: they are LibTorch's own for the rule, and a Python kernel kept for one of their ops
    # would be replaced by theirs with a warning.
    _core.register_meta_kernels()
    library = registrations._meta_lib_dont_use_me_use_register_meta
    registered = list(library._op_impls)  # "aten/<name>[.<overload>]/Meta"
    library._destroy()
    functions = {}
    for kind in ("meta", "post_autograd", "pre_autograd"):  # activate_meta's precedence
        for op, fn in global_decomposition_table[kind].items():
            # A decomposition (not a Meta function) computes the op from others, with temporaries the device's kernel
            # does not make: its outputs alone are counted.
            functions.setdefault(op, fn if kind == "meta" else _outputs_only(fn, _core.uncounted))
    by_name = {op.name(): (op, fn) for op, fn in functions.items()}
    kept = torch.library.Library("aten", "IMPL", "Meta")
    for key in registered:
        namespace, name, _ = key.split("/")
        qualified = f"{namespace}::{name}"
        if qualified == "aten::_local_scalar_dense" or not needs_python_meta_kernel(qualified):
            continue  # Tensor.item(): memgate's own below
        entry = by_name.get(qualified)
        if entry is not None:
            kept.impl(entry[0], entry[1])
    kept.impl("_local_scalar_dense", _read_on_meta)
    fast_paths_on_meta()
    return kept  # registrations last as long as their library object


class _AlsoMeta(str):
    """The PrivateUse1 backend's name (equal to it, printed as it) that the Meta device's type equals too."""

    def __eq__(self, other):
        return other == "meta" or str.__eq__(self, other)

    def __ne__(self, other):
        return not self.__eq__(other)

    __hash__ = str.__hash__


def fast_paths_on_meta():
    """nn.MultiheadAttention's and nn.TransformerEncoderLayer's fast path for Meta tensors as for the target's: in
    inference (eval, no gradient needed, batch first, self-attention, an even head count, ... : torch decides, in
    torch/nn/modules/activation.py and transformer.py) the CPU and CUDA run the fused _native_multi_head_attention and
    _transformer_encoder_layer_fwd, which allocate other tensors than the modules' own path; torch takes that path
    only for tensors whose device type is one of "cpu", "cuda" or the PrivateUse1 backend's name
    (torch.utils.backend_registration._privateuse1_backend_name, read as each forward checks), so an estimate took
    the other path. That name, wrapped to equal "meta" too, lets every other condition decide as on the target;
    memgate's Meta kernels run the fused ops (meta_attention.cpp). Only an estimate's process calls it."""
    from torch.utils import backend_registration

    name = backend_registration._privateuse1_backend_name
    if not isinstance(name, _AlsoMeta):
        backend_registration._privateuse1_backend_name = _AlsoMeta(name)


def _outputs_only(decomposition, uncounted):
    """A Meta kernel from a decomposition of torch's: it runs with its tensors outside the estimate's count, and the
    kernel returns fresh tensors of its outputs' shapes, strides and dtypes, counted, as a device kernel allocates
    its outputs (nll_loss2d_forward's decomposition gathers and masks; _prelu_kernel's makes a mask and a product;
    the CPU's kernels write their outputs alone). An output that is an argument (out=, in place) is returned as it
    is: it was allocated, and counted, by the caller. (No closure refers to itself here: a reference cycle would keep
    the op's inputs alive until Python's collector ran, past the step that freed them.)"""
    def kernel(*args, **kwargs):
        out = uncounted(decomposition, *args, **kwargs)
        return _fresh(out, _tensors_of(args, kwargs))

    kernel.__name__ = getattr(decomposition, "__name__", "decomposition")
    kernel.__wrapped__ = decomposition
    return kernel


def _tensors_of(args, kwargs):
    """The ids of the tensors among an op's arguments (a list of tensors' too)."""
    ids = set()
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.Tensor):
            ids.add(id(a))
        elif isinstance(a, (list, tuple)):
            ids.update(id(t) for t in a if isinstance(t, torch.Tensor))
    return ids


def _fresh(value, arguments):
    if isinstance(value, torch.Tensor):
        if id(value) in arguments:
            return value
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=value.device)
    if isinstance(value, (tuple, list)):
        items = [_fresh(v, arguments) for v in value]
        if type(value) in (tuple, list):
            return type(value)(items)
        try:
            return type(value)(items)  # torch.return_types (a structseq) takes a sequence
        except TypeError:
            return type(value)(*items)  # a namedtuple takes fields
    return value


def _read_on_meta(tensor):
    """Tensor.item() on the Meta device, which holds no values: a bool reads True. Models branch on such checks of
    their inputs (transformers asks whether a batch is packed, whether a mask is all ones) and memgate's batches are
    unpacked and unmasked, for which they read True. Any other value is an error: a size read from data cannot be
    estimated."""
    if tensor.dtype == torch.bool:
        return True
    raise RuntimeError(f"an estimate cannot read the value of a {tensor.dtype} tensor on the Meta device (Tensor.item(): "
                       f"the model's control flow or sizes depend on its data); measure it instead")


# --- Which module an op that fails on Meta was called from ---------------------------------------------------------

# Ops whose output's size depends on their input's values: torch's Python Meta kernels refuse them, or have none.
_DATA_DEPENDENT_OPS = {"aten::nonzero", "aten::masked_select", "aten::_unique", "aten::_unique2", "aten::unique_dim",
                       "aten::unique_consecutive", "aten::unique_dim_consecutive", "aten::bincount",
                       "aten::repeat_interleave", "aten::_local_scalar_dense",
                       # nn.TransformerEncoder's fast path in eval with a key padding mask: whether the mask is left
                       # aligned, and the nested tensor of the unpadded tokens
                       "aten::_nested_tensor_from_mask_left_aligned", "aten::_nested_tensor_from_mask",
                       # CTC loss with its lengths on the Meta device (meta_autograd.cpp's ctc_loss_tensor): its
                       # log_alpha is as long as the longest target
                       "aten::ctc_loss"}


def data_dependent_op(message: str) -> str:
    """The op an error on the Meta device came from when it is one whose output's size, or a value read, depends on
    a tensor's data (which Meta tensors do not hold), as memgate names it; "" for any other error. torch's texts:
    nonzero's Python Meta kernel (also boolean indexing, torch.where(cond), argwhere), "attempted to run this operator
    with Meta tensors" for masked_select, unique and bincount, a custom op whose fake kernel asks for a size from data
    (torchvision's NMS), repeat_interleave without output_size, and a read of values (tolist, cpu, numpy, item)."""
    if "The register_meta function for torch.nonzero()" in message:
        return "aten::nonzero (boolean indexing, torch.where(condition) and argwhere call it)"
    marker = ": attempted to run this operator with Meta tensors"
    if marker in message:
        op = message[:message.index(marker)].rsplit(" ", 1)[-1]
        return op if op in _DATA_DEPENDENT_OPS else ""
    if "with meta Tensors (as opposed to FakeTensors)" in message:  # a fake kernel making a size from data
        return message.split(" (", 1)[0].rsplit(" ", 1)[-1]
    if "cannot repeat_interleave a meta tensor without output_size" in message:
        return "aten::repeat_interleave (without output_size)"
    if "Cannot copy out of meta tensor" in message or "can't convert meta device type tensor to numpy" in message:
        return "a read of a tensor's values (Tensor.tolist(), .cpu(), .numpy())"
    if "an estimate cannot read the value of a" in message:  # _read_on_meta's own
        return "aten::_local_scalar_dense (Tensor.item(), int(), float() of a tensor)"
    return ""


def describe_data_dependent(message: str, module: str) -> str:
    """memgate's refusal of a data-dependent op in an estimate (data_dependent_op), naming the op and the module whose
    forward called it; "" when the error is not one."""
    op = data_dependent_op(message)
    if not op:
        return ""
    where = f", called in the forward of {module}" if module else ""
    return (f"the estimate cannot run {op}{where}: its output's size or the value read depends on the tensor's data, "
            f"which the Meta device does not hold; measure it instead (`memgate profile`)")


def module_of_error(root, traceback) -> str:
    """The innermost module of `root` whose forward is on the error's traceback (a frame whose `self` is one of its
    modules), as "'<dotted name>' (<class>)", "the model (<class>)" for the root itself, or "" when none is (the
    error came from the loss or the backward)."""
    try:
        names = {id(m): n for n, m in root.named_modules()}
    except Exception:  # noqa: BLE001 (a module whose named_modules fails: the op still names what failed)
        return ""
    found = ""
    while traceback is not None:
        module = traceback.tb_frame.f_locals.get("self")
        if isinstance(module, torch.nn.Module) and id(module) in names:
            name = names[id(module)]
            kind = type(module).__name__
            found = f"the model ({kind})" if name == "" else f"'{name}' ({kind})"
        traceback = traceback.tb_next
    return found


# --- A model's build on the Meta device, with the values it reads ----------------------------------------------------

_SMALL = 4096  # elements: a build's schedule (drop-path rates per block) or a table of sizes, not a parameter


def _value_factories():
    return {torch.linspace, torch.logspace, torch.arange, torch.range, torch.tensor, torch.as_tensor, torch.zeros,
            torch.ones, torch.full, torch.eye}


def _value_reads():
    t = torch.Tensor
    return {t.item, t.tolist, t.__bool__, t.__int__, t.__float__, t.__index__, t.__complex__, t.numpy, t.__format__,
            t.__repr__, t.__str__, t.__array__}


class _BuildOnDevice(_DeviceContext):
    """`torch.device(device)` for a model's build (factory functions make their tensors there), and on the Meta device
    the values of what the build computes from Python numbers: a builder that reads one (MONAI's SwinUNETR and many
    others: `dpr = [x.item() for x in torch.linspace(0, drop_path_rate, sum(depths))]`) gets it, where a Meta tensor
    has none ("Tensor.item() cannot be called on meta tensors"). A small tensor made by a value factory (linspace,
    arange, tensor, zeros, ...) keeps a CPU twin with its values, and so does what an op computes from twins alone;
    a read of a Meta tensor's value (item, tolist, bool, int, float, ...) reads its twin. Random ops leave the CPU's
    generator as it was, and every twin is dropped when the build ends: the model is the Meta device's alone. Values
    of parameters drawn at random are none of these (their factories are empty and rand): reading one stays an
    error."""

    def __init__(self, device):
        super().__init__(device)
        self._on_meta = self.device.type == "meta"
        self._factories = _value_factories()
        self._reads = _value_reads()
        self._twinned = []  # weak references to the Meta tensors given a twin
        self._imports = _ImportsOffTheDevice(self) if self._on_meta else None

    def __enter__(self):
        result = super().__enter__()
        if self._imports is not None:
            sys.meta_path.insert(0, self._imports)
        return result

    def __exit__(self, *exc):
        if self._imports is not None and self._imports in sys.meta_path:
            sys.meta_path.remove(self._imports)
        for ref in self._twinned:
            tensor = ref()
            if tensor is not None and "_memgate_value" in tensor.__dict__:
                del tensor._memgate_value
        self._twinned.clear()
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self._on_meta:
            return super().__torch_function__(func, types, args, kwargs)
        if func in self._reads and args:
            twin = _twin(args[0])
            if twin is not None:
                return func(twin, *args[1:], **kwargs)
        factory = func in self._factories and kwargs.get("device") is None
        result = super().__torch_function__(func, types, args, dict(kwargs))
        try:
            if factory:
                if _small_meta(result):
                    self._keep(result, func(*args, **{**kwargs, "device": "cpu"}))
            else:
                twins = _with_twins(args, kwargs)
                if twins is not None and _small_meta(result):
                    state = torch.get_rng_state()
                    try:
                        self._keep(result, func(*twins[0], **twins[1]))
                    finally:
                        torch.set_rng_state(state)
        except Exception:  # noqa: BLE001 (a twin that cannot be computed: the value stays unread, as on Meta)
            pass
        return result

    def _keep(self, result, twin):
        if isinstance(result, torch.Tensor):
            if isinstance(twin, torch.Tensor) and twin.shape == result.shape:
                result._memgate_value = twin
                self._twinned.append(weakref.ref(result))
        elif isinstance(result, (list, tuple)) and isinstance(twin, (list, tuple)) and len(result) == len(twin):
            for r, t in zip(result, twin):
                self._keep(r, t)


class _ImportsOffTheDevice:
    """A finder first on sys.meta_path while a build runs on the Meta device: a module the builder imports for the
    first time (a library imported inside the builder's body) runs its import outside the build's `torch.device`, with
    no torch function mode and the default device as it was, as a training script's import would. A tensor the module
    makes as it is imported (a detection head's anchors at class level) is then the CPU's, not a Meta tensor for the
    rest of the process: the parameter count, the first build of a probe's process, runs on the Meta device, and the
    measurement that follows it must find what a process of its own finds. It finds nothing itself: it asks the finders
    after it and has the loader found run the module's code off the device."""

    def __init__(self, context):
        self._context = context
        self._finding = False

    def find_spec(self, name, path=None, target=None):
        if self._finding:
            return None
        self._finding = True
        try:
            spec = None
            for finder in sys.meta_path[sys.meta_path.index(self) + 1:] if self in sys.meta_path else []:
                find = getattr(finder, "find_spec", None)
                if find is not None:
                    spec = find(name, path, target)
                    if spec is not None:
                        break
        finally:
            self._finding = False
        loader = getattr(spec, "loader", None)
        # Built-in and frozen modules' loaders are classes shared by all (and make no tensors): left as they are.
        if loader is None or isinstance(loader, type) or not hasattr(loader, "exec_module"):
            return spec
        original = loader.exec_module
        context = self._context

        def exec_module(module):
            try:
                del loader.exec_module  # the loader's own again, for a reload
            except AttributeError:
                pass
            with _off_the_device(context):
                original(module)

        try:
            loader.exec_module = exec_module
        except (AttributeError, TypeError):
            pass  # a loader that takes no attribute: its module is imported on the device, as before
        return spec


class _off_the_device:
    """The torch function modes (the build's `torch.device` and any above it) off the stack and the default device
    as it was before the build, for an import; put back as they were after it."""

    def __init__(self, context):
        self._context = context

    def __enter__(self):
        from torch.overrides import _pop_mode
        from torch.utils import _device

        self._modes = [_pop_mode() for _ in range(torch._C._len_torch_function_stack())]
        self._device = _device.CURRENT_DEVICE
        _device.CURRENT_DEVICE = getattr(self._context, "old_device", None)

    def __exit__(self, *exc):
        from torch.overrides import _push_mode
        from torch.utils import _device

        _device.CURRENT_DEVICE = self._device
        for mode in reversed(self._modes):
            _push_mode(mode)
        return False


def _twin(value):
    return value.__dict__.get("_memgate_value") if isinstance(value, torch.Tensor) else None


def _small_meta(result):
    if isinstance(result, torch.Tensor):
        return result.device.type == "meta" and result.numel() <= _SMALL
    if isinstance(result, (list, tuple)):
        return bool(result) and all(_small_meta(r) for r in result)
    return False


def _with_twins(args, kwargs):
    """The op's arguments with each Meta tensor replaced by its twin; None unless there is one and every Meta tensor
    has one."""
    found = False

    def swap(value):
        nonlocal found
        if isinstance(value, torch.Tensor) and value.device.type == "meta":
            twin = _twin(value)
            if twin is None:
                raise LookupError
            found = True
            return twin
        if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
            return type(value)(swap(v) for v in value)
        return value

    try:
        swapped = tuple(swap(a) for a in args), {k: swap(v) for k, v in kwargs.items()}
    except LookupError:
        return None
    return swapped if found else None


def building_on(device: str):
    """The context a model's builder runs in on `device` (memgate's PythonModel): _BuildOnDevice."""
    return _BuildOnDevice(device)


def autocast_on_meta():
    """`torch.autocast(device_type="meta", ...)` in an estimate, as the target device runs the same code: a model or a
    loss that names its tensors' device (`torch.autocast(device_type=x.device.type, enabled=False)`, an SSIM loss
    kept in fp32) names the Meta device here, which torch's autocast refuses ("unsupported scalarType": the Meta
    device has no autocast of its own). On the Meta device memgate's autocast is PrivateUse1's (AutocastScope and
    meta_autocast.cpp: its kernels at AutocastPrivateUse1 cast by the target's policy), so a region for "meta" sets
    PrivateUse1's state as torch sets a device's: enabled or not (its key excluded while not), its dtype, the cache,
    and on entry with enabled=True its key included, as a region for "cuda" turns CUDA's autocast on. Left as they
    were after it. Other device types are torch's own."""
    from torch.amp import autocast_mode

    autocast = autocast_mode.autocast
    if getattr(autocast, "_memgate_meta", False):
        return
    backend = torch._C._get_privateuse1_backend_name()
    original_init, original_enter, original_exit = autocast.__init__, autocast.__enter__, autocast.__exit__

    def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        if device_type != "meta" or torch._jit_internal.is_scripting():
            self._memgate_on_meta = False
            return original_init(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
        self._memgate_on_meta = True
        self.device = "meta"
        self.fast_dtype = torch.get_autocast_dtype(backend) if dtype is None else dtype
        self._enabled = enabled
        self._cache_enabled = torch.is_autocast_cache_enabled() if cache_enabled is None else cache_enabled

    def __enter__(self):
        if not getattr(self, "_memgate_on_meta", False):
            return original_enter(self)
        self.prev_cache_enabled = torch.is_autocast_cache_enabled()
        self.prev = torch.is_autocast_enabled(backend)
        self.prev_fastdtype = torch.get_autocast_dtype(backend)
        # Included while the guard lives (an RAII guard: dropped on exit).
        self._memgate_include = (
            torch._C._IncludeDispatchKeyGuard(torch._C.DispatchKey.AutocastPrivateUse1) if self._enabled else None)
        torch.set_autocast_enabled(backend, self._enabled)
        torch.set_autocast_dtype(backend, self.fast_dtype)
        torch.autocast_increment_nesting()
        torch.set_autocast_cache_enabled(self._cache_enabled)
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        if not getattr(self, "_memgate_on_meta", False):
            return original_exit(self, exc_type, exc_val, exc_tb)
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()
        torch.set_autocast_enabled(backend, self.prev)
        torch.set_autocast_dtype(backend, self.prev_fastdtype)
        torch.set_autocast_cache_enabled(self.prev_cache_enabled)
        self._memgate_include = None
        return False

    autocast.__init__, autocast.__enter__, autocast.__exit__ = __init__, __enter__, __exit__
    autocast._memgate_meta = True
