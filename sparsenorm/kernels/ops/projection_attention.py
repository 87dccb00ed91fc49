"""The registered operator for memory-efficient sparsemax / 1.5-entmax attention.

``sparsenorm::projection_attention`` runs the blockwise algorithm of
:mod:`sparsenorm.kernels.reference.projection_attention` (exact threshold search over key blocks,
then one ``P V`` pass; O(L) extra memory) on every device, with a fake (shape) implementation so
``torch.compile(fullgraph=True)`` treats it as one opaque node, and its closed-form blockwise
backward ``sparsenorm::projection_attention_backward`` registered as its autograd formula. The
backward is not itself differentiable (no double backward).

:func:`projection_attention` is its checked entry point for direct calls; the attention layer calls
the op through :mod:`sparsenorm.kernels.attention.dispatch`, which has checked the arguments.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from ..._validation import check_floating, check_n_iter, check_param, compute_dtype
from .. import cpu
from ..reference import projection_attention as ref

BLOCK_Q = ref.BLOCK_Q
BLOCK_K = ref.BLOCK_K


@torch.library.custom_op("sparsenorm::projection_attention", mutates_args=())
def projection_attention_op(query: Tensor, key: Tensor, value: Tensor, keep: Optional[Tensor],
                            key_lengths: Optional[Tensor], is_causal: bool, scale: float, kind: str,
                            block_q: int, block_k: int, alpha: float, n_iter: int,
                            causal_offset: int = 0) -> Tuple[Tensor, Tensor, Tensor]:
    """``(out, shift, tau)``; see :func:`projection_attention` and the reference module."""
    return ref.forward(query, key, value, keep, key_lengths, is_causal, scale, kind, block_q, block_k, alpha, n_iter,
                       causal_offset=causal_offset)


@projection_attention_op.register_kernel("cpu")
def _projection_attention_cpu(query, key, value, keep, key_lengths, is_causal, scale, kind, block_q, block_k, alpha,
                              n_iter, causal_offset=0):
    # The blockwise loop of the reference, with each kept query block's threshold found by the C++
    # row solver (the one sparsemax/entmax15 use) instead of the search's passes over the block.
    solver = _cpu_kept_thresholds if cpu.PROJECTION.get() is not None else None  # None: not built, or not allowed now
    return ref.forward(query, key, value, keep, key_lengths, is_causal, scale, kind, block_q, block_k, alpha, n_iter,
                       kept_thresholds=solver, causal_offset=causal_offset)


def _cpu_kept_thresholds(z: Tensor, kind: str) -> Optional[Tensor]:
    """The C++ kernel's threshold of each row of ``z`` (rows minus their maxima), or None where it
    is not built or allowed (:func:`sparsenorm.kernels.disabled`) or cannot take ``z``."""
    ext = cpu.PROJECTION.kernel_for(z)
    if ext is None or z.shape[-1] == 0:
        return None
    return ext.thresholds(z.reshape(-1, z.shape[-1]), kind == "entmax15").view(z.shape[:-1] + (1,))


@projection_attention_op.register_fake
def _projection_attention_fake(query, key, value, keep, key_lengths, is_causal, scale, kind, block_q, block_k, alpha,
                               n_iter, causal_offset=0):
    B, Hq, L, _ = query.shape
    row = query.new_empty((B, Hq, L), dtype=compute_dtype(query))
    return query.new_empty((B, Hq, L, value.shape[-1])), row, row.clone()


@torch.library.custom_op("sparsenorm::projection_attention_backward", mutates_args=())
def projection_attention_backward(grad_out: Tensor, query: Tensor, key: Tensor, value: Tensor,
                                     keep: Optional[Tensor], key_lengths: Optional[Tensor], is_causal: bool,
                                     scale: float, kind: str, shift: Tensor, tau: Tensor, block_q: int,
                                     block_k: int, alpha: float, n_iter: int,
                                     causal_offset: int = 0) -> Tuple[Tensor, Tensor, Tensor]:
    """``(d query, d key, d value)`` from the forward's saved ``shift`` and ``tau``."""
    return ref.backward(grad_out, query, key, value, keep, key_lengths, is_causal, scale, kind, shift, tau,
                        block_q, block_k, alpha, n_iter, causal_offset)


@projection_attention_backward.register_fake
def _projection_attention_backward_fake(grad_out, query, key, value, keep, key_lengths, is_causal, scale, kind,
                                        shift, tau, block_q, block_k, alpha, n_iter, causal_offset=0):
    return torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)


def _setup(ctx, inputs, output) -> None:
    (query, key, value, keep, key_lengths, is_causal, scale, kind, block_q, block_k, alpha, n_iter,
     causal_offset) = inputs
    _, shift, tau = output
    ctx.save_for_backward(query, key, value, keep, key_lengths, shift, tau)
    ctx.args = (is_causal, scale, kind)
    ctx.options = (block_q, block_k, alpha, n_iter, causal_offset)  # after shift and tau in the backward op
    ctx.mark_non_differentiable(shift, tau)


def _backward(ctx, grad_out, _grad_shift, _grad_tau):
    query, key, value, keep, key_lengths, shift, tau = ctx.saved_tensors
    dq, dk, dv = projection_attention_backward(grad_out.contiguous(), query, key, value, keep, key_lengths,
                                                  *ctx.args, shift, tau, *ctx.options)
    return dq, dk, dv, None, None, None, None, None, None, None, None, None, None


projection_attention_op.register_autograd(_backward, setup_context=_setup)


def check_attention_inputs(query: Tensor, key: Tensor, value: Tensor, keep: Optional[Tensor],
                           key_lengths: Optional[Tensor]) -> None:
    """Raise naming the argument unless ``query`` (B, Hq, L, E), ``key`` (B, Hk, S, E), ``value``
    (B, Hk, S, Ev) share one floating dtype with ``Hk`` dividing ``Hq``, ``keep`` is a boolean mask
    broadcastable to (B, Hq, L, S) and ``key_lengths`` an integer (B,) tensor (both optional, on the
    query's device). Shapes and dtypes only: no tensor value is read."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        check_floating(t, name)
        if t.dim() != 4:
            raise ValueError(f"{name} must have shape (batch, heads, length, features), got {tuple(t.shape)}")
    if not (query.dtype == key.dtype == value.dtype):
        raise TypeError(f"query, key and value must have one dtype, got {query.dtype}, {key.dtype}, {value.dtype}")
    B, Hq, L, E = query.shape
    if key.shape[0] != B or value.shape[0] != B:
        raise ValueError(f"query, key and value must have one batch size (dim 0), got {B}, {key.shape[0]}, "
                         f"{value.shape[0]}")
    if key.shape[-1] != E:
        raise ValueError(f"query and key must have the same last dimension, got {E} and {key.shape[-1]}")
    if key.shape[1:3] != value.shape[1:3]:
        raise ValueError(f"key and value must have the same heads and length, got {tuple(key.shape)} and "
                         f"{tuple(value.shape)}")
    if Hq % key.shape[1]:
        raise ValueError(f"key has {key.shape[1]} heads, which does not divide query's {Hq} heads")
    if keep is not None:
        if not isinstance(keep, Tensor) or keep.dtype != torch.bool:
            raise TypeError("keep must be a boolean tensor (True = attend) or None")
        scores_shape = (B, Hq, L, key.shape[2])
        if keep.dim() > 4 or any(n not in (1, m) for n, m in zip(keep.shape[::-1], scores_shape[::-1])):
            raise ValueError(f"keep of shape {tuple(keep.shape)} does not broadcast to the scores' shape "
                             f"{scores_shape}")
        if keep.device != query.device:
            raise ValueError(f"keep is on {keep.device} but query is on {query.device}")
    if key_lengths is not None:
        if not isinstance(key_lengths, Tensor) or key_lengths.dtype not in (torch.int32, torch.int64):
            raise TypeError("key_lengths must be an int32/int64 tensor of shape (batch,)")
        if key_lengths.shape != (B,):
            raise ValueError(f"key_lengths must have shape ({B},), got {tuple(key_lengths.shape)}")
        if key_lengths.device != query.device:
            raise ValueError(f"key_lengths is on {key_lengths.device} but query is on {query.device}")


def _check_options(kind: str, block_q: int, block_k: int, alpha: float, n_iter: int) -> None:
    if kind not in ref.KINDS:
        raise ValueError(f"kind must be one of {ref.KINDS}, got {kind!r}")
    if kind == "entmax_bisect":
        if isinstance(alpha, Tensor):
            raise TypeError("alpha must be a number here (one alpha for all rows)")
        check_param(alpha, "alpha", low=1.0, low_inclusive=False)
        check_n_iter(n_iter)
    for name, b in (("block_q", block_q), ("block_k", block_k)):
        if not isinstance(b, int) or isinstance(b, bool) or b < 1:
            raise ValueError(f"{name} must be a positive int, got {b!r}")


def projection_attention(
    query: Tensor, key: Tensor, value: Tensor, kind: str = "sparsemax", keep: Optional[Tensor] = None,
    key_lengths: Optional[Tensor] = None, is_causal: bool = False, scale: Optional[float] = None,
    alpha: float = 1.5, n_iter: int = 50, block_q: int = BLOCK_Q, block_k: int = BLOCK_K, causal_offset: int = 0,
) -> Tensor:
    """sparsemax (``kind='sparsemax'``), 1.5-entmax (``'entmax15'``) or alpha-entmax by bisection
    (``'entmax_bisect'``) attention in O(L) extra memory.

    ``out = P V`` with ``P = kind(query key^T * scale)`` over the keys there, row by row, without
    the L x S matrix (see :mod:`sparsenorm.kernels.reference.projection_attention`). ``query``
    (B, Hq, L, E), ``key`` (B, Hk, S, E), ``value`` (B, Hk, S, Ev) of one floating dtype, ``Hk``
    dividing ``Hq`` (grouped-query attention) -> (B, Hq, L, Ev). ``scale`` defaults to
    ``1/sqrt(E)``. Masks, all optional and combined: ``keep`` boolean broadcastable to
    (B, Hq, L, S), True = attend; ``key_lengths`` (B,) int, keys ``j >= key_lengths[b]`` are not
    there; ``is_causal``, query ``i`` sees keys ``j <= i + causal_offset`` (0: top-left, as SDPA;
    ``S - L``: bottom-right, as FlashAttention >= 2.1). Not-there keys get
    exactly zero weight; a query with no key there gives a zero output row and zero gradient.
    float16/bfloat16 inputs are computed in float32. Differentiable in ``query``, ``key`` and
    ``value`` (closed form, blockwise, O(L) extra memory); not twice.

    sparsemax and 1.5-entmax are exact (closed form on the support found by the search).
    ``'entmax_bisect'`` reproduces ``sparsenorm.entmax_bisect(scores, alpha, n_iter=n_iter)`` (``alpha
    > 1``, one number; ``n_iter`` halvings of the threshold's bracket, one pass over the keys each,
    then the weights divided by their sum), not differentiable in ``alpha``.
    """
    check_attention_inputs(query, key, value, keep, key_lengths)
    _check_options(kind, block_q, block_k, alpha, n_iter)
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    check_param(scale, "scale")
    out, _, _ = projection_attention_op(query, key, value, keep, key_lengths, bool(is_causal), float(scale), kind,
                                        block_q, block_k, float(alpha), int(n_iter), int(causal_offset))
    return out


__all__ = ["projection_attention", "projection_attention_op", "projection_attention_backward",
           "check_attention_inputs"]
