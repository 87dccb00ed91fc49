"""The multi-label loss of the registry's ``softmax`` entry (its single-label loss is ``F.cross_entropy``)."""
from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def softmax_multilabel_loss(logits: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """Cross-entropy to the normalized label vector ``y / |y|`` (rows with no label give 0).

    Args:
        logits: ``(N, C)`` (classes on dim 1, as ``F.cross_entropy``).
        target: multi-hot (or non-negative weights) of the logits' shape, floating.
        reduction: ``'mean'`` | ``'sum'`` | ``'none'``, as ``F.cross_entropy``.
    """
    dist = target / target.sum(dim=1, keepdim=True).clamp_min(1)
    return F.cross_entropy(logits, dist, reduction=reduction)
