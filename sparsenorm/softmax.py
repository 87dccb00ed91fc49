"""Softmax, the dense baseline, under sparsenorm's "not there" rule, for the registry's ``softmax`` entry.

A class is not there when ``mask == False``, its logit is ``-inf``, or it is ``<= finfo(dtype).min / 2``
(:func:`sparsenorm._validation.mark_not_there`): it gets exactly 0 probability (``-inf`` log-probability),
and a row with no class there gives zeros (``-inf`` logs), never NaN.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ._validation import run_on_rows


def _softmax_rows(z: Tensor) -> Tensor:
    """Rows on the last dim, not-there entries already ``-inf``: a row with none there gives zeros;
    a NaN entry is there, so its row stays NaN (as every normalizer's)."""
    empty = (z == float("-inf")).all(-1, keepdim=True)
    return torch.softmax(z, -1).masked_fill(empty, 0.0)


def _log_softmax_rows(z: Tensor) -> Tensor:
    empty = (z == float("-inf")).all(-1, keepdim=True)
    return torch.log_softmax(z.masked_fill(empty, 0.0), -1).masked_fill(empty | (z == float("-inf")),
                                                                        float("-inf"))


def masked_softmax(x: Tensor, dim: int = -1, mask: Optional[Tensor] = None) -> Tensor:
    r"""``torch.softmax`` with the "not there" rule: :math:`p_i = e^{x_i} / \sum_{j \text{ there}} e^{x_j}`
    over the entries that are there, 0 elsewhere; a row with none there gives zeros (not NaN).
    Through the one entry path (``_validation.run_on_rows``), so argument checks and dtypes are those
    of every normalizer."""
    return run_on_rows(_softmax_rows, x, dim, mask)


def masked_log_softmax(x: Tensor, dim: int = -1, mask: Optional[Tensor] = None) -> Tensor:
    """``torch.log_softmax`` with the "not there" rule (log 0 = ``-inf``; a row with none there: all ``-inf``)."""
    return run_on_rows(_log_softmax_rows, x, dim, mask)


__all__ = ["masked_softmax", "masked_log_softmax"]
