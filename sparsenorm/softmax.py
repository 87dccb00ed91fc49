"""Softmax, the dense baseline, under sparsenorm's "not there" rule, for the registry's ``softmax`` entry.

A class is not there when ``mask == False``, its logit is ``-inf``, or it is ``<= finfo(dtype).min / 2``
(:func:`sparsenorm._validation.mark_not_there`): it gets exactly 0 probability (``-inf`` log-probability),
and a row with no class there gives zeros (``-inf`` logs), never NaN.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ._validation import mark_not_there


def masked_softmax(x: Tensor, dim: int = -1, mask: Optional[Tensor] = None) -> Tensor:
    r"""``torch.softmax`` with the "not there" rule: :math:`p_i = e^{x_i} / \sum_{j \text{ there}} e^{x_j}`
    over the entries that are there, 0 elsewhere; a row with none there gives zeros (not NaN)."""
    z = mark_not_there(x, mask)
    out = torch.softmax(z, dim).masked_fill(~(z > float("-inf")).any(dim, keepdim=True), 0.0)
    return out.to(x.dtype)


def masked_log_softmax(x: Tensor, dim: int = -1, mask: Optional[Tensor] = None) -> Tensor:
    """``torch.log_softmax`` with the "not there" rule (log 0 = ``-inf``; a row with none there: all ``-inf``)."""
    z = mark_not_there(x, mask)
    empty = ~(z > float("-inf")).any(dim, keepdim=True)
    return torch.log_softmax(z.masked_fill(empty, 0.0), dim).masked_fill(empty | (z == float("-inf")),
                                                                         float("-inf")).to(x.dtype)
