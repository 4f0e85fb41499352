"""Which Meta kernel an estimate runs for each op (issue 59; python/memgate/_meta.py): torch's Python one where
neither LibTorch nor memgate has one that runs on the Meta device (max_unpool2d), memgate's own for the ops of the issue
that LibTorch lacks (2-D cross-entropy, PReLU, GroupNorm, hardtanh's backward, roll, the abs.out under integer abs),
LibTorch's or memgate's own everywhere else (gelu's structured kernel, memgate's
convolution under LibTorch's composite, memgate's layer norm and mse_loss_backward). Read from the dispatcher, where
each kernel says which file registered it; then the ops of the issue run forward and backward on Meta.

    python tests/python/meta_rule_test.py <build>/python
"""
import sys

sys.path.insert(0, sys.argv[1])

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from memgate._meta import prefer_libtorch_meta_kernels  # noqa: E402

kept = prefer_libtorch_meta_kernels()


def meta_kernel_of(op):
    lines = [line for line in torch._C._dispatch_dump(op).splitlines() if line.startswith("Meta:")]
    return lines[0] if lines else ""


failures = []


def expect(op, where, also_not=None):
    line = meta_kernel_of(op)
    ok = where in line and (also_not is None or also_not not in line)
    print(f"{'ok  ' if ok else 'FAIL'} {op:40s} {line[:110]}")
    if not ok:
        failures.append(f"{op}: expected a Meta kernel from {where}, got {line or 'none'}")


def expect_composite(op):
    line = meta_kernel_of(op)
    ok = line == "" and torch._C._dispatch_has_kernel_for_dispatch_key(op, "CompositeExplicitAutograd")
    print(f"{'ok  ' if ok else 'FAIL'} {op:40s} {'(LibTorch composite)' if ok else line[:110]}")
    if not ok:
        failures.append(f"{op}: expected no Meta kernel (LibTorch's CompositeExplicitAutograd runs), got {line}")


# torch's Python kernels: the CPU runs a kernel of its own, which LibTorch has no Meta twin for (nor memgate).
for op in ["aten::max_unpool2d"]:
    expect(op, "memgate/_meta.py")
# ... and those memgate gives a C++ Meta kernel too (src/estimate/meta_kernels.cpp), so that a TorchScript or zoo
# fixture's estimate, which has no Python, runs them: memgate's, with the outputs torch's Python kernels allocate.
for op in ["aten::nll_loss2d_forward", "aten::nll_loss2d_backward", "aten::_prelu_kernel",
           "aten::_prelu_kernel_backward", "aten::native_group_norm", "aten::native_group_norm_backward",
           "aten::hardtanh", "aten::hardtanh_backward", "aten::roll", "aten::abs.out"]:
    expect(op, "meta_kernels.cpp")
# LibTorch's structured kernels.
for op in ["aten::gelu", "aten::nll_loss_forward", "aten::sigmoid"]:
    expect(op, "RegisterMeta")
# memgate's around LibTorch's structured kernel: the outputs it makes, then the copies of a non-contiguous input (and
# gradient) that the CPU's kernels make (src/estimate/meta_ops.cpp).
for op in ["aten::_softmax", "aten::_log_softmax", "aten::_softmax_backward_data", "aten::_log_softmax_backward_data"]:
    expect(op, "meta_kernels.cpp")
# memgate's own (src/estimate/meta_kernels.cpp), which model what the target's kernels allocate.
for op in ["aten::convolution_overrideable", "aten::convolution_backward_overrideable", "aten::native_layer_norm",
           "aten::mm", "aten::mse_loss", "aten::mse_loss_backward", "aten::native_batch_norm", "aten::relu"]:
    expect(op, "meta_kernels.cpp")
# LibTorch's composites, which the CPU runs too, down to kernels that run on Meta.
for op in ["aten::convolution", "aten::convolution_backward", "aten::abs"]:
    expect_composite(op)

# The ops, forward and backward, on Meta.
m = torch.device("meta")
x = torch.randn(2, 3, 8, 8, device=m, requires_grad=True)
runs = {
    "2-D cross-entropy": lambda: F.cross_entropy(x, torch.randint(3, (2, 8, 8), device=m)),
    "MSE": lambda: F.mse_loss(x, torch.randn(2, 3, 8, 8, device=m)),
    "PReLU": lambda: torch.nn.PReLU(3).to(m)(x).sum(),
    "GroupNorm": lambda: torch.nn.GroupNorm(1, 3).to(m)(x).sum(),
    "ReLU6": lambda: F.relu6(x).sum(),
    "roll": lambda: torch.roll(x, (1, -1), (2, 3)).sum(),
    "conv": lambda: torch.nn.Conv2d(3, 4, 3).to(m)(x).sum(),
}
for name, make in runs.items():
    try:
        make().backward()
        print(f"ok   {name} runs forward and backward on Meta")
    except Exception as e:  # noqa: BLE001
        failures.append(f"{name}: {type(e).__name__}: {str(e).splitlines()[0]}")
        print(f"FAIL {name}: {type(e).__name__}: {str(e).splitlines()[0]}")
integer = torch.abs(torch.arange(5, device=m) - 2)
if integer.dtype != torch.int64:
    failures.append(f"integer abs: expected int64, got {integer.dtype}")

if failures:
    print("\n".join(["", *failures]), file=sys.stderr)
    sys.exit(1)
