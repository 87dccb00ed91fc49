r"""A classifier layer and its single-label loss in one call, without the N x V logits.

Language models end in ``logits = F.linear(input, weight, bias)`` over the vocabulary (32k-256k
entries) followed by a loss; the N x V logits and their gradient are where the memory goes.
:func:`fused_linear_loss` computes ``registry.get(normalizer).single_label_loss(F.linear(input,
weight, bias), target)`` and its gradients w.r.t. ``input``, ``weight`` and ``bias`` block by block
(``sparsenorm::linear_loss``, :mod:`sparsenorm.kernels.ops.linear_loss`), for every registry entry
whose ``linear_loss`` capability is set. It lives above the registry (as attention does): it takes a
normalizer by name.

Its arguments are PyTorch's: ``fused_linear_loss(input, weight, target, bias)`` with the default
``normalizer="softmax"`` is ``F.cross_entropy(F.linear(input, weight, bias), target)`` (and
``torch.nn.functional.linear_cross_entropy(input, weight, target, linear_bias=bias)``), with
``reduction``, ``ignore_index`` and ``label_smoothing`` as there, and ``softcap`` as Cut
Cross-Entropy's and Liger's (Gemma 2's ``softcap * tanh(logits / softcap)``).
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor, nn

from . import registry
from ._validation import check_floating, compute_dtype, value_checks_enabled
from .kernels.ops import linear_loss as linear_loss_ops
from .losses._common import check_reduction

__all__ = ["fused_linear_loss", "FusedLinearLoss", "streamable_normalizers"]

_LAYOUT = "weight is (V, d): nn.Linear(d, V).weight, an LM's lm_head.weight"


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


def _check_options(entry: registry.Normalizer, normalizer: str, label_smoothing, softcap) -> float:
    """Checks ``label_smoothing`` and ``softcap``; returns the cap as a float (0.0: none)."""
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float)) \
            or not (0.0 <= float(label_smoothing) <= 1.0):
        raise ValueError(f"label_smoothing must be a number in [0, 1], got {label_smoothing!r}")
    if label_smoothing and entry.linear_loss == "ev_softmax" and float(entry.params.get("eps", 0.0)) == 0.0:
        raise ValueError(f"label_smoothing needs {normalizer!r} with eps > 0: with eps = 0 its distribution is 0 "
                         "off the support, where the smoothed target puts mass (an infinite loss)")
    if softcap is None:
        return 0.0
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not (
            math.isfinite(softcap) and softcap > 0):
        raise ValueError(f"softcap must be None or a finite number > 0, got {softcap!r}")
    return float(softcap)


def _check(input: Tensor, weight: Tensor, target: Tensor, bias: Optional[Tensor], vocab_mask: Optional[Tensor]):
    check_floating(input, "input")
    check_floating(weight, "weight")
    if not isinstance(target, Tensor) or target.is_floating_point() or target.is_complex() \
            or target.dtype == torch.bool:
        got = target.dtype if isinstance(target, Tensor) else type(target).__name__
        raise TypeError(f"target must be an integer tensor of class indices, got {got}")
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D (V, d) = (vocabulary, features), got shape {tuple(weight.shape)} "
                         f"({_LAYOUT})")
    if input.dim() == 0:
        raise ValueError(f"input must be (..., d) with d = weight.shape[1] = {weight.shape[1]}, got a 0-dim tensor "
                         f"({_LAYOUT})")
    shape_in, shape_t = tuple(input.shape[:-1]), tuple(target.shape)
    if shape_t != shape_in and input.dim() == 2 and shape_t == tuple(weight.shape[:-1]) \
            and input.shape[-1] == weight.shape[-1]:
        raise ValueError(
            f"input {tuple(input.shape)} and weight {tuple(weight.shape)} look swapped (target {shape_t} matches "
            "weight's rows): the order is (input, weight, target), as torch.nn.functional.linear_cross_entropy and "
            f"Cut Cross-Entropy; Liger's LigerFusedLinearCrossEntropyLoss.forward takes (weight, input, target) "
            f"({_LAYOUT})")
    if input.shape[-1] != weight.shape[1]:
        hint = (" (weight looks transposed: pass it as (V, d), not (d, V))"
                if input.shape[-1] == weight.shape[0] else "")
        raise ValueError(f"input's last dim must be weight's feature dim d = weight.shape[1] = {weight.shape[1]}, "
                         f"got input {tuple(input.shape)} and weight {tuple(weight.shape)}{hint} ({_LAYOUT})")
    if weight.shape[0] == 0:
        raise ValueError(f"weight has no vocabulary entries: V = weight.shape[0] = 0 ({_LAYOUT})")
    if shape_t != shape_in:
        raise ValueError(f"target must have input's shape without its last dim, {shape_in}, got {shape_t}")
    for t, name in ((weight, "weight"), (target, "target")):
        if t.device != input.device:
            raise ValueError(f"{name} is on {t.device} but input is on {input.device}")
    if bias is not None:
        if not isinstance(bias, Tensor):
            hint = (f" (the normalizer is a keyword argument: normalizer={bias!r})" if isinstance(bias, str) else "")
            raise TypeError(f"bias must be a tensor of shape (V,) or None, got {type(bias).__name__}{hint}")
        check_floating(bias, "bias")
        if tuple(bias.shape) != (weight.shape[0],):
            raise ValueError(f"bias must have shape (V,) = ({weight.shape[0]},), got {tuple(bias.shape)} ({_LAYOUT})")
        if bias.device != input.device:
            raise ValueError(f"bias is on {bias.device} but input is on {input.device}")
    if vocab_mask is not None:
        if not isinstance(vocab_mask, Tensor) or vocab_mask.dtype != torch.bool:
            got = vocab_mask.dtype if isinstance(vocab_mask, Tensor) else type(vocab_mask).__name__
            raise TypeError(f"vocab_mask must be a boolean tensor (True = there), got {got}")
        if tuple(vocab_mask.shape) != (weight.shape[0],):
            raise ValueError(f"vocab_mask must have shape (V,) = ({weight.shape[0]},), got "
                             f"{tuple(vocab_mask.shape)} ({_LAYOUT})")
        if vocab_mask.device != input.device:
            raise ValueError(f"vocab_mask is on {vocab_mask.device} but input is on {input.device}")


def fused_linear_loss(
    input: Tensor,
    weight: Tensor,
    target: Tensor,
    bias: Optional[Tensor] = None,
    *,
    normalizer: str = "softmax",
    reduction: str = "mean",
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    softcap: Optional[float] = None,
    vocab_mask: Optional[Tensor] = None,
    token_chunk: int = 0,
    vocab_chunk: int = 0,
    **params,
) -> Tensor:
    r"""``registry.get(normalizer).single_label_loss(F.linear(input, weight, bias), target)``
    without the N x V logits; by default (``normalizer="softmax"``) ``F.cross_entropy(F.linear(input,
    weight, bias), target)``, the loss of ``torch.nn.functional.linear_cross_entropy``.

    The arguments are PyTorch's (``F.linear`` then ``F.cross_entropy``): ``input`` and ``weight``
    in ``F.linear``'s layout, ``bias`` fourth, the rest keyword-only. With ``z = x W^T + b`` the
    logits of one token (capped to ``softcap * tanh(z / softcap)`` if ``softcap`` is given) and
    ``y`` its class:

    * ``softmax`` (and ``posthoc_evidential``, which trains as softmax): ``log sum_v e^{z_v} - z_y``.
    * ``ev_softmax``: the NLL of Eq. 10 of the ev-softmax paper,
      ``-log p_y``, ``p_v ∝ (1{z_v >= t} + eps) e^{z_v}`` with ``t = min(mean_v z_v, max_v z_v)``;
      without a cap the mean logit is ``x . mean_v(W) + mean_v(b)``, known before the vocabulary is
      read, so the normaliser ``sum_on e^z + eps/(1+eps) sum_off e^z`` is one streamed pass (Eq. 10's
      two masses). Gradient w.r.t. ``z``: ``p - e_y`` (Eq. 12 as eps -> 0).
    * ``sparsemax``, ``entmax15``, ``entmax_bisect``: the Fenchel-Young loss
      ``H_alpha(p*) + <p*, z> - z_y`` (sparsemax paper Eq. 19 at ``alpha = 2``; Peters et al. 2019),
      gradient ``p* - e_y``, exactly sparse. The threshold of ``p*`` is found from each vocabulary
      chunk's largest logits and checked exact (tokens that fail the check are redone on whole
      rows); the backward products touch only the support's rows of ``weight``.

    ``label_smoothing = s`` replaces ``e_y`` by ``q = (1 - s) e_y + s u``, ``u`` uniform over the
    vocabulary entries that are there (all of them unless ``vocab_mask`` or a ``-inf`` bias says
    otherwise), as ``F.cross_entropy(..., label_smoothing=s)`` does: cross-entropy to ``q`` for
    softmax and ev-softmax (``-sum_v q_v log p_v``; ev-softmax needs ``eps > 0``, else the loss is
    infinite and a ``ValueError`` says so), the Fenchel-Young loss ``H(p*) - H(q) + <p* - q, z>``
    for the sparse kinds: each the registry loss given the target distribution ``q``, gradient
    ``p - q``.

    Conventions of ``torch.nn.CrossEntropyLoss``: ``target`` holds class indices of ``input``'s
    shape without its last dim; rows whose target is ``ignore_index`` give 0 and no gradient;
    ``reduction`` 'mean' (over the rows not ignored; 0 if all are), 'sum' or 'none' (``target``'s
    shape).

    Args:
        input: ``(..., d)`` features (float32/float64; float16/bfloat16 are computed in float32).
        weight: ``(V, d)`` classifier, ``F.linear``'s layout (``nn.Linear(d, V).weight``; an LM's
            ``lm_head.weight``).
        target: class indices, ``input.shape[:-1]``.
        bias: ``(V,)`` or None.
        normalizer: a registry name with a ``linear_loss`` capability (:func:`streamable_normalizers`).
        reduction: ``'mean'`` | ``'sum'`` | ``'none'``.
        ignore_index: target value of rows to skip.
        label_smoothing: ``s`` in [0, 1] (above).
        softcap: None, or ``c > 0``: the logits are ``c * tanh(z / c)`` (Gemma 2's final-logit cap,
            Cut Cross-Entropy's and Liger's ``softcap``).
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
    backward. With ``softcap`` and ev-softmax or ``label_smoothing``, each row's mean capped logit
    comes from its whole-row block, or (a streamed vocabulary, ``vocab_chunk < V``) from one more
    pass of products.

    Returns:
        The loss, in ``input``'s dtype.
    """
    check_reduction(reduction)
    entry = _entry(normalizer, params)
    _check(input, weight, target, bias, vocab_mask)
    cap = _check_options(entry, normalizer, label_smoothing, softcap)
    smooth = float(label_smoothing)
    if reduction == "elementwise_mean":
        reduction = "mean"
    work = compute_dtype(input)
    h = input.reshape(-1, input.shape[-1]).to(work)
    w = weight.to(work)
    b = None if bias is None else bias.to(work)
    y = target.reshape(-1).long()
    n_classes = weight.shape[0]
    if value_checks_enabled(y):
        checked = y[y != ignore_index]
        if checked.numel() and (checked.min() < 0 or checked.max() >= n_classes):
            bad = checked[(checked < 0) | (checked >= n_classes)][0].item()
            raise IndexError(f"target contains class index {bad}, outside [0, V) = [0, {n_classes}) "
                             f"(ignore_index={ignore_index})")
    kind = entry.linear_loss
    param = float(entry.params.get("eps", 0.0)) if kind == "ev_softmax" else float(entry.alpha or 0.0)
    if reduction == "none":
        rows = linear_loss_ops.linear_loss(h, w, b, y, vocab_mask, None, kind, param, ignore_index, False,
                                           token_chunk, vocab_chunk, 0, smooth, cap)[0]
        return rows.reshape(target.shape).to(input.dtype)
    valid = (y != ignore_index).to(work)
    if reduction == "mean":
        count = valid.sum()
        row_weight = valid / torch.where(count > 0, count, torch.ones_like(count))
    else:
        row_weight = valid
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (input, weight, bias))
    loss = linear_loss_ops.linear_loss(h, w, b, y, vocab_mask, row_weight, kind, param, ignore_index, needs_grad,
                                       token_chunk, vocab_chunk, 0, smooth, cap)[0]
    return loss.to(input.dtype)


class FusedLinearLoss(nn.Module):
    """Module form of :func:`fused_linear_loss`: ``loss(input, weight, target, bias=None,
    vocab_mask=None)`` (``F.linear``'s order: ``input`` first, the ``(V, d)`` weight second) with the
    normalizer, its parameters, ``reduction``, ``ignore_index``, ``label_smoothing`` and ``softcap``
    fixed at construction. It holds no weight: pass the output layer's (``lm_head.weight``).

    Liger-Kernel's ``LigerFusedLinearCrossEntropyLoss.forward`` takes ``(weight, input, target,
    bias)``: swapped arguments are recognised from the shapes and named in the error."""

    def __init__(self, normalizer: str = "softmax", *, reduction: str = "mean", ignore_index: int = -100,
                 label_smoothing: float = 0.0, softcap: Optional[float] = None, token_chunk: int = 0,
                 vocab_chunk: int = 0, **params):
        super().__init__()
        check_reduction(reduction)
        entry = _entry(normalizer, params)
        _check_options(entry, normalizer, label_smoothing, softcap)
        self.normalizer = normalizer
        self.params = dict(params)
        self.reduction = reduction
        self.ignore_index = ignore_index
        self.label_smoothing = label_smoothing
        self.softcap = softcap
        self.token_chunk = token_chunk
        self.vocab_chunk = vocab_chunk

    def forward(self, input: Tensor, weight: Tensor, target: Tensor, bias: Optional[Tensor] = None,
                vocab_mask: Optional[Tensor] = None) -> Tensor:
        return fused_linear_loss(input, weight, target, bias, normalizer=self.normalizer, reduction=self.reduction,
                                 ignore_index=self.ignore_index, label_smoothing=self.label_smoothing,
                                 softcap=self.softcap, vocab_mask=vocab_mask, token_chunk=self.token_chunk,
                                 vocab_chunk=self.vocab_chunk, **self.params)

    def extra_repr(self) -> str:
        extra = "".join(f", {k}={v}" for k, v in self.params.items())
        opts = (f", label_smoothing={self.label_smoothing}" if self.label_smoothing else "") + (
            f", softcap={self.softcap}" if self.softcap is not None else "")
        return (f"normalizer={self.normalizer!r}{extra}, reduction={self.reduction!r}, "
                f"ignore_index={self.ignore_index}{opts}")
