"""``sparse_attention``: scaled dot-product attention with any sparsenorm normalizer in place of softmax."""
from __future__ import annotations

from functools import partial
from typing import Callable, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import registry
from .._validation import check_attention_batch, check_floating, check_param, compute_dtype
from . import stats
from .blockwise import ev_softmax_attention_blockwise
from .masks import causal_keep, combine_keep, split_mask

BLOCKWISE_MIN_SCORES = 1 << 20
"""The blockwise ev-softmax path is chosen automatically once ``L * S`` reaches this."""

_BLOCKWISE_NORMALIZERS = ("ev_softmax", "posthoc_evidential")


def resolve_normalizer(normalizer: Union[str, Callable], params: dict) -> Tuple[Callable, Optional[str]]:
    """``(fn(scores, dim=-1), registry name or None)`` for a registry name or a callable.

    Attention uses each normalizer's evaluation form (``Normalizer.forward``); ev-softmax's
    Jacobian (Eq. 9) trains it directly, so Eq. 10's eps is not used here. ``posthoc_evidential``
    is ev-softmax of the scores (Theorem 3.1 with the keys as the linear layer); the modules and
    :mod:`sparsenorm.hf` use softmax for it in training mode.
    """
    if callable(normalizer):
        return (partial(normalizer, **params) if params else normalizer), None
    if not isinstance(normalizer, str):
        raise TypeError(f"normalizer must be a registry name or a callable, got {type(normalizer).__name__}")
    if normalizer == "posthoc_evidential":
        if params:
            raise ValueError(f"normalizer 'posthoc_evidential' takes no parameters, got {sorted(params)}")
        return registry.get("ev_softmax").forward, normalizer
    return registry.get(normalizer, **params).forward, normalizer


def _check_inputs(query: Tensor, key: Tensor, value: Tensor, dropout_p: float, scale) -> None:
    for name, t in (("query", query), ("key", key), ("value", value)):
        check_floating(t, name)
        if t.dim() < 2:
            raise ValueError(f"{name} must have at least 2 dimensions (..., length, features), got shape {tuple(t.shape)}")
    if key.shape[-1] != query.shape[-1]:
        raise ValueError(f"query and key must have the same last dimension, got {query.shape[-1]} and {key.shape[-1]}")
    if key.shape[-2] != value.shape[-2]:
        raise ValueError(f"key and value must have the same length (dim -2), got {key.shape[-2]} and {value.shape[-2]}")
    check_attention_batch(query, key, value)
    if not (key.dtype == value.dtype == query.dtype):
        raise TypeError(f"query, key and value must have one dtype, got {query.dtype}, {key.dtype}, {value.dtype}")
    check_param(dropout_p, "dropout_p", low=0.0, high=1.0, high_inclusive=False)
    if scale is not None:
        check_param(scale, "scale")


def _expand_heads(query: Tensor, t: Tensor, name: str) -> Tensor:
    """Grouped-query attention: repeat each key/value head over its group of query heads."""
    if query.dim() < 3 or t.dim() < 3:
        return t
    hq, hk = query.shape[-3], t.shape[-3]
    if hk == hq or hk == 1:
        return t
    if hq % hk:
        raise ValueError(f"{name} has {hk} heads (dim -3), which does not divide query's {hq} heads")
    return t.repeat_interleave(hq // hk, dim=-3)


def _normalize(fn: Callable, scores: Tensor, keep: Optional[Tensor]) -> Tensor:
    """``fn`` over the last dim with not-there keys at ``-inf``; rows with no valid key give zeros."""
    if keep is None:
        return fn(scores, dim=-1)
    scores = scores.masked_fill(~keep, float("-inf"))
    empty = ~keep.any(-1, keepdim=True)
    # No normalizer sees an all -inf row (softmax would give NaN); those rows are zeroed after,
    # and masked_fill passes them no gradient.
    weights = fn(scores.masked_fill(empty, 0.0), dim=-1)
    return weights.masked_fill(empty, 0.0)


def _flash_ev_softmax(query: Tensor, key: Tensor, value: Tensor, keep: Optional[Tensor], is_causal: bool,
                      scale: Optional[float]) -> Optional[Tensor]:
    """ev-softmax attention by the Triton flash kernel, or None where it does not apply.

    It applies to 4-D (B, H, L, E) inputs with E <= 128 and the value's head dim equal to the
    query's, without batch broadcasting, and to masks that vary over keys only (padding); other
    cases (and a missing triton) return None, and the caller takes the PyTorch paths.
    """
    from ..kernels.ops import triton_launchers

    launchers = triton_launchers()
    if launchers is None or any(t.dim() != 4 for t in (query, key, value)):
        return None
    B, E, S = query.shape[0], query.shape[-1], key.shape[-2]
    if E > 128 or value.shape[-1] != E or key.shape[0] != B or value.shape[0] != B:
        return None
    key_mask = None
    if keep is not None:
        if keep.dim() > 4:
            return None
        keep = keep.reshape((1,) * (4 - keep.dim()) + keep.shape)
        if keep.shape[1] != 1 or keep.shape[2] != 1:
            return None  # a mask that differs between heads or queries
        key_mask = keep.expand(B, 1, 1, S).reshape(B, S)
    return launchers.flash_ev_softmax_attention(query, key, value, is_causal=is_causal, scale=scale,
                                                key_mask=key_mask)


def sparse_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    normalizer: Union[str, Callable] = "ev_softmax",
    attn_mask: Optional[Tensor] = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: Optional[float] = None,
    return_weights: bool = False,
    **params,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Scaled dot-product attention ``normalizer(q k^T * scale + mask) v``.

    Shapes, broadcasting, ``scale`` and masks follow ``F.scaled_dot_product_attention``: ``query``
    (..., Hq, L, E), ``key`` (..., Hk, S, E), ``value`` (..., Hk, S, Ev) -> (..., Hq, L, Ev);
    leading dims broadcast; ``scale`` defaults to ``1/sqrt(E)``. Grouped-query attention: when
    ``Hk`` divides ``Hq``, key/value head ``h`` serves query heads ``h*Hq/Hk ... (h+1)*Hq/Hk - 1``
    (SDPA's ``enable_gqa``, here automatic).

    ``attn_mask`` (broadcastable to (..., L, S)): boolean, True = attend; or float, added to the
    scores, where ``-inf`` and values at or below ``finfo(dtype).min / 2`` mean "not there".
    ``is_causal``: query ``i`` sees keys ``j <= i`` (top-left, as SDPA); unlike SDPA it may be
    combined with ``attn_mask``. Not-there keys get exactly zero weight for every normalizer and
    are left out of its threshold (ev-softmax's mean is over the valid keys only, so padding does
    not change a sequence's weights). A query with no valid key gives a zero output row and zero
    gradient.

    ``normalizer``: a name from :mod:`sparsenorm.registry` (its evaluation form; ``**params``
    rebind its parameters, e.g. ``alpha=1.3``, ``r=0.5``) or a callable ``fn(scores, dim=-1)``
    (``**params`` passed to it). ``dropout_p`` drops weights as SDPA does (always, when > 0).

    On CUDA, ev-softmax without weights, dropout, statistics recording or a float mask runs the
    Triton flash kernel (:mod:`sparsenorm.kernels.triton`, extra ``[gpu]``) where it applies (see
    :func:`_flash_ev_softmax`). Elsewhere, ev-softmax without weights, dropout or a float mask that needs a gradient runs blockwise
    (:mod:`sparsenorm.attention.blockwise`, exact, O(L) extra memory) once ``L * S`` reaches
    :data:`BLOCKWISE_MIN_SCORES`. The other normalizers need the whole row for their threshold
    (a sort or an iteration over all scores), so they run densely, with the L x S weights.

    Returns the output, or ``(output, weights)`` with ``return_weights`` (weights (..., Hq, L, S),
    after dropout, as ``nn.MultiheadAttention`` returns them).
    """
    _check_inputs(query, key, value, dropout_p, scale)
    keep, bias = split_mask(attn_mask)
    return attend(query, key, value, normalizer, keep, bias, is_causal, dropout_p, scale, return_weights, **params)


def attend(
    query: Tensor, key: Tensor, value: Tensor, normalizer: Union[str, Callable], keep: Optional[Tensor],
    bias: Optional[Tensor], is_causal: bool = False, dropout_p: float = 0.0, scale: Optional[float] = None,
    return_weights: bool = False, **params,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """:func:`sparse_attention` with the mask already split into a boolean ``keep`` and a finite
    ``bias`` (see :func:`sparsenorm.attention.masks.split_mask`); shapes as there."""
    fn, name = resolve_normalizer(normalizer, params)
    if (query.is_cuda and name in _BLOCKWISE_NORMALIZERS and not return_weights and dropout_p == 0.0
            and bias is None and not stats.recording()):
        out = _flash_ev_softmax(query, key, value, keep, is_causal, scale)
        if out is not None:
            return out
    key, value = _expand_heads(query, key, "key"), _expand_heads(query, value, "value")
    L, S = query.shape[-2], key.shape[-2]
    scale = query.shape[-1] ** -0.5 if scale is None else float(scale)
    out_dtype = query.dtype
    cdt = compute_dtype(query)
    scores_shape = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2]) + (L, S)
    for m in (keep, bias):
        if m is not None:
            try:
                if torch.broadcast_shapes(m.shape, scores_shape) != scores_shape:
                    raise RuntimeError
            except RuntimeError:
                raise ValueError(f"attn_mask of shape {tuple(m.shape)} does not broadcast to the "
                                 f"attention scores' shape {tuple(scores_shape)}") from None
    if bias is not None:
        bias = bias.to(cdt)
    q, k, v = query.to(cdt), key.to(cdt), value.to(cdt)
    record = stats.recording()

    blockwise = (
        name in _BLOCKWISE_NORMALIZERS and not return_weights and dropout_p == 0.0
        and L * S >= max(BLOCKWISE_MIN_SCORES, 1) and (bias is None or not bias.requires_grad)
    )
    if blockwise:
        # The blockwise path slices masks by (row, column): give 0-d/1-d masks both dims.
        keep, bias = (None if m is None else m.reshape((1,) * max(0, 2 - m.dim()) + m.shape) for m in (keep, bias))
        batch = scores_shape[:-2]
        q, k, v = q.expand(*batch, L, q.shape[-1]), k.expand(*batch, S, k.shape[-1]), v.expand(*batch, S, v.shape[-1])
        out, support, count = ev_softmax_attention_blockwise(q, k, v, keep, bias, is_causal, scale, count_support=record)
        if record:
            stats.observe(support, count)
        return out.to(out_dtype)

    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if bias is not None:
        scores = scores + bias
    if is_causal:
        keep = combine_keep(keep, causal_keep(L, S, device=query.device))
    weights = _normalize(fn, scores, keep)
    if record:
        valid = (keep.expand(scores_shape).sum(-1) if keep is not None
                 else torch.full((), S, dtype=torch.long))
        stats.observe((weights != 0).sum(-1), valid)
    if dropout_p > 0.0:
        weights = F.dropout(weights, dropout_p, training=True)
    out = torch.matmul(weights, v).to(out_dtype)
    return (out, weights.to(out_dtype)) if return_weights else out
