"""The perturbation mode: ``SPARSENORM_TEST_NUDGE=<salt>`` moves the rounded quantities that decide
the PyTorch reference path's supports (attention scores, ev-softmax's row mean) by +-1 or +-2 ulp, so
that every comparison between the reference and another path (C++ or Triton kernel, blockwise against dense,
compiled against eager) is exercised as on a machine where the two round differently (issue 34). A test that
passes only because both paths happened to round alike fails in this mode.

The nudge is a deterministic function of each value's bits and the salt: the same score gives the
same nudged score in the forward and in the backward (which recomputes it), so a path stays
consistent with itself. It is an identity for autograd (``x + (nudged - x).detach()``), and
leaves 0, +-inf, NaN and huge values (masks: ``finfo.min``) alone. Each run with another salt picks
other directions.
"""
from __future__ import annotations

import functools
import os

import torch
from torch import Tensor

ENV = "SPARSENORM_TEST_NUDGE"

_INT_OF = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
           torch.float64: torch.int64}

# (module, attribute, what to nudge): the returned value of each function below is a rounded
# quantity that decides a support and that another path computes in its own way (the C++ and
# Triton kernels their own dot products and sums; the dense path its own matmul): attention score
# blocks (evidential and searched, forward and backward alike, since they recompute from the same
# inputs through the same function), and ev-softmax's row mean. Not nudged: the inputs (no rounding
# produced them, so no other machine sees them differently); the attention threshold function,
# which the C++ kernel calls itself (bit for bit the same on any machine); the thresholds of
# sparsemax, entmax, r/t-softmax and sparsehourglass, continuous maps compared by value (an entry at
# tau has probability 0 on either side; r-softmax's tau is torch.lerp's formula in both paths).
TARGETS = [
    ("sparsenorm.kernels.reference.evidential", "row_mean"),
    ("sparsenorm.kernels.reference.evidential_attention", "score_block"),
    ("sparsenorm.kernels.reference.projection_attention", "_Grouped.scores"),
]


def salt() -> int | None:
    value = os.environ.get(ENV, "")
    return int(value) if value.strip() else None


def nudge(x, salt: int):
    """``x`` with each finite nonzero entry moved by -2, -1, +1 or +2 ulp (chosen by its bits and ``salt``)."""
    if not isinstance(x, Tensor) or x.dtype not in _INT_OF or x.numel() == 0:
        return x
    with torch.no_grad():
        xd = x.detach()
        bits = xd.contiguous().view(_INT_OF[xd.dtype]).to(torch.int64)
        h = bits * 0x9E3779B1 + salt * 0x85EBCA6B
        h = (h ^ (h >> 15)) & 3  # 0..3
        steps = torch.tensor([-2, -1, 1, 2], device=xd.device)[h]
        movable = torch.isfinite(xd) & (xd != 0) & (xd.abs() <= torch.finfo(xd.dtype).max / 4)
        direction = torch.where(steps > 0, torch.full_like(xd, float("inf")), torch.full_like(xd, float("-inf")))
        y = xd.clone()
        for step in (1, 2):
            y = torch.where(movable & (steps.abs() >= step), torch.nextafter(y, direction), y)
    return x + (y - xd) if x.requires_grad else y


def install(monkeypatch, salt: int) -> None:
    """Wrap every function in ``TARGETS`` so that its result is nudged."""
    import importlib

    for module_name, path in TARGETS:
        owner = importlib.import_module(module_name)
        *parents, name = path.split(".")
        for parent in parents:
            owner = getattr(owner, parent)
        original = getattr(owner, name)

        @functools.wraps(original)
        def wrapped(*args, __original=original, **kwargs):
            return nudge(__original(*args, **kwargs), salt)

        monkeypatch.setattr(owner, name, wrapped)
