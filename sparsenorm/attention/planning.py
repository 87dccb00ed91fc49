"""``sparsenorm.attention.plan``: which backend ``sparse_attention(..., backend="auto")`` runs for
given shapes, and why -- without tensors and without a GPU (the choice itself is made in
:func:`sparsenorm.kernels.auto_plan.choose_attention`, the same function ``auto`` runs)."""
from __future__ import annotations

from typing import Optional

import torch

from .. import registry
from ..kernels.auto_plan import FLOAT_DTYPES, MASK_KINDS, AttentionPlan, AttentionSpec, choose_attention


def plan(normalizer: str, *, device="cpu", dtype=torch.float32, causal: bool = False, q_len: int, k_len: int,
         head_dim: int, value_dim: Optional[int] = None, mask: Optional[str] = None, need_weights: bool = False,
         dropout_p: float = 0.0, requires_grad: bool = False, count_support: bool = False) -> AttentionPlan:
    """Which backend ``sparse_attention(q, k, v, normalizer, backend="auto")`` runs, and why.

    ``device`` (``"cpu"``, ``"cuda"``), ``dtype``, ``causal``, ``q_len`` (L), ``k_len`` (S),
    ``head_dim`` (E), ``value_dim`` (default E); ``mask`` None, ``"keys"`` (key padding or key
    lengths), ``"general"`` (a boolean mask that varies over queries or heads) or ``"float"`` (an
    additive mask); what the call asks for: ``need_weights``, ``dropout_p``, ``requires_grad`` (the
    inputs require grad), ``count_support`` (inside ``sparsenorm.attention.record``). Inputs are
    taken as 4-D (B, H, L, E) of one batch size. Returns an :class:`AttentionPlan`: ``backend``,
    ``reason``, ``proof`` (the committed GPU run behind a CUDA device kernel) and ``rejected`` (each
    backend tried before, with why not). Example::

        >>> plan("ev_softmax", device="cuda", dtype=torch.bfloat16, causal=True, q_len=4096, k_len=4096, head_dim=64)
        AttentionPlan(backend='flex', reason='FlexAttention with the threshold folded in (passed the CUDA suite)', ...)
    """
    if normalizer not in registry.names():
        raise ValueError(f"normalizer must be one of {', '.join(registry.names())}, got {normalizer!r}")
    if mask not in MASK_KINDS:
        raise ValueError(f"mask must be one of {MASK_KINDS}, got {mask!r}")
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"dtype must be a floating dtype, got {dtype}")
    for arg, value in (("q_len", q_len), ("k_len", k_len), ("head_dim", head_dim)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{arg} must be a non-negative int, got {value!r}")
    device_type = torch.device(device).type
    spec = AttentionSpec(normalizer, registry.get(normalizer).attention_threshold, device_type, dtype, bool(causal),
                         q_len, k_len, head_dim, head_dim if value_dim is None else value_dim, mask,
                         needs_weights=bool(need_weights), dropout=dropout_p > 0, requires_grad=bool(requires_grad),
                         count_support=bool(count_support))
    return choose_attention(spec)


__all__ = ["plan", "AttentionPlan"]
