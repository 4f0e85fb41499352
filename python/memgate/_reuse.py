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
