"""Attention masks in the one "not there" convention of sparsenorm: the one path every mask takes.

An attention mask is what ``torch.nn.functional.scaled_dot_product_attention`` accepts: a boolean
tensor (True = attend) or a float tensor added to the scores. A key is "not there" for a query
when the boolean mask is False there, or the float mask is ``-inf`` or at or below
``finfo(dtype).min / 2`` (the rule of :mod:`sparsenorm._validation`; the ``finfo.min`` fill of
Hugging Face's eager masks, also after a bias was added to it). "Not there" means exactly zero
weight and no part in a threshold (ev-softmax's mean, sparsehourglass's sum), for every normalizer.

:func:`split_mask` turns any such mask into ``(keep, bias)``: a boolean keep mask and the finite
additive part (None where the mask is boolean); :func:`merge` combines several. Both are tensor
operations only -- no value is read on the host, so they compile and never synchronise. Every
attention path (:func:`~sparsenorm.attention.sparse_attention`,
:class:`~sparsenorm.attention.MultiheadAttention`, :mod:`sparsenorm.hf`) reads masks through them.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from .._validation import is_there, value_checks_enabled
from ..kernels.attention.call import causal_keep, combine_keep, lengths_keep

Mask = Tuple[Optional[Tensor], Optional[Tensor]]

__all__ = ["split_mask", "merge", "causal_keep", "combine_keep", "lengths_keep"]


def split_mask(attn_mask: Optional[Tensor], name: str = "attn_mask", true_means_attend: bool = True) -> Mask:
    """``(keep, bias)`` of an attention mask: boolean keep mask (True = attend) and finite bias.

    A boolean mask gives ``(mask, None)`` (``(~mask, None)`` with ``true_means_attend=False``,
    ``torch.nn.MultiheadAttention``'s convention). A float mask gives ``keep`` = its entries that
    are there and ``bias`` = the mask with the others set to 0 (differentiable where kept). A NaN
    entry counts as there, so it makes its row's output NaN as in SDPA; in eager mode on CPU it is
    refused with ``ValueError`` instead. Other dtypes raise ``TypeError`` naming ``name``.
    """
    if attn_mask is None:
        return None, None
    if not isinstance(attn_mask, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(attn_mask).__name__}")
    if attn_mask.dtype == torch.bool:
        return (attn_mask if true_means_attend else ~attn_mask), None
    if not attn_mask.is_floating_point():
        raise TypeError(f"{name} must be a boolean or floating-point tensor, got dtype {attn_mask.dtype}")
    if value_checks_enabled(attn_mask) and bool(torch.isnan(attn_mask.detach()).any()):
        raise ValueError(f"{name} contains NaN")
    keep = is_there(attn_mask)
    return keep, torch.where(keep, attn_mask, torch.zeros((), dtype=attn_mask.dtype, device=attn_mask.device))


def merge(*masks: Mask) -> Mask:
    """Several ``(keep, bias)`` pairs as one: keep masks AND-ed, biases added (broadcasting)."""
    keep = combine_keep(*(m[0] for m in masks))
    bias = None
    for _, b in masks:
        if b is not None:
            bias = b if bias is None else bias + b
    return keep, bias
