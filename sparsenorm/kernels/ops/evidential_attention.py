"""The ev-softmax attention ops, each with ``register_fake`` and a closed-form autograd from its
saved outputs (FlashAttention-2's backward on the support):

* ``sparsenorm::ev_softmax_attention_blockwise`` (+ ``..._backward``): exact ev-softmax attention
  in O(L) extra memory, pure PyTorch (:mod:`..reference.evidential_attention`) on any device, the
  fused C++ kernel (``kernels/cpu/evidential_attention.cpp``) on CPU where built;
* ``sparsenorm::ev_softmax_attention_flash`` (+ ``..._backward``): the same by the Triton flash
  kernel (:mod:`..triton.attention`), on CUDA (or on CPU tensors under ``TRITON_INTERPRET=1``).

:func:`ev_softmax_attention_blockwise` and :func:`ev_softmax_attention_flash` are their checked
entry points; :mod:`sparsenorm.kernels.attention.dispatch` picks between them.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
from torch import Tensor

from .. import cpu
from ..reference import evidential_attention as ref_attention
from ..policy import triton_launchers


# ---------------------------------------------------------------------------------------------
# sparsenorm::ev_softmax_attention_blockwise
# ---------------------------------------------------------------------------------------------
@torch.library.custom_op("sparsenorm::ev_softmax_attention_blockwise", mutates_args=())
def ev_softmax_attention_blockwise_op(
    q: Tensor, k: Tensor, v: Tensor, keep: Optional[Tensor], bias: Optional[Tensor], is_causal: bool,
    scale: float, count_support: bool, block_q: int, block_k: int, causal_offset: int = 0,
) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``(out, lse, thr, support, count)``; see :func:`.reference.evidential_attention.forward`
    (``support`` is empty unless ``count_support``; with ``is_causal`` query ``i`` sees keys
    ``j <= i + causal_offset``)."""
    return _blockwise_reference(q, k, v, keep, bias, is_causal, scale, count_support, block_q, block_k, causal_offset)


def _blockwise_reference(q, k, v, keep, bias, is_causal, scale, count_support, block_q, block_k, causal_offset=0):
    out, lse, thr, support, count = ref_attention.forward(q, k, v, keep, bias, is_causal, scale, count_support,
                                                          block_q, block_k, causal_offset)
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
def _blockwise_cpu(q, k, v, keep, bias, is_causal, scale, count_support, block_q, block_k, causal_offset=0):
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
        return _blockwise_reference(q, k, v, keep, bias, is_causal, scale, count_support, block_q, block_k,
                                    causal_offset)
    rows, Ev = q.shape[:-1], v.shape[-1]
    qs = q * scale  # the scores are qs @ k^T, as in the reference (and its backward)
    thr, count = ref_attention.threshold(qs, k, keep, bias, is_causal, 1.0, block_k, causal_offset)
    qs, k, v, *masks = _kernel_inputs(qs, k, v, keep, bias)
    count = count.expand_as(thr).reshape(-1, rows[-1]).contiguous()
    out, lse, thr, support = ext.ev_softmax_attention_forward(
        qs, k, v, thr.reshape(-1, rows[-1]).contiguous(), count, *masks, bool(is_causal), int(causal_offset),
        bool(count_support), int(block_q), int(block_k))
    return (out.reshape(rows + (Ev,)), lse.reshape(rows + (1,)), thr.reshape(rows + (1,)),
            support.reshape(rows) if count_support else support, count.reshape(rows))


@ev_softmax_attention_blockwise_op.register_fake
def _blockwise_fake(q, k, v, keep, bias, is_causal, scale, count_support, block_q, block_k, causal_offset=0):
    rows = q.shape[:-1]
    support = q.new_empty(rows if count_support else (0,), dtype=torch.long)
    return (q.new_empty(rows + (v.shape[-1],)), q.new_empty(rows + (1,)), q.new_empty(rows + (1,)), support,
            q.new_empty(rows))


@torch.library.custom_op("sparsenorm::ev_softmax_attention_blockwise_backward", mutates_args=())
def ev_softmax_attention_blockwise_backward(
    grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, thr: Tensor,
    keep: Optional[Tensor], bias: Optional[Tensor], is_causal: bool, scale: float, block_q: int, block_k: int,
    causal_offset: int = 0,
) -> Tuple[Tensor, Tensor, Tensor]:
    """``(dq, dk, dv)`` of the blockwise op from its saved outputs (closed form, FlashAttention-2)."""
    return ref_attention.backward(grad_out.contiguous(), q, k, v, out, lse, thr, keep, bias, is_causal, scale,
                                  block_q, block_k, causal_offset)


@ev_softmax_attention_blockwise_backward.register_kernel("cpu")
def _blockwise_backward_cpu(grad_out, q, k, v, out, lse, thr, keep, bias, is_causal, scale, block_q, block_k,
                            causal_offset=0):
    """The fused C++ backward where the forward's kernel applies (and ``grad_out`` has q's dtype), else
    the reference. FlashAttention-2 from the saved ``out, lse, thr``: ``P = exp(c - lse)`` on the
    support (Eq. 7's, from the saved threshold), ``dV = P^T dO``, ``dS = P * (dO V^T - delta)`` with
    ``delta_i = dO_i . out_i`` (softmax's Jacobian on the support, Eq. 9), ``dQ = scale dS K``,
    ``dK = dS^T (Q scale)``; the threshold carries no gradient."""
    ext = cpu.EVIDENTIAL_ATTENTION.kernel_for(q)
    if ext is None or not _fused_cpu_applies(q, k, v, keep, bias) or grad_out.dtype != q.dtype:
        return ref_attention.backward(grad_out.contiguous(), q, k, v, out, lse, thr, keep, bias, is_causal, scale,
                                      block_q, block_k, causal_offset)
    rows, Ev = q.shape[:-1], v.shape[-1]
    per_row = lambda t, last: t.expand(*rows, last).reshape(-1, rows[-1], last).contiguous()
    qs, k_flat, v_flat, *masks = _kernel_inputs(q * scale, k, v, keep, bias)
    dq, dk, dv = ext.ev_softmax_attention_backward(
        per_row(grad_out, Ev), qs, k_flat, v_flat, per_row(out, Ev), per_row(lse, 1).squeeze(-1),
        per_row(thr, 1).squeeze(-1), *masks, bool(is_causal), int(causal_offset), int(block_q), int(block_k))
    return dq.mul_(scale).reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)


@ev_softmax_attention_blockwise_backward.register_fake
def _blockwise_backward_fake(grad_out, q, k, v, out, lse, thr, keep, bias, is_causal, scale, block_q, block_k,
                             causal_offset=0):
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            torch.empty_like(k, memory_format=torch.contiguous_format),
            torch.empty_like(v, memory_format=torch.contiguous_format))


def _blockwise_setup(ctx, inputs, output) -> None:
    q, k, v, keep, bias, is_causal, scale, _, block_q, block_k, causal_offset = inputs
    out, lse, thr, support, count = output
    ctx.save_for_backward(q, k, v, out, lse, thr, keep, bias)
    ctx.args = (is_causal, scale, block_q, block_k, causal_offset)
    ctx.mark_non_differentiable(lse, thr, support, count)


def _blockwise_autograd(ctx, grad_out, *_):
    q, k, v, out, lse, thr, keep, bias = ctx.saved_tensors
    dq, dk, dv = ev_softmax_attention_blockwise_backward(grad_out, q, k, v, out, lse, thr, keep, bias, *ctx.args)
    return dq, dk, dv, None, None, None, None, None, None, None, None


ev_softmax_attention_blockwise_op.register_autograd(_blockwise_autograd, setup_context=_blockwise_setup)


def ev_softmax_attention_blockwise(
    q: Tensor, k: Tensor, v: Tensor, keep: Optional[Tensor] = None, bias: Optional[Tensor] = None,
    is_causal: bool = False, scale: Optional[float] = None, count_support: bool = False,
    block_q: Optional[int] = None, block_k: Optional[int] = None, causal_offset: int = 0,
) -> Tuple[Tensor, Optional[Tensor], Tensor]:
    """ev-softmax attention without the L x S matrix: ``(out, support, valid_count)``, differentiable
    in ``q, k, v``.

    ``q`` (..., L, E), ``k`` (..., S, E), ``v`` (..., S, Ev) with one batch shape (...) (expand
    them first); ``keep`` boolean (True = attend) and ``bias`` (finite, no gradient) broadcastable
    to (..., L, S); ``is_causal``: query ``i`` sees keys ``j <= i + causal_offset`` (0: SDPA's
    top-left causal mask; ``S - L``: bottom-right), combined with ``keep``. ``support``
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
        q, k, v, keep, bias, bool(is_causal), scale, count_support, block_q, block_k, int(causal_offset))
    return out, (support if count_support else None), count


# ---------------------------------------------------------------------------------------------
# sparsenorm::key_prefix_sums: the causal threshold's key sums (no gradient: Eq. 9)
# ---------------------------------------------------------------------------------------------
@torch.library.custom_op("sparsenorm::key_prefix_sums", mutates_args=())
def key_prefix_sums(k: Tensor) -> Tensor:
    """float32 prefix sums of ``k`` (..., S, D) along S (what the causal ev-softmax threshold
    ``q_i . mean(k_0..k_{e_i})`` needs); ``torch.cumsum`` here, a one-pass Triton scan on CUDA
    (``torch.cumsum`` along the sequence is slow there: see :mod:`..triton.prefix`)."""
    return torch.cumsum(k, dim=-2, dtype=torch.float32)


@key_prefix_sums.register_kernel("cuda")
def _key_prefix_sums_cuda(k: Tensor) -> Tensor:
    launchers = triton_launchers()
    if launchers is None or k.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return torch.cumsum(k, dim=-2, dtype=torch.float32)
    return launchers.key_prefix_sums(k)


@key_prefix_sums.register_fake
def _key_prefix_sums_fake(k: Tensor) -> Tensor:
    return k.new_empty(k.shape, dtype=torch.float32)


# ---------------------------------------------------------------------------------------------
# sparsenorm::ev_softmax_attention_flash (Triton)
# ---------------------------------------------------------------------------------------------
@torch.library.custom_op("sparsenorm::ev_softmax_attention_flash", mutates_args=())
def ev_softmax_attention_flash_op(
    q: Tensor, k: Tensor, v: Tensor, key_lengths: Optional[Tensor], key_mask: Optional[Tensor], is_causal: bool,
    scale: float, causal_offset: int = 0,
) -> Tuple[Tensor, Tensor, Tensor]:
    """``(out, lse2, thr2)`` of :func:`.triton.attention.flash_ev_softmax_attention_forward`."""
    return triton_launchers().flash_ev_softmax_attention_forward(q, k, v, key_lengths, is_causal, scale, key_mask,
                                                                 causal_offset)


@ev_softmax_attention_flash_op.register_fake
def _flash_fake(q, k, v, key_lengths, key_mask, is_causal, scale, causal_offset=0):
    stats = q.new_empty(q.shape[:-1], dtype=torch.float32)
    return torch.empty_like(q, memory_format=torch.contiguous_format), stats, torch.empty_like(stats)


@torch.library.custom_op("sparsenorm::ev_softmax_attention_flash_backward", mutates_args=())
def ev_softmax_attention_flash_backward(
    grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse2: Tensor, thr2: Tensor,
    key_lengths: Optional[Tensor], key_mask: Optional[Tensor], is_causal: bool, scale: float, causal_offset: int = 0,
) -> Tuple[Tensor, Tensor, Tensor]:
    """``(dq, dk, dv)`` of the flash op from its saved outputs (Triton, FlashAttention-2)."""
    return triton_launchers().flash_ev_softmax_attention_backward(grad_out, q, k, v, out, lse2, thr2, key_lengths,
                                                                  is_causal, scale, key_mask, causal_offset)


@ev_softmax_attention_flash_backward.register_fake
def _flash_backward_fake(grad_out, q, k, v, out, lse2, thr2, key_lengths, key_mask, is_causal, scale,
                         causal_offset=0):
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            torch.empty_like(k, memory_format=torch.contiguous_format),
            torch.empty_like(v, memory_format=torch.contiguous_format))


def _flash_setup(ctx, inputs, output) -> None:
    q, k, v, key_lengths, key_mask, is_causal, scale, causal_offset = inputs
    out, lse2, thr2 = output
    ctx.save_for_backward(q, k, v, out, lse2, thr2, key_lengths, key_mask)
    ctx.args = (is_causal, scale, causal_offset)
    ctx.mark_non_differentiable(lse2, thr2)


def _flash_autograd(ctx, grad_out, *_):
    q, k, v, out, lse2, thr2, key_lengths, key_mask = ctx.saved_tensors
    dq, dk, dv = ev_softmax_attention_flash_backward(grad_out, q, k, v, out, lse2, thr2, key_lengths, key_mask,
                                                     *ctx.args)
    return dq, dk, dv, None, None, None, None, None


ev_softmax_attention_flash_op.register_autograd(_flash_autograd, setup_context=_flash_setup)


def ev_softmax_attention_flash(
    q: Tensor, k: Tensor, v: Tensor, key_lengths: Optional[Tensor] = None, is_causal: bool = False,
    scale: Optional[float] = None, key_mask: Optional[Tensor] = None, causal_offset: int = 0,
) -> Tensor:
    """Exact ev-softmax attention ``ev_softmax(q k^T * scale) v`` (Eq. 7 per query) by the Triton
    flash kernel, differentiable in ``q, k, v`` (the op ``sparsenorm::ev_softmax_attention_flash``).

    ``q`` (B, Hq, L, D), ``k`` and ``v`` (B, Hk, S, D) with ``Hk`` dividing ``Hq`` (GQA), one dtype
    (float16/bfloat16/float32), ``D <= 128``; ``key_lengths`` (B,) int: keys ``j >= len`` are not
    there (clamped to ``[0, S]``); ``key_mask`` (B, S) bool: False = not there (any padding side);
    ``is_causal``: query ``i`` sees keys ``j <= i + causal_offset`` (0: top-left, as SDPA; ``S - L``:
    bottom-right, as FlashAttention >= 2.1); all three combine. ``scale`` defaults to
    ``1/sqrt(D)``. The threshold of query ``i`` is ``q_i . mean(valid keys) * scale`` (carries no
    gradient); a query with no valid key gives zeros. Returns (B, Hq, L, D) in q's dtype. Needs
    triton (CUDA tensors, or CPU tensors under ``TRITON_INTERPRET=1``); argument errors name the
    argument (raised by the launcher).
    """
    if isinstance(scale, Tensor) or (scale is not None and not math.isfinite(float(scale))):
        raise ValueError(f"scale must be a finite number or None, got {scale}")
    if triton_launchers() is None:
        raise RuntimeError("ev_softmax_attention_flash needs triton: pip install 'sparsenorm[gpu]'")
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    return ev_softmax_attention_flash_op(q, k, v, key_lengths, key_mask, bool(is_causal), scale, int(causal_offset))[0]


__all__ = ["key_prefix_sums", "ev_softmax_attention_blockwise_op", "ev_softmax_attention_blockwise_backward",
           "ev_softmax_attention_flash_op", "ev_softmax_attention_flash_backward", "ev_softmax_attention_blockwise",
           "ev_softmax_attention_flash"]
