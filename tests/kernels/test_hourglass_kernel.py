"""The fused C++ CPU kernel of sparsehourglass (``hourglass_forward`` / ``hourglass_backward`` in
sparsenorm/kernels/cpu/projection.cpp) against the reference operators (kernels/reference/hourglass.py,
itself the paper's formula tested in tests/test_hourglass.py) and autograd through the formula.

Error model: alpha = (1 + qK) / (|sum z| + qK) differs by the summation order of sum z (the kernel
sums in double): |d alpha| / alpha <= (K + 4) eps (|sum| |z|) / D with |sum| |z| = sum |z_i|;
p = [alpha z - tau]_+ then moves by at most 2 max|alpha z| (K + 4) eps · (sum|z|/D + 1) with the
threshold's own sums. The tests take atol = 4 (K + 4) eps (1 + max|alpha z|) (1 + sum|z| / D).
"""
from __future__ import annotations

import math

import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck

from sparsenorm import kernels, sparsehourglass
from sparsenorm.kernels import cpu
from sparsenorm.kernels.reference import hourglass as ref


@pytest.fixture(scope="module", autouse=True)
def kernel():
    saved = cpu._code_setting
    if cpu.PROJECTION.load() is None:
        pytest.skip(f"C++ kernel not buildable here: {cpu.PROJECTION.error}")
    cpu._code_setting = True
    yield
    cpu._code_setting = saved


def rows(dtype):
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(8, 37, generator=gen, dtype=dtype) * 2
    x[0, :5] = float("-inf")
    x[1] = float("-inf")  # nothing there
    x[2, ::3] = torch.finfo(dtype).min  # additive mask value: not there
    x[3, 4] = float("nan")
    x[4] = x[4] - x[4].mean()  # sum z = 0 up to rounding
    x[5] = x[5] + 10.0  # large |sum z|
    x[6, :] = 0.25  # all equal
    return x


def tolerance(x, q):
    finfo = torch.finfo(x.dtype)
    there = x > finfo.min / 2
    z = torch.where(there & ~x.isnan(), x, torch.zeros_like(x))
    k = there.sum(-1, keepdim=True)
    d = z.sum(-1, keepdim=True).abs() + q * k
    ratio = (z.abs().sum(-1, keepdim=True) / d.clamp_min(1e-30)).max()
    return 4 * (x.shape[-1] + 4) * finfo.eps * (1 + 10 * (1 + q)) * (1 + float(ratio))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("q", [0.1, 1.0, 7.0])
def test_forward_and_backward_match_reference(dtype, q):
    x = rows(dtype)
    g = torch.randn_like(x)
    q_rows = torch.full((x.shape[0], 1), q, dtype=dtype)
    ext = cpu.PROJECTION.load()
    p, alpha, total = ext.hourglass_forward(x, q_rows)
    p_ref, alpha_ref, total_ref = ref.forward(x, q_rows)
    nan_rows = x.isnan().any(-1)
    assert p[nan_rows].isnan().all() and p_ref[nan_rows].isnan().all()
    ok = ~nan_rows
    atol = tolerance(x[ok], q)
    torch.testing.assert_close(p[ok], p_ref[ok], rtol=0, atol=atol)
    torch.testing.assert_close(alpha[ok], alpha_ref[ok], rtol=atol, atol=0)
    assert torch.equal(p[1], torch.zeros_like(p[1]))
    assert torch.all(p[2, ::3] == 0) and torch.all(p[0, :5] == 0)
    # backward on the same (reference) forward outputs
    grad, grad_q = ext.hourglass_backward(g, p_ref.contiguous(), x, alpha_ref, total_ref, q_rows)
    grad_ref, grad_q_ref = ref.backward(g, p_ref, x, alpha_ref, total_ref, q_rows)
    assert grad[nan_rows].isnan().all()
    gscale = 1 + float(g.abs().max()) * x.shape[-1]
    torch.testing.assert_close(grad[ok], grad_ref[ok], rtol=0, atol=atol * gscale)
    torch.testing.assert_close(grad_q[ok], grad_q_ref[ok], rtol=0,
                               atol=atol * gscale * (1 + float(x[ok].nan_to_num(0, 0, 0).abs().sum())))
    assert torch.all(grad[2, ::3] == 0) and torch.all(grad[1] == 0)


@pytest.mark.parametrize("k", [5, 29])  # below and past one SIMD width
def test_gradcheck_through_kernel_x_and_q(k):
    gen = torch.Generator().manual_seed(k)
    x = (torch.randn(4, k, generator=gen, dtype=torch.float64) * 2).requires_grad_(True)
    q = torch.tensor([[0.3], [1.0], [2.5], [0.05]], dtype=torch.float64, requires_grad=True)
    assert cpu.PROJECTION.kernel_for(x.detach()) is not None
    assert gradcheck(lambda a, b: sparsehourglass(a, b), (x, q))
    q0 = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)  # one shared q
    assert gradcheck(lambda a, b: sparsehourglass(a, b), (x, q0))
    assert gradgradcheck(lambda a: sparsehourglass(a, 0.8), (x,))


def test_kernel_and_reference_paths_agree_through_autograd():
    gen = torch.Generator().manual_seed(12)
    x = torch.randn(5, 40, generator=gen, dtype=torch.float64) * 3
    x[0, :7] = -math.inf
    g = torch.randn(5, 40, generator=gen, dtype=torch.float64)
    q = torch.rand(5, generator=gen, dtype=torch.float64) + 0.1
    grads = []
    for disable in (True, False):
        xi, qi = x.clone().requires_grad_(True), q.clone().requires_grad_(True)
        with kernels.disabled() if disable else torch.enable_grad():
            out = sparsehourglass(xi, qi)
            grads.append((out.detach(), *torch.autograd.grad(out, (xi, qi), g)))
    for a, b in zip(grads[1], grads[0]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11)
