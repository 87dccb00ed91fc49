"""ev-softmax attention on PyTorch's FlexAttention (``torch.nn.attention.flex_attention``).

ev-softmax (ev-softmax paper, Eq. 7) keeps the keys whose score is at least the mean score over the
valid keys, and gives them softmax weights. The mean is linear in the keys,
``mean_j (q . k_j) * scale = q . mean_j(k_j) * scale``, so each query's threshold is computed
before the attention (:func:`sparsenorm.kernels.reference.evidential_attention.threshold`: the mean of the valid keys,
their prefix means under a causal mask), and FlexAttention then runs its fused online softmax with

* a ``score_mod`` that moves every score below its query's threshold down by a constant ``C`` large
  enough that ``exp(-C)`` underflows to 0 in the score's dtype: off-support keys get exactly zero
  weight whenever the row has a score at or above its threshold;
* a ``BlockMask`` (``create_block_mask``) for the keys that are not there (``keep``,
  ``key_lengths``, causal), which FlexAttention skips block by block.

Rounding: the threshold here is ``q . mean(k)``, the dense path's is ``mean(q . k)``; an entry
within rounding of its row's mean can fall on different sides, as for the blockwise and Triton
paths. Should rounding put the threshold above every valid score of a row (a single valid key;
keys whose scores tie), the dense ev-softmax caps the threshold at the row's maximum; here every
valid score of such a row is then off the support and the row gets softmax over its valid keys,
whose scores all lie within rounding of the maximum: the same weights for a single key and for
exact ties (the cases that occur), and within rounding ambiguity otherwise. FlexAttention cannot
return row maxima on CPU, so this needs no second pass.

Only the forward runs on CPU (FlexAttention has no CPU backward); on CUDA FlexAttention
differentiates it (the threshold carries no gradient: the support indicator is piecewise constant,
Eq. 9). Outside ``torch.compile`` on CUDA the function calls a compiled ``flex_attention`` (its
eager form materializes the scores); on CPU it calls the eager one.
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Optional

import torch
from torch import Tensor

from .._validation import check_param, compute_dtype
from .ops.projection_attention import check_attention_inputs
from .reference.evidential_attention import threshold

try:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
except ImportError:  # torch < 2.5
    create_block_mask = flex_attention = None


def flex_available() -> bool:
    """Whether this torch has ``torch.nn.attention.flex_attention``."""
    return flex_attention is not None


def _require_flex() -> None:
    if flex_attention is None:
        raise RuntimeError(f"backend='flex' needs torch.nn.attention.flex_attention (torch >= 2.5); torch "
                           f"{torch.__version__} has none: use another attention backend")


@lru_cache(maxsize=None)
def _compiled_flex():
    return torch.compile(flex_attention, dynamic=False)


@lru_cache(maxsize=32)
def _causal_block_mask(L: int, S: int, device: torch.device, offset: int = 0):
    def causal(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + offset

    return create_block_mask(causal, None, None, L, S, device=device)


def off_support_drop(dtype: torch.dtype) -> float:
    """``C`` with ``exp(-C)`` = 0 in ``dtype`` (below its smallest subnormal), plus a margin."""
    finfo = torch.finfo(dtype)
    return float(math.ceil(-math.log(finfo.smallest_normal * finfo.eps)) + 16)


def _valid_keys(keep: Optional[Tensor], key_lengths: Optional[Tensor], S: int) -> Optional[Tensor]:
    """``keep`` and the key-length mask, as one boolean mask broadcastable to (B, Hq, L, S)."""
    if key_lengths is None:
        return keep
    short = (torch.arange(S, device=key_lengths.device) < key_lengths.view(-1, 1, 1, 1))
    return short if keep is None else keep & short


def ev_softmax_flex_attention(
    query: Tensor, key: Tensor, value: Tensor, keep: Optional[Tensor] = None, key_lengths: Optional[Tensor] = None,
    is_causal: bool = False, scale: Optional[float] = None, causal_offset: int = 0,
) -> Tensor:
    """ev-softmax attention (Eq. 7 over the valid keys) by ``flex_attention``; ``backend="flex"``.

    ``query`` (B, Hq, L, E), ``key`` (B, Hk, S, E), ``value`` (B, Hk, S, Ev) of one floating dtype,
    ``Hk`` dividing ``Hq`` (grouped-query attention) -> (B, Hq, L, Ev). ``scale`` defaults to
    ``1/sqrt(E)``. Masks, optional and combined: ``keep`` boolean broadcastable to (B, Hq, L, S),
    True = attend; ``key_lengths`` (B,) int, keys ``j >= key_lengths[b]`` are not there;
    ``is_causal``, query ``i`` sees keys ``j <= i + causal_offset`` (0: top-left, as SDPA; ``S - L``:
    bottom-right, as FlashAttention >= 2.1). Not-there keys get exactly
    zero weight and are left out of the mean; a query with no valid key gives a zero row. Equals
    ``sparse_attention(..., normalizer="ev_softmax")`` (see the module notes for rounding).

    On CPU only the forward exists: call it under ``torch.no_grad()`` (or with inputs that do not
    require grad); a differentiable call raises ``NotImplementedError``.
    """
    _require_flex()
    check_attention_inputs(query, key, value, keep, key_lengths)
    if scale is not None:
        check_param(scale, "scale")
    scale = query.shape[-1] ** -0.5 if scale is None else float(scale)
    B, Hq, L, _ = query.shape
    Hk, S = key.shape[1], key.shape[2]
    if query.device.type == "cpu":
        if torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)):
            raise NotImplementedError(
                "backend='flex' (ev_softmax_flex_attention) has no backward on CPU: FlexAttention "
                f"differentiates only on CUDA in torch {torch.__version__}. Call it under torch.no_grad(), "
                "or use the default attention backend to train on CPU")
        query, key, value = query.detach(), key.detach(), value.detach()

    valid = _valid_keys(keep, key_lengths, S)
    cdt = compute_dtype(query)
    with torch.no_grad():  # the threshold carries no gradient (Eq. 9)
        keys = key.to(cdt).repeat_interleave(Hq // Hk, dim=1) if Hk != Hq else key.to(cdt)
        valid4 = None if valid is None else valid.reshape((1,) * (4 - valid.dim()) + valid.shape)
        thr, _ = threshold(query.to(cdt), keys, valid4, None, bool(is_causal), scale, causal_offset=causal_offset)
        thr = thr.squeeze(-1).expand(B, Hq, L).contiguous()
    drop = off_support_drop(cdt)

    def score_mod(score, b, h, q_idx, kv_idx):
        return torch.where(score >= thr[b, h, q_idx], score, score - drop)

    block_mask = None
    if valid is not None:
        valid_full = valid4.expand(B, Hq, L, S)

        def mask_mod(b, h, q_idx, kv_idx):
            ok = valid_full[b, h, q_idx, kv_idx]
            return ok & (kv_idx <= q_idx + causal_offset) if is_causal else ok

        block_mask = create_block_mask(mask_mod, B, Hq, L, S, device=query.device)
    elif is_causal:  # the causal structure alone: one mask for every batch and head, built once per shape
        build = _causal_block_mask.__wrapped__ if torch.compiler.is_compiling() else _causal_block_mask
        block_mask = build(L, S, query.device, int(causal_offset))
    attend = _compiled_flex() if query.is_cuda and not torch.compiler.is_compiling() else flex_attention
    return attend(query, key, value, score_mod=score_mod, block_mask=block_mask, scale=scale,
                  enable_gqa=Hk != Hq)


__all__ = ["ev_softmax_flex_attention", "flex_available", "off_support_drop"]
