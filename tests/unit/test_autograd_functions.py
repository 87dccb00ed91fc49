"""The autograd.Functions around the registered operators (r-/t-softmax, sparsehourglass) turn off
autograd's zero-filling of missing output gradients (``sparsenorm/kernels/ops/_autograd.py``): an incoming
gradient of None (a later Function returned None for the output) must still act exactly as zeros,
which is what autograd used to hand them (NaN rows included: 0 times NaN stays NaN)."""
import contextlib

import pytest
import torch

import sparsenorm


class _DropsGrad(torch.autograd.Function):
    """Identity whose backward returns None: the Function before it gets a None gradient."""

    @staticmethod
    def forward(ctx, y):
        return y.clone()

    @staticmethod
    def backward(ctx, grad):
        return None


@pytest.mark.parametrize("name", ["t_softmax", "r_softmax", "sparsehourglass"])
@pytest.mark.parametrize("kernels_on", [True, False])
def test_none_incoming_grad_acts_as_zeros(name, kernels_on):
    fn = getattr(sparsenorm, name)
    torch.manual_seed(0)
    x = torch.randn(3, 5, dtype=torch.float64)
    x[1, 2] = float("nan")
    with contextlib.nullcontext() if kernels_on else sparsenorm.kernels.disabled():
        xs = x.clone().requires_grad_()
        param = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
        y = fn(xs, param)
        expected = torch.autograd.grad(y, (xs, param), torch.zeros_like(y))
        xs = x.clone().requires_grad_()
        param = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
        # the sum of xs and param keeps both in the graph, so the None reaches fn's backward
        out = _DropsGrad.apply(fn(xs, param)).sum() + (xs.sum() + param) * 0
        got = torch.autograd.grad(out, (xs, param))
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=0, atol=0, equal_nan=True)
