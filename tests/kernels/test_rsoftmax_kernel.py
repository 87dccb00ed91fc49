"""The fused C++ CPU kernel of r-softmax (sparsenorm/kernels/cpu/rsoftmax.cpp).

Oracles: the reference path (``sparsenorm.kernels.disabled()``: ``torch.topk`` selection, itself
tested against ``torch.quantile`` and the paper's formula in test_rsoftmax.py) and the sync-free
sorted reference. Same support and values to rounding, incl. ties, -inf entries, empty rows,
per-row r, r = 0 and 1; gradients w.r.t. x and r.
"""
from __future__ import annotations

import math

import pytest
import torch

from sparsenorm import kernels, r_softmax
from sparsenorm.kernels import cpu
from sparsenorm.kernels.reference import rsoftmax as ref


@pytest.fixture(scope="module", autouse=True)
def kernel():
    saved = cpu._code_setting
    if cpu.RSOFTMAX.load() is None:
        pytest.skip(f"C++ kernel not buildable here: {cpu.RSOFTMAX.error}")
    cpu._code_setting = True
    yield
    cpu._code_setting = saved


def cases(dtype):
    gen = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(shape, generator=gen, dtype=dtype) * 3

    masked = randn(6, 40)
    masked[0, :5] = -math.inf
    masked[2] = -math.inf
    masked[4, 1:] = -math.inf  # one valid entry
    ties = torch.arange(60, dtype=dtype).remainder(5).view(4, 15)
    poisoned = randn(3, 9)
    poisoned[1, 2] = math.nan
    poisoned[2, 0] = math.inf
    return [("random", randn(7, 33)), ("long", randn(3, 3001)), ("K=1", randn(4, 1)), ("K=2", randn(5, 2)),
            ("-inf and empty rows", masked), ("ties", ties), ("all equal", torch.full((3, 8), 0.7, dtype=dtype)),
            ("NaN and +inf", poisoned)]


def both(x, r):
    with kernels.disabled():
        pure = r_softmax(x, r)
    return pure, r_softmax(x, r)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("r", [0.0, 0.25, 0.5, 0.9, 1.0, "per-row"])
def test_kernel_matches_reference(dtype, r):
    for label, x in cases(dtype):
        rr = torch.rand(x.shape[0], generator=torch.Generator().manual_seed(3), dtype=dtype) if r == "per-row" else r
        pure, fused = both(x, rr)
        assert torch.equal(torch.isnan(pure), torch.isnan(fused)), label
        assert torch.equal(pure == 0, fused == 0), f"{label}: support differs"
        ok = ~torch.isnan(pure)
        eps = torch.finfo(dtype).eps
        torch.testing.assert_close(fused[ok], pure[ok], rtol=64 * eps, atol=64 * eps, msg=label)
        # the sync-free sorted reference agrees too
        rows = torch.full((x.shape[0], 1), rr, dtype=dtype) if not isinstance(rr, torch.Tensor) else rr[:, None]
        sorted_p = ref.forward(x, rows, sorted_threshold=True)[0]
        assert torch.equal(sorted_p == 0, fused == 0), f"{label}: support differs from the sorted reference"


@pytest.mark.parametrize("per_row_r", [False, True])
def test_gradients_match_reference(per_row_r):
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(6, 25, generator=gen, dtype=torch.float64) * 2
    x[1, :3] = -math.inf
    g = torch.randn(6, 25, generator=gen, dtype=torch.float64)
    r0 = torch.rand(6, generator=gen, dtype=torch.float64) if per_row_r else torch.tensor(0.4, dtype=torch.float64)
    grads = []
    for disable in (True, False):
        xi, ri = x.clone().requires_grad_(True), r0.clone().requires_grad_(True)
        if disable:
            with kernels.disabled():
                out = torch.autograd.grad(r_softmax(xi, ri), (xi, ri), g)
        else:
            out = torch.autograd.grad(r_softmax(xi, ri), (xi, ri), g)
        grads.append(out)
    torch.testing.assert_close(grads[1][0], grads[0][0], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grads[1][1], grads[0][1], rtol=1e-10, atol=1e-12)


def test_gradcheck_through_kernel():
    gen = torch.Generator().manual_seed(5)
    x = (torch.randn(4, 9, generator=gen, dtype=torch.float64) * 2).requires_grad_(True)
    r = torch.tensor([[0.3], [0.55], [0.8], [0.1]], dtype=torch.float64, requires_grad=True)
    assert cpu.RSOFTMAX.kernel_for(x.detach()) is not None
    assert torch.autograd.gradcheck(lambda a, b: r_softmax(a, b), (x, r))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("k", [2, 20])  # inside and past one SIMD width
def test_subnormal_weights(dtype, k):
    # x = (0, ..., 0, tiny) with tau between 0 and tiny: the one weight x - tau, hence the sum, is
    # subnormal and 1 / sum overflows; normalising by that reciprocal gave NaN and inf.
    tiny = torch.finfo(dtype).tiny
    x = torch.zeros(1, k, dtype=dtype)
    x[0, -1] = tiny
    r = 1 - 0.2 / (k - 1)  # tau = 0.8 tiny
    pure, fused = both(x, r)
    expected = torch.zeros(1, k, dtype=dtype)
    expected[0, -1] = 1
    torch.testing.assert_close(pure, expected, rtol=0, atol=0)
    torch.testing.assert_close(fused, expected, rtol=0, atol=0)
