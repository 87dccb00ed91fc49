"""``torch.compile(fn, fullgraph=True)`` works for every normalizer and loss (issue 9, item 4).

Small shapes and the ``aot_eager`` backend (traces forward and backward through dynamo and AOT
autograd, which is what breaks on a host synchronisation or a data-dependent branch) keep the
default suite fast; one inductor test is marked slow. Oracle: the same call in eager mode.
"""
from __future__ import annotations

import math

import pytest
import torch

import sparsenorm
from sparsenorm import kernels, losses

NORMALIZERS = {
    "ev_softmax": lambda x, m: sparsenorm.ev_softmax(x, mask=m),
    "ev_softmax_train": lambda x, m: sparsenorm.ev_softmax_train(x, mask=m),
    "log_ev_softmax_train": lambda x, m: sparsenorm.log_ev_softmax_train(x, mask=m),
    "sparsemax": lambda x, m: sparsenorm.sparsemax(x, mask=m),
    "entmax15": lambda x, m: sparsenorm.entmax15(x, mask=m),
    "sparsemax_bisect": lambda x, m: sparsenorm.sparsemax_bisect(x, n_iter=30, mask=m),
    "entmax_bisect": lambda x, m: sparsenorm.entmax_bisect(x, 1.3, n_iter=30, mask=m),
    "entmax_bisect(alpha=0.5)": lambda x, m: sparsenorm.entmax_bisect(x, 0.5, n_iter=30, mask=m),
    "t_softmax": lambda x, m: sparsenorm.t_softmax(x, 1.0, mask=m),
    "r_softmax": lambda x, m: sparsenorm.r_softmax(x, 0.5, mask=m),
    "sparsehourglass": lambda x, m: sparsenorm.sparsehourglass(x, mask=m),
}

TARGET = torch.tensor([0, 2, 3, 1])
MULTI_HOT = torch.tensor([[1.0, 0, 1, 0, 0, 0], [0, 0, 1, 0, 0, 0], [0, 1, 0, 1, 0, 0], [1, 1, 0, 0, 0, 0]])
LOSSES = {
    "ev_softmax_nll_loss": lambda z, m: losses.ev_softmax_nll_loss(z, TARGET, mask=m),
    "ev_softmax_multilabel_loss": lambda z, m: losses.ev_softmax_multilabel_loss(z, MULTI_HOT, mask=m),
    "ev_softmax_kl_div": lambda z, m: losses.ev_softmax_kl_div(z, 0.5 * z, mask=m),
    "sparsemax_loss": lambda z, m: losses.sparsemax_loss(z, TARGET, mask=m),
    "sparsemax_bisect_loss": lambda z, m: losses.sparsemax_bisect_loss(z, TARGET, n_iter=30, mask=m),
    "entmax15_loss": lambda z, m: losses.entmax15_loss(z, TARGET, mask=m),
    "entmax_bisect_loss": lambda z, m: losses.entmax_bisect_loss(z, MULTI_HOT, alpha=1.3, n_iter=30, mask=m),
    "sparsehourglass_hinge_loss": lambda z, m: losses.sparsehourglass_hinge_loss(z, TARGET, mask=m),
    "sparsehourglass_multilabel_hinge_loss":
        lambda z, m: losses.sparsehourglass_multilabel_hinge_loss(z, MULTI_HOT, mask=m),
    "r_softmax_loss": lambda z, m: losses.r_softmax_loss(z, MULTI_HOT, mask=m),
    "t_softmax_loss": lambda z, m: losses.t_softmax_loss(z, MULTI_HOT, mask=m),
}


def inputs():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 6, generator=gen) * 2
    x[1, 4] = -math.inf
    x[2, 5] = torch.finfo(torch.float32).min
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[3, 5] = False
    return x, mask


def check_compiled_equals_eager(fn, backend="aot_eager"):
    x, mask = inputs()
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend=backend)
    xe = x.clone().requires_grad_(True)
    xc = x.clone().requires_grad_(True)
    eager = fn(xe, mask)
    got = compiled(xc, mask)
    torch.testing.assert_close(got, eager, rtol=1e-5, atol=1e-6)
    g = torch.randn(eager.shape, generator=torch.Generator().manual_seed(1))
    (ge,) = torch.autograd.grad(eager, xe, g)
    (gc,) = torch.autograd.grad(got, xc, g)
    torch.testing.assert_close(gc, ge, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", list(NORMALIZERS))
def test_every_normalizer_compiles_fullgraph(name):
    check_compiled_equals_eager(NORMALIZERS[name])


@pytest.mark.parametrize("name", list(LOSSES))
def test_every_loss_compiles_fullgraph(name):
    check_compiled_equals_eager(LOSSES[name])


def test_compiled_reference_path():
    with kernels.disabled():
        check_compiled_equals_eager(NORMALIZERS["ev_softmax"])
        check_compiled_equals_eager(NORMALIZERS["entmax15"])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ev_softmax", "sparsemax", "r_softmax"])
def test_inductor(name):
    check_compiled_equals_eager(NORMALIZERS[name], backend="inductor")


@pytest.mark.parametrize("log", [False, True])
def test_ev_softmax_backward_on_cuda_is_traceable_without_running_a_kernel(log):
    """What ``torch.compile`` does to ev-softmax's backward on CUDA, without a GPU: AOT autograd
    calls the autograd formula on fake CUDA tensors. The fused backward must be the registered op
    (its fake kernel answers), not a Triton launch on fake tensors: that was every ev-softmax
    function failing to compile on the GPU (issue 39). Here a launch fails for want of a driver."""
    from types import SimpleNamespace

    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    from sparsenorm.kernels.ops import evidential

    with FakeTensorMode(), torch.no_grad():  # no_grad: the fused path (create_graph=False)
        out = torch.empty(4, 6, device="cuda")
        grad = torch.empty(4, 6, device="cuda")
        ctx = SimpleNamespace(saved_tensors=(out,), log=log)
        dx, *_ = evidential._ev_softmax_backward(ctx, grad)
    assert isinstance(dx, FakeTensor) and dx.device.type == "cuda" and dx.shape == out.shape


@pytest.mark.parametrize("log", [False, True])
def test_ev_softmax_backward_op_passes_opcheck(log):
    """The fused backward op's registration (schema, fake kernel, no aliasing) and its value
    against the differentiable closed form, float64. The log form on CPU is the C++ kernel: its
    error model (``test_log_backward_kernel.py``) is a sum of the K entries in another order and
    exp within 2 ulp of torch's, so ``(K + 4) eps sum|g| + eps |g_i|`` per entry."""
    from sparsenorm.kernels.ops import evidential

    gen = torch.Generator().manual_seed(4)
    x = torch.randn(5, 7, generator=gen, dtype=torch.float64)
    x[0, 2] = -math.inf
    out = evidential.ev_softmax(x, 1e-6 if log else None, log)
    grad = torch.randn(5, 7, generator=gen, dtype=torch.float64)
    torch.library.opcheck(evidential.ev_softmax_backward, (grad, out, log))
    fused = evidential.ev_softmax_backward(grad, out, log)
    reference = evidential._differentiable_backward(grad, out, log)
    eps, k = torch.finfo(torch.float64).eps, x.shape[-1]
    bound = (k + 4) * eps * grad.abs().sum(-1, keepdim=True) + eps * grad.abs()
    assert torch.all((fused - reference).abs() <= bound)
