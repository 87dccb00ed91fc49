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

from ..._validation import check_param, compute_dtype
from .call import combine_keep
from ..ops.projection_attention import check_attention_inputs
from ..reference.evidential_attention import threshold

try:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
except ImportError:  # torch < 2.5
    create_block_mask = flex_attention = None


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


def _key_validity(keep: Optional[Tensor], key_lengths: Optional[Tensor], B: int, S: int):
    """``keep`` and ``key_lengths`` as one (B, S) boolean key-padding mask (None: every key is there),
    or ``NotImplemented`` where ``keep`` varies over heads or queries."""
    keys = None
    if keep is not None:
        k4 = keep.reshape((1,) * (4 - keep.dim()) + keep.shape)
        if k4.shape[1] != 1 or k4.shape[2] != 1:
            return NotImplemented
        keys = k4.expand(B, 1, 1, S).reshape(B, S)
    if key_lengths is not None:
        short = torch.arange(S, device=key_lengths.device) < key_lengths.view(-1, 1)
        keys = short if keys is None else keys & short
    return keys


def key_padding_threshold(query: Tensor, key: Tensor, valid_keys: Optional[Tensor], is_causal: bool, scale: float,
                          causal_offset: int = 0) -> Tensor:
    """Each query's ev-softmax threshold (B, Hq, L), float32: ``scale * q_i . mean of the valid keys
    it sees`` (Eq. 7's mean, linear in the keys), for a key-padding mask ``valid_keys`` (B, S) or
    None, causal or not. The keys are summed per key/value head (no GQA copy); under a causal mask
    their prefix sums come from the op ``sparsenorm::key_prefix_sums`` (one pass on CUDA). A query
    that sees no key gets 0 (its row is empty either way). No gradient (Eq. 9)."""
    from ..ops.evidential_attention import key_prefix_sums

    B, Hq, L, D = query.shape
    Hk, S = key.shape[1], key.shape[2]
    keys = key if valid_keys is None else key.masked_fill(~valid_keys.view(B, 1, S, 1), 0.0)
    if is_causal:
        last = torch.arange(L, device=query.device) + int(causal_offset)
        seen = last.clamp(0, S - 1)
        sums = key_prefix_sums(keys)  # (B, Hk, S, D) float32
        if not (causal_offset == 0 and L == S):
            sums = sums[:, :, seen]
        if valid_keys is None:
            count = (seen + 1).to(torch.float32).expand(B, L)
        else:
            count = valid_keys.to(torch.int32).cumsum(-1)[:, seen].to(torch.float32)
        count = count * (last >= 0).to(torch.float32)  # queries before the first key see none
    else:
        sums = keys.sum(-2, keepdim=True, dtype=torch.float32)  # (B, Hk, 1, D)
        count = (torch.full((B, 1), float(S), device=query.device) if valid_keys is None
                 else valid_keys.sum(-1, keepdim=True, dtype=torch.float32))
    group = Hq // Hk
    dots = (query.view(B, Hk, group, L, D) * sums.unsqueeze(2)).sum(-1, dtype=torch.float32)  # (B, Hk, G, L)
    return (dots.reshape(B, Hq, L) * scale / count.clamp_min(1).view(B, 1, -1)).contiguous()


def ev_softmax_flex_attention(
    query: Tensor, key: Tensor, value: Tensor, keep: Optional[Tensor] = None, key_lengths: Optional[Tensor] = None,
    is_causal: bool = False, scale: Optional[float] = None, causal_offset: int = 0, bias: Optional[Tensor] = None,
) -> Tensor:
    """ev-softmax attention (Eq. 7 over the valid keys) by ``flex_attention``; ``backend="flex"``.

    ``query`` (B, Hq, L, E), ``key`` (B, Hk, S, E), ``value`` (B, Hk, S, Ev) of one floating dtype,
    ``Hk`` dividing ``Hq`` (grouped-query attention) -> (B, Hq, L, Ev). ``scale`` defaults to
    ``1/sqrt(E)``. Masks, optional and combined: ``keep`` boolean broadcastable to (B, Hq, L, S),
    True = attend; ``key_lengths`` (B,) int, keys ``j >= key_lengths[b]`` are not there;
    ``is_causal``, query ``i`` sees keys ``j <= i + causal_offset`` (0: top-left, as SDPA; ``S - L``:
    bottom-right, as FlashAttention >= 2.1); ``bias`` a finite float mask broadcastable to
    (B, Hq, L, S) added to the scaled scores (not differentiated: the threshold is the mean of
    ``s + bias`` over the valid keys, as the dense path's). Not-there keys get exactly zero weight
    and are left out of the mean; a query with no valid key gives a zero row. Equals
    ``sparse_attention(..., normalizer="ev_softmax")`` (see the module notes for rounding).

    Blocks: the causal and key-padding structure go into a ``BlockMask``, so FlexAttention skips the
    key blocks above the diagonal and past the padding; one mask per shape for causal alone (cached),
    one per call where padding is given (built from a (B, S) key mask, not from L x S entries).

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

    cdt = compute_dtype(query)
    valid_keys = _key_validity(keep, key_lengths, B, S) if bias is None else NotImplemented
    with torch.no_grad():  # the threshold carries no gradient (Eq. 9)
        if valid_keys is not NotImplemented:
            thr = key_padding_threshold(query.detach(), key.detach(), valid_keys, bool(is_causal), scale,
                                        causal_offset)
        else:  # a mask that varies over queries or heads, or a float mask: the general threshold
            keys = key.detach().to(cdt).repeat_interleave(Hq // Hk, dim=1) if Hk != Hq else key.detach().to(cdt)
            valid = keep if key_lengths is None else combine_keep(
                keep, torch.arange(S, device=key.device) < key_lengths.view(-1, 1, 1, 1))
            valid4 = None if valid is None else valid.reshape((1,) * (4 - valid.dim()) + valid.shape)
            bias4 = None if bias is None else bias.detach().to(cdt).reshape((1,) * (4 - bias.dim()) + bias.shape)
            thr, _ = threshold(query.detach().to(cdt), keys, valid4, bias4, bool(is_causal), scale,
                               causal_offset=causal_offset)
            thr = thr.squeeze(-1).expand(B, Hq, L).contiguous()
            valid_keys = None if valid4 is None else valid4.expand(B, Hq, L, S)
    drop = off_support_drop(cdt)

    if bias is None:
        def score_mod(score, b, h, q_idx, kv_idx):
            return torch.where(score >= thr[b, h, q_idx], score, score - drop)
    else:
        full_bias = bias.detach().reshape((1,) * (4 - bias.dim()) + bias.shape).expand(B, Hq, L, S)

        def score_mod(score, b, h, q_idx, kv_idx):
            s = score + full_bias[b, h, q_idx, kv_idx]
            return torch.where(s >= thr[b, h, q_idx], s, s - drop)

    block_mask = _block_mask(valid_keys, bool(is_causal), int(causal_offset), B, Hq, L, S, query.device)
    attend = _compiled_flex() if query.is_cuda and not torch.compiler.is_compiling() else flex_attention
    return attend(query, key, value, score_mod=score_mod, block_mask=block_mask, scale=scale,
                  enable_gqa=Hk != Hq)


def _block_mask(valid: Optional[Tensor], is_causal: bool, causal_offset: int, B: int, H: int, L: int, S: int,
                device):
    """The ``BlockMask`` of the keys each query may see: None (every key), the cached causal one, or
    one built from ``valid`` -- a (B, S) key-padding mask (no head or query dimension: the mask is
    evaluated on B x S points per block row, not on L x S) or a (B, H, L, S) general one."""
    if valid is None:
        if not is_causal:
            return None
        build = _causal_block_mask.__wrapped__ if torch.compiler.is_compiling() else _causal_block_mask
        return build(L, S, device, causal_offset)
    if valid.dim() == 2:
        def mask_mod(b, h, q_idx, kv_idx):
            ok = valid[b, kv_idx]
            return ok & (kv_idx <= q_idx + causal_offset) if is_causal else ok

        return create_block_mask(mask_mod, B, None, L, S, device=device)

    def mask_mod(b, h, q_idx, kv_idx):
        ok = valid[b, h, q_idx, kv_idx]
        return ok & (kv_idx <= q_idx + causal_offset) if is_causal else ok

    return create_block_mask(mask_mod, B, H, L, S, device=device)


__all__ = ["ev_softmax_flex_attention", "off_support_drop", "key_padding_threshold"]
