"""Fuzzing every registry loss (single- and multi-label), driven by the registry (issue 25, item 3).

Inputs: logits ``(N, C)`` or ``(N, C, d)`` in every dtype, magnitudes up to 1e4, subnormals, classes
that are not there (``-inf`` or ``finfo.min``) off the target; class-index targets with ignored
rows, or multi-hot targets. Invariants: per-row losses are finite and non-negative (every loss
here is a Fenchel-Young loss, a negative log-likelihood or a hinge: >= 0, up to rounding),
ignored rows give exactly 0, ``'mean'`` is the sum over the rows that count divided by their
number, gradients are finite, and the kernel path equals the reference path.

A ``'mean'`` over no counted row (an empty batch, or every row ignored): sparsenorm's own losses
give 0 with a zero gradient (documented in ``sparsenorm.losses._common.reduce_loss``: no silent
NaN); the softmax entries' losses are ``torch.nn.functional.cross_entropy`` itself, which gives
NaN there (0 / 0), and that is what is expected of them.

Error model: a loss is a few n-term sums of ``z``-sized terms, so its rounding error is at most
``C (C + 2) eps_c max(1, |z|)`` (``eps_c`` the compute dtype's epsilon), plus the rounding of
the result to the output dtype. Its gradient is ``J^T v`` plus terms that are exact on both paths
(hinge counts): ``v`` (``p - q`` or its like) carries that error, and ``J``, the normalizer's
Jacobian, has entries up to the oracle's ``grad_scale`` (``1 + 1 / w_eff`` for r-/t-softmax,
whose ``e = p / w`` is huge where the quantile sits within rounding of an entry; 1 for the
others), so the kernel and reference gradients may differ by ``4 (C + 1) grad_scale`` times
that error, plus each one's rounding to the output dtype. A row whose float64 loss exceeds the
dtype's range (float16 hinges over logits near 1e4) is only checked for its ignored-row zero. Where even
``C (C + 1) grad_scale`` overflows the dtype the exact gradient is not representable and its finiteness is not asserted.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from fuzz_inputs import DTYPES, FUZZ, values
from fuzz_oracles import C_OPS, ORACLES
from sparsenorm import kernels, registry
from sparsenorm._validation import compute_dtype

IGNORE = -100
CASES = [(name, kind) for name in registry.names() for kind in ("single", "multi")]


@st.composite
def batches(draw, kind):
    dtype = draw(st.sampled_from(DTYPES))
    n, c = draw(st.integers(0, 5)), draw(st.integers(1, 6))
    extra = (draw(st.integers(1, 3)),) if draw(st.booleans()) else ()
    shape = (n, c) + extra
    logits = draw(values(shape, dtype)).double()
    # finite logits that are there; the classes that are not there (never the target) come below
    logits = torch.nan_to_num(logits, nan=0.0, posinf=0.0, neginf=0.0)
    logits = logits.masked_fill(logits <= torch.finfo(dtype).min / 2, 0.0)
    rows = torch.Size((n,) + extra)
    gone = torch.tensor(draw(st.lists(st.booleans(), min_size=math.prod(shape), max_size=math.prod(shape))),
                        dtype=torch.bool).reshape(shape) & draw(st.booleans())
    if kind == "single":
        target = torch.tensor(draw(st.lists(st.sampled_from([IGNORE] + list(range(c))), min_size=rows.numel(),
                                            max_size=rows.numel())), dtype=torch.long).reshape(rows)
        on_target = torch.nn.functional.one_hot(target.clamp_min(0), c).movedim(-1, 1).bool()
        gone &= ~on_target
    else:
        target = torch.tensor(draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=math.prod(shape),
                                            max_size=math.prod(shape)))).reshape(shape)
        gone &= target == 0
    fill = draw(st.sampled_from([-math.inf, torch.finfo(dtype).min]))
    logits = logits.to(dtype).masked_fill(gone, fill)
    if kind == "multi":
        target = target.to(dtype)
    return logits.requires_grad_(True), target


def jacobian_scale(name, logits):
    """The largest ``grad_scale`` of the normalizer's oracle over the rows (classes on dim 1)."""
    entry, cdt = registry.get(name), compute_dtype(logits)
    z = logits.detach().double().movedim(1, -1)
    z = z.reshape(-1, z.shape[-1])
    scale = 1.0
    for row in z:
        row = row[row > torch.finfo(logits.dtype).min / 2]
        if row.numel():
            scale = max(scale, ORACLES[name](row, entry.params, "forward", cdt).grad_scale)
    return scale


def loss_of(entry, kind):
    return entry.single_label_loss if kind == "single" else entry.multi_label_loss


def run(loss, logits, target):
    per_row = loss(logits, target, reduction="none")
    grad = torch.autograd.grad(per_row.sum(), logits)[0] if per_row.numel() else torch.zeros_like(logits)
    return per_row.detach(), grad


@pytest.mark.parametrize("name,kind", CASES, ids=[f"{n}-{k}" for n, k in CASES])
@FUZZ
@given(data=st.data())
def test_loss_on_fuzzed_input(name, kind, data):
    logits, target = data.draw(batches(kind), label="batch")
    entry = registry.get(name)
    loss = loss_of(entry, kind)
    per_row, grad = run(loss, logits, target)
    counted = target != IGNORE if kind == "single" else torch.ones(per_row.shape, dtype=torch.bool)

    assert per_row.shape == tuple(logits.shape[:1] + logits.shape[2:])
    there = torch.where(logits.detach() > torch.finfo(logits.dtype).min / 2, logits.detach().double(), 0.0)
    z_max = max(1.0, there.abs().max().item()) if there.numel() else 1.0
    c = logits.shape[1]
    tol = C_OPS * (c + 2) * torch.finfo(compute_dtype(logits)).eps * z_max
    rows = per_row.double()
    # the pair hinges sum |z_i - z_j| over up to C^2 pairs: in float16 the exact loss itself may
    # exceed finfo.max (e.g. logits near 1e4); finiteness is asserted where the float64 loss fits
    exact = loss(logits.detach().double(), target if kind == "single" else target.double(), reduction="none")
    fits = exact.abs() < torch.finfo(logits.dtype).max / 2
    assert torch.isfinite(rows[fits]).all(), f"loss not finite: {rows.tolist()}"
    assert (rows[~counted] == 0).all(), "an ignored row must give exactly 0"
    if not fits.all():
        return
    assert (rows >= -tol).all(), f"negative loss beyond rounding ({tol:.3g}): {rows.tolist()}"
    jac = jacobian_scale(name, logits)
    representable = C_OPS * (c + 1) * jac < torch.finfo(logits.dtype).max
    assert torch.isfinite(grad).all() or not representable, f"gradient not finite: {grad.tolist()}"
    mean = loss(logits, target, reduction="mean").double()
    if not counted.any():
        if entry.single_label_loss is F.cross_entropy:  # torch's own loss: its 0 / 0
            assert torch.isnan(mean), f"torch's cross_entropy gives NaN for a mean over no row, got {mean}"
        else:
            assert mean == 0, f"a mean over no counted row is 0 (reduce_loss), got {mean}"
            (mean_grad,) = torch.autograd.grad(loss(logits, target, reduction="mean"), logits)
            assert (mean_grad == 0).all(), "a mean over no counted row has a zero gradient"
    expected_mean = rows.sum() / max(int(counted.sum()), 1)
    out_eps = torch.finfo(logits.dtype).eps
    # the mean may be summed in the output dtype (torch's float16 cross_entropy): n roundings of
    # a partial sum of at most sum|rows|, then the division's
    n_rows = max(int(counted.sum()), 1)
    bound = tol + out_eps * ((rows.numel() + 1) * rows.abs().sum() / n_rows + 1)
    assert not counted.any() or abs(mean - expected_mean) <= bound

    if entry.cpu_kernel:
        with kernels.disabled():
            per_row_r, grad_r = run(loss, logits, target)
        bound = 2 * tol + out_eps * rows.abs()
        assert ((rows - per_row_r.double()).abs() <= bound).all(), (
            f"kernel {rows.tolist()} != reference {per_row_r.tolist()}")
        if not representable:
            return
        # J^T v, v = p - q (or its like) within the probabilities' error model (module docstring)
        g_bound = 4 * (c + 1) * jac * (tol + out_eps) + out_eps * torch.maximum(grad.double().abs(),
                                                                              grad_r.double().abs())
        assert ((grad.double() - grad_r.double()).abs() <= g_bound).all(), (
            f"kernel grad {grad.tolist()} != reference {grad_r.tolist()}")
