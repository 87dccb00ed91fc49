"""Attention masks in the one "not there" convention of sparsenorm.

An attention mask is what ``torch.nn.functional.scaled_dot_product_attention`` accepts: a boolean
tensor (True = attend) or a float tensor added to the scores. A key is "not there" for a query
when the boolean mask is False there, or the float mask is ``-inf`` or at or below
``finfo(dtype).min / 2`` (the ``finfo.min`` fill of Hugging Face's eager masks, also after a
bias was added to it). "Not there" means exactly zero weight and no part in a threshold (ev-softmax's
mean, sparsehourglass's sum), for every normalizer.

:func:`split_mask` turns any such mask into ``(keep, bias)``: a boolean keep mask (or None) and
the finite additive part (or None). Everything in :mod:`sparsenorm.attention` and
:mod:`sparsenorm.hf` reads masks through it.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor


def not_there_level(dtype: torch.dtype) -> float:
    """Additive mask values at or below this are "not there": ``finfo(dtype).min / 2``."""
    return torch.finfo(dtype).min / 2


def split_mask(attn_mask: Optional[Tensor], name: str = "attn_mask") -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """``(keep, bias)`` of an SDPA-style mask: boolean keep mask (True = attend) and finite bias.

    A boolean mask gives ``(mask, None)``. A float mask gives ``keep = mask > finfo.min / 2`` (None
    if every entry is kept) and ``bias`` = the mask with the not-there entries set to 0 (None if
    the mask is 0 wherever it keeps a key, as Hugging Face's padding masks are). Other dtypes
    raise ``TypeError`` naming ``name``.
    """
    if attn_mask is None:
        return None, None
    if not isinstance(attn_mask, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(attn_mask).__name__}")
    if attn_mask.dtype == torch.bool:
        return attn_mask, None
    if not attn_mask.is_floating_point():
        raise TypeError(f"{name} must be a boolean or floating-point tensor, got dtype {attn_mask.dtype}")
    if torch.isnan(attn_mask).any():
        raise ValueError(f"{name} contains NaN")
    keep = attn_mask > not_there_level(attn_mask.dtype)
    bias = attn_mask.masked_fill(~keep, 0.0)
    all_kept = bool(keep.all())
    if not attn_mask.requires_grad and not bool(bias.any()):
        bias = None
    return (None if all_kept else keep), bias


def causal_keep(q_len: int, k_len: int, device=None, offset: int = 0) -> Tensor:
    """Boolean ``(q_len, k_len)`` mask, True where key ``j <= i + offset``.

    ``offset=0`` is SDPA's ``is_causal`` (top-left aligned); ``offset = k_len - q_len`` aligns the
    last query with the last key, as decoding with a key/value cache needs.
    """
    rows = torch.arange(q_len, device=device).unsqueeze(-1)
    cols = torch.arange(k_len, device=device)
    return cols <= rows + offset


def combine_keep(*masks: Optional[Tensor]) -> Optional[Tensor]:
    """The logical AND of the boolean masks given (broadcasting); None if none is given."""
    out = None
    for m in masks:
        if m is not None:
            out = m if out is None else out & m
    return out
