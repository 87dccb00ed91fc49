"""Losses for evidential softmax, through its full-support training form (ev-softmax paper Eq. 10).

All three go through :func:`sparsenorm.log_ev_softmax_train` (log space), so they are finite even
for a target outside the ev-softmax support, and their gradients are the Eq. 12 forms:
``ev_softmax_train(x) - q`` for a cross-entropy to the target distribution ``q``.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from .._validation import check_eps, check_floating, compute_dtype, value_checks_enabled
from ..evidential import log_ev_softmax_train
from ._common import (
    FlatBatch,
    check_reduction,
    class_weight_per_row,
    flatten_logits_and_target,
    reduce_loss,
)


def _cross_entropy_rows(logp: Tensor, batch: FlatBatch) -> Tensor:
    """``-Σ_c q_c log p_c`` per row; ``0 · log 0`` counts as 0 (masked classes outside the target)."""
    if batch.target_index is not None:
        return -logp.gather(1, batch.target_index.unsqueeze(1)).squeeze(1)
    q = batch.target_dist
    return -torch.where(q != 0, q * logp, torch.zeros_like(logp)).sum(1)


def ev_softmax_nll_loss(
    input: Tensor,
    target: Tensor,
    eps: float = 1e-6,
    weight: Optional[Tensor] = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    mask: Optional[Tensor] = None,
) -> Tensor:
    r"""Negative log-likelihood of the training-time ev-softmax (Eq. 10), in log space.

    ``loss = -Σ_c q_c log ev_softmax_train(input)_c`` with ``q`` the one-hot class (integer
    ``target``) or a target distribution (floating ``target`` of the input's shape), following
    ``torch.nn.CrossEntropyLoss``: ``input`` (C,), (N, C) or (N, C, d1, ...) with classes on dim 1,
    ``ignore_index`` (class-index targets; negative values work), per-class ``weight`` and
    ``reduction`` in {'mean', 'sum', 'none'}. 'mean' divides by the total weight of the rows that
    are not ignored (for distribution targets a row's weight is ``q · weight``, as in
    :mod:`sparsenorm.losses._common`); if every row is ignored it is 0.

    Finite for eps > 0 even when the target lies outside the ev-softmax support; its gradient is
    ``ev_softmax_train(input) - q`` exactly, which tends to Eq. 12 as eps → 0. Computed in float32
    for float16/bfloat16 input and returned in the input dtype. ``mask`` (boolean, broadcastable
    to ``input``, True = keep), ``-inf`` logits and logits ``<= finfo(dtype).min / 2`` mark classes
    that are not there (probability 0; a target on one gives ``+inf``).
    """
    check_eps(eps)
    check_floating(input, "input")
    batch = flatten_logits_and_target(input, target, ignore_index=ignore_index, mask=mask)
    logp = log_ev_softmax_train(batch.logits, dim=1, eps=eps)
    per_row = _cross_entropy_rows(logp, batch)
    loss = reduce_loss(per_row, batch, reduction, class_weight_per_row(batch, weight))
    return loss.to(input.dtype)


class EvSoftmaxNLLLoss(nn.Module):
    """Module form of :func:`ev_softmax_nll_loss` (``torch.nn.CrossEntropyLoss``'s arguments + eps)."""

    def __init__(
        self,
        eps: float = 1e-6,
        weight: Optional[Tensor] = None,
        ignore_index: int = -100,
        reduction: str = "mean",
    ):
        super().__init__()
        check_eps(eps)
        check_reduction(reduction)
        self.eps = eps
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.register_buffer("weight", weight)

    def forward(self, input: Tensor, target: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        return ev_softmax_nll_loss(
            input, target, eps=self.eps, weight=self.weight,
            ignore_index=self.ignore_index, reduction=self.reduction, mask=mask,
        )

    def extra_repr(self) -> str:
        return f"eps={self.eps}, ignore_index={self.ignore_index}, reduction={self.reduction!r}"


_KL_REDUCTIONS = ("mean", "batchmean", "sum", "none")


def ev_softmax_kl_div(
    p_logits: Tensor,
    q_logits: Tensor,
    eps: float = 1e-6,
    dim: int = -1,
    reduction: str = "mean",
    mask: Optional[Tensor] = None,
) -> Tensor:
    r"""``KL(p ‖ q)`` between two training-time ev-softmax distributions given by their logits.

    ``p = ev_softmax_train(p_logits)``, ``q = ev_softmax_train(q_logits)`` (Eq. 10, the same eps),
    ``KL = Σ_k p_k (log p_k - log q_k)`` over ``dim`` with both logs in log space: the KL term of
    the ELBO in the ev-softmax paper's VAEs (p the posterior, q the prior). Differentiable w.r.t.
    both logits. Entries that are not there in ``p_logits`` (``-inf``, ``<= finfo(dtype).min / 2``,
    or ``mask == False``, which applies to both) contribute 0; an entry there in p but not in q
    gives ``+inf`` (as KL should).

    Reduction: 'none' gives the KL of each distribution (the logits' shape without ``dim``);
    'sum' sums them; 'mean' (alias 'batchmean') averages them, i.e. the sum over classes and the
    mean over distributions — what ``torch.nn.functional.kl_div(..., reduction='batchmean')``
    computes for 2-D input, not its element-wise 'mean'.
    """
    check_floating(p_logits, "p_logits")
    check_floating(q_logits, "q_logits")
    if p_logits.shape != q_logits.shape:
        raise ValueError(
            f"p_logits and q_logits must have the same shape, got {tuple(p_logits.shape)} and {tuple(q_logits.shape)}"
        )
    if p_logits.dtype != q_logits.dtype:
        raise TypeError(f"p_logits and q_logits must have the same dtype, got {p_logits.dtype} and {q_logits.dtype}")
    if reduction not in _KL_REDUCTIONS:
        raise ValueError(f"reduction must be one of {_KL_REDUCTIONS}, got {reduction!r}")
    check_eps(eps)
    log_p = log_ev_softmax_train(p_logits, dim=dim, eps=eps, mask=mask).to(compute_dtype(p_logits))
    log_q = log_ev_softmax_train(q_logits, dim=dim, eps=eps, mask=mask).to(compute_dtype(q_logits))
    p = log_p.exp()
    # log_p - log_q is -inf - (...) where p = 0: zero it before the product, so that its
    # gradient (0 * -inf) is not NaN.
    terms = p * torch.where(p > 0, log_p - log_q, torch.zeros_like(p))
    kl = terms.sum(dim)
    if reduction == "none":
        out = kl
    elif reduction == "sum":
        out = kl.sum()
    else:
        out = kl.mean() if kl.numel() else kl.sum()
    return out.to(p_logits.dtype)


def ev_softmax_multilabel_loss(
    input: Tensor,
    target: Tensor,
    eps: float = 1e-6,
    reduction: str = "mean",
    mask: Optional[Tensor] = None,
) -> Tensor:
    r"""Multi-label loss: cross-entropy of Eq. 10 to the normalized label vector ``q = y / |y|``.

    ``loss = -Σ_c q_c log ev_softmax_train(input)_c``, which equals ``KL(q ‖ ev_softmax_train)``
    plus the constant entropy ``H(q)`` (so same gradient, ``ev_softmax_train(input) - q``).
    ``target`` is a multi-hot (bool, integer or floating) tensor, or a nonnegative distribution,
    of the input's shape ((N, C) or (N, C, d1, ...), classes on dim 1). A row with no label
    (``|y| = 0``) has loss 0 and zero gradient; it still counts in the 'mean' (as
    ``cross_entropy`` with the all-zero row ``y / max(|y|, 1)`` does). ``mask`` as in
    :func:`ev_softmax_nll_loss`.

    Raises:
        ValueError: on a shape mismatch or a negative target entry.
    """
    check_eps(eps)
    check_floating(input, "input")
    if not isinstance(target, Tensor):
        raise TypeError(f"target must be a torch.Tensor, got {type(target).__name__}")
    if target.shape != input.shape:
        raise ValueError(
            f"target must be a multi-hot/label vector of the input's shape {tuple(input.shape)}, "
            f"got {tuple(target.shape)}"
        )
    if target.is_complex():
        raise TypeError(f"target must be real, got {target.dtype}")
    compute = compute_dtype(input)
    y = target.to(compute)
    if value_checks_enabled(y) and y.numel() and bool((y < 0).any()):
        raise ValueError("target must be nonnegative (a multi-hot vector or label weights)")
    class_dim = 0 if input.dim() == 1 else 1
    q = y / y.sum(class_dim, keepdim=True).clamp_min(torch.finfo(compute).tiny)
    batch = flatten_logits_and_target(input, q, mask=mask)
    logp = log_ev_softmax_train(batch.logits, dim=1, eps=eps)
    per_row = _cross_entropy_rows(logp, batch)
    return reduce_loss(per_row, batch, reduction).to(input.dtype)
