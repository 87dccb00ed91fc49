"""Minimal examples of what the fuzz suite found (issue 25, item 3), one plain test each."""
from __future__ import annotations

import math

import torch

import sparsenorm as sn
from sparsenorm import kernels, registry
from sparsenorm.kernels.reference.rsoftmax import _order_statistics


def test_registry_softmax_keeps_a_row_of_only_nan_nan():
    # found: softmax over dim 0 of [[0, nan]]: the column [nan] gave 0 (it counted as "nothing
    # there"), though NaN is there by the library's rule and must stay in its row
    x = torch.tensor([[0.0, math.nan]], dtype=torch.float16)
    for form in (registry.get("softmax").forward, registry.get("softmax").log_prob):
        out = form(x, dim=0)
        assert torch.isnan(out[0, 1]) and not torch.isnan(out[0, 0])


def test_r_softmax_ties_at_the_quantile_give_one_gradient_on_kernel_and_reference():
    # found: x = (0, 0, 0, 1, 0.5), r = 0 in float16: d tau / d x went to entry 0 on the kernel and
    # to entry 2 on the CPU reference (torch.topk orders ties arbitrarily), so the gradients differed
    x = torch.tensor([0.0, 0.0, 0.0, 1.0, 0.5], dtype=torch.float16, requires_grad=True)
    g = torch.tensor([0.1, -0.4, 0.3, 0.9, -0.2], dtype=torch.float16)
    (kernel,) = torch.autograd.grad(sn.r_softmax(x, 0.0), x, g)
    with kernels.disabled():
        (reference,) = torch.autograd.grad(sn.r_softmax(x, 0.0), x, g)
    torch.testing.assert_close(kernel, reference, rtol=0, atol=0)


def test_order_statistics_indices_are_those_of_the_stable_sort():
    rows = torch.tensor([[0.0, 0.0, 0.0, 1.0, 0.5], [2.0, 1.0, 1.0, 1.0, 3.0], [1.0, 1.0, 0.0, 1.0, 1.0]])
    order = torch.sort(rows, dim=-1, stable=True).indices
    for rank in range(rows.shape[-1]):
        for r in (rank, torch.full((3, 1), rank)):
            _, _, lo_idx, hi_idx = _order_statistics(rows, r)
            assert lo_idx.squeeze(-1).tolist() == order[:, rank].tolist()
            assert hi_idx.squeeze(-1).tolist() == order[:, min(rank + 1, 4)].tolist()
