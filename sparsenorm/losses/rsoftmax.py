"""The r-softmax paper's multi-label loss (Eq. 4) and its sparsity-rate predictor (Sec. 4.1).

Eq. 4 (Bałazy et al.), for logits ``z``, multi-hot ``y`` and ``eta = y / |y|_1``::

    L(z, y) = || y * (f(z) - eta) ||_2^2 + sum_{y_i = 1, y_j = 0} max(0, eta_i - (z_i - z_j))

with ``f = r-softmax(., r)`` (the paper) or ``t-softmax(., t)`` (the same loss for t-softmax).
The first term fits the probabilities of the positive labels to ``eta``; the second pushes each
negative logit below every positive one by the margin ``eta_i``.
"""
from __future__ import annotations

from typing import Callable, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._validation import check_param
from ..rsoftmax import r_softmax, t_softmax
from ._common import FlatBatch, check_reduction, flatten_logits_and_target, reduce_loss
from .hourglass import multilabel_positives, pair_classes, positive_negative_hinge

Param = Union[float, Tensor]


def _per_row_param(value: Param, batch: FlatBatch, name: str) -> Param:
    """A loss parameter given per example (the unreduced loss's shape, or (N, 1)) as (M, 1) rows."""
    if not isinstance(value, Tensor) or value.dim() == 0:
        return value
    rows = batch.logits.shape[0]
    if value.numel() != rows:
        raise ValueError(
            f"{name} must be a number, a 0-d tensor or one value per example (shape "
            f"{batch.out_shape}), got shape {tuple(value.shape)}"
        )
    return value.reshape(rows, 1)


def _eq4_single_label_rows(p: Tensor, z: Tensor, k: Tensor) -> Tensor:
    """Eq. 4 per row for one positive class ``k`` per row (``eta = e_k``), in O(C) time and memory.

    With ``y = e_k`` the fit term is ``(p_k - 1)^2`` and the pairs are ``(k, j)`` for every ``j != k``
    with margin ``eta_k = 1``: ``sum_{j != k} max(0, 1 - (z_k - z_j))``, one pass over the row instead
    of the multi-label form's sort. A ``-inf`` ``z_j`` (not there) gives 0; a row whose ``k`` is not
    there gives ``+inf``, as in the multi-label form.
    """
    k = k.unsqueeze(1)
    z_k = z.gather(1, k)
    fit = (p.gather(1, k).squeeze(1) - 1).pow(2)
    hinge = (1 - (z_k - z)).clamp_min(0).scatter(1, k, 0.0)
    return (fit + hinge.sum(1)).masked_fill(z_k.squeeze(1) == float("-inf"), float("inf"))


def _eq4_loss(
    normalizer: Callable[[Tensor, FlatBatch], Tensor],
    input: Tensor,
    target: Tensor,
    reduction: str,
    ignore_index: int,
    mask: Optional[Tensor] = None,
) -> Tensor:
    """Eq. 4 with the normalizer ``f(z, batch)`` on the flattened rows: O(C) per row for class-index
    targets, O(C log C) for multi-hot ones (the same value for one-hot rows)."""
    check_reduction(reduction)
    batch = flatten_logits_and_target(input, target, ignore_index=ignore_index, mask=mask)
    z = batch.logits
    if batch.target_index is not None:
        per_row = _eq4_single_label_rows(normalizer(z, batch), z, batch.target_index)
        return reduce_loss(per_row, batch, reduction).to(input.dtype)
    positive, eta = multilabel_positives(batch)
    p = normalizer(z, batch)
    y = positive.to(z.dtype)
    fit = (y * (p - eta)).pow(2).sum(1)
    pos, neg, bad_rows = pair_classes(z, positive)
    per_row = (fit + positive_negative_hinge(z, pos, neg, eta)).masked_fill(bad_rows, float("inf"))
    return reduce_loss(per_row, batch, reduction).to(input.dtype)


def eq4_loss(
    input: Tensor,
    target: Tensor,
    normalizer: Callable[[Tensor], Tensor],
    reduction: str = "mean",
    ignore_index: int = -100,
    mask: Optional[Tensor] = None,
) -> Tensor:
    r"""The r-softmax paper's Eq. 4 with any normalizer ``f``: :func:`r_softmax_loss` with ``f(rows)`` in place
    of r-softmax, for a variant of it (e.g. one whose threshold is computed without a gradient).

    ``normalizer`` maps the flattened logits ``(M, C)`` (classes on dim 1, "not there" classes as
    ``-inf``, in the compute dtype) to probabilities of that shape; its parameters must be fixed or
    given per row ``(M, 1)``. Shapes, targets, masks and reductions as :func:`r_softmax_loss`.
    """
    return _eq4_loss(lambda z, batch: normalizer(z), input, target, reduction, ignore_index, mask)


def r_softmax_loss(
    input: Tensor,
    target: Tensor,
    r: Param = 0.5,
    reduction: str = "mean",
    ignore_index: int = -100,
    mask: Optional[Tensor] = None,
) -> Tensor:
    r"""The r-softmax paper's multi-label loss (Eq. 4) with ``f = r-softmax(., r)``.

    .. math:: L(z, y) = \| y \odot (\mathrm{r\text{-}softmax}(z, r) - \eta) \|_2^2
              + \sum_{y_i = 1, y_j = 0} \max(0, \eta_i - (z_i - z_j)), \quad \eta = y / \|y\|_1

    Non-negative. Zero exactly when r-softmax matches ``eta`` on the positive labels and every
    negative logit is at least ``eta_i`` below every positive ``z_i``. A row without a positive
    label gives 0.

    Args:
        input: logits ``(C,)``, ``(N, C)`` or ``(N, C, d1, ...)`` (classes on dim 1).
        target: multi-hot ``y`` of the logits' shape (floating; any non-negative weights are
            read as positives ``target > 0`` with ``eta = target / sum(target)``), or class
            indices (one-hot, so the loss also serves single-label training; ``ignore_index``
            applies to them).
        r: sparsity rate in ``[0, 1]``: a number, or one value per example (the unreduced loss's
            shape), e.g. from :class:`SparsityRatePredictor`. A tensor ``r`` with
            ``requires_grad`` gets r-softmax's gradient w.r.t. ``r``.
        reduction: ``'mean'`` | ``'sum'`` | ``'none'``.

    Classes that are "not there" (``mask == False``, ``-inf`` logits or logits ``<= finfo(dtype).min
    / 2``) are excluded from the quantile and from every pair; a positive label on one gives ``+inf``.
    The pair term takes O(C) time and memory per row for class indices (one positive: a single pass) and
    O(C log C) time, O(C) memory for multi-hot targets.
    """
    check_param(r, "r", low=0.0, high=1.0)

    def normalizer(z: Tensor, batch: FlatBatch) -> Tensor:
        return r_softmax(z, _per_row_param(r, batch, "r"), dim=1)

    return _eq4_loss(normalizer, input, target, reduction, ignore_index, mask)


def t_softmax_loss(
    input: Tensor,
    target: Tensor,
    t: Param = 1.0,
    reduction: str = "mean",
    ignore_index: int = -100,
    mask: Optional[Tensor] = None,
) -> Tensor:
    r"""The r-softmax paper's multi-label loss (Eq. 4) with ``f = t-softmax(., t)`` (Eq. 1).

    Same as :func:`r_softmax_loss` with t-softmax in place of r-softmax; ``t > 0`` is a number,
    a 0-d tensor (e.g. a learned parameter, which gets a gradient) or one value per example.
    """
    check_param(t, "t", low=0.0, low_inclusive=False)

    def normalizer(z: Tensor, batch: FlatBatch) -> Tensor:
        return t_softmax(z, _per_row_param(t, batch, "t"), dim=1)

    return _eq4_loss(normalizer, input, target, reduction, ignore_index, mask)


class RSoftmaxLoss(nn.Module):
    """Module form of :func:`r_softmax_loss`; ``forward(input, target, r=None)`` can take a per-example r."""

    def __init__(self, r: float = 0.5, reduction: str = "mean", ignore_index: int = -100):
        super().__init__()
        check_param(r, "r", low=0.0, high=1.0)
        check_reduction(reduction)
        self.r = float(r)
        self.reduction = reduction
        self.ignore_index = ignore_index

    def forward(self, input: Tensor, target: Tensor, r: Optional[Param] = None,
                mask: Optional[Tensor] = None) -> Tensor:
        return r_softmax_loss(input, target, self.r if r is None else r, self.reduction, self.ignore_index, mask)


class TSoftmaxLoss(nn.Module):
    """Module form of :func:`t_softmax_loss`.

    With ``learnable=True``, ``t`` is learned jointly (stored as ``log_t``, so it stays > 0).
    """

    def __init__(self, t: float = 1.0, reduction: str = "mean", ignore_index: int = -100,
                 learnable: bool = False):
        super().__init__()
        check_param(t, "t", low=0.0, low_inclusive=False)
        check_reduction(reduction)
        log_t = torch.log(torch.as_tensor(float(t), dtype=torch.get_default_dtype()))
        if learnable:
            self.log_t = nn.Parameter(log_t)
        else:
            self.register_buffer("log_t", log_t)
        self.reduction = reduction
        self.ignore_index = ignore_index

    @property
    def t(self) -> Tensor:
        return self.log_t.exp()

    def forward(self, input: Tensor, target: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        return t_softmax_loss(input, target, self.t, self.reduction, self.ignore_index, mask)


def label_count_loss(count_logits: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """Cross-entropy of logits over the label count ``0..C`` (rows ``(N, C + 1)``) against the true ``|y|``
    of the multi-hot ``target`` ``(N, C)``: the count term of the r-softmax paper's Sec. 4.1 objective."""
    return F.cross_entropy(count_logits, (target > 0).sum(-1).long(), reduction=reduction)


class SparsityRatePredictor(nn.Module):
    """Predicts the number of positive labels per example, hence r-softmax's sparsity rate r.

    The r-softmax paper, Sec. 4.1: "we add an additional layer to the neural network which is
    responsible for predicting the sparsity rate that is later passed as an argument to r-softmax
    function. We supplied the multi-label classification cost function with the cross-entropy loss
    component responsible for evaluating the correctness of the number of labels indicated by the
    model." Implemented literally:

    * one linear layer ``in_features -> n_classes + 1`` gives logits over the label count
      ``k in {0, ..., C}`` (:meth:`forward`);
    * :meth:`count_loss` is the cross-entropy of those logits against the true count ``|y|``;
    * :meth:`rate` turns the predicted count into ``r = (C - k) / C`` (the fraction of zeros),
      passed to :func:`sparsenorm.r_softmax` / :func:`r_softmax_loss`;
    * :meth:`joint_loss` is Eq. 4 with that ``r`` plus ``count_weight`` times the count loss.

    Gaps in the paper, filled as stated: the layer's input (here: the features the classifier's
    last layer also sees), the weight of the cross-entropy term (``count_weight``, default 1), and
    how the count becomes ``r`` (here the arg-max count, detached, so ``r`` is trained only by the
    cross-entropy term; the authors' code also detaches the threshold; ``hard=False`` instead uses
    the expected count, differentiable). By Eq. 3 itself, ``k = C`` gives ``r = 0``, which still
    zeroes the row minimum (at most ``C - 1`` predicted labels), and ``k = 0`` gives ``r = 1``,
    the one-hot arg-max (r-softmax cannot output an empty label set).
    """

    def __init__(self, in_features: int, n_classes: int, bias: bool = True):
        super().__init__()
        if n_classes < 1:
            raise ValueError(f"n_classes must be >= 1, got {n_classes}")
        self.n_classes = n_classes
        self.layer = nn.Linear(in_features, n_classes + 1, bias=bias)

    def forward(self, features: Tensor) -> Tensor:
        """Logits over the number of positive labels ``0..C``: shape ``features.shape[:-1] + (C + 1,)``."""
        return self.layer(features)

    def count_loss(self, count_logits: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
        """Cross-entropy between the predicted count distribution and the true ``|y|`` (target multi-hot (N, C))."""
        if target.shape[-1] != self.n_classes:
            raise ValueError(f"target must have {self.n_classes} classes on its last dim, "
                             f"got shape {tuple(target.shape)}")
        return label_count_loss(count_logits, target, reduction)

    def rate(self, count_logits: Tensor, hard: bool = True) -> Tensor:
        """Sparsity rate ``r = (C - k) / C`` per example, from the arg-max (``hard``) or expected count."""
        if hard:
            k = count_logits.detach().argmax(-1).to(count_logits.dtype)
        else:
            ks = torch.arange(self.n_classes + 1, dtype=count_logits.dtype, device=count_logits.device)
            k = (count_logits.softmax(-1) * ks).sum(-1)
        return ((self.n_classes - k) / self.n_classes).clamp(0.0, 1.0)

    def joint_loss(
        self,
        logits: Tensor,
        count_logits: Tensor,
        target: Tensor,
        count_weight: float = 1.0,
        hard: bool = True,
        reduction: str = "mean",
    ) -> Tensor:
        """Eq. 4 with the predicted ``r`` plus ``count_weight`` x the count cross-entropy (Sec. 4.1)."""
        r = self.rate(count_logits, hard=hard)
        eq4 = r_softmax_loss(logits, target, r=r, reduction=reduction)
        return eq4 + count_weight * self.count_loss(count_logits, target, reduction=reduction)
