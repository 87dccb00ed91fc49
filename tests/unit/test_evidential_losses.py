"""Losses of the training-time ev-softmax (Eq. 10): NLL, KL between two of them, multi-label.

Oracle for the NLL: ``torch.nn.functional.cross_entropy`` of the shifted logits
``x + log(1{x >= mean(x)} + eps)`` (Eq. 10 is exactly the softmax of those), with the indicator
computed here literally; it also pins down CrossEntropyLoss's conventions (weight,
ignore_index, reductions, extra dims).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from sparsenorm import (
    EvSoftmaxNLLLoss,
    ev_softmax,
    ev_softmax_kl_div,
    ev_softmax_multilabel_loss,
    ev_softmax_nll_loss,
    ev_softmax_train,
)


def shifted_logits(x: torch.Tensor, eps: float, dim: int = 1) -> torch.Tensor:
    """Logits whose softmax is Eq. 10, computed literally."""
    support = (x >= x.mean(dim, keepdim=True)).to(x.dtype)
    return x + torch.log(support + eps)


# ------------------------------------------------------------------------------------------------
# ev_softmax_nll_loss
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("eps", [1e-6, 0.3])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_matches_cross_entropy_of_shifted_logits(eps, reduction):
    torch.manual_seed(0)
    x = torch.randn(7, 5, dtype=torch.float64)
    y = torch.randint(0, 5, (7,))
    expected = F.cross_entropy(shifted_logits(x, eps), y, reduction=reduction)
    torch.testing.assert_close(ev_softmax_nll_loss(x, y, eps=eps, reduction=reduction), expected)


def test_nll_extra_dims_weight_and_ignore_index():
    torch.manual_seed(1)
    x = torch.randn(3, 6, 4, 2, dtype=torch.float64)
    y = torch.randint(0, 6, (3, 4, 2))
    y[0, 1, 1] = -1
    y[2, 3, 0] = -1
    weight = torch.rand(6, dtype=torch.float64) + 0.1
    for reduction in ("mean", "sum", "none"):
        expected = F.cross_entropy(shifted_logits(x, 1e-6), y, weight=weight, ignore_index=-1, reduction=reduction)
        got = ev_softmax_nll_loss(x, y, weight=weight, ignore_index=-1, reduction=reduction)
        torch.testing.assert_close(got, expected)
    assert ev_softmax_nll_loss(x, y, ignore_index=-1, reduction="none").shape == (3, 4, 2)


def test_nll_default_ignore_index_and_all_ignored():
    x = torch.randn(4, 3, requires_grad=True)
    y = torch.tensor([0, -100, 2, -100])
    expected = F.cross_entropy(shifted_logits(x.detach(), 1e-6), y)
    torch.testing.assert_close(ev_softmax_nll_loss(x, y), expected)
    loss = ev_softmax_nll_loss(x, torch.full((4,), -100))
    loss.backward()
    assert loss.item() == 0.0 and torch.all(x.grad == 0)


def test_nll_gradient_is_train_probability_minus_target_even_outside_support():
    # class 2 is far below the mean: ev-softmax gives it exactly 0, the NLL stays finite
    x = torch.tensor([[10.0, 9.0, -50.0]], dtype=torch.float64, requires_grad=True)
    y = torch.tensor([2])
    assert ev_softmax(x.detach())[0, 2] == 0
    loss = ev_softmax_nll_loss(x, y)
    loss.backward()
    assert math.isfinite(loss.item())
    expected_loss = -(-50.0 + math.log(1e-6) - torch.logsumexp(shifted_logits(x.detach(), 1e-6), 1).item())
    assert loss.item() == pytest.approx(expected_loss, rel=1e-12)
    expected_grad = ev_softmax_train(x.detach()) - F.one_hot(y, 3).double()
    torch.testing.assert_close(x.grad, expected_grad)
    # float32 with the probability underflowing to 0: still finite
    x32 = torch.tensor([[10.0, 9.0, -200.0]], requires_grad=True)
    loss32 = ev_softmax_nll_loss(x32, y)
    loss32.backward()
    assert torch.isfinite(loss32) and torch.isfinite(x32.grad).all()


def test_nll_eq12_numerically():
    # d NLL / dx -> ev_softmax(x) - delta_y as eps -> 0 (Eq. 12), for targets on and off the support
    torch.manual_seed(2)
    x = torch.randn(8, 6, dtype=torch.float64)
    y = torch.randint(0, 6, (8,))
    target = F.one_hot(y, 6).double()
    errors = []
    for eps in (1e-2, 1e-5, 1e-8):
        xx = x.clone().requires_grad_(True)
        ev_softmax_nll_loss(xx, y, eps=eps, reduction="sum").backward()
        errors.append((xx.grad - (ev_softmax(x) - target)).abs().max().item())
    assert errors[0] > errors[1] > errors[2] and errors[2] < 1e-7


def test_nll_distribution_target():
    torch.manual_seed(3)
    x = torch.randn(5, 4, dtype=torch.float64)
    q = torch.softmax(torch.randn(5, 4, dtype=torch.float64), 1)
    for reduction in ("mean", "sum", "none"):
        expected = F.cross_entropy(shifted_logits(x, 1e-6), q, reduction=reduction)
        torch.testing.assert_close(ev_softmax_nll_loss(x, q, reduction=reduction), expected)
    # one-hot distributions give the class-index loss
    y = torch.randint(0, 4, (5,))
    torch.testing.assert_close(ev_softmax_nll_loss(x, F.one_hot(y, 4).double()), ev_softmax_nll_loss(x, y))
    # class weights with distribution targets: each row weighted by q . weight (sparsenorm's convention)
    weight = torch.rand(4, dtype=torch.float64)
    per_row = F.cross_entropy(shifted_logits(x, 1e-6), q, reduction="none")
    row_weight = q @ weight
    torch.testing.assert_close(ev_softmax_nll_loss(x, q, weight=weight),
                               (per_row * row_weight).sum() / row_weight.sum())


def test_nll_with_masked_classes():
    # -inf logits are absent classes; a target distribution with no mass there gives a finite loss
    x = torch.tensor([[1.0, 2.0, float("-inf"), 0.5]], dtype=torch.float64, requires_grad=True)
    q = torch.tensor([[0.5, 0.5, 0.0, 0.0]], dtype=torch.float64)
    loss = ev_softmax_nll_loss(x, q)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(x.grad).all() and x.grad[0, 2] == 0
    torch.testing.assert_close(loss, ev_softmax_nll_loss(x.detach()[:, [0, 1, 3]], q[:, [0, 1, 3]]))


@settings(max_examples=40, deadline=None)
@given(arrays(np.float64, (3, 4), elements=st.floats(-30, 30, width=64)), st.integers(0, 3))
def test_nll_nonnegative(x, y):
    loss = ev_softmax_nll_loss(torch.from_numpy(x), torch.full((3,), y), reduction="none")
    assert torch.all(loss >= 0)


def test_nll_near_zero_at_a_confident_correct_prediction():
    x = torch.tensor([[30.0, 0.0, 0.0]], dtype=torch.float64)
    assert ev_softmax_nll_loss(x, torch.tensor([0])).item() < 1e-12


def test_nll_gradcheck():
    torch.manual_seed(4)
    x = torch.randn(4, 5, 2, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 5, (4, 2))
    y[1, 0] = -100
    weight = torch.rand(5, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda t: ev_softmax_nll_loss(t, y, eps=0.01, weight=weight), (x,))
    q = torch.softmax(torch.randn(4, 5, 2, dtype=torch.float64), 1)
    assert torch.autograd.gradcheck(lambda t: ev_softmax_nll_loss(t, q, eps=0.01, reduction="sum"), (x,))
    x_small, y_small = x[:2, :, :1].detach().requires_grad_(True), y[:2, :1]
    assert torch.autograd.gradgradcheck(lambda t: ev_softmax_nll_loss(t, y_small, eps=0.01), (x_small,))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_nll_half_precision(dtype):
    torch.manual_seed(5)
    x = torch.randn(6, 10).to(dtype).requires_grad_(True)
    y = torch.randint(0, 10, (6,))
    loss = ev_softmax_nll_loss(x, y)
    assert loss.dtype == dtype
    torch.testing.assert_close(loss.float(), ev_softmax_nll_loss(x.detach().float(), y), atol=1e-2, rtol=1e-2)
    loss.backward()
    assert x.grad.dtype == dtype and torch.isfinite(x.grad).all()


def test_nll_module():
    torch.manual_seed(6)
    weight = torch.rand(4)
    module = EvSoftmaxNLLLoss(eps=0.01, weight=weight, ignore_index=-1, reduction="sum")
    x = torch.randn(5, 4)
    y = torch.tensor([0, 1, -1, 3, 2])
    torch.testing.assert_close(module(x, y),
                               ev_softmax_nll_loss(x, y, eps=0.01, weight=weight, ignore_index=-1, reduction="sum"))
    assert "weight" in dict(module.named_buffers())
    assert "eps=0.01" in repr(module)


def test_nll_bad_arguments():
    x = torch.randn(4, 3)
    with pytest.raises(ValueError, match="eps"):
        ev_softmax_nll_loss(x, torch.zeros(4, dtype=torch.long), eps=-1.0)
    with pytest.raises(ValueError, match="reduction"):
        ev_softmax_nll_loss(x, torch.zeros(4, dtype=torch.long), reduction="avg")
    with pytest.raises(ValueError, match="shape"):
        ev_softmax_nll_loss(x, torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="shape"):
        ev_softmax_nll_loss(x, torch.zeros(4, 4))
    with pytest.raises(TypeError, match="input"):
        ev_softmax_nll_loss(torch.ones(4, 3, dtype=torch.long), torch.zeros(4, dtype=torch.long))
    with pytest.raises(TypeError, match="target"):
        ev_softmax_nll_loss(x, torch.zeros(4, dtype=torch.bool))
    with pytest.raises(IndexError):
        ev_softmax_nll_loss(x, torch.tensor([0, 1, 2, 3]))
    with pytest.raises(ValueError, match="weight"):
        ev_softmax_nll_loss(x, torch.zeros(4, dtype=torch.long), weight=torch.ones(4))
    with pytest.raises(ValueError, match="reduction"):
        EvSoftmaxNLLLoss(reduction="avg")


# ------------------------------------------------------------------------------------------------
# ev_softmax_kl_div
# ------------------------------------------------------------------------------------------------
def kl_literal(p_logits, q_logits, eps):
    p = torch.softmax(shifted_logits(p_logits, eps, -1), -1)
    q = torch.softmax(shifted_logits(q_logits, eps, -1), -1)
    return (p * (p.log() - q.log())).sum(-1)


def test_kl_matches_literal_and_reductions():
    torch.manual_seed(7)
    a = torch.randn(6, 5, dtype=torch.float64)
    b = torch.randn(6, 5, dtype=torch.float64)
    expected = kl_literal(a, b, 0.01)
    torch.testing.assert_close(ev_softmax_kl_div(a, b, eps=0.01, reduction="none"), expected)
    torch.testing.assert_close(ev_softmax_kl_div(a, b, eps=0.01, reduction="sum"), expected.sum())
    torch.testing.assert_close(ev_softmax_kl_div(a, b, eps=0.01), expected.mean())
    torch.testing.assert_close(ev_softmax_kl_div(a, b, eps=0.01, reduction="batchmean"), expected.mean())
    # 'mean' is F.kl_div's 'batchmean' between the two Eq. 10 distributions
    p = ev_softmax_train(a, eps=0.01)
    log_q = torch.log(ev_softmax_train(b, eps=0.01))
    torch.testing.assert_close(ev_softmax_kl_div(a, b, eps=0.01), F.kl_div(log_q, p, reduction="batchmean"))


def test_kl_default_eps_is_finite_where_probabilities_underflow():
    a = torch.tensor([[5.0, 4.0, -300.0, -1.0]], requires_grad=True)
    b = torch.tensor([[-300.0, 4.0, 5.0, -1.0]], requires_grad=True)
    kl = ev_softmax_kl_div(a, b)
    kl.backward()
    assert torch.isfinite(kl) and kl > 0
    assert torch.isfinite(a.grad).all() and torch.isfinite(b.grad).all()


@settings(max_examples=25, deadline=None)
@given(arrays(np.float64, (2, 2, 5), elements=st.floats(-20, 20, width=64)))
def test_kl_nonnegative_and_zero_on_equal_inputs(logits):
    a, b = torch.from_numpy(logits)
    assert torch.all(ev_softmax_kl_div(a, b, reduction="none") >= -1e-12)
    assert torch.all(ev_softmax_kl_div(a, a.clone(), reduction="none").abs() < 1e-12)


def test_kl_dim_and_extra_dims():
    torch.manual_seed(8)
    a = torch.randn(3, 4, 5, dtype=torch.float64)
    b = torch.randn(3, 4, 5, dtype=torch.float64)
    got = ev_softmax_kl_div(a, b, dim=1, reduction="none")
    assert got.shape == (3, 5)
    torch.testing.assert_close(got, ev_softmax_kl_div(a.movedim(1, -1), b.movedim(1, -1), reduction="none"))


def test_kl_masked_entries():
    a = torch.tensor([[1.0, 0.5, float("-inf"), 2.0]], dtype=torch.float64)
    b = torch.tensor([[0.0, 1.0, float("-inf"), 2.0]], dtype=torch.float64)
    torch.testing.assert_close(ev_softmax_kl_div(a, b), ev_softmax_kl_div(a[:, [0, 1, 3]], b[:, [0, 1, 3]]))
    assert torch.isfinite(ev_softmax_kl_div(b, a))  # both lack class 2
    # mass of p where q has none: infinite KL, as it should be
    c = torch.tensor([[1.0, 0.5, 3.0, 2.0]], dtype=torch.float64)
    assert ev_softmax_kl_div(c, a).item() == math.inf


def test_kl_gradcheck():
    torch.manual_seed(9)
    a = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda s, t: ev_softmax_kl_div(s, t, eps=0.05), (a, b))
    assert torch.autograd.gradgradcheck(lambda s, t: ev_softmax_kl_div(s, t, eps=0.05), (a, b))


def test_kl_bad_arguments():
    a = torch.randn(3, 4)
    with pytest.raises(ValueError, match="shape"):
        ev_softmax_kl_div(a, torch.randn(3, 5))
    with pytest.raises(TypeError, match="dtype"):
        ev_softmax_kl_div(a, a.double())
    with pytest.raises(TypeError, match="q_logits"):
        ev_softmax_kl_div(a, torch.ones(3, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="reduction"):
        ev_softmax_kl_div(a, a, reduction="elementwise")
    with pytest.raises(ValueError, match="eps"):
        ev_softmax_kl_div(a, a, eps=-0.1)


# ------------------------------------------------------------------------------------------------
# ev_softmax_multilabel_loss
# ------------------------------------------------------------------------------------------------
def test_multilabel_matches_cross_entropy_to_normalized_labels():
    torch.manual_seed(10)
    x = torch.randn(6, 5, dtype=torch.float64)
    y = (torch.rand(6, 5) > 0.5).double()
    y[0] = 0  # no label
    y[1, 0] = 1
    q = y / y.sum(1, keepdim=True).clamp_min(1)
    for reduction in ("mean", "sum", "none"):
        expected = F.cross_entropy(shifted_logits(x, 1e-6), q, reduction=reduction)
        torch.testing.assert_close(ev_softmax_multilabel_loss(x, y, reduction=reduction), expected)
    # bool and integer multi-hot targets are the same labels
    torch.testing.assert_close(ev_softmax_multilabel_loss(x, y.bool()), ev_softmax_multilabel_loss(x, y))
    torch.testing.assert_close(ev_softmax_multilabel_loss(x, y.long()), ev_softmax_multilabel_loss(x, y))


def test_multilabel_is_kl_plus_entropy_and_gradient_is_p_minus_q():
    torch.manual_seed(11)
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    y = torch.zeros(4, 6, dtype=torch.float64)
    y[torch.arange(4), torch.tensor([0, 2, 4, 5])] = 1
    y[:2, 1] = 1
    q = y / y.sum(1, keepdim=True)
    loss = ev_softmax_multilabel_loss(x, y, reduction="none")
    p = ev_softmax_train(x.detach())
    kl = (q * (torch.log(q.clamp_min(1e-300)) - p.log())).sum(1)
    entropy = -(q * torch.log(q.clamp_min(1e-300))).sum(1)
    torch.testing.assert_close(loss, kl + entropy)
    loss.sum().backward()
    torch.testing.assert_close(x.grad, p - q)


def test_multilabel_rows_without_labels_give_zero_and_zero_gradient():
    x = torch.randn(3, 4, requires_grad=True)
    y = torch.tensor([[1.0, 0, 0, 1], [0, 0, 0, 0], [0, 1, 0, 0]])
    loss = ev_softmax_multilabel_loss(x, y, reduction="none")
    assert loss[1] == 0
    loss.sum().backward()
    assert torch.all(x.grad[1] == 0)
    # they count in the mean, as in F.cross_entropy with an all-zero target row
    torch.testing.assert_close(ev_softmax_multilabel_loss(x, y), loss.sum() / 3)


def test_multilabel_extra_dims_and_gradcheck():
    torch.manual_seed(12)
    x = torch.randn(2, 5, 3, dtype=torch.float64, requires_grad=True)
    y = (torch.rand(2, 5, 3) > 0.6).double()
    got = ev_softmax_multilabel_loss(x, y, reduction="none")
    assert got.shape == (2, 3)
    rows = ev_softmax_multilabel_loss(x.movedim(1, -1).reshape(6, 5), y.movedim(1, -1).reshape(6, 5),
                                      reduction="none")
    torch.testing.assert_close(got, rows.reshape(2, 3))
    assert torch.autograd.gradcheck(lambda t: ev_softmax_multilabel_loss(t, y, eps=0.05), (x,))


@settings(max_examples=40, deadline=None)
@given(arrays(np.float64, (3, 5), elements=st.floats(-20, 20, width=64)), arrays(np.bool_, (3, 5)))
def test_multilabel_nonnegative(x, y):
    assert torch.all(ev_softmax_multilabel_loss(torch.from_numpy(x), torch.from_numpy(y), reduction="none") >= 0)


def test_multilabel_bad_arguments():
    x = torch.randn(3, 4)
    with pytest.raises(ValueError, match="shape"):
        ev_softmax_multilabel_loss(x, torch.ones(3, 5))
    with pytest.raises(ValueError, match="shape"):
        ev_softmax_multilabel_loss(x, torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="nonnegative"):
        ev_softmax_multilabel_loss(x, -torch.ones(3, 4))
    with pytest.raises(TypeError, match="input"):
        ev_softmax_multilabel_loss(torch.ones(3, 4, dtype=torch.long), torch.ones(3, 4))
    with pytest.raises(ValueError, match="eps"):
        ev_softmax_multilabel_loss(x, torch.ones(3, 4), eps=-1.0)
    with pytest.raises(ValueError, match="reduction"):
        ev_softmax_multilabel_loss(x, torch.ones(3, 4), reduction="avg")
