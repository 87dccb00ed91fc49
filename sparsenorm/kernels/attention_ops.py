"""The attention operators, and which one runs: the attention half of the op layer.

Registered ops (``torch.library.custom_op``, each with ``register_fake`` and a closed-form
autograd from its saved outputs):

* ``sparsenorm::ev_softmax_attention_blockwise`` (+ ``..._backward``): exact ev-softmax
  attention in O(L) extra memory, pure PyTorch (:mod:`.reference.evidential_attention`), any device;
* ``sparsenorm::ev_softmax_attention_flash`` (+ ``..._backward``): the same by the Triton flash
  kernel (:mod:`.triton.attention`), on CUDA (or on CPU tensors under ``TRITON_INTERPRET=1``);
* ``sparsenorm::projection_attention`` (:mod:`.attention_projection_ops`): sparsemax / 1.5-entmax /
  alpha-entmax attention in O(L) extra memory by a blockwise threshold search, any device;
* ev-softmax on PyTorch's FlexAttention (:mod:`.flex_attention`; not an op of ours: FlexAttention
  is itself compilable), ``backend="flex"`` only (never chosen by ``"auto"``).

Dispatch. The registry says what attention may do with a normalizer
(``Normalizer.attention_threshold``: ``"known"``, ``"searched"`` or None); :data:`KERNELS` maps
that capability to its memory-efficient kernels by backend name. A kernel is a function of one
:class:`AttentionCall` returning ``(out, support, valid)`` -- or None where it does not apply to
those inputs (the flash kernel: another device, a mask that varies over queries, ...). Adding
"this normalizer's attention op is X" is one line::

    register_attention_kernel("searched", "blockwise", my_kernel)

:func:`attention` picks the kernel: an explicit ``backend`` must apply (else ``ValueError``);
``"auto"`` tries :data:`AUTO_ORDER` (the blockwise kernels from :data:`BLOCKWISE_MIN_SCORES`
scores on) and falls back to :func:`dense_attention`, which builds the L x S
weights and works for every normalizer, weights, dropout and float-mask gradients included.
The device is looked at here, never above.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .._validation import compute_dtype
from . import cpu, flex_attention
from .attention_projection_ops import projection_attention_op
from .ops import triton_launchers
from .reference import evidential_attention as ref_attention

BLOCKWISE_MIN_SCORES = 1 << 20
"""``backend="auto"`` takes a blockwise kernel once ``L * S`` reaches this (below it the dense
path is as fast and its memory is small)."""

BACKENDS = ("auto", "dense", "blockwise", "triton", "flex")
"""Valid values of ``backend``: ``"auto"``, the dense path, and the memory-efficient kernel kinds."""

AUTO_ORDER = ("triton", "blockwise")
"""The memory-efficient backends ``backend="auto"`` tries, in this order, before the dense path."""


def _auto_min_scores(backend: str) -> int:
    """The least ``L * S`` at which ``backend="auto"`` takes ``backend``."""
    return BLOCKWISE_MIN_SCORES if backend == "blockwise" else 0


# ---------------------------------------------------------------------------------------------
# Masks in the kernels' form (the "not there" rule itself is in sparsenorm._validation)
# ---------------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------------
# One attention call, as every kernel receives it
# ---------------------------------------------------------------------------------------------
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
    :func:`attention` zeroes those rows of every kernel's result."""

    def broadcast(self) -> Tuple[Tensor, Tensor, Tensor, Optional[Tensor], Optional[Tensor]]:
        """``(q, k, v, keep, bias)`` in the compute dtype with one batch shape (GQA heads repeated,
        leading dims expanded), ``key_lengths`` folded into ``keep``; masks keep their broadcast form
        with at least 2 dims. For kernels that take no GQA, broadcasting or key lengths."""
        cdt = compute_dtype(self.q)
        batch = tuple(self.scores_shape[:-2])
        L, S = self.scores_shape[-2], self.scores_shape[-1]
        q = self.q.to(cdt).expand(*batch, L, self.q.shape[-1])
        k = expand_heads(self.q, self.k).to(cdt).expand(*batch, S, self.k.shape[-1])
        v = expand_heads(self.q, self.v).to(cdt).expand(*batch, S, self.v.shape[-1])
        keep = combine_keep(self.keep, lengths_keep(self.key_lengths, S, len(self.scores_shape)))
        keep, bias = (None if m is None else m.reshape((1,) * max(0, 2 - m.dim()) + m.shape)
                      for m in (keep, self.bias))
        return q, k, v, keep, None if bias is None else bias.to(cdt)


AttentionKernel = Callable[[AttentionCall], Optional[Tuple[Tensor, Optional[Tensor], Optional[Tensor]]]]
"""``kernel(call) -> (out, support, valid)`` or None where it does not apply; ``out`` (..., Hq, L, Ev)
in any floating dtype (cast to the query's after), ``support``/``valid`` (..., Hq, L) integer
counts when ``call.count_support`` (else None)."""


# ---------------------------------------------------------------------------------------------
# sparsenorm::ev_softmax_attention_blockwise
# ---------------------------------------------------------------------------------------------
@torch.library.custom_op("sparsenorm::ev_softmax_attention_blockwise", mutates_args=())
def ev_softmax_attention_blockwise_op(
    q: Tensor, k: Tensor, v: Tensor, keep: Optional[Tensor], bias: Optional[Tensor], is_causal: bool,
    scale: float, count_support: bool, block_q: int, block_k: int,
) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``(out, lse, thr, support, count)``; see :func:`.reference.evidential_attention.forward`
    (``support`` is empty unless ``count_support``)."""
    return _blockwise_reference(q, k, v, keep, bias, is_causal, scale, count_support, block_q, block_k)


def _blockwise_reference(q, k, v, keep, bias, is_causal, scale, count_support, block_q, block_k):
    out, lse, thr, support, count = ref_attention.forward(q, k, v, keep, bias, is_causal, scale, count_support,
                                                          block_q, block_k)
    if support is None:
        support = torch.empty((0,), dtype=torch.long, device=q.device)
    return out, lse, thr, support, count.contiguous()


def _batch_offsets(mask: Tensor, batch: Tuple[int, ...], L: int, S: int) -> Tuple[Tensor, Tensor]:
    """``(view, offsets)``: ``mask`` expanded to (*batch, L, S) without a copy, and the element
    offset of each flattened batch index in it, (N,) int64 (broadcast dims have stride 0)."""
    view = mask.expand(*batch, L, S)
    offsets = torch.zeros(batch, dtype=torch.long)
    for d, size in enumerate(batch):
        shape = [1] * len(batch)
        shape[d] = size
        offsets = offsets + torch.arange(size, dtype=torch.long).reshape(shape) * view.stride(d)
    return view, offsets.reshape(-1)


def _fused_cpu_applies(q: Tensor, k: Tensor, v: Tensor, keep: Optional[Tensor], bias: Optional[Tensor]) -> bool:
    """Whether the C++ kernels take these inputs: float32/float64 with one dtype for ``q, k, v`` and
    ``bias``, one batch shape (masks broadcastable to it), a boolean ``keep``, no empty dim. Anything
    else (e.g. a float64 bias on float32 inputs, zero keys) runs the reference, which defines it."""
    dt = q.dtype
    return (k.dtype == dt and v.dtype == dt and (bias is None or bias.dtype == dt)
            and (keep is None or keep.dtype == torch.bool)
            and q.dim() >= 2 and k.shape[:-2] == q.shape[:-2] and v.shape[:-2] == q.shape[:-2]
            and all(m.dim() <= q.dim() for m in (keep, bias) if m is not None)
            and min(q.shape[-2:]) > 0 and min(k.shape[-2:]) > 0 and v.shape[-1] > 0
            and all(t.device.type == "cpu" for t in (k, v, *(m for m in (keep, bias) if m is not None))))


def _kernel_inputs(qs: Tensor, k: Tensor, v: Tensor, keep: Optional[Tensor], bias: Optional[Tensor]) -> tuple:
    """The C++ kernels' shared arguments: ``qs`` (= q * scale), ``k``, ``v`` as contiguous (N, ., .)
    tensors, then ``keep``, its offsets, ``bias``, its offsets (None where absent)."""
    batch, (L, E), S, Ev = tuple(qs.shape[:-2]), qs.shape[-2:], k.shape[-2], v.shape[-1]
    masks = [_batch_offsets(m, batch, L, S) if m is not None else (None, None) for m in (keep, bias)]
    return (qs.reshape(-1, L, E).contiguous(), k.reshape(-1, S, E).contiguous(), v.reshape(-1, S, Ev).contiguous(),
            *masks[0], *masks[1])


@ev_softmax_attention_blockwise_op.register_kernel("cpu")
def _blockwise_cpu(q, k, v, keep, bias, is_causal, scale, count_support, block_q, block_k):
    """The fused C++ forward (``kernels/cpu/evidential_attention.cpp``) where it is built and allowed
    (see :mod:`.cpu`) and :func:`_fused_cpu_applies`; else the reference.

    ev-softmax (Eq. 7) of query ``i``'s scores ``s_ij = (q_i scale) . k_j (+ b_ij)`` keeps the valid
    keys with ``s_ij >= t_i``, ``t_i`` the mean valid score, which is linear in the keys:
    ``t_i = (q_i scale) . mean_j k_j (+ mean_j b_ij)``. So ``t_i`` and the valid-key count come first,
    from the reference's own :func:`.reference.evidential_attention.threshold` (O(L E) work without
    a general mask; both paths share them bit for bit), and the kernel makes one pass over the key
    tiles with the online softmax on the support: ``c_ij = s_ij - t_i`` on it, ``-inf`` off it,
    ``out_i = sum_j exp(c_ij - m_i) v_j / l_i`` with ``m_i = max_j c_ij``, ``l_i = sum_j exp(c_ij - m_i)``,
    and ``lse_i = m_i + log l_i``, the log-normalizer of the shifted scores the backward
    (:func:`_blockwise_backward_cpu`) reads."""
    ext = cpu.EVIDENTIAL_ATTENTION.kernel_for(q)
    if ext is None or not _fused_cpu_applies(q, k, v, keep, bias):
        return _blockwise_reference(q, k, v, keep, bias, is_causal, scale, count_support, block_q, block_k)
    rows, Ev = q.shape[:-1], v.shape[-1]
    qs = q * scale  # the scores are qs @ k^T, as in the reference (and its backward)
    thr, count = ref_attention.threshold(qs, k, keep, bias, is_causal, 1.0, block_k)
    qs, k, v, *masks = _kernel_inputs(qs, k, v, keep, bias)
    count = count.expand_as(thr).reshape(-1, rows[-1]).contiguous()
    out, lse, thr, support = ext.ev_softmax_attention_forward(
        qs, k, v, thr.reshape(-1, rows[-1]).contiguous(), count, *masks, bool(is_causal), bool(count_support),
        int(block_q), int(block_k))
    return (out.reshape(rows + (Ev,)), lse.reshape(rows + (1,)), thr.reshape(rows + (1,)),
            support.reshape(rows) if count_support else support, count.reshape(rows))


@ev_softmax_attention_blockwise_op.register_fake
def _blockwise_fake(q, k, v, keep, bias, is_causal, scale, count_support, block_q, block_k):
    rows = q.shape[:-1]
    support = q.new_empty(rows if count_support else (0,), dtype=torch.long)
    return (q.new_empty(rows + (v.shape[-1],)), q.new_empty(rows + (1,)), q.new_empty(rows + (1,)), support,
            q.new_empty(rows))


@torch.library.custom_op("sparsenorm::ev_softmax_attention_blockwise_backward", mutates_args=())
def ev_softmax_attention_blockwise_backward(
    grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, thr: Tensor,
    keep: Optional[Tensor], bias: Optional[Tensor], is_causal: bool, scale: float, block_q: int, block_k: int,
) -> Tuple[Tensor, Tensor, Tensor]:
    """``(dq, dk, dv)`` of the blockwise op from its saved outputs (closed form, FlashAttention-2)."""
    return ref_attention.backward(grad_out.contiguous(), q, k, v, out, lse, thr, keep, bias, is_causal, scale,
                                  block_q, block_k)


@ev_softmax_attention_blockwise_backward.register_kernel("cpu")
def _blockwise_backward_cpu(grad_out, q, k, v, out, lse, thr, keep, bias, is_causal, scale, block_q, block_k):
    """The fused C++ backward where the forward's kernel applies (and ``grad_out`` has q's dtype), else
    the reference. FlashAttention-2 from the saved ``out, lse, thr``: ``P = exp(c - lse)`` on the
    support (Eq. 7's, from the saved threshold), ``dV = P^T dO``, ``dS = P * (dO V^T - delta)`` with
    ``delta_i = dO_i . out_i`` (softmax's Jacobian on the support, Eq. 9), ``dQ = scale dS K``,
    ``dK = dS^T (Q scale)``; the threshold carries no gradient."""
    ext = cpu.EVIDENTIAL_ATTENTION.kernel_for(q)
    if ext is None or not _fused_cpu_applies(q, k, v, keep, bias) or grad_out.dtype != q.dtype:
        return ref_attention.backward(grad_out.contiguous(), q, k, v, out, lse, thr, keep, bias, is_causal, scale,
                                      block_q, block_k)
    rows, Ev = q.shape[:-1], v.shape[-1]
    per_row = lambda t, last: t.expand(*rows, last).reshape(-1, rows[-1], last).contiguous()
    qs, k_flat, v_flat, *masks = _kernel_inputs(q * scale, k, v, keep, bias)
    dq, dk, dv = ext.ev_softmax_attention_backward(
        per_row(grad_out, Ev), qs, k_flat, v_flat, per_row(out, Ev), per_row(lse, 1).squeeze(-1),
        per_row(thr, 1).squeeze(-1), *masks, bool(is_causal), int(block_q), int(block_k))
    return dq.mul_(scale).reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)


@ev_softmax_attention_blockwise_backward.register_fake
def _blockwise_backward_fake(grad_out, q, k, v, out, lse, thr, keep, bias, is_causal, scale, block_q, block_k):
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            torch.empty_like(k, memory_format=torch.contiguous_format),
            torch.empty_like(v, memory_format=torch.contiguous_format))


def _blockwise_setup(ctx, inputs, output) -> None:
    q, k, v, keep, bias, is_causal, scale, _, block_q, block_k = inputs
    out, lse, thr, support, count = output
    ctx.save_for_backward(q, k, v, out, lse, thr, keep, bias)
    ctx.args = (is_causal, scale, block_q, block_k)
    ctx.mark_non_differentiable(lse, thr, support, count)


def _blockwise_autograd(ctx, grad_out, *_):
    q, k, v, out, lse, thr, keep, bias = ctx.saved_tensors
    dq, dk, dv = ev_softmax_attention_blockwise_backward(grad_out, q, k, v, out, lse, thr, keep, bias, *ctx.args)
    return dq, dk, dv, None, None, None, None, None, None, None


ev_softmax_attention_blockwise_op.register_autograd(_blockwise_autograd, setup_context=_blockwise_setup)


def ev_softmax_attention_blockwise(
    q: Tensor, k: Tensor, v: Tensor, keep: Optional[Tensor] = None, bias: Optional[Tensor] = None,
    is_causal: bool = False, scale: Optional[float] = None, count_support: bool = False,
    block_q: Optional[int] = None, block_k: Optional[int] = None,
) -> Tuple[Tensor, Optional[Tensor], Tensor]:
    """ev-softmax attention without the L x S matrix: ``(out, support, valid_count)``, differentiable
    in ``q, k, v``.

    ``q`` (..., L, E), ``k`` (..., S, E), ``v`` (..., S, Ev) with one batch shape (...) (expand
    them first); ``keep`` boolean (True = attend) and ``bias`` (finite, no gradient) broadcastable
    to (..., L, S); ``is_causal`` SDPA's top-left causal mask, combined with ``keep``. ``support``
    (..., L) is the number of attended keys per query when ``count_support``, else None. Rows with
    no valid key give 0 and zero gradient. :func:`sparsenorm.attention.sparse_attention` validates
    arguments and picks this path; call this directly only with checked inputs.
    """
    if bias is not None and bias.requires_grad:
        raise ValueError("the blockwise path does not differentiate the float mask; use the dense path")
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    block_q = ref_attention.BLOCK_Q if block_q is None else block_q
    block_k = ref_attention.BLOCK_K if block_k is None else block_k
    out, _, _, support, count = ev_softmax_attention_blockwise_op(
        q, k, v, keep, bias, bool(is_causal), scale, count_support, block_q, block_k)
    return out, (support if count_support else None), count


def _ev_softmax_blockwise(call: AttentionCall):
    q, k, v, keep, bias = call.broadcast()
    out, support, count = ev_softmax_attention_blockwise(q, k, v, keep, bias, call.is_causal, call.scale,
                                                         call.count_support)
    return out, support, count


# ---------------------------------------------------------------------------------------------
# sparsenorm::ev_softmax_attention_flash (Triton)
# ---------------------------------------------------------------------------------------------
@torch.library.custom_op("sparsenorm::ev_softmax_attention_flash", mutates_args=())
def ev_softmax_attention_flash_op(
    q: Tensor, k: Tensor, v: Tensor, key_lengths: Optional[Tensor], key_mask: Optional[Tensor], is_causal: bool,
    scale: float,
) -> Tuple[Tensor, Tensor, Tensor]:
    """``(out, lse2, thr2)`` of :func:`.triton.attention.flash_ev_softmax_attention_forward`."""
    return triton_launchers().flash_ev_softmax_attention_forward(q, k, v, key_lengths, is_causal, scale, key_mask)


@ev_softmax_attention_flash_op.register_fake
def _flash_fake(q, k, v, key_lengths, key_mask, is_causal, scale):
    stats = q.new_empty(q.shape[:-1], dtype=torch.float32)
    return torch.empty_like(q, memory_format=torch.contiguous_format), stats, torch.empty_like(stats)


@torch.library.custom_op("sparsenorm::ev_softmax_attention_flash_backward", mutates_args=())
def ev_softmax_attention_flash_backward(
    grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse2: Tensor, thr2: Tensor,
    key_lengths: Optional[Tensor], key_mask: Optional[Tensor], is_causal: bool, scale: float,
) -> Tuple[Tensor, Tensor, Tensor]:
    """``(dq, dk, dv)`` of the flash op from its saved outputs (Triton, FlashAttention-2)."""
    return triton_launchers().flash_ev_softmax_attention_backward(grad_out, q, k, v, out, lse2, thr2, key_lengths,
                                                                  is_causal, scale, key_mask)


@ev_softmax_attention_flash_backward.register_fake
def _flash_backward_fake(grad_out, q, k, v, out, lse2, thr2, key_lengths, key_mask, is_causal, scale):
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            torch.empty_like(k, memory_format=torch.contiguous_format),
            torch.empty_like(v, memory_format=torch.contiguous_format))


def _flash_setup(ctx, inputs, output) -> None:
    q, k, v, key_lengths, key_mask, is_causal, scale = inputs
    out, lse2, thr2 = output
    ctx.save_for_backward(q, k, v, out, lse2, thr2, key_lengths, key_mask)
    ctx.args = (is_causal, scale)
    ctx.mark_non_differentiable(lse2, thr2)


def _flash_autograd(ctx, grad_out, *_):
    q, k, v, out, lse2, thr2, key_lengths, key_mask = ctx.saved_tensors
    dq, dk, dv = ev_softmax_attention_flash_backward(grad_out, q, k, v, out, lse2, thr2, key_lengths, key_mask,
                                                     *ctx.args)
    return dq, dk, dv, None, None, None, None


ev_softmax_attention_flash_op.register_autograd(_flash_autograd, setup_context=_flash_setup)


def flash_ev_softmax_attention(
    q: Tensor, k: Tensor, v: Tensor, key_lengths: Optional[Tensor] = None, is_causal: bool = False,
    scale: Optional[float] = None, key_mask: Optional[Tensor] = None,
) -> Tensor:
    """Exact ev-softmax attention ``ev_softmax(q k^T * scale) v`` (Eq. 7 per query) by the Triton
    flash kernel, differentiable in ``q, k, v`` (the op ``sparsenorm::ev_softmax_attention_flash``).

    ``q`` (B, Hq, L, D), ``k`` and ``v`` (B, Hk, S, D) with ``Hk`` dividing ``Hq`` (GQA), one dtype
    (float16/bfloat16/float32), ``D <= 128``; ``key_lengths`` (B,) int: keys ``j >= len`` are not
    there (clamped to ``[0, S]``); ``key_mask`` (B, S) bool: False = not there (any padding side);
    ``is_causal``: top-left causal mask, as SDPA; all three combine. ``scale`` defaults to
    ``1/sqrt(D)``. The threshold of query ``i`` is ``q_i . mean(valid keys) * scale`` (carries no
    gradient); a query with no valid key gives zeros. Returns (B, Hq, L, D) in q's dtype. Needs
    triton (CUDA tensors, or CPU tensors under ``TRITON_INTERPRET=1``); argument errors name the
    argument (raised by the launcher).
    """
    if isinstance(scale, Tensor) or (scale is not None and not math.isfinite(float(scale))):
        raise ValueError(f"scale must be a finite number or None, got {scale}")
    if triton_launchers() is None:
        raise RuntimeError("flash_ev_softmax_attention needs triton: pip install 'sparsenorm[gpu]'")
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    return ev_softmax_attention_flash_op(q, k, v, key_lengths, key_mask, bool(is_causal), scale)[0]

_FLASH_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@torch._dynamo.assume_constant_result
def _triton_runs_on(device_type: str) -> bool:
    """Whether the Triton kernels can run on this device type here: CUDA with triton installed (and
    kernels allowed), or CPU under Triton's interpreter. Constant for ``torch.compile``."""
    interpreting = os.environ.get("TRITON_INTERPRET") == "1"
    if device_type != "cuda" and not (device_type == "cpu" and interpreting):
        return False
    launchers = triton_launchers()
    if launchers is None:
        return False
    from .triton._common import INTERPRET
    return INTERPRET == (device_type == "cpu")


def _flash_key_mask(keep: Optional[Tensor], batch: int, k_len: int) -> Tuple[bool, Optional[Tensor]]:
    """``(applies, key_mask (B, S))``: a keep mask the flash kernel takes varies over keys only."""
    if keep is None:
        return True, None
    if keep.dim() > 4:
        return False, None
    keep = keep.reshape((1,) * (4 - keep.dim()) + keep.shape)
    if keep.shape[1] != 1 or keep.shape[2] != 1:
        return False, None  # a mask that differs between heads or queries
    return True, keep.expand(batch, 1, 1, k_len).reshape(batch, k_len)


def _ev_softmax_flash(call: AttentionCall):
    """The flash op where it applies: 4-D (B, H, L, E) inputs with one batch size, E <= 128, the
    value's head dim equal to the query's, a float32/float16/bfloat16 dtype, no float mask, no
    support counting, a mask that varies over keys only (padding); else None."""
    q, k, v = call.q, call.k, call.v
    if not _triton_runs_on(q.device.type) or call.bias is not None or call.count_support:
        return None
    if any(t.dim() != 4 for t in (q, k, v)) or q.dtype not in _FLASH_DTYPES:
        return None
    B, E, S = q.shape[0], q.shape[-1], k.shape[-2]
    if E > 128 or v.shape[-1] != E or k.shape[0] != B or v.shape[0] != B:
        return None
    applies, key_mask = _flash_key_mask(call.keep, B, S)
    if not applies:
        return None
    out, _, _ = ev_softmax_attention_flash_op(q, k, v, call.key_lengths, key_mask, call.is_causal, call.scale)
    return out, None, None


# ---------------------------------------------------------------------------------------------
# The table and the choice
# ---------------------------------------------------------------------------------------------
# ---------------------------------------------------------------------------------------------
# Kernels living elsewhere: sparsemax / entmax (threshold searched), FlexAttention
# ---------------------------------------------------------------------------------------------
def _four_dims(call: AttentionCall):
    """``(q, k, v, keep, key_lengths, unflatten)`` as (B, H, L, E) tensors for the kernels that take
    only that layout: 4-D inputs with one batch size go as they are (GQA and ``key_lengths`` kept);
    any other broadcastable layout is expanded to one batch of single-head rows (``keep`` then
    materialized at L x S booleans) and ``unflatten`` restores the caller's leading dims."""
    q, k, v = call.q, call.k, call.v
    if len(call.scores_shape) == 4 and all(t.dim() == 4 for t in (q, k, v)) and q.shape[0] == k.shape[0] == v.shape[0]:
        keep = None if call.keep is None else call.keep.reshape((1,) * (4 - call.keep.dim()) + call.keep.shape)
        return q, k, v, keep, call.key_lengths, lambda out: out
    q, k, v, keep, _ = call.broadcast()
    batch, (L, S) = call.scores_shape[:-2], call.scores_shape[-2:]
    keep = None if keep is None else keep.expand(call.scores_shape).reshape(-1, 1, L, S)
    flat = (q.reshape(-1, 1, L, q.shape[-1]), k.reshape(-1, 1, S, k.shape[-1]), v.reshape(-1, 1, S, v.shape[-1]))
    return (*flat, keep, None, lambda out: out.reshape(*batch, L, out.shape[-1]))


def _searched_kind(alpha: Optional[float]) -> str:
    """The blockwise search for alpha-entmax: the exact closed forms at alpha = 2 (sparsemax) and
    1.5, bisection otherwise."""
    return {2.0: "sparsemax", 1.5: "entmax15"}.get(alpha, "entmax_bisect")


def _searched_blockwise(call: AttentionCall):
    """``sparsenorm::projection_attention`` (O(L) extra memory) for the normalizers whose threshold
    is searched; not for a float mask (the op takes none) or support counting (it returns no counts)."""
    if call.bias is not None or call.count_support:
        return None
    q, k, v, keep, key_lengths, unflatten = _four_dims(call)
    out, _, _ = projection_attention_op(q, k, v, keep, key_lengths, call.is_causal, call.scale,
                                        _searched_kind(call.alpha), searched_block_q(k.shape[-2]), BLOCK_K_SEARCHED,
                                        float(call.alpha if call.alpha is not None else 1.5), BISECT_STEPS)
    return unflatten(out), None, None


def _ev_softmax_flex(call: AttentionCall):
    """ev-softmax on FlexAttention (:mod:`.flex_attention`) where this torch has it and,
    on CPU, only outside autograd (FlexAttention has no CPU backward); no float mask, no counts."""
    if not flex_attention.flex_available() or call.bias is not None or call.count_support:
        return None
    if call.q.device.type == "cpu" and torch.is_grad_enabled() and any(
            t.requires_grad for t in (call.q, call.k, call.v)):
        return None
    q, k, v, keep, key_lengths, unflatten = _four_dims(call)
    return unflatten(flex_attention.ev_softmax_flex_attention(q, k, v, keep, key_lengths, call.is_causal, call.scale)), None, None


BISECT_STEPS = 50
"""Bisection steps of a searched threshold with no closed form (alpha not 1.5 or 2):
``entmax_bisect``'s default, which the registry entry keeps (it binds no ``n_iter``)."""

BLOCK_Q_SEARCHED, BLOCK_K_SEARCHED = 256, 1024
"""Query and key block sizes of the searched-threshold kernel (its reference module's defaults);
the query block shrinks for long key sequences (:func:`searched_block_q`)."""

SEARCHED_SCORES_PER_BLOCK = 2 ** 20
"""At most this many scores per head in one query block (block_q x S; 4 MB in float32), down to
64 queries: a query block's kept scores and kept ``dO Vᵀ`` are swept by every pass, and past the
caches each sweep runs at memory speed (L = S = 8192, B·H = 8, one thread: 256 queries 2.27x /
2.30x SDPA's fused kernel for sparsemax / entmax15, 128 queries 1.99x / 2.02x, 64 queries
1.85x / 2.08x; medians of 3 interleaved rounds, docs/guide/attention.md)."""


def searched_block_q(keys: int) -> int:
    """The searched kernel's query block for ``keys`` keys (see :data:`SEARCHED_SCORES_PER_BLOCK`)."""
    block = BLOCK_Q_SEARCHED
    while block > 64 and block * keys > SEARCHED_SCORES_PER_BLOCK:
        block //= 2
    return block

KERNELS: Dict[str, Dict[str, AttentionKernel]] = {
    "known": {"triton": _ev_softmax_flash, "blockwise": _ev_softmax_blockwise, "flex": _ev_softmax_flex},
    "searched": {"blockwise": _searched_blockwise},
}
"""``KERNELS[attention_threshold][backend]``: the memory-efficient kernels by the registry's
capability (``Normalizer.attention_threshold``) and backend name (one of :data:`BACKENDS`)."""


def register_attention_kernel(threshold: str, backend: str, kernel: AttentionKernel) -> None:
    """Make ``kernel`` the ``backend`` kernel of every normalizer whose registry entry has
    ``attention_threshold == threshold`` (replacing any before)."""
    if backend not in BACKENDS or backend in ("auto", "dense"):
        raise ValueError(f"backend must be one of {[b for b in BACKENDS if b not in ('auto', 'dense')]}, "
                         f"got {backend!r}")
    KERNELS.setdefault(threshold, {})[backend] = kernel


def dense_attention(fn: Callable[..., Tensor], call: AttentionCall, dropout_p: float = 0.0):
    """``(out, weights, support, valid)`` with the L x S weights ``fn(scores, dim=-1)``; every
    normalizer (a function of the scores). Not-there keys are ``-inf`` for ``fn``; a row with no
    valid key is given zeros (no normalizer sees an all ``-inf`` row) and, through ``masked_fill``,
    no gradient."""
    q, k, v = call.q.to(compute_dtype(call.q)), expand_heads(call.q, call.k), expand_heads(call.q, call.v)
    k, v = k.to(q.dtype), v.to(q.dtype)
    L, S = call.scores_shape[-2], call.scores_shape[-1]
    scores = torch.matmul(q, k.transpose(-2, -1)) * call.scale
    if call.bias is not None:
        scores = scores + call.bias.to(q.dtype)
    keep = combine_keep(call.keep, lengths_keep(call.key_lengths, S, len(call.scores_shape)),
                        causal_keep(L, S, device=q.device) if call.is_causal else None)
    if keep is None:
        weights = fn(scores, dim=-1)
    else:
        empty = ~keep.any(-1, keepdim=True)
        weights = fn(scores.masked_fill(~keep, float("-inf")).masked_fill(empty, 0.0), dim=-1)
        weights = weights.masked_fill(empty, 0.0)
    support = valid = None
    if call.count_support:
        support = (weights != 0).sum(-1)
        valid = (keep.expand(call.scores_shape).sum(-1) if keep is not None
                 else torch.full((), S, dtype=torch.long, device=q.device))
    if dropout_p > 0.0:
        weights = F.dropout(weights, dropout_p, training=True)
    return torch.matmul(weights, v), weights, support, valid


def check_backend(backend: str) -> None:
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")


def attention(fn: Callable[..., Tensor], threshold: Optional[str], call: AttentionCall, dropout_p: float = 0.0,
              return_weights: bool = False, backend: str = "auto"):
    """``(out, weights or None, support or None, valid or None)`` by the kernel ``backend`` names.

    ``fn`` is the normalizer's map of the scores (for the dense path), ``threshold`` its registry
    capability (which memory-efficient kernels apply). The memory-efficient kernels return no
    weights, apply no dropout and do not differentiate a float mask: an explicit ``backend`` asked
    for with any of those, or that does not apply to the inputs, raises ``ValueError``. Query rows
    past ``call.query_lengths`` are zeroed here (output, weights; left out of the counts).
    """
    out, weights, support, valid = _run(fn, threshold, call, dropout_p, return_weights, backend)
    if call.query_lengths is not None:
        L = call.scores_shape[-2]
        rows = torch.arange(L, device=call.query_lengths.device) < call.query_lengths.reshape(
            (-1,) + (1,) * (len(call.scores_shape) - 2))  # (B, 1, ..., L)
        out = out.masked_fill(~rows.unsqueeze(-1), 0.0)
        weights = None if weights is None else weights.masked_fill(~rows.unsqueeze(-1), 0.0)
        valid = None if valid is None else valid * rows
    return out, weights, support, valid


def _run(fn, threshold, call, dropout_p, return_weights, backend):
    check_backend(backend)
    kernels = KERNELS.get(threshold, {}) if threshold is not None else {}
    if backend == "dense":
        return dense_attention(fn, call, dropout_p)
    efficient = not return_weights and dropout_p == 0.0 and (call.bias is None or not call.bias.requires_grad)
    if backend == "auto":
        n_scores = call.scores_shape[-2] * call.scores_shape[-1]
        for name in AUTO_ORDER if efficient else ():
            kernel = kernels.get(name)
            if kernel is not None and n_scores >= max(_auto_min_scores(name), 1):
                result = kernel(call)
                if result is not None:
                    return (result[0], None, *result[1:])
        return dense_attention(fn, call, dropout_p)
    if not efficient:
        raise ValueError(f"backend={backend!r} returns no weights, applies no dropout and does not differentiate "
                         "a float mask; use backend='dense' (or 'auto') for those")
    kernel = kernels.get(backend)
    if kernel is None:
        raise ValueError(f"backend={backend!r} has no kernel for this normalizer (attention_threshold="
                         f"{threshold!r}; its backends: {', '.join(['dense', *kernels])})")
    if call.scores_shape[-2] * call.scores_shape[-1] == 0:
        # No query or no key: the answer is an empty or all-zero output (a query with no key attends
        # to nothing), which the dense path gives exactly; the tiled kernels assume at least one tile.
        out, _, support, valid = dense_attention(fn, call, dropout_p)
        return out, None, support, valid
    result = kernel(call)
    if result is None:
        raise ValueError(f"backend={backend!r} does not apply to these inputs (device, dtype, shapes or mask form); "
                         "use backend='auto'")
    return (result[0], None, *result[1:])


__all__ = ["ev_softmax_attention_blockwise_op", "ev_softmax_attention_blockwise_backward",
           "ev_softmax_attention_flash_op", "ev_softmax_attention_flash_backward", "ev_softmax_attention_blockwise",
           "flash_ev_softmax_attention",
           "AttentionCall", "KERNELS", "BACKENDS", "AUTO_ORDER", "register_attention_kernel", "attention",
           "dense_attention", "BLOCKWISE_MIN_SCORES"]
