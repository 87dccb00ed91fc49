"""The fused C++ backward of ev-softmax's log form (``log_backward`` in
sparsenorm/kernels/cpu/evidential.cpp, the op ``sparsenorm::ev_softmax_log_backward``) against the
reference (the -inf entries' gradient dropped, then log_softmax's backward).

Error model: both compute g_i - exp(y_i) S with S = sum of the kept g; S differs by the summation
order (<= K eps sum|g| each), exp by <= 2 ulp (Sleef u10 vs torch's), so |d grad_i| <= (K + 4) eps
sum|g| (exp(y_i) <= 1), plus eps |g_i| for the subtraction.
"""
from __future__ import annotations

import math

import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck

from sparsenorm import log_ev_softmax_train
from sparsenorm.kernels import cpu, ops


@pytest.fixture(scope="module", autouse=True)
def kernel():
    saved = cpu._code_setting
    if cpu.EVIDENTIAL.load() is None:
        pytest.skip(f"C++ kernel not buildable here: {cpu.EVIDENTIAL.error}")
    cpu._code_setting = True
    yield
    cpu._code_setting = saved


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("k", [1, 7, 37, 3001])
@pytest.mark.parametrize("eps", [0.0, 1e-6])
def test_kernel_matches_reference(dtype, k, eps):
    gen = torch.Generator().manual_seed(k)
    x = torch.randn(6, k, generator=gen, dtype=dtype) * 3
    x[0, : k // 2] = -math.inf
    x[1] = -math.inf  # empty row: all -inf
    x[2, 0] = math.nan
    x[3, ::3] = torch.finfo(dtype).min  # additive mask value: not there
    y = log_ev_softmax_train(x, eps=eps)
    g = torch.randn(6, k, generator=gen, dtype=dtype)
    fused = cpu.EVIDENTIAL.load().log_backward(g, y)
    pure = ops.evidential._log_backward_reference(g, y)
    assert torch.equal(fused.isnan(), pure.isnan())
    assert torch.all(fused[y == -math.inf] == 0)
    ok = ~pure.isnan()
    finfo = torch.finfo(dtype)
    atol = ((k + 4) * finfo.eps * g.abs().sum(-1, keepdim=True) + finfo.eps * g.abs()).expand_as(g)
    assert torch.all((fused[ok] - pure[ok]).abs() <= atol[ok])


@pytest.mark.parametrize("eps", [1e-3, 0.5])
def test_gradcheck_through_kernel(eps):
    # eps > 0 and every entry there: every output finite (finite differences of a -inf output,
    # or across Eq. 7's support boundary, are not defined); the -inf entries are checked above.
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(4, 21, generator=gen, dtype=torch.float64) * 2).requires_grad_(True)
    assert cpu.EVIDENTIAL.kernel_for(x.detach()) is not None
    assert gradcheck(lambda v: log_ev_softmax_train(v, eps=eps), (x,))
    assert gradgradcheck(lambda v: log_ev_softmax_train(v, eps=eps), (x,))  # differentiable path
