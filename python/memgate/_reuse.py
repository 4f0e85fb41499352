"""One built module for every batch size of an estimate process (python_model.cpp: the build is kept between probes,
its allocations replayed): what must be as the build left it for the next probe to start where a new build would."""


def hooks_of(module):
    """Every hook on the module's submodules and on its parameters, counted per object: a probe that registers one (a
    training loop's optimizer adding gradient hooks) leaves the module running it in the next probe, so the module
    is not kept."""
    out = []
    for m in module.modules():
        out.append((id(m), len(m._forward_hooks), len(m._forward_pre_hooks), len(m._backward_hooks),
                    len(m._backward_pre_hooks)))
    for p in module.parameters():
        out.append((id(p), len(p._backward_hooks or ()), len(getattr(p, "_post_accumulate_grad_hooks", None) or ()),
                    p.grad is None))
    return tuple(out)


def flags_of(module):
    """Each submodule's training flag and each parameter's requires_grad, as the build left them."""
    return ([(m, m.training) for m in module.modules()], [(p, p.requires_grad) for p in module.parameters()])


def restore_flags(flags) -> None:
    modules, params = flags
    for m, training in modules:
        m.training = training
    for p, requires_grad in params:
        p.requires_grad_(requires_grad)


# --- The Python state around a build: what a process of its own would start its step from ----------------------------
#
# A probe's process runs several builds (the parameter count's, then each batch size's, or one build kept for every
# batch size of an estimate), and the user's code keeps state between them: a loss with a module-level step counter, a
# package's globals, a model's attributes set in its forward. Each build ends with `settle(module)`: the first time a
# module of the user's own is seen, its globals are recorded; every later build puts back each global rebound since
# (and drops those added), so that each step starts from the globals the first build left, in a sweep as in a process
# of its own. The module's own attributes are recorded too: a kept module whose forward set one (a call counter, a
# cached tensor) is not kept for the next batch size (`attributes_unchanged`), it is built anew. What the user's code
# changes inside an object is put back in place as well (`_inner_state`): a list it appends to, a dict or set it fills,
# a class attribute or an instance's attribute of a class of its own that it counts up, each as the first build left
# it, and so on inside them (a few levels deep). Tensors and nn.Modules are left as they are.

import collections as _collections
import os as _os
import sys as _sys
import sysconfig as _sysconfig
import weakref as _weakref

_GLOBALS = {}  # id(module) -> (weak reference to the module, its globals as the first build left them)
_ATTRIBUTES = _weakref.WeakKeyDictionary()  # built module -> its modules' attributes as the build left them
_INNER = {}  # id(module) -> the in-place state of its globals as the first build left them (_inner_state)
_OWN = {}  # module name -> whether it is the user's own
_NOT_OWN = tuple({_os.path.realpath(p) + _os.sep for k, p in _sysconfig.get_paths().items()
                  if k in ("stdlib", "platstdlib", "purelib", "platlib")} |
                 {_os.path.dirname(_os.path.realpath(__file__)) + _os.sep})  # memgate's own (its __main__ too)


def _is_own(name, module):
    own = _OWN.get(name)
    if own is None:
        where = getattr(module, "__file__", None)
        top = name.partition(".")[0]
        own = bool(where) and top not in ("memgate", "torch") and not _os.path.realpath(where).startswith(_NOT_OWN)
        _OWN[name] = own
    return own


def _own_modules():
    return [m for name, m in list(_sys.modules.items()) if m is not None and _is_own(name, m)]


def _forget(key):
    def forget(_ref):
        _GLOBALS.pop(key, None)
        _INNER.pop(key, None)
    return forget


_DEPTH = 4  # how deep inside the globals state is recorded (a dict of lists of objects of the user's own classes)
_WIDE = 10_000  # the items of a container looked into, at most (a global list of a million indices is copied, not walked)


def _own_class(cls) -> bool:
    name = getattr(cls, "__module__", None)
    module = _sys.modules.get(name) if isinstance(name, str) else None
    return module is not None and _is_own(name, module)


def _inner_state(value, seen, depth):
    """What the user's code can change inside `value` without rebinding it, recorded by reference: a list's, dict's,
    set's, deque's or bytearray's items; a class of its own's attributes; an instance of its own class's __dict__. None
    for anything else (numbers and strings cannot change; tensors and nn.Modules are left alone)."""
    if depth > _DEPTH or id(value) in seen:
        return None
    import torch  # the probe's process has imported it before any build
    if isinstance(value, (torch.Tensor, torch.nn.Module, _weakref.ReferenceType)):
        return None
    if isinstance(value, type):
        if not _own_class(value):
            return None
        seen.add(id(value))
        items = {k: v for k, v in vars(value).items() if not (k.startswith("__") and k.endswith("__"))}
        return ("class", value, items, _inner_states(items.values(), seen, depth + 1))
    # The builtin containers exactly: a subclass may compute its items as it is read (transformers' lazy auto
    # mappings import a module per key), and is left as it is.
    kind = type(value)
    if kind in (list, _collections.deque, bytearray):
        seen.add(id(value))
        items = list(value)
        return ("sequence", value, items, _inner_states(items[:_WIDE], seen, depth + 1))
    if kind in (dict, _collections.OrderedDict, _collections.defaultdict):
        seen.add(id(value))
        items = dict(value)
        return ("dict", value, items, _inner_states(list(items.values())[:_WIDE], seen, depth + 1))
    if kind is set:
        seen.add(id(value))
        return ("set", value, set(value), [])
    if _own_class(type(value)) and isinstance(getattr(value, "__dict__", None), dict):
        seen.add(id(value))
        items = dict(value.__dict__)
        return ("object", value, items, _inner_states(items.values(), seen, depth + 1))
    return None


def _inner_states(values, seen=None, depth=0):
    seen = set() if seen is None else seen
    out = []
    for v in values:
        try:
            state = _inner_state(v, seen, depth)
        except Exception:  # an object whose reading runs the user's code and fails: not recorded, left as it is
            continue
        if state is not None:
            out.append(state)
    return out


def _rebind(now, first, set_, delete) -> None:
    """Names in `now` (a namespace) put back as `first` had them, by identity: those added since deleted, those
    rebound since set back."""
    for name in [n for n in now if n not in first]:
        delete(name)
    for name, value in first.items():
        if now.get(name, first) is not value:
            set_(name, value)


def _put_back(state) -> None:
    """Puts what `_inner_state` recorded back into the same object, in place, then inside its items."""
    kind, value, items, inner = state
    try:
        if kind == "sequence":
            if isinstance(value, _collections.deque):
                value.clear()
                value.extend(items)
            else:
                value[:] = items
        elif kind in ("dict", "set"):
            value.clear()
            value.update(items)
        elif kind == "class":  # a class's __dict__ is read-only: through setattr and delattr
            _rebind({n: v for n, v in vars(value).items() if not (n.startswith("__") and n.endswith("__"))}, items,
                    lambda n, v: setattr(value, n, v), lambda n: delattr(value, n))
        else:
            _rebind(value.__dict__, items, value.__dict__.__setitem__, value.__dict__.__delitem__)
    except (TypeError, AttributeError, ValueError):
        return  # an object that refuses (a read-only attribute): left as the user's code left it
    for state in inner:
        _put_back(state)


def settle(module=None) -> None:
    """As a build starts (no module) and ends (python_model.cpp): the user's modules' globals as the first build left
    them (recorded, or put back), and the built module's attributes recorded."""
    for m in _own_modules():
        key = id(m)
        seen = _GLOBALS.get(key)
        if seen is None or seen[0]() is not m:
            try:
                _GLOBALS[key] = (_weakref.ref(m, _forget(key)), dict(m.__dict__))
            except TypeError:
                continue
            _INNER[key] = _inner_states(m.__dict__.values())
            continue
        _rebind(m.__dict__, seen[1], m.__dict__.__setitem__, m.__dict__.__delitem__)
        for state in _INNER.get(key, ()):
            _put_back(state)
    if module is None:
        return
    try:
        _ATTRIBUTES[module] = attributes_of(module)
    except TypeError:
        pass


def attributes_of(module):
    """Each submodule's attributes (by identity; `training` aside, which restore_flags puts back)."""
    return [(id(m), {k: id(v) for k, v in m.__dict__.items() if k != "training"}) for m in module.modules()]


def attributes_unchanged(module) -> bool:
    """Whether no attribute of the module's was set, added or removed since its build (a kept module whose forward
    set one would start the next batch size from another state than a build of its own)."""
    recorded = _ATTRIBUTES.get(module)
    return recorded is not None and recorded == attributes_of(module)
