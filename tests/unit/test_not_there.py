"""One "not there" rule for every normalizer and loss, in every dtype (issue 8, item 1).

An entry is not there when it is ``-inf``, ``False`` in ``mask``, or at or below
``finfo(dtype).min / 2`` (an additive mask such as Hugging Face's ``finfo.min``). Oracle: the same
function on the row without those entries (it must give the same values on the rest, exact zeros
there, and a zero gradient there), for every registry normalizer and every loss.
"""
from __future__ import annotations

import math

import pytest
import torch

import sparsenorm
from sparsenorm import losses, registry

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
TOL = {torch.float32: 1e-5, torch.float64: 1e-12, torch.float16: 2e-3, torch.bfloat16: 1e-2}
N_VALID, N_PAD = 6, 3

# Every public normalizer: the registry's forms plus the functions that are not registry forms.
FUNCTIONS = {}
for _name in registry.names():
    _entry = registry.get(_name)
    FUNCTIONS[_name] = _entry.forward
    if _entry.train_forward is not _entry.forward:
        FUNCTIONS[f"{_name} (train)"] = _entry.train_forward
    if _entry.log_prob is not None:
        FUNCTIONS[f"{_name} (log)"] = _entry.log_prob
FUNCTIONS["sparsemax_bisect"] = sparsenorm.sparsemax_bisect
FUNCTIONS["entmax_bisect(alpha=0.5)"] = lambda x, dim=-1, mask=None: sparsenorm.entmax_bisect(x, 0.5, dim, mask=mask)
FUNCTIONS["entmax_bisect(alpha=1.3)"] = lambda x, dim=-1, mask=None: sparsenorm.entmax_bisect(x, 1.3, dim, mask=mask)
FUNCTIONS["ev_softmax_train(eps=0.1)"] = lambda x, dim=-1, mask=None: sparsenorm.ev_softmax_train(x, dim, 0.1, mask)


def padding_variants(dtype):
    """(label, pad value or None for a boolean mask)."""
    finfo = torch.finfo(dtype)
    return [("-inf", -math.inf), ("finfo.min", finfo.min), ("finfo.min / 2", finfo.min / 2), ("mask", None)]


def make_rows(dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(4, N_VALID, generator=gen, dtype=torch.float64) * 2).to(dtype)


def padded(x, pad_value):
    """x with N_PAD entries put between its entries (positions 1, 3, 5), and the keep mask."""
    rows, n = x.shape
    keep = torch.ones(n + N_PAD, dtype=torch.bool)
    keep[[1, 3, 5]] = False
    full = torch.zeros(rows, n + N_PAD, dtype=x.dtype)
    full[:, keep] = x
    if pad_value is not None:
        full[:, ~keep] = pad_value
    else:
        full[:, ~keep] = torch.randn(rows, N_PAD, dtype=torch.float64).mul(5).to(x.dtype)  # junk, masked out
    return full, keep


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_every_normalizer_leaves_out_what_is_not_there(name, dtype):
    fn = FUNCTIONS[name]
    is_log = "(log)" in name
    x = make_rows(dtype)
    expected = fn(x, dim=-1).double()
    for label, pad_value in padding_variants(dtype):
        full, keep = padded(x, pad_value)
        inp = full.clone().requires_grad_(True)
        mask = keep.expand_as(full) if pad_value is None else None
        out = fn(inp, dim=-1, mask=mask)
        assert out.dtype == dtype, label
        got = out.double()
        off = float("-inf") if is_log else 0.0
        assert (got[:, ~keep] == off).all(), f"{label}: entries not there must be exactly {off}"
        torch.testing.assert_close(got[:, keep], expected, rtol=TOL[dtype], atol=TOL[dtype], msg=label)
        g = torch.randn(full.shape, dtype=torch.float64).to(dtype)
        (grad,) = torch.autograd.grad(out, inp, g)
        assert torch.isfinite(grad).all(), label
        assert (grad[:, ~keep] == 0).all(), f"{label}: entries not there must get a zero gradient"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_a_row_with_nothing_there_gives_zeros(name, dtype):
    fn = FUNCTIONS[name]
    is_log = "(log)" in name
    x = make_rows(dtype, seed=1)
    x[1] = torch.finfo(dtype).min  # an additive mask over the whole row
    mask = torch.ones(x.shape, dtype=torch.bool)
    mask[2] = False
    inp = x.clone().requires_grad_(True)
    out = fn(inp, dim=-1, mask=mask)
    off = float("-inf") if is_log else 0.0
    assert (out[1:3].double() == off).all()
    assert torch.isfinite(out[[0, 3]]).all()
    (grad,) = torch.autograd.grad(out, inp, torch.ones_like(out))
    assert torch.isfinite(grad).all() and (grad[1:3] == 0).all()


def test_values_above_half_of_finfo_min_are_there():
    # -1e4 in float16 is a very negative score, not a mask: it keeps its (tiny) softmax weight.
    x = torch.tensor([[0.0, -1e4, 1.0]], dtype=torch.float16)
    assert sparsenorm.ev_softmax_train(x.float().double(), eps=0.5)[0, 1] == 0  # underflows either way
    log_p = sparsenorm.log_ev_softmax_train(x, eps=0.5)
    assert torch.isfinite(log_p).all()
    assert sparsenorm.log_ev_softmax_train(torch.tensor([[0.0, -32752.0, 1.0]], dtype=torch.float16))[0, 1] == -math.inf


def test_mask_must_be_boolean_and_broadcast():
    x = torch.randn(2, 5)
    with pytest.raises(TypeError, match="mask"):
        sparsenorm.sparsemax(x, mask=torch.ones(2, 5))
    with pytest.raises(ValueError, match="mask"):
        sparsenorm.r_softmax(x, 0.5, mask=torch.ones(3, 5, dtype=torch.bool))
    # a broadcastable mask (one per column) works
    out = sparsenorm.t_softmax(x, 1.0, mask=torch.tensor([True, True, False, True, True]))
    assert (out[:, 2] == 0).all()


def test_modules_take_mask():
    x = torch.randn(3, 7)
    mask = torch.rand(3, 7) > 0.3
    mask[:, 0] = True
    modules = [sparsenorm.EvSoftmax(), sparsenorm.EvSoftmaxTrain(), sparsenorm.LogEvSoftmaxTrain(),
               sparsenorm.Sparsemax(), sparsenorm.Entmax15(), sparsenorm.SparsemaxBisect(), sparsenorm.EntmaxBisect(),
               sparsenorm.TSoftmax(1.0), sparsenorm.RSoftmax(0.5), sparsenorm.SparseHourglass()]
    for module in modules:
        out = module(x, mask=mask)
        zero = float("-inf") if isinstance(module, sparsenorm.LogEvSoftmaxTrain) else 0.0
        assert (out[~mask] == zero).all(), type(module).__name__


# ------------------------------------------------------------------------------------------- losses
def _loss_cases():
    target_index = torch.tensor([0, 2, 4, 5])
    multi_hot = torch.zeros(4, N_VALID)
    multi_hot[[0, 0, 1, 2, 3], [0, 3, 2, 4, 5]] = 1.0
    return {
        "ev_softmax_nll_loss": (losses.ev_softmax_nll_loss, target_index),
        "ev_softmax_multilabel_loss": (losses.ev_softmax_multilabel_loss, multi_hot),
        "sparsemax_loss": (losses.sparsemax_loss, target_index),
        "sparsemax_bisect_loss": (losses.sparsemax_bisect_loss, target_index),
        "entmax15_loss": (losses.entmax15_loss, target_index),
        "entmax_bisect_loss": (losses.entmax_bisect_loss, target_index),
        "entmax_bisect_loss (dist)": (losses.entmax_bisect_loss, multi_hot),
        "sparsehourglass_hinge_loss": (losses.sparsehourglass_hinge_loss, target_index),
        "sparsehourglass_multilabel_hinge_loss": (losses.sparsehourglass_multilabel_hinge_loss, multi_hot),
        "r_softmax_loss": (losses.r_softmax_loss, multi_hot),
        "t_softmax_loss": (losses.t_softmax_loss, multi_hot),
    }


LOSSES = _loss_cases()


def _pad_target(target, keep):
    if target.is_floating_point():
        full = torch.zeros(target.shape[0], keep.numel())
        full[:, keep] = target
        return full
    return keep.nonzero().squeeze(1)[target]  # the class indices in the padded layout


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(LOSSES))
def test_every_loss_leaves_out_what_is_not_there(name, dtype):
    loss_fn, target = LOSSES[name]
    x = make_rows(dtype, seed=2)
    expected = loss_fn(x, target.to(dtype) if target.is_floating_point() else target, reduction="none").double()
    for label, pad_value in padding_variants(dtype):
        full, keep = padded(x, pad_value)
        t = _pad_target(target, keep)
        t = t.to(dtype) if t.is_floating_point() else t
        inp = full.clone().requires_grad_(True)
        mask = keep.expand_as(full) if pad_value is None else None
        out = loss_fn(inp, t, reduction="none", mask=mask)
        assert out.dtype == dtype
        torch.testing.assert_close(out.double(), expected, rtol=10 * TOL[dtype], atol=10 * TOL[dtype], msg=label)
        (grad,) = torch.autograd.grad(out.sum(), inp)
        assert torch.isfinite(grad).all(), label
        assert (grad[:, ~keep] == 0).all(), label
