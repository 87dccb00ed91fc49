"""float32 accuracy of ev-softmax (issue 8, item 3): as accurate as a masked ``torch.softmax``.

Oracle: ev-softmax evaluated in float64 on the same float32 inputs. Bound: the error of
``torch.softmax`` of the same float32 logits masked to the same support (the masked-softmax
level; within 1.5x of it), at logit scales 1 to 1e4, on both the reference path and the CPU
kernel (where built).
"""
from __future__ import annotations

import pytest
import torch

from sparsenorm import ev_softmax, ev_softmax_train, kernels

SCALES = [1.0, 10.0, 100.0, 1e3, 1e4]


def inputs(scale, seed=0):
    """Short rows (where centering at the mean cost accuracy most) and long ones."""
    rows = []
    for k, n in ((4, 2000), (10, 2000), (1000, 100)):
        gen = torch.Generator().manual_seed(seed + k)
        x = (torch.randn(n, k, generator=gen, dtype=torch.float64) * scale).float()
        # keep rows whose entries are clear of the mean, so float32 and float64 agree on the support
        x64 = x.double()
        gap = (x64 - x64.mean(-1, keepdim=True)).abs().amin(-1)
        rows.append(x[gap > 1e-4 * scale])
    return rows


@pytest.mark.parametrize("path", ["default", "reference"])
@pytest.mark.parametrize("scale", SCALES)
def test_ev_softmax_float32_error_is_at_masked_softmax_level(scale, path):
    for x in inputs(scale):
        _check_ev_softmax_accuracy(x, path)


def _check_ev_softmax_accuracy(x, path):
    assert x.shape[0] > 50
    if path == "reference":
        with kernels.disabled():
            got = ev_softmax(x)
    else:
        got = ev_softmax(x)
    exact = ev_softmax(x.double())
    support = x.double() >= x.double().mean(-1, keepdim=True)
    assert not ((got > 0) & ~support).any()  # (on the support, float32 may underflow to 0)
    masked_softmax = torch.softmax(x.masked_fill(~support, float("-inf")), -1)
    softmax_err = (masked_softmax.double() - exact).abs().max().item()
    err = (got.double() - exact).abs().max().item()
    assert err <= 1.5 * softmax_err + 1e-12, (err, softmax_err)


@pytest.mark.parametrize("scale", SCALES)
def test_ev_softmax_train_float32_error_is_at_softmax_level(scale):
    for x in inputs(scale, seed=1):
        _check_train_accuracy(x)


def _check_train_accuracy(x):
    exact = ev_softmax_train(x.double(), eps=0.1)
    support = x >= x.double().mean(-1, keepdim=True)
    shift = torch.log(torch.tensor(0.1)) - torch.log1p(torch.tensor(0.1))
    softmax_err = (torch.softmax(torch.where(support, x, x + shift), -1).double() - exact).abs().max().item()
    for disable in (False, True):
        if disable:
            with kernels.disabled():
                got = ev_softmax_train(x, eps=0.1)
        else:
            got = ev_softmax_train(x, eps=0.1)
        assert (got.double() - exact).abs().max().item() <= 1.5 * softmax_err + 1e-12
