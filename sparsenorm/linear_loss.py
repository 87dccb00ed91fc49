r"""A classifier layer and its single-label loss in one call, without the N x V logits.

Language models end in ``logits = F.linear(hidden, weight, bias)`` over the vocabulary (32k-256k
entries) followed by a loss; the N x V logits and their gradient are where the memory goes.
:func:`fused_linear_loss` computes ``registry.get(name).single_label_loss(F.linear(hidden, weight,
bias), target)`` and its gradients w.r.t. ``hidden``, ``weight`` and ``bias`` block by block
(``sparsenorm::linear_loss``, :mod:`sparsenorm.kernels.ops.linear_loss`), for every registry entry
whose ``linear_loss`` capability is set. It lives above the registry (as attention does): it takes a
normalizer by name.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from . import registry
from ._validation import check_floating, compute_dtype, value_checks_enabled
from .kernels.ops import linear_loss as linear_loss_ops
from .losses._common import check_reduction

__all__ = ["fused_linear_loss", "FusedLinearLoss", "streamable_normalizers"]


def streamable_normalizers() -> list[str]:
    """The registry names :func:`fused_linear_loss` takes (entries with a ``linear_loss`` kind)."""
    return [name for name, entry in registry.NORMALIZERS.items() if entry.linear_loss is not None]


def _entry(normalizer: str, params: dict) -> registry.Normalizer:
    if not isinstance(normalizer, str):
        raise TypeError(f"normalizer must be a registry name, got {type(normalizer).__name__}")
    entry = registry.get(normalizer, **params)
    if entry.linear_loss is None:
        raise ValueError(f"normalizer {normalizer!r} has no streamable single-label loss; "
                         f"fused_linear_loss takes: {', '.join(streamable_normalizers())}")
    return entry


def _check(hidden: Tensor, weight: Tensor, target: Tensor, bias: Optional[Tensor], vocab_mask: Optional[Tensor]):
    check_floating(hidden, "hidden")
    check_floating(weight, "weight")
    if weight.dim() != 2:
        raise ValueError(f"weight must be (vocabulary, features), got shape {tuple(weight.shape)}")
    if hidden.dim() == 0 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(f"hidden's last dim must be weight's feature dim {weight.shape[1]}, got shape "
                         f"{tuple(hidden.shape)}")
    if weight.shape[0] == 0:
        raise ValueError("weight has no vocabulary entries (size 0 along dim 0)")
    if not isinstance(target, Tensor) or target.is_floating_point() or target.is_complex() \
            or target.dtype == torch.bool:
        got = target.dtype if isinstance(target, Tensor) else type(target).__name__
        raise TypeError(f"target must be an integer tensor of class indices, got {got}")
    if tuple(target.shape) != tuple(hidden.shape[:-1]):
        raise ValueError(f"target must have hidden's shape without its last dim, {tuple(hidden.shape[:-1])}, "
                         f"got {tuple(target.shape)}")
    for t, name in ((weight, "weight"), (target, "target")):
        if t.device != hidden.device:
            raise ValueError(f"{name} is on {t.device} but hidden is on {hidden.device}")
    if bias is not None:
        check_floating(bias, "bias")
        if tuple(bias.shape) != (weight.shape[0],):
            raise ValueError(f"bias must have shape ({weight.shape[0]},), got {tuple(bias.shape)}")
        if bias.device != hidden.device:
            raise ValueError(f"bias is on {bias.device} but hidden is on {hidden.device}")
    if vocab_mask is not None:
        if not isinstance(vocab_mask, Tensor) or vocab_mask.dtype != torch.bool:
            got = vocab_mask.dtype if isinstance(vocab_mask, Tensor) else type(vocab_mask).__name__
            raise TypeError(f"vocab_mask must be a boolean tensor (True = there), got {got}")
        if tuple(vocab_mask.shape) != (weight.shape[0],):
            raise ValueError(f"vocab_mask must have shape ({weight.shape[0]},), got {tuple(vocab_mask.shape)}")
        if vocab_mask.device != hidden.device:
            raise ValueError(f"vocab_mask is on {vocab_mask.device} but hidden is on {hidden.device}")


def fused_linear_loss(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    normalizer: str = "ev_softmax",
    bias: Optional[Tensor] = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    vocab_mask: Optional[Tensor] = None,
    token_chunk: int = 0,
    vocab_chunk: int = 0,
    **params,
) -> Tensor:
    r"""``registry.get(normalizer).single_label_loss(F.linear(hidden, weight, bias), target)``
    without the N x V logits.

    With ``z = h W^T + b`` the logits of one token and ``y`` its class:

    * ``softmax`` (and ``posthoc_evidential``, which trains as softmax): ``log sum_v e^{z_v} - z_y``.
    * ``ev_softmax``: the NLL of Eq. 10 of the ev-softmax paper,
      ``-log p_y``, ``p_v ∝ (1{z_v >= t} + eps) e^{z_v}`` with ``t = min(mean_v z_v, max_v z_v)``;
      the mean logit is ``h . mean_v(W) + mean_v(b)``, known before the vocabulary is read, so
      the normaliser ``sum_on e^z + eps/(1+eps) sum_off e^z`` is one streamed pass (Eq. 10's two
      masses). Gradient w.r.t. ``z``: ``p - e_y`` (Eq. 12 as eps -> 0).
    * ``sparsemax``, ``entmax15``, ``entmax_bisect``: the Fenchel-Young loss
      ``H_alpha(p*) + <p*, z> - z_y`` (sparsemax paper Eq. 19 at ``alpha = 2``; Peters et al. 2019),
      gradient ``p* - e_y``, exactly sparse. The threshold of ``p*`` is found from each vocabulary
      chunk's largest logits and checked exact (tokens that fail the check are redone on whole
      rows); the backward products touch only the support's rows of ``weight``.

    Conventions of ``torch.nn.CrossEntropyLoss`` (and of the registry's losses): ``target`` holds
    class indices of ``hidden``'s shape without its last dim; rows whose target is
    ``ignore_index`` give 0 and no gradient; ``reduction`` 'mean' (over the rows not ignored; 0 if
    all are), 'sum' or 'none' (``target``'s shape).

    Args:
        hidden: ``(..., d)`` features (float32/float64; float16/bfloat16 are computed in float32).
        weight: ``(V, d)`` classifier (``nn.Linear(d, V).weight``; an LM's output embedding).
        target: class indices, ``hidden.shape[:-1]``.
        normalizer: a registry name with a ``linear_loss`` capability (:func:`streamable_normalizers`).
        bias: ``(V,)`` or None.
        ignore_index: target value of rows to skip.
        reduction: ``'mean'`` | ``'sum'`` | ``'none'``.
        vocab_mask: ``(V,)`` bool, False for vocabulary entries that are not there (e.g. the
            padding rows of a vocabulary padded to a multiple of 64). Not there, by the library's
            one rule, is also a bias of ``-inf`` or at or below ``finfo(dtype).min / 2``: such
            entries have probability 0, stay out of ev-softmax's mean and get no gradient; a target
            on one gives an infinite loss.
        token_chunk: tokens per block (0: blocks of about 32 MiB of logits, and of whole vocabulary
            rows at least 128 tokens or the hidden size, whichever is smaller: every block re-reads
            ``weight``).
        vocab_chunk: vocabulary entries per block (0: whole vocabulary rows while at least 32 of
            them fit in a block, else chunks).

    Further keyword arguments are the normalizer's parameters (``eps`` for ev_softmax, ``alpha``
    for entmax_bisect), as :func:`sparsenorm.registry.get` takes them.

    Gradients. With 'mean' or 'sum' and a graph to build, the gradients are computed in the same
    pass as the loss (the loss is meant to be the last operation); the backward scales them by the
    incoming gradient. With 'none' the backward recomputes the logits block by block. No double
    backward.

    Returns:
        The loss, in ``hidden``'s dtype.
    """
    check_reduction(reduction)
    entry = _entry(normalizer, params)
    _check(hidden, weight, target, bias, vocab_mask)
    if reduction == "elementwise_mean":
        reduction = "mean"
    work = compute_dtype(hidden)
    h = hidden.reshape(-1, hidden.shape[-1]).to(work)
    w = weight.to(work)
    b = None if bias is None else bias.to(work)
    y = target.reshape(-1).long()
    n_classes = weight.shape[0]
    if value_checks_enabled(y):
        checked = y[y != ignore_index]
        if checked.numel() and (checked.min() < 0 or checked.max() >= n_classes):
            bad = checked[(checked < 0) | (checked >= n_classes)][0].item()
            raise IndexError(f"target contains class index {bad}, outside [0, {n_classes}) "
                             f"(ignore_index={ignore_index})")
    kind = entry.linear_loss
    param = float(entry.params.get("eps", 0.0)) if kind == "ev_softmax" else float(entry.alpha or 0.0)
    if reduction == "none":
        rows = linear_loss_ops.linear_loss(h, w, b, y, vocab_mask, None, kind, param, ignore_index, False,
                                           token_chunk, vocab_chunk, 0)[0]
        return rows.reshape(target.shape).to(hidden.dtype)
    valid = (y != ignore_index).to(work)
    if reduction == "mean":
        count = valid.sum()
        row_weight = valid / torch.where(count > 0, count, torch.ones_like(count))
    else:
        row_weight = valid
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (hidden, weight, bias))
    loss = linear_loss_ops.linear_loss(h, w, b, y, vocab_mask, row_weight, kind, param, ignore_index, needs_grad,
                                       token_chunk, vocab_chunk, 0)[0]
    return loss.to(hidden.dtype)


class FusedLinearLoss(nn.Module):
    """Module form of :func:`fused_linear_loss`: ``loss(hidden, weight, target, bias=None,
    vocab_mask=None)`` with the normalizer, its parameters, ``ignore_index`` and ``reduction``
    fixed at construction. It holds no weight: pass the output layer's (``lm_head.weight``)."""

    def __init__(self, normalizer: str = "ev_softmax", ignore_index: int = -100, reduction: str = "mean",
                 token_chunk: int = 0, vocab_chunk: int = 0, **params):
        super().__init__()
        check_reduction(reduction)
        _entry(normalizer, params)
        self.normalizer = normalizer
        self.params = dict(params)
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.token_chunk = token_chunk
        self.vocab_chunk = vocab_chunk

    def forward(self, hidden: Tensor, weight: Tensor, target: Tensor, bias: Optional[Tensor] = None,
                vocab_mask: Optional[Tensor] = None) -> Tensor:
        return fused_linear_loss(hidden, weight, target, self.normalizer, bias=bias, ignore_index=self.ignore_index,
                                 reduction=self.reduction, vocab_mask=vocab_mask, token_chunk=self.token_chunk,
                                 vocab_chunk=self.vocab_chunk, **self.params)

    def extra_repr(self) -> str:
        extra = "".join(f", {k}={v}" for k, v in self.params.items())
        return f"normalizer={self.normalizer!r}{extra}, ignore_index={self.ignore_index}, reduction={self.reduction!r}"
