"""One attention call as every attention kernel receives it (:class:`AttentionCall`), and the one
function that turns its normalised masks into the form each kernel takes (:func:`kernel_mask`).

The layer above (``sparsenorm.attention``, ``sparsenorm.hf``) converts each mask convention once
(boolean, additive float, key padding, lengths) into the call's ``keep`` (boolean, True = attend),
``bias`` (finite float), ``key_lengths``, ``query_lengths`` and ``is_causal``; the "not there" rule
itself is in ``sparsenorm._validation``. Here those are only reshaped and combined.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import torch
from torch import Tensor

from ..._validation import compute_dtype


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


def lengths_keep(key_lengths: Optional[Tensor], k_len: int, ndim: int) -> Optional[Tensor]:
    """``key_lengths`` (B,) as a boolean mask (B, 1, ..., 1, S) of ``ndim`` dims: key ``j < len``."""
    if key_lengths is None:
        return None
    cols = torch.arange(k_len, device=key_lengths.device)
    return cols < key_lengths.reshape((-1,) + (1,) * (ndim - 1))


def expand_heads(query: Tensor, t: Tensor) -> Tensor:
    """Grouped-query attention: repeat each key/value head over its group of query heads."""
    if query.dim() < 3 or t.dim() < 3:
        return t
    hq, hk = query.shape[-3], t.shape[-3]
    return t if hk in (hq, 1) else t.repeat_interleave(hq // hk, dim=-3)


@dataclass(frozen=True)
class AttentionCall:
    """The validated arguments of one attention call.

    ``q`` (..., Hq, L, E), ``k`` (..., Hk, S, E), ``v`` (..., Hk, S, Ev) in the caller's dtype,
    leading dims broadcastable, ``Hk`` dividing ``Hq`` (GQA, not yet expanded); ``keep`` boolean
    (True = attend) and ``bias`` (finite float, may require grad) broadcastable to
    ``scores_shape`` = (..., Hq, L, S), causal mask not applied; ``key_lengths`` (B,) integer
    with B = ``scores_shape[0]`` (keys ``j >= len`` are not there), or None; ``scale`` a float;
    ``alpha`` the registry's entmax alpha of a ``"searched"`` normalizer; ``count_support``:
    return the attended keys per query (for :func:`sparsenorm.attention.record`);
    ``query_lengths`` see below.
    """

    q: Tensor
    k: Tensor
    v: Tensor
    keep: Optional[Tensor]
    bias: Optional[Tensor]
    key_lengths: Optional[Tensor]
    is_causal: bool
    scale: float
    scores_shape: Tuple[int, ...]
    alpha: Optional[float] = None
    count_support: bool = False
    query_lengths: Optional[Tensor] = None
    """(B,) integer or None: query rows ``i >= len`` are padding. Kernels need not look at it:
    :func:`sparsenorm.kernels.attention.dispatch.run_attention_kernel` zeroes those rows of every
    kernel's result."""
    causal_offset: int = 0
    """With ``is_causal``, query ``i`` sees the keys ``j <= i + causal_offset``: 0 is SDPA's top-left
    alignment, ``S - L`` the bottom-right one (FlashAttention >= 2.1; the last query sees every key, as
    chunked prefill and decoding with a key/value cache need). Every kernel takes it."""

    def expanded_inputs(self) -> Tuple[Tensor, Tensor, Tensor, Optional[Tensor], Optional[Tensor]]:
        """``(q, k, v, keep, bias)`` in the compute dtype with one batch shape (GQA heads repeated,
        leading dims expanded); ``keep`` in the ``"expanded"`` form of :func:`kernel_mask` (key lengths
        folded in), ``bias`` with at least 2 dims. For kernels that take no GQA, broadcasting or key
        lengths."""
        cdt = compute_dtype(self.q)
        batch = tuple(self.scores_shape[:-2])
        L, S = self.scores_shape[-2], self.scores_shape[-1]
        q = self.q.to(cdt).expand(*batch, L, self.q.shape[-1])
        k = expand_heads(self.q, self.k).to(cdt).expand(*batch, S, self.k.shape[-1])
        v = expand_heads(self.q, self.v).to(cdt).expand(*batch, S, self.v.shape[-1])
        bias = None if self.bias is None else _at_least_2d(self.bias)
        return q, k, v, kernel_mask(self, "expanded"), None if bias is None else bias.to(cdt)


AttentionKernel = Callable[[AttentionCall], Optional[Tuple[Tensor, Optional[Tensor], Optional[Tensor]]]]
"""``kernel(call) -> (out, support, valid)`` or None where it does not apply; ``out`` (..., Hq, L, Ev)
in any floating dtype (cast to the query's after), ``support``/``valid`` (..., Hq, L) integer
counts when ``call.count_support`` (else None)."""


def _at_least_2d(m: Tensor) -> Tensor:
    return m.reshape((1,) * max(0, 2 - m.dim()) + m.shape)


def _four_dims(m: Tensor) -> Tensor:
    return m.reshape((1,) * (4 - m.dim()) + m.shape)


MASK_FORMS = ("dense", "expanded", "batch_heads", "flat_rows", "keys", "query_rows")
"""The forms :func:`kernel_mask` gives."""


def kernel_mask(call: AttentionCall, form: str):
    """The call's masks in the form one kernel takes; None where nothing is masked.

    * ``"dense"`` -- ``keep``, key lengths and the causal mask (with ``causal_offset``) in one boolean
      mask broadcastable to ``scores_shape`` (the dense path);
    * ``"expanded"`` -- ``keep`` and key lengths in one boolean mask of at least 2 dims, broadcastable
      to ``scores_shape``; causal left to the kernel (the blockwise ev-softmax op);
    * ``"batch_heads"`` -- ``keep`` alone as 4 dims (B, H, L, S) broadcastable; key lengths and causal
      left to the kernel (the searched op and FlexAttention, on 4-D inputs);
    * ``"flat_rows"`` -- the ``"expanded"`` mask materialised as (N, 1, L, S), N the flattened batch
      (the same kernels, on inputs flattened to single-head rows);
    * ``"keys"`` -- ``keep`` as a (B, S) key-padding mask (the flash kernel); ``NotImplemented``
      where ``keep`` varies over heads or queries (or has more than 4 dims);
    * ``"query_rows"`` -- ``query_lengths`` as a boolean (B, 1, ..., L) mask of the query rows that
      are there.
    """
    L, S = call.scores_shape[-2], call.scores_shape[-1]
    ndim = len(call.scores_shape)
    if form == "dense":
        return combine_keep(call.keep, lengths_keep(call.key_lengths, S, ndim),
                            causal_keep(L, S, device=call.q.device, offset=call.causal_offset)
                            if call.is_causal else None)
    if form == "expanded":
        keep = combine_keep(call.keep, lengths_keep(call.key_lengths, S, ndim))
        return None if keep is None else _at_least_2d(keep)
    if form == "batch_heads":
        return None if call.keep is None else _four_dims(call.keep)
    if form == "flat_rows":
        keep = kernel_mask(call, "expanded")
        return None if keep is None else keep.expand(call.scores_shape).reshape(-1, 1, L, S)
    if form == "keys":
        if call.keep is None:
            return None
        if call.keep.dim() > 4:
            return NotImplemented
        keep = _four_dims(call.keep)
        if keep.shape[1] != 1 or keep.shape[2] != 1:
            return NotImplemented  # a mask that differs between heads or queries
        batch = call.q.shape[0]
        return keep.expand(batch, 1, 1, S).reshape(batch, S)
    if form == "query_rows":
        if call.query_lengths is None:
            return None
        return torch.arange(L, device=call.query_lengths.device) < call.query_lengths.reshape(
            (-1,) + (1,) * (ndim - 2))  # (B, 1, ..., L)
    raise ValueError(f"form must be one of {MASK_FORMS}, got {form!r}")


__all__ = ["AttentionCall", "AttentionKernel", "kernel_mask", "causal_keep", "combine_keep", "lengths_keep",
           "expand_heads"]
