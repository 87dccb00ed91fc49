"""Hinge losses for sparsehourglass (Laha et al., NeurIPS 2018), multi-class and multi-label.

Formulas from ``shared/papers/README.md``, with ``alpha = alpha(z)`` the sparsehourglass scale
(:func:`sparsenorm.hourglass.hourglass_scale`, a function of the logits, differentiated through):

* multi-class: ``L(z; y) = sum_j max(1{j != y} - alpha z_y + alpha z_j, 0) / alpha``;
* multi-label, with ``eta = y / |y|_1`` and over ordered pairs ``(i, j)``, ``Delta rho =
  (eta_i - eta_j) / alpha``, ``Delta z = z_i - z_j``: ``|Delta rho - Delta z| / 2`` when both
  labels are positive and ``max(Delta rho - Delta z, 0)`` when ``i`` is positive and ``j`` not.

Both are zero exactly when ``sparsehourglass(z)`` equals the target (``e_y``, resp. ``eta``):
sparsemax's output on its support satisfies ``p_i - p_j = alpha (z_i - z_j)`` and a negative
``j`` is outside the support iff ``alpha (z_i - z_j) >= p_i``.
"""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
from torch import Tensor, nn

from .._validation import check_param, value_checks_enabled
from ..hourglass import hourglass_scale
from ._common import (
    FlatBatch,
    check_reduction,
    class_weight_per_row,
    flatten_logits_and_target,
    one_hot_like,
    reduce_loss,
)

Param = Union[float, Tensor]


def sparsehourglass_hinge_loss(
    input: Tensor,
    target: Tensor,
    q: Param = 1.0,
    weight: Optional[Tensor] = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    mask: Optional[Tensor] = None,
) -> Tensor:
    r"""Multi-class sparsehourglass hinge loss (Laha et al. 2018).

    .. math:: L(z; y) = \frac{1}{\alpha(z)} \sum_j \max(1\{j \ne y\} - \alpha(z) z_y + \alpha(z) z_j, 0)

    Non-negative; zero iff ``sparsehourglass(z, q) = e_y`` (i.e. ``alpha (z_y - z_j) >= 1`` for
    every ``j != y``).

    Args:
        input: logits ``(C,)``, ``(N, C)`` or ``(N, C, d1, ...)`` (classes on dim 1).
        target: class indices (integer), the logits' shape without the class dim.
        q: the sparsehourglass parameter, ``q > 0``.
        weight: optional per-class weight ``(C,)``, applied per row as in ``CrossEntropyLoss``.
        ignore_index: target value whose rows contribute nothing (negative values work).
        reduction: ``'mean'`` | ``'sum'`` | ``'none'`` (``'elementwise_mean'`` = ``'mean'``).

    A class that is "not there" (``mask == False``, a ``-inf`` logit or one ``<= finfo(dtype).min /
    2``) is left out of ``alpha`` and its term is 0 (a target on one gives ``+inf``). Gradient by
    autograd (through ``alpha(z)`` as well).
    """
    check_param(q, "q", low=0.0, low_inclusive=False)
    check_reduction(reduction)
    batch = flatten_logits_and_target(input, target, ignore_index=ignore_index, allow_dist=False, mask=mask)
    z = batch.logits
    alpha = hourglass_scale(z, q, dim=1)
    one_hot = one_hot_like(batch).to(z.dtype)
    absent = z == float("-inf")
    z_fin = z.masked_fill(absent, 0.0)
    z_y = z.gather(1, batch.target_index.unsqueeze(1))
    margins = torch.where(absent, 0.0, (1.0 - one_hot) - alpha * z_y + alpha * z_fin)
    per_row = margins.clamp_min(0).sum(1) / alpha.squeeze(1)
    loss = reduce_loss(per_row, batch, reduction, class_weight_per_row(batch, weight))
    return loss.to(input.dtype)


def multilabel_positives(batch: FlatBatch) -> Tuple[Tensor, Tensor]:
    """``(positive (M, C) bool, eta (M, C))`` of a flattened batch (class indices read as one-hot rows).

    ``eta = y / |y|_1`` over the positive labels (``target > 0``; for a 0/1 multi-hot target
    this is the paper's ``eta``); a row without a positive label has ``eta = 0``.
    """
    z = batch.logits
    y = one_hot_like(batch).to(z.dtype)
    if value_checks_enabled(y) and bool((y < 0).any()):
        raise ValueError("target must be non-negative (a multi-hot vector or a distribution)")
    positive = y > 0
    eta = y / y.sum(1, keepdim=True).clamp_min(torch.finfo(z.dtype).tiny)
    return positive, eta


def _multilabel_rows(input: Tensor, target: Tensor, ignore_index: int, mask: Optional[Tensor] = None):
    """Flatten, and return ``(batch, z, positive (M, C) bool, eta (M, C))`` (see :func:`multilabel_positives`)."""
    batch = flatten_logits_and_target(input, target, ignore_index=ignore_index, mask=mask)
    return (batch, batch.logits, *multilabel_positives(batch))


def pair_classes(z: Tensor, positive: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """``(pos, neg, bad_rows)``: the classes that take part in the pairwise terms, ``(M, C)``, ``(M, C)``, ``(M,)``.

    ``-inf`` logits (classes "not there") take part in no pair: as negatives their hinge term
    is exactly 0 in the limit. A positive label on a ``-inf`` logit cannot be fitted: such rows
    are flagged in ``bad_rows`` (their loss is ``+inf``).
    """
    valid = z > float("-inf")
    return positive & valid, ~positive & valid, (positive & ~valid).any(1)


def positive_negative_hinge(z: Tensor, pos: Tensor, neg: Tensor, margin: Tensor) -> Tensor:
    """``sum_{i in pos, j in neg} max(0, margin_i - (z_i - z_j))`` per row, in O(C log C) time and O(C) memory.

    With ``a_i = z_i - margin_i`` each positive contributes ``sum_{z_j > a_i} (z_j - a_i)`` over the
    negatives: the negatives' logits are sorted once, and a binary search plus suffix sums give
    every positive's count and sum (the direct form builds the ``(M, C, C)`` pair tensor).
    """
    ordered = z.masked_fill(~neg, float("-inf")).sort(1).values  # negatives ascending, the others first
    finite = ordered.masked_fill(ordered == float("-inf"), 0.0)
    suffix = torch.cat([finite.flip(1).cumsum(1).flip(1), finite.new_zeros(finite.shape[0], 1)], 1)
    a = torch.where(pos, z - margin, z.new_zeros(()))
    first_above = torch.searchsorted(ordered.detach().contiguous(), a.detach().contiguous(), right=True)
    count = (z.shape[1] - first_above).to(z.dtype)
    per_positive = suffix.gather(1, first_above) - count * a
    return torch.where(pos, per_positive, z.new_zeros(())).sum(1)


def positive_pair_spread(u: Tensor, pos: Tensor) -> Tensor:
    """``sum_{i < j, both in pos} |u_i - u_j|`` per row, in O(C log C): for the ``n`` positives sorted
    ascending, ``sum_k u_(k) (2k - n - 1)``."""
    ordered = u.masked_fill(~pos, float("inf")).sort(1).values  # positives first
    n = pos.sum(1, keepdim=True)
    rank = torch.arange(1, u.shape[1] + 1, device=u.device).unsqueeze(0)
    weight = torch.where(rank <= n, 2 * rank - n - 1, 0).to(u.dtype)
    return (ordered.masked_fill(rank > n, 0.0) * weight).sum(1)


def sparsehourglass_multilabel_hinge_loss(
    input: Tensor,
    target: Tensor,
    q: Param = 1.0,
    reduction: str = "mean",
    ignore_index: int = -100,
    mask: Optional[Tensor] = None,
) -> Tensor:
    r"""Multi-label (pairwise) sparsehourglass hinge loss (Laha et al. 2018).

    With ``eta = y / |y|_1``, ``alpha = alpha(z)``, ``Delta rho_ij = (eta_i - eta_j) / alpha``
    and ``Delta z_ij = z_i - z_j``:

    .. math:: L(z; y) = \sum_{y_i = y_j = 1} \frac{|\Delta\rho_{ij} - \Delta z_{ij}|}{2}
              + \sum_{y_i = 1, y_j = 0} \max(\Delta\rho_{ij} - \Delta z_{ij}, 0)

    ``rho`` is the output the model should produce, i.e. the target ``eta`` (the README's "the
    output"): with the model's own output the first sum would vanish on its support. Non-negative;
    zero iff ``sparsehourglass(z, q) = eta``. A row without a positive label gives 0.

    Args:
        input: logits ``(C,)``, ``(N, C)`` or ``(N, C, d1, ...)``.
        target: multi-hot (or any non-negative weights, normalized to ``eta``) of the logits'
            shape, floating; or class indices (one-hot; ``ignore_index`` applies to them).
        q: the sparsehourglass parameter, ``q > 0``.
        reduction: ``'mean'`` | ``'sum'`` | ``'none'``.

    Both sums are computed from sorted logits (:func:`positive_pair_spread`,
    :func:`positive_negative_hinge`): O(C log C) time and O(C) memory per row.
    Classes that are not there (``mask == False``, ``-inf`` or ``<= finfo(dtype).min / 2``) are left
    out of ``alpha`` and of every pair; a positive label on one gives ``+inf``.
    """
    check_param(q, "q", low=0.0, low_inclusive=False)
    check_reduction(reduction)
    batch, z, positive, eta = _multilabel_rows(input, target, ignore_index, mask)
    alpha = hourglass_scale(z, q, dim=1)  # (M, 1)
    pos, neg, bad_rows = pair_classes(z, positive)
    rho = eta / alpha  # Delta rho_ij = rho_i - rho_j; rho_j = 0 for a negative j
    # Both ordered pairs (i, j) and (j, i) of positives count |.| / 2: once per unordered pair.
    spread = positive_pair_spread(torch.where(pos, rho - z, z.new_zeros(())), pos)
    per_row = (spread + positive_negative_hinge(z, pos, neg, rho)).masked_fill(bad_rows, float("inf"))
    return reduce_loss(per_row, batch, reduction).to(input.dtype)


class SparseHourglassHingeLoss(nn.Module):
    """Module form of :func:`sparsehourglass_hinge_loss`."""

    def __init__(self, q: float = 1.0, weight: Optional[Tensor] = None, ignore_index: int = -100,
                 reduction: str = "mean"):
        super().__init__()
        check_param(q, "q", low=0.0, low_inclusive=False)
        check_reduction(reduction)
        self.q = float(q)
        self.register_buffer("weight", weight)
        self.ignore_index = ignore_index
        self.reduction = reduction

    def forward(self, input: Tensor, target: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        return sparsehourglass_hinge_loss(input, target, self.q, self.weight, self.ignore_index, self.reduction, mask)


class SparseHourglassMultilabelHingeLoss(nn.Module):
    """Module form of :func:`sparsehourglass_multilabel_hinge_loss`."""

    def __init__(self, q: float = 1.0, reduction: str = "mean", ignore_index: int = -100):
        super().__init__()
        check_param(q, "q", low=0.0, low_inclusive=False)
        check_reduction(reduction)
        self.q = float(q)
        self.reduction = reduction
        self.ignore_index = ignore_index

    def forward(self, input: Tensor, target: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        return sparsehourglass_multilabel_hinge_loss(input, target, self.q, self.reduction, self.ignore_index, mask)
