"""The C++ autograd kernels (dispatch key AutogradCPU) of ev_softmax, project and entmax_bisect.

Loading the evidential / projection extensions registers, for CPU tensors, a C++ autograd kernel
that overrides the ops' Python autograd (``register_autograd`` in ``sparsenorm/kernels/ops/``)
to save its per-call Python cost. Its forward redispatches to the op (the same registered CPU
kernel runs) and its backward runs the same formulas as the Python autograd, op for op. So:

* the kernel is registered once the extensions are loaded, and a graph built on CPU has a C++ node;
* gradients (plain and with ``create_graph``) equal the Python autograd functions' *exactly* on the
  same saved output (same ops on the same values: no tolerance);
* float64 ``gradcheck`` and ``gradgradcheck`` pass through it;
* the kernel policy still holds: under ``sparsenorm.kernels.disabled()`` the forward is the
  reference's (it agrees with the fused kernel only to rounding, so it being bit-equal to the
  reference shows the reference ran).

Without a compiler the extensions cannot be built and every test here skips.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

import sparsenorm
from sparsenorm import kernels
from sparsenorm.kernels import cpu as cpu_kernels
from sparsenorm.kernels import ops
from sparsenorm.kernels.reference import evidential as ref_evidential
from sparsenorm.kernels.reference import projection as ref_projection

OP_NAMES = ("sparsenorm::ev_softmax", "sparsenorm::project", "sparsenorm::entmax_bisect")


@pytest.fixture(scope="module", autouse=True)
def extensions():
    """Build (or load the cached) extensions once; skip the module if they cannot be built."""
    saved = cpu_kernels._code_setting
    for ext in (cpu_kernels.EVIDENTIAL, cpu_kernels.PROJECTION):
        if ext.load() is None:
            pytest.skip(f"C++ CPU kernel could not be built: {ext.error}")
    sparsenorm.use_cpu_kernels(True)
    yield
    cpu_kernels._code_setting = saved


# (label, op call, Python autograd backward on the op layer, the ctx attributes it reads)
CASES = {
    "ev_softmax": (lambda x: ops.ev_softmax(x, None, False), ops.evidential._ev_softmax_backward, {"log": False}),
    "ev_softmax_train": (lambda x: ops.ev_softmax(x, 1e-6, False), ops.evidential._ev_softmax_backward, {"log": False}),
    "log_ev_softmax_train": (lambda x: ops.ev_softmax(x, 1e-6, True), ops.evidential._ev_softmax_backward,
                             {"log": True}),
    "log_ev_softmax": (lambda x: ops.ev_softmax(x, None, True), ops.evidential._ev_softmax_backward, {"log": True}),
    "sparsemax": (lambda x: ops.project(x, "sparsemax", None), ops.projection._project_autograd, {"kind": "sparsemax"}),
    "entmax15": (lambda x: ops.project(x, "entmax15", None), ops.projection._project_autograd, {"kind": "entmax15"}),
    "entmax_bisect": (lambda x: ops.entmax_bisect(x, 1.7, 50, True), ops.projection._entmax_bisect_autograd,
                      {"alpha": 1.7}),
    "entmax_bisect(alpha=1.5)": (lambda x: ops.entmax_bisect(x, 1.5, 50, False), ops.projection._entmax_bisect_autograd,
                                 {"alpha": 1.5}),
}


def logits(dtype=torch.float64, shape=(5, 9), seed=0):
    """Random rows with the edge cases: a -inf entry, an entry at finfo.min, ties, an all -inf row."""
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype) * 2
    x[1, 4] = -math.inf
    x[2, 5] = torch.finfo(dtype).min
    x[3, :3] = 0.5
    x[4] = -math.inf
    return x


def test_the_cpp_autograd_kernels_are_registered_and_used_on_cpu():
    for name in OP_NAMES:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(name, "AutogradCPU"), name
    for label, (call, _, _) in CASES.items():
        y = call(logits().requires_grad_())
        # a torch::autograd::Function node is a CppFunction; the Python autograd's would be GeneratedBackwardFor_...
        assert type(y.grad_fn).__name__ == "CppFunction", (label, type(y.grad_fn))


@pytest.mark.parametrize("label", sorted(CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("create_graph", [False, True])
def test_gradients_equal_the_python_autograd_exactly(label, dtype, create_graph):
    call, python_backward, ctx_attributes = CASES[label]
    x = logits(dtype).requires_grad_()
    y = call(x)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(1), dtype=dtype)
    (got,) = torch.autograd.grad(y, x, g, create_graph=create_graph)
    ctx = SimpleNamespace(saved_tensors=(y.detach(),), **ctx_attributes)
    with torch.set_grad_enabled(create_graph):  # the engine runs a backward with grad mode = create_graph
        want = python_backward(ctx, g)[0]
    torch.testing.assert_close(got.detach(), want.detach(), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("label", sorted(CASES))
def test_gradcheck_and_gradgradcheck_through_the_cpp_kernel(label):
    call = CASES[label][0]
    # rows without ties at the support's edge (gradcheck's finite differences need a locally smooth map)
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(2), dtype=torch.float64).requires_grad_()
    if label.startswith("log"):  # the -inf entries of the log form are constant; check the finite ones
        support = torch.isfinite(call(x.detach()))
        fn = lambda t: torch.where(support, call(t), 0.0)  # noqa: E731
    else:
        fn = call
    assert type(call(x).grad_fn).__name__ == "CppFunction"
    assert torch.autograd.gradcheck(fn, (x,))
    assert torch.autograd.gradgradcheck(fn, (x,))


def test_the_forward_keeps_the_kernel_policy():
    """Under kernels.disabled() the C++ autograd kernel's forward is the reference's, bit for bit."""
    x = logits(torch.float32, shape=(64, 33), seed=3)
    with kernels.disabled():
        y = ops.ev_softmax(x.clone().requires_grad_(), 1e-6, False)
        p = ops.project(x.clone().requires_grad_(), "entmax15", None)
    assert type(y.grad_fn).__name__ == "CppFunction"
    # the test can tell the paths apart: on these rows the fused kernels round differently
    assert not torch.equal(ops.ev_softmax(x, 1e-6, False), ref_evidential.ev_softmax_forward(x, 1e-6, False))
    assert not torch.equal(ops.project(x, "entmax15", None), ref_projection.project(x, -1, "entmax15"))
    torch.testing.assert_close(y.detach(), ref_evidential.ev_softmax_forward(x, 1e-6, False), rtol=0, atol=0,
                               equal_nan=True)
    torch.testing.assert_close(p.detach(), ref_projection.project(x, -1, "entmax15").contiguous(), rtol=0, atol=0,
                               equal_nan=True)


def test_no_graph_without_grad():
    x = logits().requires_grad_()
    with torch.no_grad():
        assert ops.ev_softmax(x, None, False).grad_fn is None
        assert ops.project(x, "sparsemax", None).grad_fn is None
    assert ops.entmax_bisect(x.detach(), 1.7, 50, True).grad_fn is None
