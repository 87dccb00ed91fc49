"""ev-softmax (Eq. 7), its training form (Eq. 10) and the log of Eq. 10 on rows along the last dim.

Entries at or below ``finfo.min / 2`` (``-inf`` included) are not there: left out of the mean,
probability 0 (log ``-inf``). The threshold is ``min(mean, max)`` over the entries that are there:
ties with the mean are kept (``>=``), and rounding of the mean of near-equal entries can never
empty a row. A row with no entry there gives zeros (log: ``-inf``); NaN or ``+inf`` makes the row
NaN. Probabilities are ``softmax`` of ``x`` with the off-support entries replaced, so they are
exactly as accurate as a masked ``torch.softmax``. Sync-free: only tensor ops, static shapes.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from ..._validation import not_there_level


def off_support_shift(eps: float) -> float:
    """Eq. 10's weight ``(1{on} + eps)`` as a log-shift of the off-support entries: the constant
    ``log(1 + eps)`` is subtracted from every entry (softmax ignores it)."""
    return math.log(eps) - math.log1p(eps)


def row_mean(x: Tensor, valid: Tensor, count: Tensor) -> Tensor:
    """The mean of each row's entries that are there (``(..., 1)``): the one rounded quantity that
    decides the support (the C++ kernel sums it in double, in another order)."""
    total = torch.where(valid, x, torch.zeros((), dtype=x.dtype, device=x.device)).sum(-1, keepdim=True)
    return total / count.clamp_min(1)


def ev_softmax_forward(x: Tensor, eps: Optional[float], log: bool) -> Tensor:
    """``eps=None`` or ``0``: Eq. 7 (log: ``-inf`` off the support); else Eq. 10."""
    valid = ~(x <= not_there_level(x.dtype))  # NaN counts as there, so it reaches the row's output
    count = valid.sum(-1, keepdim=True)
    threshold = torch.minimum(row_mean(x, valid, count), x.amax(-1, keepdim=True))
    on = x >= threshold
    neg_inf = torch.full((), -math.inf, dtype=x.dtype, device=x.device)
    if eps is None or eps == 0.0:
        z = torch.where(on, x, neg_inf)
    else:
        z = torch.where(valid, torch.where(on, x, x + off_support_shift(eps)), neg_inf)
    out = torch.log_softmax(z, -1) if log else torch.softmax(z, -1)
    return out.masked_fill(count == 0, -math.inf if log else 0.0)
