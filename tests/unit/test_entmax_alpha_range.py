"""entmax_bisect and its loss accept every alpha the entmax package accepts (issue 8, item 4).

Oracle: the ``entmax`` package (1.3), values and gradients w.r.t. X and alpha, for the alphas its
own tests use (0.2, 0.5, 0.75, random from 0.05) and some above 1.
"""
from __future__ import annotations

import entmax
import pytest
import torch

from sparsenorm import entmax_bisect, entmax_bisect_loss

ALPHAS = [0.05, 0.2, 0.5, 0.75, 0.99, 1.25, 1.5, 2.0, 3.0]


@pytest.mark.parametrize("alpha", ALPHAS)
def test_values_and_gradients_match_the_entmax_package(alpha):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, 9, generator=gen, dtype=torch.float64) * 2
    a = torch.full((6, 1), alpha, dtype=torch.float64)
    g = torch.randn(6, 9, generator=gen, dtype=torch.float64)
    ours_x, ours_a = x.clone().requires_grad_(True), a.clone().requires_grad_(True)
    theirs_x, theirs_a = x.clone().requires_grad_(True), a.clone().requires_grad_(True)
    ours = entmax_bisect(ours_x, ours_a, dim=-1, n_iter=60)
    theirs = entmax.entmax_bisect(theirs_x, theirs_a, dim=-1, n_iter=60)
    torch.testing.assert_close(ours, theirs, rtol=1e-9, atol=1e-12)
    grads = torch.autograd.grad(ours, (ours_x, ours_a), g)
    expected = torch.autograd.grad(theirs, (theirs_x, theirs_a), g)
    torch.testing.assert_close(grads[0], expected[0], rtol=1e-7, atol=1e-10)
    torch.testing.assert_close(grads[1], expected[1], rtol=1e-7, atol=1e-10)


def test_random_alphas_per_row_as_in_the_entmax_tests():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(10, 7, generator=gen, dtype=torch.float64)
    a = 0.05 + 2.5 * torch.rand(10, 1, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(entmax_bisect(x, a), entmax.entmax_bisect(x, a), rtol=1e-9, atol=1e-12)
    xa = (x.clone().requires_grad_(True), a.clone().requires_grad_(True))
    assert torch.autograd.gradcheck(lambda x_, a_: entmax_bisect(x_, a_, n_iter=80), xa)


@pytest.mark.parametrize("alpha", [0.2, 0.5, 0.75])
def test_alpha_below_one_is_dense_and_sums_to_one(alpha):
    x = torch.randn(4, 12, dtype=torch.float64) * 3
    p = entmax_bisect(x, alpha)
    assert (p > 0).all()
    torch.testing.assert_close(p.sum(-1), torch.ones(4, dtype=torch.float64))


@pytest.mark.parametrize("alpha", [0.3, 0.75, 1.5])
def test_loss_matches_the_entmax_package(alpha):
    gen = torch.Generator().manual_seed(2)
    z = torch.randn(5, 6, generator=gen, dtype=torch.float64).requires_grad_(True)
    y = torch.tensor([0, 3, 5, 1, 2])
    ours = entmax_bisect_loss(z, y, alpha=alpha, reduction="none")
    theirs = entmax.entmax_bisect_loss(z, y, alpha=alpha)
    torch.testing.assert_close(ours, theirs, rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(torch.autograd.grad(ours.sum(), z)[0], torch.autograd.grad(theirs.sum(), z)[0],
                               rtol=1e-7, atol=1e-9)


def test_alpha_must_be_positive():
    x = torch.randn(2, 3)
    for bad in (0.0, -0.5):
        with pytest.raises(ValueError, match="alpha"):
            entmax_bisect(x, bad)
        with pytest.raises(ValueError, match="alpha"):
            entmax_bisect_loss(x, torch.tensor([0, 1]), alpha=bad)
