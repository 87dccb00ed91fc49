"""The multi-label loss of the registry's ``softmax`` entry (its single-label loss is ``F.cross_entropy``)."""
from __future__ import annotations

import torch
from torch import Tensor

from .._validation import check_floating
from ..softmax import masked_log_softmax


def softmax_multilabel_loss(logits: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """Cross-entropy to the normalized label vector ``y / |y|`` (rows with no label give 0), reduced
    as ``F.cross_entropy`` with probability targets ('mean' divides by the number of rows).

    Classes that are not there (``-inf``, ``<= finfo.min / 2``) have log-probability ``-inf``;
    only labelled classes enter the sum, so an unlabelled class that is not there adds 0, not
    ``0 * -inf = NaN`` as ``F.cross_entropy`` gives (found by the fuzz suite).

    Args:
        logits: ``(N, C)`` (classes on dim 1, as ``F.cross_entropy``).
        target: multi-hot (or non-negative weights) of the logits' shape, floating.
        reduction: ``'mean'`` | ``'sum'`` | ``'none'``, as ``F.cross_entropy``.
    """
    check_floating(logits, "logits")
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    dist = target / target.sum(dim=1, keepdim=True).clamp_min(1)
    log_p = masked_log_softmax(logits, dim=1)
    per_row = -torch.where(dist > 0, dist * log_p, torch.zeros((), dtype=log_p.dtype)).sum(1)
    if reduction == "none":
        return per_row
    return per_row.sum() if reduction == "sum" else per_row.mean()


__all__ = ["softmax_multilabel_loss"]
