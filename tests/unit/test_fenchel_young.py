"""Fenchel–Young losses of sparsemax / entmax: values, gradients, conventions, errors.

Oracles: the ``entmax`` package's losses, the sparsemax paper's formulas (multi-class and
multi-label, and the modified Huber loss in the binary case), and the closed-form gradient p* - q.
"""
from __future__ import annotations

import math

import entmax
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.autograd import gradcheck

from sparsenorm import entmax15, entmax_bisect, sparsemax
from sparsenorm.losses import (
    Entmax15Loss,
    EntmaxBisectLoss,
    SparsemaxBisectLoss,
    SparsemaxLoss,
    entmax15_loss,
    entmax_bisect_loss,
    sparsemax_bisect_loss,
    sparsemax_loss,
)

LOSSES = {
    "sparsemax": (sparsemax_loss, entmax.sparsemax_loss, {}),
    "sparsemax_bisect": (sparsemax_bisect_loss, entmax.sparsemax_bisect_loss, {}),
    "entmax15": (entmax15_loss, entmax.entmax15_loss, {}),
    "entmax_bisect": (entmax_bisect_loss, entmax.entmax_bisect_loss, {}),
}
MAPS = {
    "sparsemax": sparsemax,
    "sparsemax_bisect": sparsemax,
    "entmax15": entmax15,
    "entmax_bisect": lambda z: entmax_bisect(z, 1.5),
}


def _data(n=7, c=5, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, c, generator=g, dtype=dtype) * 2
    y = torch.randint(0, c, (n,), generator=g)
    return z, y


# ----------------------------------------------------------------------------- agreement with entmax

@pytest.mark.parametrize("name", list(LOSSES))
def test_per_example_values_and_gradients_match_entmax(name):
    ours_fn, ref_fn, _ = LOSSES[name]
    z, y = _data()
    zr = z.clone().requires_grad_(True)
    zo = z.clone().requires_grad_(True)
    ours = ours_fn(zo, y, reduction="none")
    ref = ref_fn(zr, y)
    assert torch.allclose(ours, ref, atol=1e-12)
    g = torch.rand(len(y), dtype=torch.float64)
    assert torch.allclose(torch.autograd.grad(ours, zo, g)[0], torch.autograd.grad(ref, zr, g)[0], atol=1e-12)


@pytest.mark.parametrize("alpha", [1.2, 1.5, 2.0, 2.5])
def test_entmax_bisect_loss_matches_entmax_for_alpha(alpha):
    z, y = _data(seed=1)
    assert torch.allclose(entmax_bisect_loss(z, y, alpha=alpha, reduction="none"),
                          entmax.entmax_bisect_loss(z, y, alpha=alpha), atol=1e-12)


@pytest.mark.parametrize("reduction", ["elementwise_mean", "sum", "none"])
def test_modules_match_entmax_modules(reduction):
    z, y = _data(n=9, seed=2)
    y[2] = 1
    y[5] = 1
    pairs = [
        (SparsemaxLoss(k=2, ignore_index=1, reduction=reduction),
         entmax.SparsemaxLoss(k=2, ignore_index=1, reduction=reduction)),
        (Entmax15Loss(k=3, ignore_index=1, reduction=reduction),
         entmax.Entmax15Loss(k=3, ignore_index=1, reduction=reduction)),
        (SparsemaxBisectLoss(n_iter=50, reduction=reduction),
         entmax.SparsemaxBisectLoss(n_iter=50, reduction=reduction)),
        (EntmaxBisectLoss(alpha=1.7, n_iter=50, reduction=reduction),
         entmax.EntmaxBisectLoss(alpha=1.7, n_iter=50, reduction=reduction)),
    ]
    for ours, ref in pairs:
        assert torch.allclose(ours(z, y), ref(z, y), atol=1e-12), type(ours).__name__


def test_module_defaults_are_entmax_defaults():
    assert SparsemaxLoss().reduction == "elementwise_mean" and SparsemaxLoss().k is None
    assert Entmax15Loss().k == 100 and Entmax15Loss().ignore_index == -100
    assert EntmaxBisectLoss().alpha == 1.5 and EntmaxBisectLoss().n_iter == 50
    assert SparsemaxBisectLoss().n_iter == 50


# ----------------------------------------------------------------------------- the papers' formulas

def test_sparsemax_loss_is_the_papers_formula_multiclass_and_multilabel():
    """L(z; q) = -q^T z + 1/2 sum_{j in S}(z_j^2 - tau^2) + 1/2 ||q||^2 (Martins & Astudillo 2016)."""
    torch.manual_seed(3)
    z = torch.randn(6, 7, dtype=torch.float64) * 2
    y = (torch.rand(6, 7) < 0.4).to(torch.float64)
    y[:, 0] = 1.0  # every row has a label
    q = y / y.sum(-1, keepdim=True)
    p = sparsemax(z)
    on = p > 0
    tau = ((z - p) * on).sum(-1) / on.sum(-1)
    literal = -(q * z).sum(-1) + 0.5 * ((z ** 2 - tau.unsqueeze(-1) ** 2) * on).sum(-1) + 0.5 * (q ** 2).sum(-1)
    assert torch.allclose(sparsemax_loss(z, y, reduction="none"), literal, atol=1e-12)  # multi-hot -> y/|y|
    assert torch.allclose(sparsemax_loss(z, q, reduction="none"), literal, atol=1e-12)
    idx = torch.arange(6) % 7
    onehot = torch.nn.functional.one_hot(idx, 7).to(torch.float64)
    literal_mc = -(z.gather(1, idx[:, None]).squeeze(1)) + 0.5 * ((z ** 2 - tau.unsqueeze(-1) ** 2) * on).sum(-1) + 0.5
    assert torch.allclose(sparsemax_loss(z, idx, reduction="none"), literal_mc, atol=1e-12)
    assert torch.allclose(sparsemax_loss(z, onehot, reduction="none"), literal_mc, atol=1e-12)


def test_sparsemax_loss_binary_is_modified_huber():
    """For z = (t, 0) and target 0: p_0 = clip((1 + t)/2, 0, 1) and the loss is the modified Huber
    loss of the margin t scaled by 1/4: 0 for t >= 1, (1 - t)^2 / 4 on [-1, 1], -t for t <= -1."""
    t = torch.linspace(-4, 4, 161, dtype=torch.float64)
    offset = torch.randn(161, dtype=torch.float64)  # only the margin matters
    z = torch.stack([t + offset, offset], -1)
    loss = sparsemax_loss(z, torch.zeros(161, dtype=torch.long), reduction="none")
    huber = torch.where(t >= 1, torch.zeros_like(t), torch.where(t <= -1, -t, (1 - t) ** 2 / 4))
    assert torch.allclose(loss, huber, atol=1e-12)


@pytest.mark.parametrize("name", list(LOSSES))
def test_gradient_is_prediction_minus_target(name):
    fn = LOSSES[name][0]
    z, y = _data(seed=4)
    z.requires_grad_(True)
    (g,) = torch.autograd.grad(fn(z, y, reduction="sum"), z)
    expect = MAPS[name](z.detach()) - torch.nn.functional.one_hot(y, z.shape[1]).to(z.dtype)
    assert torch.allclose(g, expect, atol=1e-12)
    q = torch.softmax(torch.randn_like(z), -1)
    (g,) = torch.autograd.grad(fn(z, q, reduction="sum"), z)
    assert torch.allclose(g, MAPS[name](z.detach()) - q, atol=1e-12)


@pytest.mark.parametrize("name", list(LOSSES))
def test_gradcheck(name):
    fn = LOSSES[name][0]
    z, y = _data(n=4, c=5, seed=5)
    z.requires_grad_(True)
    kw = {"n_iter": 80} if "bisect" in name else {}
    assert gradcheck(lambda t: fn(t, y, **kw), (z,))
    q = torch.softmax(torch.randn(4, 5, dtype=torch.float64), -1)
    assert gradcheck(lambda t: fn(t, q, reduction="none", **kw), (z,))


def test_gradcheck_alpha():
    z, y = _data(n=4, c=5, seed=6)
    z.requires_grad_(True)
    shared = torch.tensor(1.6, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda t, a: entmax_bisect_loss(t, y, alpha=a, n_iter=80), (z, shared))
    per_row = torch.tensor([1.2, 1.5, 2.0, 3.0], dtype=torch.float64, requires_grad=True)
    q = torch.softmax(torch.randn(4, 5, dtype=torch.float64), -1)
    assert gradcheck(lambda t, a: entmax_bisect_loss(t, q, alpha=a, n_iter=80, reduction="sum"), (z, per_row))
    module = EntmaxBisectLoss(alpha=torch.nn.Parameter(torch.tensor(1.5, dtype=torch.float64)))
    module(z, y).backward()
    assert module.alpha.grad is not None and torch.isfinite(module.alpha.grad)


# ------------------------------------------------------------------------ non-negativity, zero at perfect prediction

@settings(max_examples=60, deadline=None)
@given(st.integers(2, 12), st.integers(0, 10_000), st.floats(0.01, 50.0), st.sampled_from(list(LOSSES)))
def test_nonnegative(c, seed, scale, name):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(3, c, generator=g, dtype=torch.float64) * scale
    y = torch.randint(0, c, (3,), generator=g)
    q = torch.softmax(torch.randn(3, c, generator=g, dtype=torch.float64) * 3, -1)
    fn = LOSSES[name][0]
    assert (fn(z, y, reduction="none") >= 0).all()
    assert (fn(z, q, reduction="none") >= 0).all()


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 12), st.integers(0, 10_000), st.sampled_from([1.25, 1.5, 2.0, 3.0]))
def test_zero_at_perfect_prediction(c, seed, alpha):
    g = torch.Generator().manual_seed(seed)
    q = torch.rand(2, c, generator=g, dtype=torch.float64)
    q = torch.where(q < 0.3, torch.zeros_like(q), q)
    q[:, 0] += 0.1
    q = q / q.sum(-1, keepdim=True)
    # The logits whose prediction is exactly q: p = [(alpha-1) z - tau]_+^(1/(alpha-1)) with tau = 0.
    z = q ** (alpha - 1) / (alpha - 1)
    assert entmax_bisect_loss(z, q, alpha=alpha, reduction="none").abs().max() < 1e-9
    if alpha == 2.0:
        assert sparsemax_loss(z, q, reduction="none").abs().max() < 1e-12
    if alpha == 1.5:
        assert entmax15_loss(z, q, reduction="none").abs().max() < 1e-12
    # A class index predicted with certainty (margin > 1 for sparsemax, > 2 for 1.5-entmax).
    y = torch.randint(0, c, (2,), generator=g)
    z_hard = torch.nn.functional.one_hot(y, c).to(torch.float64) * 2.5
    for fn in (sparsemax_loss, entmax15_loss, sparsemax_bisect_loss):
        assert fn(z_hard, y, reduction="none").abs().max() < 1e-12


# ----------------------------------------------------------------------------- CrossEntropyLoss conventions

@pytest.mark.parametrize("name", list(LOSSES))
def test_reductions_ignore_index_and_weight(name):
    fn = LOSSES[name][0]
    z, y = _data(n=8, c=4, seed=7)
    per = fn(z, y, reduction="none")
    assert per.shape == (8,)
    assert torch.equal(fn(z, y), per)  # per row by default, as the entmax package's functions
    assert torch.allclose(fn(z, y, reduction="sum"), per.sum())
    assert torch.allclose(fn(z, y, reduction="mean"), per.mean())
    assert torch.allclose(fn(z, y, reduction="elementwise_mean"), per.mean())
    for ignore in (-1, -100, 2):
        yi = y.clone()
        yi[[1, 4]] = ignore
        zi = z.clone().requires_grad_(True)
        out = fn(zi, yi, ignore_index=ignore, reduction="mean")
        keep = torch.ones(8, dtype=torch.bool)
        keep[[1, 4]] = False
        if ignore == 2:
            keep &= y != 2
        assert torch.allclose(out, per[keep & (yi != ignore)].mean())
        (g,) = torch.autograd.grad(out, zi)
        assert torch.equal(g[1], torch.zeros(4, dtype=torch.float64))
    w = torch.tensor([0.5, 1.0, 2.0, 3.0], dtype=torch.float64)
    assert torch.allclose(fn(z, y, weight=w, reduction="none"), per * w[y])
    assert torch.allclose(fn(z, y, weight=w, reduction="mean"), (per * w[y]).sum() / w[y].sum())
    # Everything ignored: 0 with a zero gradient (CrossEntropyLoss gives NaN here).
    zi = z.clone().requires_grad_(True)
    out = fn(zi, torch.full_like(y, -100), reduction="mean")
    assert out == 0 and torch.equal(torch.autograd.grad(out, zi)[0], torch.zeros_like(z))


@pytest.mark.parametrize("name", list(LOSSES))
def test_extra_dimensions(name):
    fn = LOSSES[name][0]
    torch.manual_seed(8)
    z = torch.randn(3, 5, 4, 2, dtype=torch.float64) * 2
    y = torch.randint(0, 5, (3, 4, 2))
    per = fn(z, y, reduction="none")
    assert per.shape == (3, 4, 2)
    flat = fn(z.movedim(1, -1).reshape(-1, 5), y.reshape(-1), reduction="none")
    assert torch.allclose(per.reshape(-1), flat, atol=1e-12)
    q = torch.softmax(torch.randn_like(z), 1)
    assert fn(z, q, reduction="none").shape == (3, 4, 2)
    single = fn(z[0, :, 0, 0], y[0, 0, 0], reduction="none")  # (C,) logits, scalar target
    assert torch.allclose(single, per[0, 0, 0])


def test_multilabel_conventions():
    torch.manual_seed(9)
    z = torch.randn(4, 6, dtype=torch.float64) * 2
    y = torch.tensor([[1, 0, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0], [0, 1, 0, 0, 0, 1], [1, 1, 1, 1, 1, 1]],
                     dtype=torch.float64)
    for fn in (sparsemax_loss, entmax15_loss):
        per = fn(z, y, reduction="none")
        assert torch.allclose(per, fn(z, 3 * y, reduction="none"))  # rows are normalized
        zr = z.clone().requires_grad_(True)
        out = fn(zr, y, reduction="none")
        assert out[1] == 0  # no label: no loss
        (g,) = torch.autograd.grad(out.sum(), zr)
        assert torch.equal(g[1], torch.zeros(6, dtype=torch.float64))
    with pytest.raises(ValueError, match="negative"):
        sparsemax_loss(z, -y)


def test_masked_classes_and_half_precision():
    z = torch.tensor([[1.0, -math.inf, 0.5, 0.2], [-math.inf, 2.0, 1.0, -math.inf]], dtype=torch.float64,
                     requires_grad=True)
    y = torch.tensor([0, 2])
    for fn in (sparsemax_loss, entmax15_loss, sparsemax_bisect_loss, entmax_bisect_loss):
        loss = fn(z, y, reduction="none")
        assert torch.isfinite(loss).all() and (loss >= 0).all()
        (g,) = torch.autograd.grad(loss.sum(), z)
        assert torch.isfinite(g).all() and g[0, 1] == 0
        assert fn(z, torch.tensor([1, 2]), reduction="none")[0] == math.inf  # target on an absent class
    zh = (torch.randn(8, 10) * 3).half().requires_grad_(True)
    yh = torch.randint(0, 10, (8,))
    loss = entmax15_loss(zh, yh, reduction="mean")
    assert loss.dtype == torch.float16 and torch.isfinite(loss)
    loss.backward()
    assert zh.grad.dtype == torch.float16 and torch.isfinite(zh.grad).all()


def test_errors():
    z, y = _data(n=4, c=3)
    with pytest.raises(ValueError):
        sparsemax_loss(z, y[:3])  # wrong number of targets
    with pytest.raises(ValueError):
        sparsemax_loss(z, torch.rand(4, 2, dtype=torch.float64))  # distribution of the wrong shape
    with pytest.raises(TypeError):
        sparsemax_loss(z, y.bool())
    with pytest.raises(TypeError):
        sparsemax_loss(z.long(), y)
    with pytest.raises(IndexError):
        sparsemax_loss(z, torch.tensor([0, 1, 2, 3]))
    with pytest.raises(ValueError, match="weight"):
        sparsemax_loss(z, y, weight=torch.ones(4))
    with pytest.raises(TypeError, match="positional"):
        sparsemax_loss(z, y, 5, torch.ones(3))  # weight is keyword-only: the third positional is entmax's k
    with pytest.raises(TypeError, match="weight"):
        sparsemax_loss(z, y, weight=[1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="reduction"):
        sparsemax_loss(z, y, reduction="avg")
    with pytest.raises(ValueError, match="reduction"):
        SparsemaxLoss(reduction="avg")
    with pytest.raises(ValueError, match="alpha"):  # 0 < alpha < 1 is accepted, as by entmax
        entmax_bisect_loss(z, y, alpha=0.0)
    with pytest.raises(ValueError, match="k"):
        entmax15_loss(z, y, k=0)
    with pytest.raises(ValueError, match="n_iter"):
        SparsemaxBisectLoss(n_iter=0)
